"""What every measurement shares: how much to run (Config), a quantity
measured once per repetition (Sample), timing of one call, and the
callbacks, which only count their calls."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax

import host_callback as hcb

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB, MiB = 1 << 10, 1 << 20

# ---- configuration ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
  """How much of everything to run."""

  smoke: bool
  reps: int                  # repetitions of every measurement
  steps: int                 # scan length of the per-step benchmark
  min_rep_s: float           # a repetition of item 1 runs its scan this long
  payload_sizes: tuple[int, ...]  # bytes per tap in the sweep
  payload_bytes: int         # bytes tapped per repetition of one size
  max_taps: int              # taps per repetition of one size, at most
  dispatch_calls: int        # calls per repetition of the dispatch benchmark
  prints: int                # prints per repetition
  bp_queue_bytes: int        # the queue bound of the back-pressure run
  bp_taps: int               # taps per back-pressure repetition
  bp_tap_bytes: int          # bytes per back-pressure tap
  bp_sleep_s: float          # how long the slow tap function sleeps
  progress_steps: int        # scan length of the progress-bar benchmark
  progress_every_steps: int  # the same, with an update every step
  compile_leaves: tuple[int, ...]  # scalar leaves tapped, compile time
  compile_reps: int          # repetitions of the compile-time benchmark
  per_call_calls: int        # calls per repetition and condition, item 10
  sharded_steps: int         # scan length of the per-step part, item 11
  sharded_step_reps: int     # its repetitions (what a callback adds there
                             # is small beside the collective's noise)
  sharded_calls: int         # calls per repetition and condition, item 11
  sharded_unwaited: int      # calls of an unwaited loop, item 11
  unwaited_timeout_s: float  # an unwaited loop still running then is stuck


FULL = Config(smoke=False, reps=7, steps=10_000, min_rep_s=0.05,
              payload_sizes=(4, 4 * KiB, 256 * KiB, 4 * MiB, 64 * MiB),
              payload_bytes=512 * MiB, max_taps=10_000, dispatch_calls=2_000,
              prints=10_000, bp_queue_bytes=16_000_000, bp_taps=64,
              bp_tap_bytes=1 * MiB, bp_sleep_s=0.002,
              progress_steps=100_000, progress_every_steps=10_000,
              compile_leaves=(1, 1_000, 4_000, 10_000), compile_reps=3,
              per_call_calls=1_000, sharded_steps=2_000,
              sharded_step_reps=15, sharded_calls=500,
              sharded_unwaited=3_000, unwaited_timeout_s=90)

SMOKE = Config(smoke=True, reps=1, steps=1_000, min_rep_s=0.0,
               payload_sizes=(4, 4 * KiB, 256 * KiB, 4 * MiB, 64 * MiB),
               payload_bytes=64 * MiB, max_taps=200, dispatch_calls=50,
               prints=200, bp_queue_bytes=16_000_000, bp_taps=24,
               bp_tap_bytes=1 * MiB, bp_sleep_s=0.001,
               progress_steps=2_000, progress_every_steps=200,
               compile_leaves=(1, 100), compile_reps=1, per_call_calls=20,
               sharded_steps=50, sharded_step_reps=1,
               sharded_calls=20, sharded_unwaited=50,
               unwaited_timeout_s=15)


# ---- samples and formatting -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sample:
  """One quantity measured once per repetition (in repetition order)."""

  values: tuple[float, ...]

  @property
  def median(self) -> float:
    return statistics.median(self.values)

  @property
  def lo(self) -> float:
    return min(self.values)

  @property
  def hi(self) -> float:
    return max(self.values)

  def map(self, fn: Callable[[float], float]) -> Sample:
    """This sample with ``fn`` applied to every value."""
    return Sample(tuple(fn(v) for v in self.values))

  def minus(self, other: Sample) -> Sample:
    """The difference repetition by repetition (both were measured in the
    same round-robin rounds)."""
    return Sample(tuple(a - b for a, b in zip(self.values, other.values)))

  def ratio(self, other: Sample) -> float | None:
    """The median of the ratios repetition by repetition (both measured in
    the same rounds, so that a slow moment of the machine slows both), or
    None when ``other`` is never positive (a cost lost in the noise)."""
    ratios = [a / b for a, b in zip(self.values, other.values) if b > 0]
    return statistics.median(ratios) if ratios else None

  def text(self) -> str:
    """``median [min–max]``."""
    if len(self.values) == 1:
      return num(self.median)
    return f"{num(self.median)} [{num(self.lo)}–{num(self.hi)}]"


def num(x: float) -> str:
  """About three significant digits, without exponents for usual sizes."""
  magnitude = abs(x)
  if magnitude >= 100:
    return f"{x:.0f}"
  if magnitude >= 10:
    return f"{x:.1f}"
  if magnitude >= 1:
    return f"{x:.2f}"
  return f"{x:.3f}"


def size_label(nbytes: int) -> str:
  """4 B, 4 KiB, 64 MiB."""
  for unit, scale in (("MiB", MiB), ("KiB", KiB)):
    if nbytes >= scale and nbytes % scale == 0:
      return f"{nbytes // scale} {unit}"
  return f"{nbytes} B"


# ---- running and timing ----------------------------------------------------

def progress(message: str) -> None:
  print(f"[bench] {message}", file=sys.stderr, flush=True)


def finish_callbacks() -> None:
  """Returns when every callback of every computation started so far has
  run: JAX's (runtime tokens) and host_callback's (its queues)."""
  jax.effects_barrier()
  hcb.barrier_wait()


class Counter:
  """The Python callbacks of every variant: each counts its calls and does
  nothing else, so that variants differ only in how they get called."""

  def __init__(self) -> None:
    self.n = 0

  def tap(self, arg: Any, transforms: Any) -> None:
    """An id_tap function."""
    del arg, transforms
    self.n += 1

  def effect(self, x: Any) -> None:
    """A jax.debug.callback / io_callback function."""
    del x
    self.n += 1

  def identity(self, x: Any) -> Any:
    """A jax.pure_callback / hcb.call function."""
    self.n += 1
    return x


def scan_of(body: Callable[[jax.Array], jax.Array], steps: int
            ) -> Callable[[jax.Array], jax.Array]:
  """A jitted scan of ``steps`` steps: ``carry = body(carry) + 1``."""

  def run(x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda c, _: (body(c) + 1, None), x, None,
                        length=steps)[0]

  return jax.jit(run)


def time_run(fn: Callable[[jax.Array], jax.Array], x: jax.Array
             ) -> tuple[float, float]:
  """(device-side, end-to-end) seconds of one call of ``fn``."""
  start = time.perf_counter()
  fn(x).block_until_ready()
  device = time.perf_counter() - start
  finish_callbacks()
  return device, time.perf_counter() - start

