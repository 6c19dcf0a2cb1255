"""Benchmarks of host_callback against JAX's own callbacks (``make bench``).

Everything is measured side by side in one process run (back-pressure in a
child process, which needs its own queue bound), repetitions interleaved
round-robin so that drift on a noisy machine hits every variant alike:

1. Per-step cost in a ``lax.scan`` with a 4-byte payload: nothing
   (baseline), empty and copying C FFI handlers (the floor), ``id_tap``
   with a Python function and with a native tap, ``jax.debug.callback``,
   ``io_callback`` unordered and ordered, ``jax.pure_callback``, ``call``
   with a Python function and with a native call.  Device-side (the scan's
   result is ready) and end to end (every callback has run).
2. Payload sweep for taps (4 B to 64 MiB per tap) as GB/s, next to
   ``memcpy`` on the same machine.
3. Dispatch: per-call time of a small jitted function with and without
   callbacks.
4. Printing: ``id_print`` against ``jax.debug.print`` of the same values.
5. Back-pressure: a 16 MB queue and a slow tap function: how long the
   producer waits, and that every tap arrives, in order.

It writes ``RESULTS.md`` (tables; one line per target, ``met`` or ``NOT
MET`` with the measured ratio) and PNG plots into ``--out``
(``bench/results`` by default).  ``--smoke`` runs a seconds-long version
for CI.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

# One CPU device: every number is about device 0 and its consumer thread.
os.environ["JAX_NUM_CPU_DEVICES"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# numpy's BLAS threads spin after use; on a 2-core machine they steal from
# whichever variant runs next.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402

import host_callback as hcb  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE_SOURCE = os.path.join(HERE, "native", "bench_native.c")
KiB, MiB = 1 << 10, 1 << 20
DISPATCH_BLOCKS = 10  # blocks per repetition of the dispatch benchmark


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


FULL = Config(smoke=False, reps=7, steps=10_000, min_rep_s=0.05,
              payload_sizes=(4, 4 * KiB, 256 * KiB, 4 * MiB, 64 * MiB),
              payload_bytes=512 * MiB, max_taps=10_000, dispatch_calls=2_000,
              prints=10_000, bp_queue_bytes=16_000_000, bp_taps=64,
              bp_tap_bytes=1 * MiB, bp_sleep_s=0.002)

SMOKE = Config(smoke=True, reps=1, steps=1_000, min_rep_s=0.0,
               payload_sizes=(4, 4 * KiB, 256 * KiB, 4 * MiB, 64 * MiB),
               payload_bytes=64 * MiB, max_taps=200, dispatch_calls=50,
               prints=200, bp_queue_bytes=16_000_000, bp_taps=24,
               bp_tap_bytes=1 * MiB, bp_sleep_s=0.001)


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


def progress(message: str) -> None:
  print(f"[bench] {message}", file=sys.stderr, flush=True)


def finish_callbacks() -> None:
  """Returns when every callback of every computation started so far has
  run: JAX's (runtime tokens) and host_callback's (its queues)."""
  jax.effects_barrier()
  hcb.barrier_wait()


# ---- the native pieces ------------------------------------------------------

class Native:
  """bench_native.c, compiled against the installed package and loaded;
  its FFI handlers registered with XLA."""

  def __init__(self, build_dir: str):
    flags = subprocess.run(
        [sys.executable, "-m", "host_callback", "--cflags", "--libs"],
        capture_output=True, text=True, check=True).stdout.split()
    path = os.path.join(build_dir, "libhcb_bench.so")
    cmd = [os.environ.get("CC", "cc"), "-O2", "-std=c11", "-shared", "-fPIC",
           "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
           NATIVE_SOURCE, *flags, "-o", path]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}"
                         f"{done.stderr}")
    self.lib = ctypes.CDLL(path)
    for name in ("hcb_bench_empty", "hcb_bench_copy", "hcb_bench_copy_attr",
                 "hcb_bench_copy_attr_ordinal"):
      jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(getattr(self.lib, name)), platform="cpu")
    self.lib.hcb_bench_tap_count.restype = ctypes.c_ulonglong
    for name in ("hcb_bench_memcpy_seconds", "hcb_bench_fresh_memcpy_seconds"):
      getattr(self.lib, name).restype = ctypes.c_double
    self.lib.hcb_bench_memcpy_seconds.argtypes = (
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    self.lib.hcb_bench_fresh_memcpy_seconds.argtypes = (
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    self.tap = hcb.native_tap(self.lib.hcb_bench_noop_tap)
    self.call = hcb.native_call(self.lib.hcb_bench_copy_call)

  def taps_received(self) -> int:
    """Records the native tap has received since the library was loaded."""
    return int(self.lib.hcb_bench_tap_count())

  @staticmethod
  def empty(x: jax.Array) -> jax.Array:
    """The empty FFI handler, shaped like a tap: one operand, the result
    aliased to it, a side effect (so it is never removed)."""
    return jax.ffi.ffi_call(
        "hcb_bench_empty", jax.ShapeDtypeStruct(x.shape, x.dtype),
        has_side_effect=True, input_output_aliases={0: 0})(x)

  @staticmethod
  def copy(x: jax.Array, target: str = "hcb_bench_copy",
           **attributes: Any) -> jax.Array:
    """A copying FFI handler, shaped like a native call: one operand, one
    result of the same shape (not aliased), a side effect."""
    return jax.ffi.ffi_call(
        target, jax.ShapeDtypeStruct(x.shape, x.dtype),
        has_side_effect=True)(x, **attributes)

  @classmethod
  def copy_attr(cls, x: jax.Array) -> jax.Array:
    """The copying handler that also reads a u64 attribute by name."""
    return cls.copy(x, "hcb_bench_copy_attr", callback_id=np.uint64(1))

  @classmethod
  def copy_attr_ordinal(cls, x: jax.Array) -> jax.Array:
    """The copying handler that also reads the attribute and the device
    ordinal, as hcb_call does."""
    return cls.copy(x, "hcb_bench_copy_attr_ordinal",
                    callback_id=np.uint64(1))


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


# ---- 1. per-step cost in a scan ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepVariant:
  """One way of spending a scan step: ``body`` maps the carry to the next
  carry; ``delivered`` says how many callbacks have run so far.  A
  diagnostic variant is not in the issue's list: it explains a cost."""

  key: str
  label: str
  body: Callable[[jax.Array], jax.Array]
  delivered: Callable[[], int] | None
  diagnostic: bool = False


@dataclasses.dataclass(frozen=True)
class StepResult:
  """Seconds per step, device-side and end to end, and callbacks run."""

  label: str
  device: Sample
  end_to_end: Sample
  delivered: int | None
  expected: int
  diagnostic: bool


def step_variants(native: Native) -> list[StepVariant]:
  """Every variant of the per-step benchmark, baseline first."""
  counters = {name: Counter() for name in (
      "id_tap", "debug", "io", "io_ordered", "pure", "call")}
  spec = jax.ShapeDtypeStruct((), jnp.float32)
  c = counters

  def debug_callback(x: jax.Array) -> jax.Array:
    jax.debug.callback(c["debug"].effect, x)
    return x

  def io_unordered(x: jax.Array) -> jax.Array:
    io_callback(c["io"].effect, None, x, ordered=False)
    return x

  def io_ordered(x: jax.Array) -> jax.Array:
    io_callback(c["io_ordered"].effect, None, x, ordered=True)
    return x

  return [
      StepVariant("baseline", "nothing (baseline)", lambda x: x, None),
      StepVariant("ffi_empty", "empty C FFI handler (floor)", native.empty,
                  None),
      StepVariant("ffi_copy", "copying C FFI handler", native.copy, None),
      StepVariant("id_tap", "`id_tap`, Python function",
                  lambda x: hcb.id_tap(c["id_tap"].tap, x),
                  lambda: c["id_tap"].n),
      StepVariant("native_tap", "`id_tap`, native tap",
                  lambda x: hcb.id_tap(native.tap, x), native.taps_received),
      StepVariant("debug_callback", "`jax.debug.callback`", debug_callback,
                  lambda: c["debug"].n),
      StepVariant("io_unordered", "`io_callback(ordered=False)`",
                  io_unordered, lambda: c["io"].n),
      StepVariant("io_ordered", "`io_callback(ordered=True)`", io_ordered,
                  lambda: c["io_ordered"].n),
      StepVariant("pure_callback", "`jax.pure_callback`",
                  lambda x: jax.pure_callback(c["pure"].identity, spec, x),
                  lambda: c["pure"].n),
      StepVariant("call", "`call`, Python function",
                  lambda x: hcb.call(c["call"].identity, x, result_shape=spec),
                  lambda: c["call"].n),
      StepVariant("native_call", "`call`, native call",
                  lambda x: hcb.call(native.call, x, result_shape=spec), None),
      StepVariant("ffi_copy_attr", "copying handler + a u64 attribute",
                  native.copy_attr, None, diagnostic=True),
      StepVariant("ffi_copy_attr_ordinal",
                  "copying handler + the attribute + the device ordinal",
                  native.copy_attr_ordinal, None, diagnostic=True),
  ]


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


def measure_per_step(cfg: Config, native: Native) -> dict[str, StepResult]:
  """Item 1: seconds per scan step of every variant.

  A step's cost is ``(t(steps) - t(1)) / (steps - 1)`` for the same loop
  run with ``steps`` steps and with one: what a call costs once (dispatch,
  which is JAX's slow path for functions with JAX effects, and the
  barrier) is not a step's.  A repetition runs the pair of loops ``runs``
  times, enough for ``min_rep_s``: a 10,000-step scan of a cheap variant
  lasts a millisecond, too short to time alone on a noisy 2-core machine.
  The runs of all variants are interleaved, so that the machine's slow
  and fast moments fall on every variant alike."""
  variants = step_variants(native)
  x = jnp.zeros((), jnp.float32)  # the 4-byte payload
  long_runs, short_runs, runs = {}, {}, {}
  for v in variants:
    long_runs[v.key] = scan_of(v.body, cfg.steps)
    short_runs[v.key] = scan_of(v.body, 1)
    time_run(short_runs[v.key], x)  # compile and warm up
    seconds = time_run(long_runs[v.key], x)[1]
    runs[v.key] = max(1, math.ceil(cfg.min_rep_s / max(seconds, 1e-9)))
  start_counts = {v.key: v.delivered() if v.delivered else 0
                  for v in variants}
  device: dict[str, list[float]] = {v.key: [] for v in variants}
  e2e: dict[str, list[float]] = {v.key: [] for v in variants}
  for _ in range(cfg.reps):
    totals = {v.key: [0.0, 0.0] for v in variants}
    for i in range(max(runs.values())):
      for v in variants:
        if i < runs[v.key]:
          d1, e1 = time_run(short_runs[v.key], x)
          d, e = time_run(long_runs[v.key], x)
          totals[v.key][0] += d - d1
          totals[v.key][1] += e - e1
    for v in variants:
      steps = runs[v.key] * (cfg.steps - 1)
      device[v.key].append(totals[v.key][0] / steps)
      e2e[v.key].append(totals[v.key][1] / steps)
  return {
      v.key: StepResult(
          v.label, Sample(tuple(device[v.key])), Sample(tuple(e2e[v.key])),
          v.delivered() - start_counts[v.key] if v.delivered else None,
          (cfg.steps + 1) * cfg.reps * runs[v.key], v.diagnostic)
      for v in variants}


# ---- 2. payload sweep -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PayloadResult:
  """GB/s at one size: taps (device-side and end to end) and memcpy."""

  size: int
  taps: int
  tap_device: Sample
  tap_e2e: Sample
  native_e2e: Sample
  memcpy: Sample
  fresh_memcpy: Sample
  delivered: int
  expected: int


def tap_loop(tap: Any, count: int) -> Callable[[jax.Array], jax.Array]:
  """A jitted scan of ``count`` taps of its (donated) carry, unchanged."""

  def run(x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda c, _: (hcb.id_tap(tap, c), None), x, None,
                        length=count)[0]

  return jax.jit(run, donate_argnums=0)


def memcpy_gbps(native: Native, size: int, total: int) -> tuple[float, float]:
  """GB/s of memcpy into a warm buffer, and of malloc + memcpy + free."""
  src = np.ones(size, np.uint8)
  dst = np.ones(size, np.uint8)  # written, so its pages are mapped
  iters = max(1, min(total // size, 1_000_000))
  native.lib.hcb_bench_memcpy_seconds(dst.ctypes.data, src.ctypes.data, size,
                                      1)
  warm = native.lib.hcb_bench_memcpy_seconds(dst.ctypes.data, src.ctypes.data,
                                             size, iters)
  fresh = native.lib.hcb_bench_fresh_memcpy_seconds(src.ctypes.data, size,
                                                    iters)
  return size * iters / warm / 1e9, size * iters / fresh / 1e9


def measure_payload(cfg: Config, native: Native) -> list[PayloadResult]:
  """Item 2: tap bandwidth at every size, against memcpy."""
  results = []
  for size in cfg.payload_sizes:
    count = max(1, min(cfg.payload_bytes // size, cfg.max_taps))
    counter = Counter()
    python_loop, native_loop = tap_loop(counter.tap, count), tap_loop(
        native.tap, count)

    def fresh_payload() -> jax.Array:
      return jnp.zeros(size // 4, jnp.float32).block_until_ready()

    for loop in (python_loop, native_loop):
      time_run(loop, fresh_payload())  # compile and warm up
    counter.n = 0
    samples: dict[str, list[float]] = {k: [] for k in (
        "device", "e2e", "native", "memcpy", "fresh")}
    gb = size * count / 1e9
    for _ in range(cfg.reps):
      device, e2e = time_run(python_loop, fresh_payload())
      samples["device"].append(gb / device)
      samples["e2e"].append(gb / e2e)
      samples["native"].append(gb / time_run(native_loop, fresh_payload())[1])
      warm, fresh = memcpy_gbps(native, size, size * count)
      samples["memcpy"].append(warm)
      samples["fresh"].append(fresh)
    results.append(PayloadResult(
        size, count, *(Sample(tuple(samples[k])) for k in (
            "device", "e2e", "native", "memcpy", "fresh")),
        counter.n, count * cfg.reps))
  return results


# ---- 3. dispatch ------------------------------------------------------------

def dispatch_variants(native: Native
                      ) -> dict[str, Callable[[jax.Array], jax.Array]]:
  """A small jitted function, without and with each kind of callback (the
  native ones show how much of a cost is Python's)."""
  counter = Counter()
  spec = jax.ShapeDtypeStruct((16,), jnp.float32)

  def small(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 2 + 1

  def with_io(x: jax.Array) -> jax.Array:
    y = small(x)
    io_callback(counter.effect, None, y)
    return y

  def with_debug(x: jax.Array) -> jax.Array:
    y = small(x)
    jax.debug.callback(counter.effect, y)
    return y

  return {
      "no callback": jax.jit(small),
      "`id_tap`": jax.jit(lambda x: hcb.id_tap(counter.tap, small(x))),
      "`call`": jax.jit(lambda x: hcb.call(counter.identity, small(x),
                                           result_shape=spec)),
      "`id_tap`, native tap": jax.jit(
          lambda x: hcb.id_tap(native.tap, small(x))),
      "`call`, native call": jax.jit(
          lambda x: hcb.call(native.call, small(x), result_shape=spec)),
      "`io_callback`": jax.jit(with_io),
      "`jax.debug.callback`": jax.jit(with_debug),
  }


@dataclasses.dataclass(frozen=True)
class DispatchResult:
  """Seconds per call: until the last result is ready (dispatch), and
  until every callback has run too (end to end)."""

  dispatch: Sample
  end_to_end: Sample


def measure_dispatch(cfg: Config, native: Native
                     ) -> dict[str, DispatchResult]:
  """Item 3: seconds per call of each variant, ``dispatch_calls`` calls per
  repetition, in blocks of calls back to back.  The blocks of all variants
  are interleaved: one slow moment of the machine would otherwise fall on
  one variant's whole repetition."""
  variants = dispatch_variants(native)
  x = jnp.arange(16, dtype=jnp.float32)
  for fn in variants.values():
    fn(x).block_until_ready()
  finish_callbacks()
  dispatch: dict[str, list[float]] = {name: [] for name in variants}
  e2e: dict[str, list[float]] = {name: [] for name in variants}
  blocks = DISPATCH_BLOCKS if cfg.dispatch_calls >= 10 * DISPATCH_BLOCKS else 1
  n = cfg.dispatch_calls // blocks
  for _ in range(cfg.reps):
    totals = {name: [0.0, 0.0] for name in variants}
    for _ in range(blocks):
      for name, fn in variants.items():
        start = time.perf_counter()
        for _ in range(n - 1):
          fn(x)
        fn(x).block_until_ready()
        totals[name][0] += time.perf_counter() - start
        finish_callbacks()
        totals[name][1] += time.perf_counter() - start
    for name in variants:
      dispatch[name].append(totals[name][0] / (n * blocks))
      e2e[name].append(totals[name][1] / (n * blocks))
  return {name: DispatchResult(Sample(tuple(dispatch[name])),
                               Sample(tuple(e2e[name])))
          for name in variants}


# ---- 4. printing ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PrintResult:
  """Seconds per print, end to end, and what each wrote."""

  id_print: Sample
  debug_print: Sample
  id_print_values: int
  debug_print_values: int
  id_print_chars: int
  debug_print_chars: int


def printed_values(text: str) -> int:
  """How many 1-d arrays a sink received (lines that open with ``[``)."""
  return sum(1 for line in text.splitlines() if line.lstrip().startswith("["))


def measure_printing(cfg: Config) -> PrintResult | None:
  """Item 4: ``prints`` prints of the same f32[4] values, into the same
  kind of sink (an io.StringIO: ``output_stream=`` for id_print,
  ``sys.stdout`` redirected for jax.debug.print), end to end.  None when
  this host_callback has no id_print."""
  if not hasattr(hcb, "id_print"):
    return None
  sink = io.StringIO()
  x = jnp.array([0.0, 0.5, 1.0, 1.5], jnp.float32)

  def with_id_print(c: jax.Array) -> jax.Array:
    return hcb.id_print(c, output_stream=sink)

  def with_debug_print(c: jax.Array) -> jax.Array:
    jax.debug.print("{}", c)
    return c

  loops = {"id_print": scan_of(with_id_print, cfg.prints),
           "debug_print": scan_of(with_debug_print, cfg.prints)}
  seconds: dict[str, list[float]] = {k: [] for k in loops}
  written: dict[str, str] = {}
  with contextlib.redirect_stdout(sink):
    for fn in loops.values():
      time_run(fn, x)  # compile and warm up
    for _ in range(cfg.reps):
      for name, fn in loops.items():
        sink.seek(0)
        sink.truncate()
        seconds[name].append(time_run(fn, x)[1] / cfg.prints)
        written[name] = sink.getvalue()
  return PrintResult(
      Sample(tuple(seconds["id_print"])), Sample(tuple(seconds["debug_print"])),
      printed_values(written["id_print"]),
      printed_values(written["debug_print"]),
      len(written["id_print"]), len(written["debug_print"]))


# ---- 5. back-pressure -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BackpressureResult:
  """The slow-consumer run against the same run with a fast consumer."""

  queue_bytes: int
  taps: int
  tap_bytes: int
  sleep_s: float
  slow_device: Sample
  fast_device: Sample
  slow_e2e: Sample
  wait: Sample          # producer wait reported by the runtime, seconds
  waits: Sample         # how many times the producer waited
  high_water_bytes: int
  received_ok: int      # repetitions where every tap arrived, in order
  reps: int
  sent: int
  received: int


def backpressure_worker(cfg: Config) -> dict[str, Any]:
  """Runs in the child process that has the small queue bound: ``bp_taps``
  taps of ``(step, bp_tap_bytes of payload)``, consumed by a function that
  sleeps (slow) or does not (fast)."""
  received: list[int] = []

  def slow(arg: Any, transforms: Any) -> None:
    del transforms
    time.sleep(cfg.bp_sleep_s)
    received.append(int(arg[0]))

  def fast(arg: Any, transforms: Any) -> None:
    del transforms
    received.append(int(arg[0]))

  def loop(tap: Callable[..., None]) -> Callable[[jax.Array], jax.Array]:
    def run(x: jax.Array) -> jax.Array:
      def step(c: jax.Array, i: jax.Array) -> tuple[jax.Array, None]:
        return hcb.id_tap(tap, (i, c))[1], None
      return jax.lax.scan(step, x, jnp.arange(cfg.bp_taps))[0]
    return jax.jit(run)

  x = jnp.zeros(cfg.bp_tap_bytes // 4, jnp.float32)
  loops = {"fast": loop(fast), "slow": loop(slow)}
  for fn in loops.values():
    time_run(fn, x)
  out: dict[str, Any] = {k: [] for k in (
      "slow_device", "fast_device", "slow_e2e", "wait_s", "waits")}
  out.update(ok=0, sent=0, received=0)
  expected = list(range(cfg.bp_taps))
  for _ in range(cfg.reps):
    for name, fn in loops.items():
      received.clear()
      before = hcb.stats()
      device, e2e = time_run(fn, x)
      after = hcb.stats()
      out[f"{name}_device"].append(device)
      if name == "slow":
        out["slow_e2e"].append(e2e)
        out["wait_s"].append(
            (after["producer_wait_ns"] - before["producer_wait_ns"]) / 1e9)
        out["waits"].append(after["producer_waits"] - before["producer_waits"])
        out["sent"] += cfg.bp_taps
        out["received"] += len(received)
        out["ok"] += received == expected
  out["high_water_bytes"] = hcb.stats()["high_water_bytes"]
  out["max_queue_bytes"] = hcb.stats()["max_queue_bytes"]
  return out


def measure_backpressure(cfg: Config) -> BackpressureResult:
  """Item 5, in a child process whose queue bound is ``bp_queue_bytes``
  (HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE, read when host_callback starts)."""
  env = dict(os.environ, HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE=str(
      cfg.bp_queue_bytes))
  done = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--backpressure-worker",
       json.dumps(dataclasses.asdict(cfg))],
      env=env, capture_output=True, text=True)
  if done.returncode != 0:
    raise RuntimeError(f"the back-pressure worker failed:\n{done.stderr}")
  out = json.loads(done.stdout.strip().splitlines()[-1])
  if out["max_queue_bytes"] != cfg.bp_queue_bytes:
    raise RuntimeError(f"the worker's queue bound is {out['max_queue_bytes']}"
                       f", not {cfg.bp_queue_bytes}")
  return BackpressureResult(
      cfg.bp_queue_bytes, cfg.bp_taps, cfg.bp_tap_bytes, cfg.bp_sleep_s,
      *(Sample(tuple(out[k])) for k in (
          "slow_device", "fast_device", "slow_e2e", "wait_s", "waits")),
      out["high_water_bytes"], out["ok"], cfg.reps, out["sent"],
      out["received"])


# ---- targets ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Measurements:
  """Everything one run measured."""

  steps: dict[str, StepResult]
  payload: list[PayloadResult]
  dispatch: dict[str, DispatchResult]
  printing: PrintResult | None
  backpressure: BackpressureResult

  def excess(self, key: str, e2e: bool = False) -> Sample:
    """Seconds per scan step of variant ``key`` over the baseline,
    device-side or end to end."""
    base, r = self.steps["baseline"], self.steps[key]
    return (r.end_to_end.minus(base.end_to_end) if e2e
            else r.device.minus(base.device))

  def cost(self, key: str, e2e: bool = False) -> float:
    """The median of :meth:`excess`."""
    return self.excess(key, e2e).median

  def cost_ratio(self, key: str, other: str, e2e: bool = False
                 ) -> float | None:
    """Per-step cost of ``key`` over that of ``other`` (paired)."""
    return self.excess(key, e2e).ratio(self.excess(other, e2e))

  def payload_at(self, size: int) -> PayloadResult | None:
    return next((p for p in self.payload if p.size == size), None)


@dataclasses.dataclass(frozen=True)
class Target:
  """One target of issue 8 and what this run measured for it."""

  key: str             # names the target in gap_notes
  text: str            # the target, e.g. "native call ≤ 1.3× the floor"
  value: float | None  # the measured ratio; None when not measured
  limit: float
  at_least: bool       # the ratio must be >= limit (else <= limit)
  detail: str          # the numbers behind the ratio, or why not measured

  @property
  def status(self) -> str:
    if self.value is None:
      return "NOT MEASURED"
    ok = self.value >= self.limit if self.at_least else self.value <= self.limit
    return "met" if ok else "NOT MET"

  def line(self) -> str:
    # two decimals, or three where a miss would round onto the limit
    digits = 3 if self.status == "NOT MET" and round(
        self.value or 0.0, 2) == round(self.limit, 2) else 2
    measured = ("not measured" if self.value is None
                else f"measured **{self.value:.{digits}f}×**")
    return f"- **{self.status}** — {self.text}: {measured} ({self.detail})"


def us(seconds: float) -> str:
  return f"{num(seconds * 1e6)} µs"


def part(seconds: float) -> str:
  """A difference of two medians: ``us``, or "nothing measurable"."""
  return us(seconds) if seconds > 0.0005e-6 else "nothing measurable"


def targets(m: Measurements) -> list[Target]:
  """Every target.  Ratios are medians of the per-repetition ratios; the
  numbers beside them are medians.  Per-step costs are over the baseline;
  the floor is the empty FFI handler."""
  cost, rel = m.cost, m.cost_ratio
  floor = cost("ffi_empty")
  tap, tap_e2e = cost("id_tap"), cost("id_tap", e2e=True)
  io_e2e = cost("io_ordered", e2e=True)
  out = [
      Target("tap_vs_debug",
             "`id_tap` device-side per-step cost ≤ 0.1× "
             "`jax.debug.callback`'s", rel("id_tap", "debug_callback"), 0.1,
             False, f"{us(tap)} vs {us(cost('debug_callback'))}"),
      Target("tap_vs_floor",
             "`id_tap` device-side per-step cost ≤ 2× the empty-FFI floor",
             rel("id_tap", "ffi_empty"), 2.0, False,
             f"{us(tap)} vs {us(floor)}"),
      Target("tap_throughput",
             "Python taps end to end ≥ 3× the throughput of "
             "`io_callback(ordered=True)`",
             rel("io_ordered", "id_tap", e2e=True), 3.0, True,
             f"{us(tap_e2e)} vs {us(io_e2e)} per callback, end to end"),
      Target("call_vs_pure",
             "`call` with a Python function ≤ 0.5× `jax.pure_callback` per "
             "call", rel("call", "pure_callback"), 0.5, False,
             f"{us(cost('call'))} vs {us(cost('pure_callback'))}"),
      Target("native_call", "native call ≤ 1.3× the floor",
             rel("native_call", "ffi_empty"), 1.3, False,
             f"{us(cost('native_call'))} vs {us(floor)}; "
             f"{rel('native_call', 'ffi_copy') or 0:.2f}× the copying "
             "handler"),
      Target("native_tap", "native tap ≤ 1.5× the floor (device-side)",
             rel("native_tap", "ffi_empty"), 1.5, False,
             f"{us(cost('native_tap'))} vs {us(floor)}"),
  ]
  big = m.payload_at(64 * MiB)
  out.append(Target(
      "big_taps", "64 MiB taps ≥ 0.7× memcpy bandwidth (end to end)",
      None if big is None else big.tap_e2e.ratio(big.memcpy), 0.7, True,
      "64 MiB not in this run's sizes" if big is None else
      f"{num(big.tap_e2e.median)} GB/s vs {num(big.memcpy.median)} GB/s"))
  none, tapped = m.dispatch["no callback"], m.dispatch["`id_tap`"]
  out.append(Target(
      "dispatch", "a jitted function with a tap dispatches within 1.2× of "
      "the same function without", tapped.dispatch.ratio(none.dispatch), 1.2,
      False, f"{us(tapped.dispatch.median)} vs {us(none.dispatch.median)} "
      "per call"))
  text = "`id_print` ≥ 5× faster than `jax.debug.print`"
  if m.printing is None:
    out.append(Target("print", text, None, 5.0, True,
                      "id_print not available"))
  else:
    mine, theirs = m.printing.id_print, m.printing.debug_print
    out.append(Target("print", text, theirs.ratio(mine), 5.0, True,
                      f"{us(mine.median)} vs {us(theirs.median)} per print, "
                      "end to end"))
  bp = m.backpressure
  out.append(Target(
      "lossless", "back-pressure loses nothing: every tap received, in order",
      bp.received / bp.sent if bp.received_ok == bp.reps else 0.0, 1.0, True,
      f"received/sent; {bp.received} of {bp.sent} taps, in order in "
      f"{bp.received_ok} of {bp.reps} repetitions"))
  return out


def gap_notes(m: Measurements, goals: list[Target]) -> list[str]:
  """What limits each missed target: the causes perf showed when this
  harness was written (2 cores, these loops), with this run's numbers.
  Re-profile when the numbers move."""
  missed = {t.key for t in goals if t.status == "NOT MET"}
  notes = []
  c = m.cost
  queries = c("ffi_copy_attr_ordinal") - c("ffi_copy")
  if missed & {"tap_vs_floor", "native_tap"}:
    notes.append(
        f"- **Taps on the device thread** (id_tap {us(c('id_tap'))}, native "
        f"tap {us(c('native_tap'))}, floor {us(c('ffi_empty'))} per step): "
        "the tap function does not matter, the handler's own path does. "
        f"Reading an attribute and the device ordinal costs {part(queries)} "
        "(the table under item 1; the tap reads two attributes). Records "
        "are carved in sequence out of a per-thread arena (src/record.c) "
        "and pushed without a lock (src/queue.c). What a profile of the "
        "native tap loop still shows on the device thread is the cache "
        "lines it shares with the consumer on the other core: the queue's "
        "count and tail, which the consumer reads for every record while "
        "it keeps up, and the previous record's link. That is also why a "
        "Python tap can cost the device thread less than a native one: "
        "its consumer is slower, takes records in batches and touches "
        "those lines less often. The order token (docs/runtime.md, "
        "\"Order\") adds an operand and a result for XLA to pass, about "
        "0.02 us. Directions: attributes read once per "
        "executable (an instantiate-stage state) instead of per call; a "
        "consumer that lets records gather while it keeps up (tried with "
        "the earlier mutex queue: a 0.5-10 us pause, no gain measurable "
        "above this machine's noise).")
  if "native_call" in missed:
    notes.append(
        f"- **Native call** ({us(c('native_call'))} per step, floor "
        f"{us(c('ffi_empty'))}): a result of its own costs "
        f"{part(c('ffi_copy') - c('ffi_empty'))} (the copying handler: "
        "XLA passes and fills a second buffer, which a call must have); "
        "the `callback_id` attribute, looked up by name, "
        f"{part(c('ffi_copy_attr') - c('ffi_copy'))}; the rest, "
        f"{part(c('native_call') - c('ffi_copy_attr'))} over the copying "
        "handler with the attribute, is the order token (an operand and "
        "a result more for XLA to pass, about 0.02 us: "
        "`callback_flavor=PURE` leaves it out, and the order with it) and "
        "libhcb's: the target lookup and the lock-free check that no tap "
        "of its device is pending (`hcb__queue_idle`). The ordinal is not asked of XLA "
        "(`XLA_FFI_DeviceOrdinal_Get` costs "
        f"{part(c('ffi_copy_attr_ordinal') - c('ffi_copy_attr'))}): with "
        "one CPU device it comes from the runtime. Across runs on this "
        "machine the ratio moves between about 1.25x and 1.45x (see the "
        "spread in the table). Directions: the `callback_id` read once per "
        "executable (an instantiate-stage state) instead of per call.")
  big = m.payload_at(64 * MiB)
  if "big_taps" in missed and big is not None:
    notes.append(
        f"- **64 MiB taps** ({num(big.tap_e2e.median)} GB/s): large "
        "records reuse up to four cached blocks (src/record.c), so the "
        "copy goes to memory that is already mapped; a fresh block would "
        "page-fault on every page (malloc + memcpy + free: "
        f"{num(big.fresh_memcpy.median)} GB/s here against "
        f"{num(big.memcpy.median)} GB/s for memcpy into a warm buffer). A "
        "miss means the copy itself and the consumer's pass over the data "
        "compete for memory bandwidth on 2 cores.")
  if "dispatch" in missed:
    d = {name: r.dispatch.median for name, r in m.dispatch.items()}
    notes.append(
        f"- **Dispatch with a tap** ({us(d['`id_tap`'])} against "
        f"{us(d['no callback'])}; with a native tap "
        f"{us(d['`id_tap`, native tap'])}, with nothing to do in "
        "Python; a native call: "
        f"{us(d['`call`, native call'])}): the C++ fast path is kept. A "
        "Python tap function takes the GIL on the consumer thread once per "
        "record while the dispatching thread holds it between calls, so "
        "the GIL goes over and back on every call. The rest is the tap's "
        "per-record work, which the native row shows: on the dispatching "
        "thread the record and the queue push; on the other core the "
        "consumer polling for the next record, which yields the processor "
        "every 256 polls so that JAX's threads get it. Tried and measured "
        "worse: a shorter poll (every record then costs a futex wake-up), "
        "and a consumer that dozes for 1 ms without being woken by pushes "
        "(records then reach the Python tap function in bursts, each "
        "taking the GIL from the dispatching thread). On 2 cores, "
        "run-to-run noise of the no-callback row is of the same size as "
        "the gap; compare within a run.")
  return notes


# ---- plots ------------------------------------------------------------------

def plot_per_step(steps: dict[str, StepResult], path: str) -> None:
  """Bars: per-step cost over the baseline, device-side and end to end."""
  import matplotlib.pyplot as plt
  base = steps["baseline"]
  keys = [k for k, r in steps.items()
          if k != "baseline" and not r.diagnostic]
  labels = [steps[k].label.replace("`", "") for k in keys]
  fig, ax = plt.subplots(figsize=(9, 5.5))
  y = np.arange(len(keys))
  for offset, (name, attr) in zip((-0.2, 0.2), (
      ("device-side", "device"), ("end to end", "end_to_end"))):
    samples = [getattr(steps[k], attr).minus(getattr(base, attr)).map(
        lambda s: max(s * 1e6, 1e-3)) for k in keys]
    med = np.array([s.median for s in samples])
    err = np.array([[m - s.lo for s, m in zip(samples, med)],
                    [s.hi - m for s, m in zip(samples, med)]])
    ax.barh(y + offset, med, height=0.4, xerr=err, label=name, capsize=2)
  ax.set_yticks(y, labels)
  ax.invert_yaxis()
  ax.set_xscale("log")
  ax.set_xlabel("µs per scan step over the baseline (median, min–max)")
  ax.set_title("Per-step cost of a callback in lax.scan, 4-byte payload")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_payload(payload: list[PayloadResult], path: str) -> None:
  """Lines: GB/s against bytes per tap, taps and memcpy."""
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 5))
  sizes = [p.size for p in payload]
  for label, attr, style in (
      ("id_tap (Python), end to end", "tap_e2e", "o-"),
      ("id_tap (Python), device-side", "tap_device", "o--"),
      ("native tap, end to end", "native_e2e", "s-"),
      ("memcpy, warm buffer", "memcpy", "k^-"),
      ("malloc + memcpy + free", "fresh_memcpy", "kv--")):
    ax.plot(sizes, [getattr(p, attr).median for p in payload], style,
            label=label)
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xticks(sizes, [size_label(s) for s in sizes])
  ax.set_xlabel("bytes per tap")
  ax.set_ylabel("GB/s (median)")
  ax.set_title("Tap bandwidth against memcpy")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_dispatch(dispatch: dict[str, DispatchResult], path: str) -> None:
  """Bars: µs per call of the small jitted function, dispatch and end to
  end."""
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(9, 4.5))
  names = list(dispatch)
  x = np.arange(len(names))
  for offset, (label, attr) in zip((-0.2, 0.2), (
      ("last result ready", "dispatch"), ("every callback done",
                                          "end_to_end"))):
    samples = [getattr(dispatch[n], attr).map(lambda v: v * 1e6)
               for n in names]
    med = np.array([s.median for s in samples])
    err = np.array([[m - s.lo for s, m in zip(samples, med)],
                    [s.hi - m for s, m in zip(samples, med)]])
    ax.bar(x + offset, med, width=0.4, yerr=err, capsize=3, label=label)
  ax.set_xticks(x, [n.replace("`", "").replace(", ", "\n") for n in names])
  ax.set_yscale("log")
  ax.set_ylabel("µs per call (median, min–max)")
  ax.set_title("Per-call time of a small jitted function")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ---- the report -------------------------------------------------------------

def machine() -> str:
  """CPU model, cores, OS."""
  model = platform.processor() or "unknown CPU"
  with contextlib.suppress(OSError):
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          model = line.split(":", 1)[1].strip()
          break
  return (f"{model}, {os.cpu_count()} cores, {platform.system()} "
          f"{platform.release()}")


def per_step_table(steps: dict[str, StepResult]) -> list[str]:
  base = steps["baseline"]
  rows = ["| variant | device-side µs/step | over baseline | end to end "
          "µs/step | over baseline | callbacks run |",
          "|---|---:|---:|---:|---:|---:|"]
  for key, r in steps.items():
    if r.diagnostic:
      continue
    dev = r.device.map(lambda s: s * 1e6)
    e2e = r.end_to_end.map(lambda s: s * 1e6)
    dev_x = r.device.minus(base.device).map(lambda s: s * 1e6)
    e2e_x = r.end_to_end.minus(base.end_to_end).map(lambda s: s * 1e6)
    run = "–" if r.delivered is None else f"{r.delivered}/{r.expected}"
    over = ("–", "–") if key == "baseline" else (dev_x.text(), e2e_x.text())
    rows.append(f"| {r.label} | {dev.text()} | {over[0]} | {e2e.text()} | "
                f"{over[1]} | {run} |")
  return rows


def anatomy_table(m: Measurements) -> list[str]:
  """Device-side cost over the baseline of the FFI handlers and the native
  callbacks, against the floor."""
  rows = ["| handler | µs/step over baseline | × floor |", "|---|---:|---:|"]
  for key in ("ffi_empty", "ffi_copy", "ffi_copy_attr",
              "ffi_copy_attr_ordinal", "native_call", "native_tap"):
    rows.append(f"| {m.steps[key].label} | {num(m.cost(key) * 1e6)} | "
                f"{m.cost_ratio(key, 'ffi_empty') or 0:.2f}× |")
  return rows


def payload_table(payload: list[PayloadResult]) -> list[str]:
  rows = ["| bytes per tap | taps | `id_tap` device-side GB/s | `id_tap` end "
          "to end GB/s | native tap end to end GB/s | memcpy GB/s | malloc + "
          "memcpy + free GB/s | end to end / memcpy | `id_tap` delivered |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for p in payload:
    rows.append(
        f"| {size_label(p.size)} | {p.taps} | {p.tap_device.text()} | "
        f"{p.tap_e2e.text()} | {p.native_e2e.text()} | {p.memcpy.text()} | "
        f"{p.fresh_memcpy.text()} | "
        f"{p.tap_e2e.median / p.memcpy.median:.2f}× | "
        f"{p.delivered}/{p.expected} |")
  return rows


def dispatch_table(dispatch: dict[str, DispatchResult]) -> list[str]:
  none = dispatch["no callback"]
  rows = ["| function | µs per call, last result ready | × no callback | "
          "µs per call, every callback done | × no callback |",
          "|---|---:|---:|---:|---:|"]
  for name, r in dispatch.items():
    rows.append(
        f"| {name} | {r.dispatch.map(lambda v: v * 1e6).text()} | "
        f"{r.dispatch.median / none.dispatch.median:.2f}× | "
        f"{r.end_to_end.map(lambda v: v * 1e6).text()} | "
        f"{r.end_to_end.median / none.end_to_end.median:.2f}× |")
  return rows


def printing_section(printing: PrintResult | None, cfg: Config) -> list[str]:
  if printing is None:
    return ["id_print not available: this build of host_callback has no "
            "`id_print`, so nothing was measured."]
  p = printing
  return [
      f"{cfg.prints} prints of an f32[4] per repetition, each into an "
      "`io.StringIO` (`output_stream=` for `id_print`, `sys.stdout` "
      "redirected for `jax.debug.print`), end to end (printed and "
      "written).", "",
      "| | µs per print | values written | characters written |",
      "|---|---:|---:|---:|",
      f"| `id_print` | {p.id_print.map(lambda v: v * 1e6).text()} | "
      f"{p.id_print_values}/{cfg.prints} | {p.id_print_chars} |",
      f"| `jax.debug.print` | {p.debug_print.map(lambda v: v * 1e6).text()} "
      f"| {p.debug_print_values}/{cfg.prints} | {p.debug_print_chars} |",
  ]


def backpressure_section(bp: BackpressureResult) -> list[str]:
  ms = lambda s: s.map(lambda v: v * 1e3).text()  # noqa: E731
  consumer = bp.taps * bp.sleep_s
  return [
      f"Queue bound {bp.queue_bytes / 1e6:g} MB; {bp.taps} taps of "
      f"{size_label(bp.tap_bytes)} ({bp.taps * bp.tap_bytes / 1e6:g} MB) per "
      f"repetition; the slow tap function sleeps {bp.sleep_s * 1e3:g} ms "
      f"(at least {consumer * 1e3:g} ms of consumer time per repetition).",
      "",
      "| | ms |", "|---|---:|",
      f"| device-side, fast consumer (no pressure) | {ms(bp.fast_device)} |",
      f"| device-side, slow consumer | {ms(bp.slow_device)} |",
      f"| producer wait reported by the runtime (`producer_wait_ns`) | "
      f"{ms(bp.wait)} |",
      f"| end to end, slow consumer | {ms(bp.slow_e2e)} |",
      "",
      f"Producer waits per repetition: {bp.waits.text()}; queue high-water "
      f"mark {bp.high_water_bytes / 1e6:.2f} MB (bound "
      f"{bp.queue_bytes / 1e6:g} MB); taps received {bp.received} of "
      f"{bp.sent} sent, in order in {bp.received_ok} of {bp.reps} "
      "repetitions.",
  ]


def report(cfg: Config, m: Measurements, goals: list[Target],
           wall_s: float) -> str:
  """RESULTS.md."""
  notes = gap_notes(m, goals)
  versions = (f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, numpy "
              f"{np.__version__}, host_callback {hcb.__version__}, Python "
              f"{platform.python_version()}")
  lines = [
      "# host_callback benchmarks", "",
      f"- Run: {datetime.datetime.now().isoformat(timespec='seconds')}, "
      f"{'smoke (CI; numbers mean nothing)' if cfg.smoke else 'full'}, "
      f"{wall_s:.0f} s",
      f"- Machine: {machine()}; one JAX CPU device",
      f"- Software: {versions}",
      f"- Every number is the median of {cfg.reps} repetitions, with "
      "[min–max]; the repetitions of all variants are interleaved; a ratio "
      "is the median of the ratios of the repetitions (each measured in "
      "one round), all within this run.",
      "- The floor is the empty C FFI handler, shaped like a tap (one "
      "operand, result aliased, `has_side_effect`); a copying handler "
      "(one operand, one result, like a native call) is shown next to it.",
      "", "## Targets", "",
      *(t.line() for t in goals),
      "", f"## 1. Per-step cost in a `lax.scan` of {cfg.steps} steps, "
      "4-byte payload", "",
      "Device-side: until the scan's result is ready. End to end: until "
      "every callback has run (`jax.effects_barrier()` and "
      "`hcb.barrier_wait()`). A step costs (t(N steps) − t(1 step)) / "
      "(N − 1), so that what a call costs once (dispatch, the barrier) is "
      "not counted as steps. \"Over baseline\" subtracts the empty step, "
      "repetition by repetition. Callbacks run counts the one-step runs "
      "too.", "",
      *per_step_table(m.steps), "",
      "![per-step cost](per_step.png)", "",
      "What a handler pays for (device-side medians; the copying handlers "
      "have a result of their own, like `hcb_call`, and read what it reads "
      "from XLA on every call):", "",
      *anatomy_table(m), "",
      "## 2. Payload sweep for taps", "",
      "GB/s = bytes tapped / seconds (1 GB = 1e9 B), for a scan of taps of "
      "its donated carry. memcpy: into a warm buffer; malloc + memcpy + "
      "free: one copy into fresh memory, as a tap record makes.", "",
      *payload_table(m.payload), "",
      "![payload sweep](payload.png)", "",
      "## 3. Dispatch", "",
      f"`jnp.sin(x) * 2 + 1` on f32[16], {cfg.dispatch_calls} calls per "
      "repetition in interleaved blocks of calls back to back, each timed "
      "until its last result is ready (the dispatch target uses this) and "
      "until every callback has run as well. The callback "
      "counts its calls; the native rows show how much of a cost is "
      "Python's.", "",
      *dispatch_table(m.dispatch), "",
      "![dispatch](dispatch.png)", "",
      "## 4. Printing", "",
      *printing_section(m.printing, cfg), "",
      "## 5. Back-pressure", "",
      *backpressure_section(m.backpressure), "",
  ]
  if notes:
    lines += ["## What limits the missed targets", "", *notes, ""]
  return "\n".join(lines)


# ---- main -------------------------------------------------------------------

def run(cfg: Config, out_dir: str) -> list[Target]:
  """Every measurement, then RESULTS.md and the plots in ``out_dir``."""
  os.makedirs(out_dir, exist_ok=True)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="hcb-bench-") as build_dir:
    native = Native(build_dir)
    progress("1/5 per-step cost in a scan")
    steps = measure_per_step(cfg, native)
    progress("2/5 payload sweep")
    payload = measure_payload(cfg, native)
    progress("3/5 dispatch")
    dispatch = measure_dispatch(cfg, native)
  progress("4/5 printing")
  printing = measure_printing(cfg)
  progress("5/5 back-pressure (child process)")
  m = Measurements(steps, payload, dispatch, printing,
                   measure_backpressure(cfg))
  goals = targets(m)
  plot_per_step(m.steps, os.path.join(out_dir, "per_step.png"))
  plot_payload(m.payload, os.path.join(out_dir, "payload.png"))
  plot_dispatch(m.dispatch, os.path.join(out_dir, "dispatch.png"))
  text = report(cfg, m, goals, time.perf_counter() - start)
  with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
    f.write(text)
  return goals


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--smoke", action="store_true",
                      help="a seconds-long run for CI (numbers mean nothing)")
  parser.add_argument("--out", default=os.path.join(HERE, "results"),
                      help="where RESULTS.md and the plots go")
  parser.add_argument("--reps", type=int,
                      help="repetitions (default 5; 1 with --smoke)")
  parser.add_argument("--steps", type=int, help="scan length of item 1")
  parser.add_argument("--backpressure-worker", metavar="CONFIG",
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.backpressure_worker:
    cfg = Config(**{k: tuple(v) if isinstance(v, list) else v
                    for k, v in json.loads(args.backpressure_worker).items()})
    print(json.dumps(backpressure_worker(cfg)))
    return 0
  cfg = SMOKE if args.smoke else FULL
  if args.reps is not None:
    cfg = dataclasses.replace(cfg, reps=max(1, args.reps))
  if args.steps is not None:
    cfg = dataclasses.replace(cfg, steps=max(2, args.steps))
  goals = run(cfg, args.out)
  for t in goals:
    measured = "-" if t.value is None else f"{t.value:.2f}x"
    progress(f"{t.status}: {t.text} ({measured})")
  progress(f"wrote {os.path.join(args.out, 'RESULTS.md')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
