"""Probe: under jit over operands sharded across GPUs, a callback is one
call the devices share (src/runtime/shared.c over the CUDA platform): the
``device_index``-th GPU stages the whole operands to the host and runs the
function once; every GPU gets the results, copied to its own memory in its
stream's order; a ``debug.callback`` that raises fails the call on every
GPU and the next call works; a queued ``id_tap`` is delivered once.  Needs
two GPUs (skips with one).
"""

from probe import DRY_RUN, done, skip

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback import debug  # noqa: E402

devices = jax.devices("cpu")[:2] if DRY_RUN else jax.devices("gpu")
if len(devices) < 2:
  skip(f"jit over sharded operands needs 2 GPUs; this machine has "
       f"{len(devices)}")
devices = devices[:2]
mesh = Mesh(np.array(devices), ("d",))
xs = np.arange(16, dtype=np.float32).reshape(4, 4)
x = jax.device_put(xs, NamedSharding(mesh, P("d")))
calls, taps = [], []


def host(a, *, device):
  calls.append((device, a.shape))
  return a * 10


def step(c, _):
  c = hcb.call(host, c, result_shape=c, call_with_device=True,
               device_index=1) * 0.1
  hcb.id_tap(lambda a, t: taps.append(float(a)), c.sum(), device_index=1)
  return c, None


out = jax.jit(lambda v: jax.lax.scan(step, v, None, length=20)[0])(x)
hcb.barrier_wait()
if not np.allclose(np.asarray(out), xs):
  done(False, f"the scan's result is wrong: {np.asarray(out)}")
if calls != [(devices[1], (4, 4))] * 20:
  done(False, f"the function ran {len(calls)} times, on "
       f"{sorted({str(d) for d, _ in calls})}: expected 20 on {devices[1]}")
if len(taps) != 20:
  done(False, f"{len(taps)} taps delivered of 20")


def check(v):
  if v.sum() > 100:
    raise ValueError("too big")


f = jax.jit(lambda v: (debug.callback(check, v), v + 1)[1])
try:
  f(x).block_until_ready()
  done(False, "a debug.callback that raised did not fail its call")
except Exception as e:  # pylint: disable=broad-except
  if "too big" not in str(e):
    done(False, f"the call failed without the callback's error: {e}")
small = jax.device_put(np.zeros((4, 4), np.float32),
                       NamedSharding(mesh, P("d")))
if not np.array_equal(np.asarray(f(small)), np.ones((4, 4), np.float32)):
  done(False, "the call after the failure came back wrong")
done(True, "20 shared calls ran once each on the chosen GPU, every GPU "
     "got the results; a raising debug.callback failed its call, the next "
     "worked")
