"""Measurement 7: the per-step cost of each drop-in (``host_callback``'s
``pure_callback``, ``io_callback``, ``debug.callback``, ``debug.print``,
``debug.log``) against its JAX counterpart in a ``lax.scan``.  What it
measures and why: bench/README.md, "What each number means"."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
from jax.experimental import io_callback as jax_io_callback

import host_callback as hcb
from host_callback import debug as hcb_debug

from hcb_bench.cases import StepResult
from hcb_bench.cases import StepVariant
from hcb_bench.cases import measure_variants
from hcb_bench.harness import Config
from hcb_bench.harness import Counter
from hcb_bench.harness import Sample

# The logger of jax.debug.log, which debug.log logs to as well.
DEBUG_LOGGER = "jax._src.debugging"


@dataclasses.dataclass(frozen=True)
class DropinPair:
  """One drop-in and its JAX counterpart: seconds per step of each."""

  key: str      # names the target in targets.py: f"dropin_{key}"
  ours: str     # the drop-in, as RESULTS.md names it
  theirs: str   # JAX's
  ours_result: StepResult
  theirs_result: StepResult

  def excess(self, baseline: StepResult, e2e: bool = True
             ) -> tuple[Sample, Sample]:
    """Seconds per step over the baseline, ours then JAX's, end to end
    (until every callback has run) or device-side."""
    if e2e:
      return (self.ours_result.end_to_end.minus(baseline.end_to_end),
              self.theirs_result.end_to_end.minus(baseline.end_to_end))
    return (self.ours_result.device.minus(baseline.device),
            self.theirs_result.device.minus(baseline.device))

  def speedup(self, baseline: StepResult) -> float | None:
    """JAX's per-step cost over ours, end to end: the median of the
    per-repetition ratios."""
    ours, theirs = self.excess(baseline)
    return theirs.ratio(ours)


@dataclasses.dataclass(frozen=True)
class DropinResult:
  """The baseline (an empty step) and every pair, in the order of
  :func:`pairs`; ``has_log`` says whether this JAX has ``jax.debug.log``."""

  steps: int
  baseline: StepResult
  pairs: list[DropinPair]
  has_log: bool


class LineSink:
  """A null ``sys.stdout``: keeps no text, counts the lines written by
  their first character (the drop-in's format starts with ``h``, JAX's
  with ``j``).  Both write one line per ``write`` call."""

  def __init__(self) -> None:
    self.lines: collections.Counter[str] = collections.Counter()

  def write(self, text: str) -> int:
    self.lines[text[:1]] += text.count("\n")
    return len(text)

  def flush(self) -> None:
    pass


class RecordSink(logging.Handler):
  """A null handler of the debug logger: formats each record's message,
  as a handler that writes it would, and counts the records by its first
  character."""

  def __init__(self) -> None:
    super().__init__(logging.DEBUG)
    self.records: collections.Counter[str] = collections.Counter()

  def emit(self, record: logging.LogRecord) -> None:
    self.records[record.getMessage()[:1]] += 1


@contextlib.contextmanager
def sinks() -> Iterator[tuple[LineSink, RecordSink]]:
  """``sys.stdout`` redirected to a :class:`LineSink` and the debug logger's
  records sent only to a :class:`RecordSink`, for both libraries alike."""
  lines, records = LineSink(), RecordSink()
  logger = logging.getLogger(DEBUG_LOGGER)
  propagate, level = logger.propagate, logger.level
  logger.addHandler(records)
  logger.propagate = False
  logger.setLevel(logging.INFO)
  try:
    with contextlib.redirect_stdout(lines):
      yield lines, records
  finally:
    logger.removeHandler(records)
    logger.propagate, logger.level = propagate, level


def variants(lines: LineSink, records: RecordSink
             ) -> tuple[list[StepVariant], list[tuple[str, str, str]]]:
  """Every variant, baseline first, then each drop-in followed by its JAX
  counterpart; and the pairs as ``(key, ours's key, JAX's key)``.  Each
  step calls back with the carry, a float32 scalar; the functions count
  their calls, the prints and logs are counted by the sinks."""
  names = ("pure", "io", "io_ordered", "debug")
  c = {f"{side}_{n}": Counter() for n in names for side in ("ours", "jax")}
  spec = jax.ShapeDtypeStruct((), jnp.float32)

  def effect(fn: Callable[[jax.Array], None]
             ) -> Callable[[jax.Array], jax.Array]:
    """A step body that calls ``fn`` on the carry and returns the carry."""

    def body(x: jax.Array) -> jax.Array:
      fn(x)
      return x

    return body

  out = [StepVariant("baseline", "nothing (baseline)", lambda x: x, None)]

  def pair(key: str, ours: str, ours_body: Callable[[jax.Array], jax.Array],
           ours_n: Callable[[], int], theirs: str,
           theirs_body: Callable[[jax.Array], jax.Array],
           theirs_n: Callable[[], int]) -> tuple[str, str, str]:
    out.append(StepVariant(f"ours_{key}", ours, ours_body, ours_n))
    out.append(StepVariant(f"jax_{key}", theirs, theirs_body, theirs_n))
    return key, f"ours_{key}", f"jax_{key}"

  pairs = [
      pair("pure_callback", "`host_callback.pure_callback`",
           lambda x: hcb.pure_callback(c["ours_pure"].identity, spec, x),
           lambda: c["ours_pure"].n,
           "`jax.pure_callback`",
           lambda x: jax.pure_callback(c["jax_pure"].identity, spec, x),
           lambda: c["jax_pure"].n),
      pair("io_callback", "`host_callback.io_callback(ordered=False)`",
           effect(lambda x: hcb.io_callback(c["ours_io"].effect, None, x)),
           lambda: c["ours_io"].n,
           "`jax.experimental.io_callback(ordered=False)`",
           effect(lambda x: jax_io_callback(c["jax_io"].effect, None, x)),
           lambda: c["jax_io"].n),
      pair("io_callback_ordered",
           "`host_callback.io_callback(ordered=True)`",
           effect(lambda x: hcb.io_callback(c["ours_io_ordered"].effect, None,
                                            x, ordered=True)),
           lambda: c["ours_io_ordered"].n,
           "`jax.experimental.io_callback(ordered=True)`",
           effect(lambda x: jax_io_callback(c["jax_io_ordered"].effect, None,
                                            x, ordered=True)),
           lambda: c["jax_io_ordered"].n),
      pair("debug_callback", "`host_callback.debug.callback`",
           effect(lambda x: hcb_debug.callback(c["ours_debug"].effect, x)),
           lambda: c["ours_debug"].n,
           "`jax.debug.callback`",
           effect(lambda x: jax.debug.callback(c["jax_debug"].effect, x)),
           lambda: c["jax_debug"].n),
      pair("debug_print", "`host_callback.debug.print`",
           effect(lambda x: hcb_debug.print("h x={x}", x=x)),
           lambda: lines.lines["h"],
           "`jax.debug.print`",
           effect(lambda x: jax.debug.print("j x={x}", x=x)),
           lambda: lines.lines["j"]),
  ]
  if hasattr(jax.debug, "log"):
    pairs.append(pair(
        "debug_log", "`host_callback.debug.log`",
        effect(lambda x: hcb_debug.log("h x={x}", x=x)),
        lambda: records.records["h"],
        "`jax.debug.log`",
        effect(lambda x: jax.debug.log("j x={x}", x=x)),
        lambda: records.records["j"]))
  return out, pairs


def measure_dropins(cfg: Config) -> DropinResult:
  """Item 7: seconds per step of every drop-in and its JAX counterpart in
  a scan of ``cfg.steps`` steps, measured as item 1 (interleaved
  repetitions, ``(t(N) - t(1)) / (N - 1)``), prints into a null
  ``sys.stdout`` and log records into a null handler for both."""
  with sinks() as (lines, records):
    steps, pairs = variants(lines, records)
    results = measure_variants(cfg, steps)
  return DropinResult(
      cfg.steps, results["baseline"],
      [DropinPair(key, results[ours].label, results[theirs].label,
                  results[ours], results[theirs])
       for key, ours, theirs in pairs],
      hasattr(jax.debug, "log"))
