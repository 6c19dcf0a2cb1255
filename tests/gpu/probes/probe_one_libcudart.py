"""Probe: the process maps one libcudart, the one JAX's CUDA plugin brought,
after host_callback's CUDA handlers found theirs (src/ffi/cuda.c looks in
the process first): two CUDA runtimes in one process would keep two sets
of state (streams, events) that must be one."""

from probe import DRY_RUN, device, done, skip

if DRY_RUN:
  skip("a CPU device loads no CUDA runtime")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import host_callback as hcb  # noqa: E402

seen = []
f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(a), x))
f(jax.device_put(jnp.ones(4), device())).block_until_ready()
hcb.barrier_wait()
with open("/proc/self/maps") as maps:
  paths = sorted({fields[-1] for fields in (line.split() for line in maps)
                  if len(fields) >= 6 and "libcudart" in fields[-1]})
done(len(paths) == 1 and len(seen) == 1,
     f"{len(paths)} libcudart mapped {paths}; the tap ran {len(seen)} time(s)")
