"""Measurement 6: the per-step cost of a progress bar in a ``lax.scan``,
``host_callback.progress.scan_tqdm`` against jax-tqdm 0.4.0's at the same
``print_rate``, and with an update every step.  What it measures and why:
bench/README.md, "What each number means"."""

from __future__ import annotations

import dataclasses
import io
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from hcb_bench.harness import Config
from hcb_bench.harness import Sample
from hcb_bench.harness import finish_callbacks

jax_tqdm: Any
try:
  import jax_tqdm
except ImportError:  # the section says so; its targets are not measured
  jax_tqdm = None


@dataclasses.dataclass(frozen=True)
class ProgressRow:
  """One ``print_rate``: seconds per step over a plain scan, both bars."""

  label: str
  steps: int
  print_rate: int | None  # None: each library's default
  ours: Sample
  theirs: Sample
  complete: int   # runs whose bars (ours and jax-tqdm's) ended complete
  runs: int

  @property
  def updates(self) -> str:
    """Updates per run, ours and jax-tqdm's when they differ."""
    if self.print_rate is not None:
      return f"{self.steps // self.print_rate}"
    theirs = 20 if self.steps > 20 else self.steps
    return f"{default_updates(self.steps)} (jax-tqdm: {theirs})"


def default_updates(steps: int) -> int:
  """How many times our bar is updated over ``steps`` by default."""
  from host_callback import progress
  return steps // max(1, steps // progress._DEFAULT_UPDATES)


@dataclasses.dataclass(frozen=True)
class ProgressResult:
  """Every row, keyed: ``defaults`` (each library's default rate),
  ``default`` (jax-tqdm's default rate, 20 updates, for both),
  ``updates`` (10,000 updates, or every step of a shorter scan) and
  ``every`` (an update every step)."""

  rows: dict[str, ProgressRow]


COMPLETE = re.compile(r"\| (\d+)/(\d+) ")


def complete(sink: io.StringIO, steps: int) -> bool:
  """Whether the last state a bar drew is ``steps/steps``."""
  found = COMPLETE.findall(sink.getvalue())
  return bool(found) and found[-1] == (str(steps), str(steps))


def bar_scan(module: Any, steps: int, print_rate: int | None,
             sink: io.StringIO) -> Callable[[jax.Array], jax.Array]:
  """A jitted scan of ``steps`` steps, ``carry + 1``, with ``module``'s
  ``scan_tqdm`` bar drawing into ``sink``."""

  @module.scan_tqdm(steps, print_rate=print_rate, file=sink)
  def body(carry: jax.Array, _: jax.Array) -> tuple[jax.Array, None]:
    return carry + 1, None

  return jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(steps))[0])


def plain_scan(steps: int) -> Callable[[jax.Array], jax.Array]:
  return jax.jit(lambda x: jax.lax.scan(
      lambda c, _: (c + 1, None), x, jnp.arange(steps))[0])


def timed(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> float:
  """Seconds until the result is ready and every callback has run (the
  bar is then complete and closed)."""
  start = time.perf_counter()
  fn(x).block_until_ready()
  finish_callbacks()
  return time.perf_counter() - start


def measure_row(cfg: Config, label: str, steps: int, print_rate: int | None
                ) -> ProgressRow:
  """Seconds per step of each bar over the plain scan, ``(t(steps) -
  t(short)) / (steps - short)`` where the short scan is ``print_rate``
  steps long (one update; jax-tqdm refuses a rate above the length; 20
  steps for the defaults), so that creating and closing the bar and the
  barrier are not counted as steps."""
  from host_callback import progress
  assert jax_tqdm is not None
  short = 20 if print_rate is None else max(print_rate, 2)
  x = jnp.zeros((), jnp.float32)
  sinks: dict[str, io.StringIO] = {}
  loops: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
  for key, module in (("ours", progress), ("theirs", jax_tqdm)):
    sinks[key] = io.StringIO()
    loops[key] = (bar_scan(module, steps, print_rate, sinks[key]),
                  bar_scan(module, short, print_rate, io.StringIO()))
  loops["plain"] = (plain_scan(steps), plain_scan(short))
  for long_loop, short_loop in loops.values():  # compile and warm up
    timed(long_loop, x)
    timed(short_loop, x)
  per_step: dict[str, list[float]] = {k: [] for k in loops}
  done = 0
  for _ in range(cfg.reps):
    for key, (long_loop, short_loop) in loops.items():
      if key in sinks:
        sinks[key].seek(0)
        sinks[key].truncate()
      t_short = timed(short_loop, x)
      per_step[key].append((timed(long_loop, x) - t_short) / (steps - short))
    done += all(complete(s, steps) for s in sinks.values())
  plain = Sample(tuple(per_step["plain"]))
  return ProgressRow(label, steps, print_rate,
                     Sample(tuple(per_step["ours"])).minus(plain),
                     Sample(tuple(per_step["theirs"])).minus(plain),
                     done, cfg.reps)


def measure_progress(cfg: Config) -> ProgressResult | None:
  """Item 6: per-step cost of both bars with their defaults, at
  jax-tqdm's default rate (20 updates), at 10,000 updates and with an
  update every step (on a shorter scan: jax-tqdm's costs about 0.1 ms per
  update).  None without jax-tqdm."""
  if jax_tqdm is None:
    return None
  n = cfg.progress_steps
  return ProgressResult({
      "defaults": measure_row(cfg, "each one's default", n, None),
      "default": measure_row(cfg, "jax-tqdm's default (20 updates)", n,
                             max(1, n // 20)),
      "updates": measure_row(cfg, "10,000 updates", n, max(1, n // 10_000)),
      "every": measure_row(cfg, "an update every step",
                           cfg.progress_every_steps, 1),
  })
