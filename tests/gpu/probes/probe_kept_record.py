"""Probe: a tap function that keeps one of its arrays (a view into the
pinned pool) does not make later taps synchronous: 2,000 taps of 16 KiB
go through the smallest pool (4 MiB) around it without the device ever
waiting for its stream (the pool's ``syncs`` and ``refusals`` in
``hcb.stats()``)."""

import os

os.environ["HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE"] = str(4 << 20)

from probe import DRY_RUN, device, done  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import host_callback as hcb  # noqa: E402

TAPS = 2000
saved, count = [], [0]
dev = device()
keep = jax.jit(lambda x: hcb.id_tap(lambda a, t: saved.append(a), x))
keep(jax.device_put(jnp.ones(16384, jnp.float32), dev)).block_until_ready()
hcb.barrier_wait()
tap = jax.jit(lambda x: hcb.id_tap(
    lambda a, t: count.__setitem__(0, count[0] + 1), x) + 1)
x = jax.device_put(jnp.zeros(4096, jnp.float32), dev)  # 16 KiB
for _ in range(TAPS):
  x = tap(x)
x.block_until_ready()
hcb.barrier_wait()
pool = hcb.stats()["devices"].get(str(dev), {}).get("pinned_pool")
kept = saved[0].sum() == 16384 if saved else False
if DRY_RUN:
  done(count[0] == TAPS and kept and pool is None,
       f"{count[0]} of {TAPS} taps delivered, the kept array intact: {kept} "
       "(a CPU device has no pinned pool)")
done(count[0] == TAPS and kept and pool is not None and pool["syncs"] == 0
     and pool["refusals"] == 0,
     f"{count[0]} of {TAPS} taps delivered, the kept array intact: {kept}; "
     f"pinned pool {pool}")
