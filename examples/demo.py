"""host_callback demo: taps inside jit + scan + cond, arriving asynchronously.

A simulated training loop taps its loss every step and, through a `cond`,
its parameters every fourth step.  The taps are copied into per-device
queues by the C runtime and delivered to Python on a consumer thread while
the device computation goes on: the host logger takes 10 ms a tap, so the
"device finished" line, printed as soon as the computation's results are
on the host, comes before most taps have been seen (the times in brackets
say when each line was printed).  `barrier_wait` then waits for the rest.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import host_callback as hcb

T0 = time.perf_counter()


def stamp() -> str:
  return f"[{1e3 * (time.perf_counter() - T0):7.1f} ms]"


def native_thread_name() -> str:
  """The OS name of this thread: the runtime names its consumers hcb-cpu-N."""
  try:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
      return f.read().strip()
  except OSError:
    return threading.current_thread().name


def log_loss(arg, transforms):
  step, loss = arg
  time.sleep(0.01)  # a slow host-side logger: the device does not wait for it
  print(f"{stamp()} tap  step {int(step):2d}  loss {float(loss):8.4f}"
        f"  (thread {native_thread_name()})", flush=True)


def log_params(arg, transforms, *, device):
  params = " ".join(f"{v:.3f}" for v in arg["w"])
  print(f"{stamp()} tap  step {int(arg['step']):2d}  params [{params}] "
        f"from {device}", flush=True)


@jax.jit
def train(w, xs):
  def step(w, inp):
    i, x = inp
    loss = jnp.sum((w * x - 1.0) ** 2)
    grad = 2 * x * (w * x - 1.0)
    w = w - 0.1 * grad
    hcb.id_tap(log_loss, (i, loss))
    lax.cond(i % 4 == 0,
             lambda w: hcb.id_tap(log_params, {"step": i, "w": w},
                                  tap_with_device=True)["w"],
             lambda w: w, w)
    return w, loss
  return lax.scan(step, w, (jnp.arange(xs.shape[0]), xs))


def main() -> None:
  xs = jnp.linspace(0.5, 1.5, 16 * 3).reshape(16, 3)
  w, losses = train(jnp.zeros(3), xs)
  # To the host as numpy: this waits for the device, and compiles nothing
  # (losses[-1] on the jax.Array would compile a slice, while the taps
  # arrive).
  losses = np.asarray(losses)
  print(f"{stamp()} device finished 16 steps; final loss "
        f"{losses[-1]:.4f}; taps still arriving...", flush=True)
  hcb.barrier_wait()
  print(f"{stamp()} barrier_wait returned: every tap delivered", flush=True)

  # A synchronous call: the device waits for numpy's eigenvalues (the
  # result is checked against result_shape before it reaches the device).
  spectrum = jax.jit(lambda m: hcb.call(
      lambda a: np.sort(np.linalg.eigvals(a).real), m,
      result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype)))
  m = jnp.array([[2., 1.], [1., 2.]])
  print(f"{stamp()} call: eigenvalues of {m.tolist()} from the host: "
        f"{spectrum(m).tolist()}", flush=True)
  # id_print: the example from the old jax.experimental.host_callback
  # documentation, under grad; the text is numpy's, formatted in C on the
  # consumer thread.
  def power3(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2")
    return y * x

  jax.grad(power3)(3.)
  jax.jit(lambda v: hcb.id_print(v, what="a summarised array"))(
      jnp.linspace(0., 1., 2000))
  hcb.barrier_wait()
  s = hcb.stats()
  print(f"runtime stats: {s['records_out']} taps, {s['bytes_out']} bytes, "
        f"{s['errors']} errors, queue high-water {s['high_water_bytes']} B")


if __name__ == "__main__":
  main()
