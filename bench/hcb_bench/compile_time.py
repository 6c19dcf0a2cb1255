"""Measurement 8: how long ``jax.jit(f).lower(t).compile()`` takes when
``f`` taps ``t``, a list of scalar leaves, against JAX's
``jax.debug.callback`` of the same leaves.  What it measures and why:
bench/README.md, "What each number means"."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

import host_callback as hcb
from host_callback import debug as hcb_debug

from hcb_bench.harness import Config
from hcb_bench.harness import Sample


def _ignore(*args: Any) -> None:
  del args


# (key, as RESULTS.md names it, the function of the leaves).  Each of ours is
# followed by the JAX variant its ratio is taken against (the same
# outputs: none, or the leaves themselves).
VARIANTS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("id_tap", "`id_tap`, its result unused",
     lambda t: (hcb.id_tap(_ignore, t), None)[1]),
    ("debug_callback", "`debug.callback`",
     lambda t: hcb_debug.callback(_ignore, t)),
    ("jax_debug_callback", "`jax.debug.callback`",
     lambda t: jax.debug.callback(_ignore, t)),
    ("id_tap_identity", "`id_tap`, returning the leaves",
     lambda t: hcb.id_tap(_ignore, t)),
    ("jax_debug_callback_identity", "`jax.debug.callback`, returning the "
     "leaves", lambda t: (jax.debug.callback(_ignore, t), t)[1]),
)

# Ours -> the JAX variant it is compared with.
PAIRS = {"id_tap": "jax_debug_callback",
         "debug_callback": "jax_debug_callback",
         "id_tap_identity": "jax_debug_callback_identity"}


@dataclasses.dataclass(frozen=True)
class CompileResult:
  """Seconds to trace, lower and compile, per number of leaves and variant."""

  leaves: tuple[int, ...]
  seconds: dict[int, dict[str, Sample]]

  def ratio(self, ours: str, n: int) -> float | None:
    """Ours over JAX's counterpart at ``n`` leaves (paired repetitions)."""
    row = self.seconds[n]
    return row[ours].ratio(row[PAIRS[ours]])

  def worst(self, ours: str) -> tuple[float | None, int]:
    """The largest ratio of :meth:`ratio` over the numbers of leaves, and
    where."""
    ratios = [(self.ratio(ours, n), n) for n in self.leaves]
    known = [(r, n) for r, n in ratios if r is not None]
    if not known:
      return None, self.leaves[0]
    return max(known)


def compile_seconds(fn: Callable[[Any], Any], leaves: list[jax.Array]
                    ) -> float:
  """One trace, lowering and compilation of a fresh ``jax.jit`` of
  ``fn``."""
  jitted = jax.jit(lambda t: fn(t))
  start = time.perf_counter()
  jitted.lower(leaves).compile()
  return time.perf_counter() - start


def measure_compile_time(cfg: Config) -> CompileResult:
  """Every variant at every number of leaves, ``cfg.compile_reps`` times,
  the variants of one number of leaves interleaved."""
  seconds: dict[int, dict[str, list[float]]] = {}
  for n in cfg.compile_leaves:
    leaves = [jnp.float32(i) for i in range(n)]
    # Warm what a first compilation of its kind pays once (registrations).
    for _, _, fn in VARIANTS:
      compile_seconds(fn, leaves[:1])
    row: dict[str, list[float]] = {key: [] for key, _, _ in VARIANTS}
    for _ in range(cfg.compile_reps):
      for key, _, fn in VARIANTS:
        row[key].append(compile_seconds(fn, leaves))
    seconds[n] = row
  return CompileResult(
      tuple(cfg.compile_leaves),
      {n: {k: Sample(tuple(v)) for k, v in row.items()}
       for n, row in seconds.items()})
