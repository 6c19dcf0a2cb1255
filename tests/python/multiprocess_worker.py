"""One of two processes of test_transforms.test_two_processes: joins a
2-process JAX cluster on loopback (gloo collectives, 2 CPU devices each),
taps and calls from every device under shard_map, and under jit over the
operands sharded across both processes (one of them failing), and prints
what this process received and raised as JSON.  Inline mode is on: it
runs eager calls only (shard_map's are compiled), and one checks the
device an inline call is given.  Usage: multiprocess_worker.py PROCESS_ID
PORT"""

import json
import os
import sys

process_id, port = int(sys.argv[1]), sys.argv[2]
os.environ["JAX_NUM_CPU_DEVICES"] = "2"
os.environ["HOST_CALLBACK_INLINE"] = "1"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=2, process_id=process_id,
                           initialization_timeout=60)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import host_callback as hcb  # noqa: E402

taps, calls = [], []


def tap(x, transforms, *, device):
  taps.append([device.id, np.asarray(x).tolist()])


def host(x, *, device):
  calls.append([device.id, np.asarray(x).tolist()])
  return x + 100


def body(x):
  x = hcb.id_tap(tap, x, tap_with_device=True)
  return hcb.call(host, x, result_shape=x, call_with_device=True)


mesh = Mesh(np.array(jax.devices()), ("d",))
xs = np.arange(8, dtype=np.float32).reshape(4, 2)
x = jax.make_array_from_callback(xs.shape, NamedSharding(mesh, P("d")),
                                 lambda index: xs[index])
out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")))(x)
hcb.barrier_wait()
# jit over operands sharded across both processes: JAX's Python callback
# runs the function on the device_index-th device, in its process.
sharded_taps, sharded_calls = [], []


def sharded_tap(x, transforms, *, device):
  sharded_taps.append([device.id, np.asarray(x).tolist()])


def sharded_host(x, *, device):
  sharded_calls.append(device.id)
  return x * 2


whole = jax.jit(lambda v: hcb.call(
    sharded_host, hcb.id_tap(sharded_tap, v, tap_with_device=True,
                             device_index=2),
    result_shape=v, call_with_device=True, device_index=2) + 1)(x)
hcb.barrier_wait()
# A call that fails under jit over operands sharded across both
# processes: its runner's process (device 3's) raises the exception, the
# other a message that says where it was raised; the same call works next.
failures = []


def fails_once(x, *, device):
  failures.append(device.id)
  if len(failures) == 1:
    raise ValueError("the first call fails")
  return x - 1


failing = jax.jit(lambda v: hcb.call(fails_once, v, result_shape=v,
                                     call_with_device=True, device_index=3))
raised = []
for _ in range(2):
  try:
    done = failing(x)
    raised.append(sorted([s.device.id, np.asarray(s.data).tolist()]
                         for s in done.addressable_shards))
  except Exception as e:  # noqa: BLE001 (what each process raised)
    raised.append(str(e))
try:
  hcb.barrier_wait()
except hcb.CallbackException as e:
  raised.append(f"barrier: {e}")
# Inline, device_index counts this process's devices: 3 of the 4 global
# ones is another process's, a clear error.
inline = []
hcb.call(lambda x, device: inline.append(device.id), 0,
         call_with_device=True, device_index=1)
try:
  hcb.call(lambda x, device: inline.append(device.id), 0,
           call_with_device=True, device_index=3)
except ValueError as e:
  inline.append(str(e))
print(json.dumps({
    "inline": inline,
    "local": [d.id for d in jax.local_devices()],
    "taps": sorted(taps), "calls": sorted(calls),
    "out": sorted([s.device.id, np.asarray(s.data).tolist()]
                  for s in out.addressable_shards),
    "runner": jax.devices()[2].id,
    "failing": {"runner": jax.devices()[3].id, "ran": failures,
                "raised": raised},
    "sharded": {"taps": sharded_taps, "calls": sharded_calls,
                "out": sorted([s.device.id, np.asarray(s.data).tolist()]
                              for s in whole.addressable_shards)}}),
      flush=True)
jax.distributed.shutdown()
