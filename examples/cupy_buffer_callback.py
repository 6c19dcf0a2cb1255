"""buffer_callback on a GPU with CuPy: a result written in place on XLA's
stream.

The callback gets XLA's own device buffers (no copy in either direction)
and XLA's CUDA stream as ``ctx.stream``.  It runs while XLA enqueues the
computation, so it enqueues its kernels on that stream too: they run after
the kernels that compute its inputs and before the ones that read its
results.  ``cupy.from_dlpack`` views a Buffer through DLPack: inside
``ExternalStream(ctx.stream)`` CuPy names XLA's stream as its own, so
nothing is synchronised.  (``cupy.asarray`` views it through
``__cuda_array_interface__``, which names XLA's stream too, and CuPy then
waits for that stream on the host before it goes on: correct, and slower.)

Run on a machine with an NVIDIA GPU, JAX's CUDA plugin and CuPy:

    python examples/cupy_buffer_callback.py
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import host_callback as hcb


def main() -> int:
  if jax.default_backend() != "gpu":
    print("examples/cupy_buffer_callback.py needs a GPU: JAX's default "
          f"backend here is {jax.default_backend()!r} (install JAX's CUDA "
          "plugin on a machine with an NVIDIA GPU)", file=sys.stderr)
    return 1
  try:
    import cupy  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("examples/cupy_buffer_callback.py needs CuPy "
          "(pip install cupy-cuda13x)", file=sys.stderr)
    return 1

  def saxpy(ctx: hcb.ExecutionContext, out: hcb.Buffer, a: hcb.Buffer,
            x: hcb.Buffer, y: hcb.Buffer) -> None:
    """out = a * x + y, by CuPy, on XLA's stream."""
    with cupy.cuda.ExternalStream(ctx.stream):
      # Views of XLA's buffers, no copy, on XLA's stream.
      a_, x_, y_ = (cupy.from_dlpack(b) for b in (a, x, y))
      result = cupy.from_dlpack(out)
      cupy.multiply(a_, x_, out=result)
      result += y_

  n = 1 << 20
  call_saxpy = hcb.buffer_callback(
      saxpy, jax.ShapeDtypeStruct((n,), jnp.float32))

  @jax.jit
  def program(a: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    # XLA computes 2 * x, CuPy writes a * (2 * x) + y into XLA's buffer, XLA
    # takes its square root: all on one stream, with no host
    # synchronisation in between.
    return jnp.sqrt(call_saxpy(a, 2 * x, y))

  x = jnp.arange(n, dtype=jnp.float32)
  z = program(jnp.float32(2.0), x, jnp.ones(n, jnp.float32))
  np.testing.assert_allclose(np.asarray(z), np.sqrt(4.0 * np.arange(n) + 1),
                             rtol=1e-6)
  print(f"on {jax.devices()[0].device_kind}: sqrt(2 * (2 * x) + 1) with "
        "the saxpy done by CuPy in XLA's buffer, on XLA's stream: z[:4] = "
        f"{np.asarray(z[:4])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
