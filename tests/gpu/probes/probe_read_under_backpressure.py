"""Probe: a tap function that reads GPU memory (a transfer to and from the
device, ``block_until_ready``, and with CuPy a synchronisation of the whole
device) while its device waits for room in a full queue finishes: the
waiting is XLA's thread's, before it enqueues, and nothing on the GPU's
streams (no CUDA host function) waits for the tap function."""

import os
import time

os.environ["HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"] = "16000000"  # the least

from probe import DRY_RUN, device, done  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import host_callback as hcb  # noqa: E402

try:
  import cupy  # noqa: E402
except ImportError:
  cupy = None

STEPS = 40  # 4 MiB taps: 160 MiB through a 16 MB queue
dev = device()
host = np.arange(1 << 16, dtype=np.float32)
reads = []


def tap(x, transforms):
  time.sleep(0.02)  # slower than the device: its queue fills
  z = jax.device_put(host, dev)  # to the GPU and back, in the tap function
  z.block_until_ready()
  if cupy is not None and not DRY_RUN:
    cupy.cuda.runtime.deviceSynchronize()  # every stream of the device
  reads.append(float(np.asarray(z)[1]))


step = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
x = jax.device_put(jnp.zeros(1 << 20, jnp.float32), dev)
for _ in range(STEPS):
  x = step(x)
x.block_until_ready()
hcb.barrier_wait()
waits = hcb.stats()["producer_waits"]
done(reads == [1.0] * STEPS and waits > 0,
     f"{len(reads)} of {STEPS} tap functions read the GPU and finished; the "
     f"device waited for room {waits} time(s)"
     + ("" if cupy is not None or DRY_RUN else " (no CuPy: no device sync)"))
