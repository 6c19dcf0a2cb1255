"""Measurement 10: one callback per jitted call, where users live.

The common program is a jitted step with one callback, called again and
again, on a machine whose cores are busy (XLA's own threads keep them busy
in a real training step).  For each drop-in and its JAX counterpart, and a
plain jitted function without a callback (the baseline): seconds per call
until the result is ready -- by then the callback has run, for both, since
both run it inside the computation.  Measured on an idle machine and beside
a busy process, which this measurement starts and stops itself (one
process that keeps one core busy: on two cores one stays free), in one run,
the blocks of calls of all variants interleaved.  What each adds is its
time less the baseline's, repetition by repetition; the target compares
what ours adds with what JAX's adds (bench/README.md, "What each number
means")."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax.experimental import io_callback as jax_io_callback

import host_callback as hcb
from host_callback import debug as hcb_debug

from hcb_bench.cases import NullOut
from hcb_bench.harness import Config
from hcb_bench.harness import Counter
from hcb_bench.harness import Sample

# The drop-ins, as the targets name them: (key, ours, JAX's).
KINDS = (
    ("pure_callback", "`pure_callback`", "`jax.pure_callback`"),
    ("io_callback", "`io_callback`", "`jax.experimental.io_callback`"),
    ("debug_callback", "`debug.callback`", "`jax.debug.callback`"),
    ("debug_print", "`debug.print`", "`jax.debug.print`"),
)
CONDITIONS = ("idle", "busy")
# Calls of one variant back to back: the blocks of all variants alternate.
BLOCK = 100


@dataclasses.dataclass(frozen=True)
class PerCallResult:
  """Seconds per call, by condition and variant ("plain", then
  ``f"{key}_ours"`` and ``f"{key}_jax"`` for each of :data:`KINDS`)."""

  calls: int
  seconds: dict[str, dict[str, Sample]]

  def added(self, condition: str, variant: str) -> Sample:
    """What ``variant`` adds to a call over the plain function."""
    row = self.seconds[condition]
    return row[variant].minus(row["plain"])

  def ratio(self, condition: str, key: str) -> float | None:
    """What JAX's adds over what ours adds (the median of the ratios of
    the repetitions)."""
    return self.added(condition, f"{key}_jax").ratio(
        self.added(condition, f"{key}_ours"))


def variants(counter: Counter, spec: jax.ShapeDtypeStruct
             ) -> dict[str, Callable[[jax.Array], Any]]:
  """The jitted functions: ``x * 2 + 1`` on ``x`` of ``spec``, with one
  callback of ``x`` (a print of its first element) or none."""

  def with_(call: Callable[[jax.Array], Any]) -> Callable[[jax.Array], Any]:
    def f(x: jax.Array) -> Any:
      out = call(x)
      return (x if out is None else out) * 2 + 1
    return jax.jit(f)

  return {
      "plain": jax.jit(lambda x: x * 2 + 1),
      "pure_callback_ours": with_(
          lambda x: hcb.pure_callback(counter.identity, spec, x)),
      "pure_callback_jax": with_(
          lambda x: jax.pure_callback(counter.identity, spec, x)),
      "io_callback_ours": with_(
          lambda x: hcb.io_callback(counter.identity, spec, x)),
      "io_callback_jax": with_(
          lambda x: jax_io_callback(counter.identity, spec, x)),
      "debug_callback_ours": with_(
          lambda x: hcb_debug.callback(counter.effect, x)),
      "debug_callback_jax": with_(
          lambda x: jax.debug.callback(counter.effect, x)),
      "debug_print_ours": with_(lambda x: hcb_debug.print("h x={}", x[0])),
      "debug_print_jax": with_(lambda x: jax.debug.print("j x={}", x[0])),
  }


@contextlib.contextmanager
def _busy() -> Iterator[None]:
  """A child process that keeps one core busy while the block runs."""
  proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
  try:
    time.sleep(0.2)  # running by now
    yield
  finally:
    proc.kill()
    proc.wait()


def time_variants(cfg: Config, fns: dict[str, Callable[[Any], Any]],
                  x: Any, calls: int) -> dict[str, dict[str, Sample]]:
  """Seconds per call of each of ``fns`` on ``x``, by condition: ``calls``
  calls per repetition and condition, in interleaved blocks, each block
  timed until its last result is ready."""
  calls = max(1, calls)
  block = min(BLOCK, calls)
  blocks = max(1, calls // block)
  seconds: dict[str, dict[str, list[float]]] = {
      c: {name: [] for name in fns} for c in CONDITIONS}
  with contextlib.redirect_stdout(NullOut()):
    for fn in fns.values():  # compiled, and warm
      for _ in range(3):
        fn(x).block_until_ready()
    for _ in range(cfg.reps):
      for condition in CONDITIONS:
        totals = {name: 0.0 for name in fns}
        with _busy() if condition == "busy" else contextlib.nullcontext():
          for _ in range(blocks):
            for name, fn in fns.items():
              start = time.perf_counter()
              for _ in range(block):
                fn(x).block_until_ready()
              totals[name] += time.perf_counter() - start
        for name in fns:
          seconds[condition][name].append(totals[name] / (block * blocks))
  return {c: {name: Sample(tuple(v)) for name, v in row.items()}
          for c, row in seconds.items()}


def measure_per_call(cfg: Config) -> PerCallResult:
  """Item 10: ``per_call_calls`` calls of each variant on f32[16]."""
  x = jnp.arange(16, dtype=jnp.float32)
  calls = max(1, cfg.per_call_calls)
  block = min(BLOCK, calls)
  return PerCallResult(
      block * max(1, calls // block),
      time_variants(cfg, variants(Counter(), jax.ShapeDtypeStruct(
          x.shape, x.dtype)), x, calls))
