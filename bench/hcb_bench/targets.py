"""The targets of issues 8 and 19, each a ratio of two things this run measured
(the list and what each ratio compares: bench/README.md, "Targets")."""

from __future__ import annotations

import dataclasses
import math

from hcb_bench.backpressure import BackpressureResult
from hcb_bench.cases import DEBUG_PRINT
from hcb_bench.cases import JAX_DEBUG_PRINT
from hcb_bench.cases import DispatchResult
from hcb_bench.cases import PayloadResult
from hcb_bench.cases import PrintResult
from hcb_bench.cases import StepResult
from hcb_bench.clients import ClientsResult
from hcb_bench.compile_time import CompileResult
from hcb_bench.compile_time import VARIANTS as COMPILE_VARIANTS
from hcb_bench.dropins import DropinResult
from hcb_bench.harness import MiB
from hcb_bench.harness import Sample
from hcb_bench.harness import num
from hcb_bench.per_call import KINDS as PER_CALL_KINDS
from hcb_bench.per_call import PerCallResult
from hcb_bench.sharded import STEP_KINDS as SHARDED_KINDS
from hcb_bench.sharded import ShardedResult
from hcb_bench.progress_bars import ProgressResult


@dataclasses.dataclass(frozen=True)
class Measurements:
  """Everything one run measured."""

  steps: dict[str, StepResult]
  payload: list[PayloadResult]
  dispatch: dict[str, DispatchResult]
  printing: PrintResult | None
  backpressure: BackpressureResult
  progress: ProgressResult | None = None
  dropins: DropinResult | None = None
  compile_time: CompileResult | None = None
  clients: ClientsResult | None = None
  per_call: PerCallResult | None = None
  sharded: ShardedResult | None = None

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

  key: str             # names the target in report.gap_notes
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
    if self.value is None:
      measured = "not measured"
    elif math.isinf(self.value):
      measured = "measured **∞** (nothing measurable over the baseline)"
    else:
      measured = f"measured **{self.value:.{digits}f}×**"
    return f"- **{self.status}** — {self.text}: {measured} ({self.detail})"


def us(seconds: float) -> str:
  return f"{num(seconds * 1e6)} µs"


def part(seconds: float) -> str:
  """A difference of two medians: ``us``, or "nothing measurable"."""
  return us(seconds) if seconds > 0.0005e-6 else "nothing measurable"


def targets(m: Measurements) -> list[Target]:
  """Every target.  Ratios are medians of the per-repetition ratios
  (section 11's per step: ShardedResult.step_ratio); the
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
  printed, jax_printed = m.dispatch[DEBUG_PRINT], m.dispatch[JAX_DEBUG_PRINT]
  out.append(Target(
      "dispatch_print", "a jitted function with one `debug.print` costs ≤ "
      "0.5× the same with `jax.debug.print` per call, until its result is "
      "ready (its line printed, for both)",
      printed.dispatch.ratio(jax_printed.dispatch), 0.5, False,
      f"{us(printed.dispatch.median)} vs {us(jax_printed.dispatch.median)} "
      f"per call; {us(none.dispatch.median)} without a print"))
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
  out += progress_targets(m.progress)
  out += dropin_targets(m.dropins)
  out += compile_targets(m.compile_time)
  out += per_call_targets(m.per_call)
  out += sharded_targets(m.sharded)
  return out


def sharded_targets(r: ShardedResult | None) -> list[Target]:
  """Issue 35: per scan step under jit over operands sharded across 4
  devices, each of our callbacks adds at most 1/20 of what
  ``jax.debug.callback`` adds there (the ratio ≥ 20)."""
  out = []
  for key, label in SHARDED_KINDS:
    text = (f"{label} per step under jit over sharded operands adds ≤ "
            "1/20 of what `jax.debug.callback` adds")
    if r is None:
      out.append(Target(f"sharded_{key}", text, None, 20.0, True,
                        "not measured"))
      continue
    mine = r.step_added("jit", key)
    theirs = r.step_added("jit", "jax")
    base = r.step_seconds["jit"]["baseline"]
    out.append(Target(
        f"sharded_{key}", text, r.step_ratio("jit", key), 20.0, True,
        f"{us(mine.median)}, 95% bound {us(r.step_bound('jit', key))}, vs "
        f"{us(theirs.median)} per step over the scan using the value "
        f"without a callback ({us(base.median)})"))
  return out


def per_call_targets(p: PerCallResult | None) -> list[Target]:
  """Issue 34: one drop-in callback per jitted call adds at most 0.1× what
  JAX's adds, until the result is ready, on an idle machine and beside a
  busy process (the ratio, JAX's over ours, ≥ 10)."""
  out = []
  for key, ours, theirs in PER_CALL_KINDS:
    for condition, where in (("idle", "on an idle machine"),
                             ("busy", "beside a busy process")):
      text = (f"one {ours} per jitted call adds ≤ 0.1× what {theirs} adds, "
              f"{where}")
      if p is None:
        out.append(Target(f"per_call_{key}_{condition}", text, None, 10.0,
                          True, "not measured"))
        continue
      mine = p.added(condition, f"{key}_ours")
      jax_added = p.added(condition, f"{key}_jax")
      plain = p.seconds[condition]["plain"]
      out.append(Target(
          f"per_call_{key}_{condition}", text, p.ratio(condition, key), 10.0,
          True, f"{us(mine.median)} vs {us(jax_added.median)} per call over "
          f"the function without a callback ({us(plain.median)})"))
  return out


def compile_targets(c: CompileResult | None) -> list[Target]:
  """Issue 28: compile time within 2× of JAX's from 1 to 10,000 tapped
  leaves: the largest ratio over the numbers of leaves measured, against
  ``jax.debug.callback`` of the same leaves with the same outputs."""
  names = {key: name for key, name, _ in COMPILE_VARIANTS}
  out = []
  for ours, theirs in (("id_tap", "jax_debug_callback"),
                       ("debug_callback", "jax_debug_callback"),
                       ("id_tap_identity", "jax_debug_callback_identity")):
    text = (f"compile time of {names[ours]} ≤ 2× {names[theirs]}'s, at "
            "every number of scalar leaves")
    if c is None:
      out.append(Target(f"compile_{ours}", text, None, 2.0, False,
                        "not measured"))
      continue
    worst, n = c.worst(ours)
    row = c.seconds[n]
    out.append(Target(
        f"compile_{ours}", text, worst, 2.0, False,
        f"the largest at {n} leaves: {num(row[ours].median)} s vs "
        f"{num(row[theirs].median)} s; leaves measured: "
        f"{', '.join(str(k) for k in c.leaves)}"))
  return out


def progress_targets(p: ProgressResult | None) -> list[Target]:
  """Issue 19: a progress bar per step ≤ 0.2× jax-tqdm 0.4.0's, at the same
  print_rate (10,000 updates, as the issue measured, and jax-tqdm's default
  of 20) and with an update every step."""
  out = []
  for key, text in (
      ("updates", "at the same `print_rate`, 10,000 updates"),
      ("default", "at the same `print_rate`, jax-tqdm's default (20 "
       "updates)"),
      ("every", "with an update every step")):
    full = (f"`progress.scan_tqdm` per-step cost ≤ 0.2× jax-tqdm 0.4.0's, "
            f"{text}")
    if p is None:
      out.append(Target(f"progress_{key}", full, None, 0.2, False,
                        "jax-tqdm not installed"))
      continue
    row = p.rows[key]
    out.append(Target(
        f"progress_{key}", full, row.ours.ratio(row.theirs), 0.2, False,
        f"{us(row.ours.median)} vs {us(row.theirs.median)} per step over a "
        f"plain scan; {row.updates} updates in {row.steps} steps"))
  return out



# The drop-ins of issue 19 and their JAX counterparts, as the targets name
# them; debug.log only where JAX has jax.debug.log.
DROPINS = (
    ("pure_callback", "`pure_callback`", "`jax.pure_callback`"),
    ("io_callback", "`io_callback(ordered=False)`",
     "`jax.experimental.io_callback(ordered=False)`"),
    ("io_callback_ordered", "`io_callback(ordered=True)`",
     "`jax.experimental.io_callback(ordered=True)`"),
    ("debug_callback", "`debug.callback`", "`jax.debug.callback`"),
    ("debug_print", "`debug.print`", "`jax.debug.print`"),
    ("debug_log", "`debug.log`", "`jax.debug.log`"),
)


def dropin_targets(d: DropinResult | None) -> list[Target]:
  """Issue 19: each drop-in ≥ 20× faster per step than its JAX counterpart
  (ours ≤ 0.05× JAX's), end to end in a scan; the ratio is JAX's cost over
  ours.  ``debug.log`` only where this JAX has ``jax.debug.log``."""
  out = []
  by_key = {} if d is None else {p.key: p for p in d.pairs}
  for key, ours, theirs in DROPINS:
    if d is not None and key == "debug_log" and not d.has_log:
      continue
    text = (f"host_callback's {ours} ≥ 20× faster per step than {theirs} "
            "(end to end, in a scan)")
    pair = by_key.get(key)
    if d is None or pair is None:
      out.append(Target(f"dropin_{key}", text, None, 20.0, True,
                        "not measured"))
      continue
    mine, jax_cost = pair.excess(d.baseline)
    out.append(Target(
        f"dropin_{key}", text, pair.speedup(d.baseline), 20.0, True,
        f"{us(mine.median)} vs {us(jax_cost.median)} per step over an "
        f"empty step, {d.steps} steps; ours "
        f"{mine.median / jax_cost.median:.3f}× JAX's"))
  return out
