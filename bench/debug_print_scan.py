"""µs per host_callback.debug.print in a 10,000-step lax.scan, formatted in
C (issue 19) against the same prints forced through the Python path, in
the same process; output to os.devnull.  Usage:
  python bench/debug_print_scan.py ["step {i} x={x}"]  (fields: i, x, s)"""
import os
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax
import host_callback as hcb
from host_callback import debug

N = 10_000

FMT = sys.argv[1] if len(sys.argv) > 1 else "step {i} x={x}"
def make(tag):
  def body(c, i):
    kw = {k: v for k, v in (("i", i), ("x", c), ("s", c[0])) if "{" + k + "}" in FMT}
    debug.print(tag + " " + FMT, **kw)
    return c + 1.0, None
  return jax.jit(lambda c: lax.scan(body, c, jnp.arange(N))[0])

def measure(tag, reps=5):
  f = make(tag)
  x = jnp.zeros(3, jnp.float32)
  old = sys.stdout
  sys.stdout = open(os.devnull, "w")
  try:
    f(x).block_until_ready(); jax.effects_barrier(); hcb.barrier_wait()
    best = float("inf")
    for _ in range(reps):
      t = time.perf_counter()
      f(x).block_until_ready(); jax.effects_barrier(); hcb.barrier_wait()
      best = min(best, time.perf_counter() - t)
  finally:
    sys.stdout.close(); sys.stdout = old
  return best / N * 1e6

def base(tag):
  f = jax.jit(lambda c: lax.scan(lambda c, i: (c + 1.0, None), c, jnp.arange(N))[0])
  x = jnp.zeros(3, jnp.float32); f(x).block_until_ready()
  t = time.perf_counter(); f(x).block_until_ready(); return (time.perf_counter()-t)/N*1e6

orig = debug._c_layout
for round_ in range(2):
  c = measure(f"c{round_}")
  print(f"paths so far {dict(debug._print_paths)}")
  debug._c_layout = lambda *a, **k: None  # force the Python path
  py = measure(f"py{round_}")
  debug._c_layout = orig
  print(f"round {round_}: C path {c:.2f} us/print, Python path {py:.2f} us/print, empty scan {base(0):.3f} us/step")
print(dict(debug._print_paths))
