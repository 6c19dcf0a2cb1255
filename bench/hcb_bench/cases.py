"""Measurements 1 to 4: the per-step cost of each kind of callback in a
``lax.scan``, the payload sweep of taps, dispatch (with a print: what
JAX's and ours cost a call when the result waits for the line), printing.  What each
measures and why is in bench/README.md, "What each number means"."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import host_callback as hcb

from hcb_bench.harness import Config
from hcb_bench.harness import Counter
from hcb_bench.harness import Sample
from hcb_bench.harness import finish_callbacks
from hcb_bench.harness import scan_of
from hcb_bench.harness import time_run
from hcb_bench.native import Native


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


def measure_per_step(cfg: Config, native: Native) -> dict[str, StepResult]:
  """Item 1: seconds per scan step of every variant of
  :func:`step_variants`."""
  return measure_variants(cfg, step_variants(native))


def measure_variants(cfg: Config, variants: list[StepVariant]
                     ) -> dict[str, StepResult]:
  """Seconds per scan step of every variant, ``(t(steps) - t(1)) /
  (steps - 1)``, over a scan of ``cfg.steps`` steps.  A repetition runs
  the pair of loops ``runs`` times, enough for ``min_rep_s``; the runs of
  all variants are interleaved."""
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
        size, count, tap_device=Sample(tuple(samples["device"])),
        tap_e2e=Sample(tuple(samples["e2e"])),
        native_e2e=Sample(tuple(samples["native"])),
        memcpy=Sample(tuple(samples["memcpy"])),
        fresh_memcpy=Sample(tuple(samples["fresh"])),
        delivered=counter.n, expected=count * cfg.reps))
  return results


# ---- 3. dispatch ------------------------------------------------------------

DISPATCH_BLOCKS = 10  # blocks per repetition of the dispatch benchmark


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

  def with_print(x: jax.Array) -> jax.Array:
    y = small(x)
    hcb.debug.print("h x={}", y[0])
    return y

  def with_jax_print(x: jax.Array) -> jax.Array:
    y = small(x)
    jax.debug.print("j x={}", y[0])
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
      # Its result is ready once its line is printed, as JAX's.
      DEBUG_PRINT: jax.jit(with_print),
      JAX_DEBUG_PRINT: jax.jit(with_jax_print),
  }


DEBUG_PRINT = "`debug.print`"
JAX_DEBUG_PRINT = "`jax.debug.print`"


class NullOut:
  """A null ``sys.stdout`` for the prints of the dispatch benchmark (both
  libraries print into it)."""

  def __init__(self) -> None:
    self.lines = 0

  def write(self, text: str) -> int:
    self.lines += text.count("\n")
    return len(text)

  def flush(self) -> None:
    pass


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
  with contextlib.redirect_stdout(NullOut()):
    return _measure_dispatch(cfg, dispatch_variants(native))


def _measure_dispatch(cfg: Config,
                      variants: dict[str, Callable[[jax.Array], jax.Array]]
                      ) -> dict[str, DispatchResult]:
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

