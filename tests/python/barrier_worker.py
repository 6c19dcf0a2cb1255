"""One of two processes of test_barrier.test_two_processes_barriers_none_early:
joins a 2-process JAX cluster on loopback (gloo collectives, 2 CPU devices
each) and runs ITERS barriers after a shard_map over the 4 global devices
and after a jit over a global sharded array with one tap per device
(device_index).  Prints, as JSON, the iterations whose barrier_wait returned
before this process's taps of that iteration had all run.
Usage: barrier_worker.py PROCESS_ID PORT ITERS"""

import json
import os
import sys
import threading

process_id, port, iters = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
os.environ["JAX_NUM_CPU_DEVICES"] = "2"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=2, process_id=process_id,
                           initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import host_callback as hcb  # noqa: E402

lock = threading.Lock()
got: list[tuple[int, int]] = []


def tap(v, transforms, *, device):
  with lock:
    got.append((int(v[0]), device.id))


mesh = Mesh(np.array(jax.devices()), ("d",))
size = 4 * 50_000
xs = np.ones(size, np.float32)
x = jax.make_array_from_callback(xs.shape, NamedSharding(mesh, P("d")),
                                 lambda index: xs[index])


def stamp(v, it):
  return jnp.concatenate([it[None], jnp.sin(jnp.cos(v) * 1.5)[:3]])


shard_map = jax.jit(jax.shard_map(
    lambda v, it: hcb.id_tap(tap, stamp(v, it), result=v,
                             tap_with_device=True) + 1,
    mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d")))


@jax.jit
def jit_sharded(v, it):
  for i in range(len(jax.devices())):
    v = hcb.id_tap(tap, stamp(v, it), result=v * 1.01, tap_with_device=True,
                   device_index=i)
  return v + 1


expected = sorted(d.id for d in jax.local_devices())
early: dict[str, list[int]] = {}
for name, f in (("shard_map", shard_map), ("jit_sharded", jit_sharded)):
  f(x, np.float32(-1)).block_until_ready()
  hcb.barrier_wait()
  with lock:
    got.clear()
  early[name] = []
  for it in range(iters):
    f(x, np.float32(it))
    hcb.barrier_wait()
    with lock:
      seen, got[:] = list(got), []
    if sorted(d for i, d in seen if i == it) != expected or any(
        i != it for i, _ in seen):
      early[name].append(it)
      jax.effects_barrier()
      hcb.barrier_wait()
      with lock:
        got.clear()
print(json.dumps(early), flush=True)
jax.distributed.shutdown()
