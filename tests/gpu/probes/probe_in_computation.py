"""Probe: on the GPU, the drop-ins' callbacks run inside the computation,
as JAX's do (the tap with attribute ``deliver``: its copy waited for on
XLA's thread, its function run there, no CUDA host function waiting).  A
computation's 100 prints have all run when its result is ready; a callback
that runs a GPU computation with a print of its own finishes; a callback
that raises fails its call, naming the exception, and the next call works.
"""

import contextlib
import io

from probe import DRY_RUN, device, done

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from host_callback import debug  # noqa: E402

N = 256 if DRY_RUN else 2048
dev = device()
seen = []


@jax.jit
def prints(x):
  def body(c, i):
    debug.print("step {}", i)
    return c + i, None
  return jax.lax.scan(body, x, jnp.arange(100.0))[0]


@jax.jit
def inner(m):
  r = m @ m
  debug.print("inner {}", r[0, 0])
  return r[0, 0]


big = jax.device_put(jnp.ones((N, N), jnp.float32), dev)
# Compiled here, not in the callback: XLA compiling a matrix product for a
# GPU autotunes it on that GPU, which waits for the computation running the
# callback, so that compile never ends.  JAX's own callbacks hang the same
# way (seen on an H100 with JAX 0.11.2: jax.debug.callback too); a callback
# may compile for the CPU, or computations XLA does not autotune.
float(inner(big))  # its print goes to the log


def runs_jax(v):
  seen.append(float(inner(big)))


@jax.jit
def outer(x):
  debug.callback(runs_jax, x)
  return x + 1


def check(v):
  if np.isnan(v).any():
    raise ValueError("found a nan")


@jax.jit
def checked(x):
  debug.callback(check, x)
  return x * 2


with jax.default_device(dev):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    total = float(prints(jnp.float32(0)))
    lines = out.getvalue().splitlines()  # read with the result: no barrier
    result = float(outer(jnp.float32(1)))
    inner_lines = out.getvalue().splitlines()[len(lines):]
  error = ""
  try:
    checked(jnp.array([1.0, np.nan])).block_until_ready()
  except jax.errors.JaxRuntimeError as e:
    error = str(e)
  after = np.asarray(checked(jnp.array([1.0, 2.0]))).tolist()

ok = (total == sum(range(100)) and len(lines) == 100 and
      lines[-1] == "step 99.0" and result == 2.0 and seen == [float(N)] and
      inner_lines == [f"inner {float(N)}"] and
      "ValueError: found a nan" in error and after == [2.0, 4.0])
done(ok, f"{len(lines)} prints before the result, a callback's GPU "
     f"computation {seen} printing {inner_lines}, a raising callback "
     f"{'failed its call' if error else 'did not fail its call'}, the next "
     f"call {after}")
