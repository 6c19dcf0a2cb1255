"""Probe: an eager debug callback on the GPU runs after the callbacks of
the computations dispatched to that GPU before it, as on the CPU (program
order), though the GPU is still computing them when it is called.  Its
argument is a ready array (put on the GPU, not computed there), so that
nothing but that rule orders the two."""

from probe import DRY_RUN, device, done

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback import debug  # noqa: E402

N, STEPS = (256, 4) if DRY_RUN else (4096, 100)
log = []


@jax.jit
def program(x):
  y = lax.fori_loop(0, STEPS, lambda i, c: (c @ x) / N, x)
  debug.callback(lambda v: log.append("compiled"), y[0, 0])
  return y


dev = device()
x = jax.device_put(jnp.ones((N, N), jnp.float32), dev)
program(x).block_until_ready()
hcb.barrier_wait()
log.clear()
with jax.default_device(dev):
  out = program(x)  # still computing ...
  debug.callback(lambda v: log.append("eager"), np.float32(1))  # ... now
out.block_until_ready()
hcb.barrier_wait()
done(log == ["compiled", "eager"], f"callbacks ran in the order {log}")
