"""What host_callback's DCE-rule wrappers cost programs without callbacks.

Times trace and lower of a program full of containers, without callbacks,
in fresh processes with and without the wrappers installed, alternating
(why and how: bench/README.md).

    .venv/bin/python bench/dce_wrappers.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp
    from jax import lax
    import host_callback as hcb

    if sys.argv[1] == "wrapped":
      # Trace one program with a tap: the wrappers are installed from here on.
      jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x)).trace(1.0)
      from jax._src.interpreters import partial_eval as pe
      assert any(hasattr(r, "__wrapped__") for r in pe.dce_rules.values())

    def body(c, x):
      # Containers whose outputs are partly or wholly unused: DCE visits them.
      lax.cond(x > 0, lambda: x * 2, lambda: x)
      lax.while_loop(lambda v: v < 3, lambda v: v + 1, x)
      lax.scan(lambda a, b: (a + b, a * b), c, jnp.arange(3.0))
      return c + jnp.sin(x), jnp.cos(x)

    def program(x, k):
      for _ in range(20):
        x, _ = lax.scan(body, x + k, jnp.arange(8.0))
      return x

    times = []
    for k in range(30):
      t0 = time.perf_counter()
      jax.jit(program, static_argnums=1).trace(1.0, k).lower()
      times.append(time.perf_counter() - t0)
    times.sort()
    print(sum(times[:10]) / 10)
""")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=4)
  args = parser.parse_args()
  results: dict[str, list[float]] = {"plain": [], "wrapped": []}
  for _ in range(args.rounds):
    for mode in results:
      out = subprocess.run([sys.executable, "-c", CHILD, mode], check=True,
                           capture_output=True, text=True).stdout
      results[mode].append(float(out.split()[-1]))
  plain = statistics.median(results["plain"])
  wrapped = statistics.median(results["wrapped"])
  print(f"trace+lower of a program of 20 scans, each with a cond, a "
        f"while_loop and an inner scan (no callbacks), median of "
        f"{args.rounds} processes x best 10 of 30:")
  print(f"  JAX's rules as they are: {plain * 1e3:8.2f} ms")
  print(f"  with our DCE wrappers:   {wrapped * 1e3:8.2f} ms "
        f"({wrapped / plain:.3f}x)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
