"""RESULTS.md: the machine and versions, one line per target, a table per
measurement and, for each missed target, the numbers behind it."""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform

import jax
import numpy as np

import host_callback as hcb

from hcb_bench.backpressure import BackpressureResult
from hcb_bench.cases import DispatchResult
from hcb_bench.cases import PayloadResult
from hcb_bench.cases import PrintResult
from hcb_bench.cases import StepResult
from hcb_bench.clients import clients_section
from hcb_bench.compile_time import PAIRS
from hcb_bench.compile_time import VARIANTS as COMPILE_VARIANTS
from hcb_bench.compile_time import CompileResult
from hcb_bench.dropins import DropinResult
from hcb_bench.harness import Config
from hcb_bench.harness import MiB
from hcb_bench.harness import num
from hcb_bench.harness import size_label
from hcb_bench.per_call import CONDITIONS
from hcb_bench.per_call import KINDS as PER_CALL_KINDS
from hcb_bench.per_call import PerCallResult
from hcb_bench import sharded as sharded_mod
from hcb_bench.sharded import ShardedResult
from hcb_bench.progress_bars import ProgressResult
from hcb_bench.targets import Measurements
from hcb_bench.targets import Target
from hcb_bench.targets import part
from hcb_bench.targets import us


def gap_notes(m: Measurements, goals: list[Target]) -> list[str]:
  """This run's numbers behind each missed target, one line each; the
  causes are in bench/README.md, "What limits the missed targets"."""
  missed = {t.key for t in goals if t.status == "NOT MET"}
  notes = []
  c = m.cost
  if missed & {"tap_vs_floor", "native_tap"}:
    notes.append(
        f"- **Taps on the device thread**: `id_tap` {us(c('id_tap'))}, "
        f"native tap {us(c('native_tap'))}, floor {us(c('ffi_empty'))} per "
        "step; reading an attribute and the device ordinal: "
        f"{part(c('ffi_copy_attr_ordinal') - c('ffi_copy'))}.")
  if "native_call" in missed:
    notes.append(
        f"- **Native call**: {us(c('native_call'))} per step, floor "
        f"{us(c('ffi_empty'))}. Over the floor: a result of its own (the "
        f"copying handler) {part(c('ffi_copy') - c('ffi_empty'))}; the "
        "`callback_id` attribute, looked up by name, "
        f"{part(c('ffi_copy_attr') - c('ffi_copy'))}; the rest, the order "
        "token and libhcb's, "
        f"{part(c('native_call') - c('ffi_copy_attr'))}. "
        "`XLA_FFI_DeviceOrdinal_Get`, which it does not call, costs "
        f"{part(c('ffi_copy_attr_ordinal') - c('ffi_copy_attr'))}.")
  big = m.payload_at(64 * MiB)
  if "big_taps" in missed and big is not None:
    notes.append(
        f"- **64 MiB taps**: {num(big.tap_e2e.median)} GB/s end to end; "
        f"malloc + memcpy + free {num(big.fresh_memcpy.median)} GB/s, "
        f"memcpy into a warm buffer {num(big.memcpy.median)} GB/s.")
  if "dispatch" in missed:
    d = {name: r.dispatch.median for name, r in m.dispatch.items()}
    notes.append(
        f"- **Dispatch with a tap**: {us(d['`id_tap`'])} per call against "
        f"{us(d['no callback'])} without a callback; with a native tap "
        f"{us(d['`id_tap`, native tap'])}, with a native call "
        f"{us(d['`call`, native call'])}.")
  if "progress_default" in missed and m.progress is not None:
    r = m.progress.rows["default"]
    notes.append(
        "- **Progress bars at jax-tqdm's default rate**: "
        f"`progress.scan_tqdm` {us(r.ours.median)}, jax-tqdm "
        f"{us(r.theirs.median)} per step over a plain scan, for "
        f"{r.updates} updates in {r.steps} steps.")
  if m.per_call is not None:
    for key, our_api, jax_api in PER_CALL_KINDS:
      for condition in CONDITIONS:
        if f"per_call_{key}_{condition}" not in missed:
          continue
        row = m.per_call.seconds[condition]
        notes.append(
            f"- **One {our_api} per call, {condition}**: "
            f"{us(row[f'{key}_ours'].median)} per call against "
            f"{us(row[f'{key}_jax'].median)} for {jax_api} and "
            f"{us(row['plain'].median)} without a callback.")
  if m.sharded is not None:
    for key, label in sharded_mod.STEP_KINDS:
      if f"sharded_{key}" not in missed:
        continue
      one = m.sharded.step_added("one", key).median
      notes.append(
          f"- **{label} per step under jit over sharded operands**: "
          f"{us(m.sharded.step_added('jit', key).median)} against "
          f"{us(m.sharded.step_added('jit', 'jax').median)} for "
          f"`jax.debug.callback`; on one device it adds {us(one)}.")
  if m.dropins is not None:
    for p in m.dropins.pairs:
      if f"dropin_{p.key}" not in missed:
        continue
      ours, theirs = p.excess(m.dropins.baseline)
      ours_dev, theirs_dev = p.excess(m.dropins.baseline, e2e=False)
      notes.append(
          f"- **Drop-ins, {p.ours}**: {us(ours.median)} per step end to end "
          f"({us(ours_dev.median)} device-side) against {p.theirs}'s "
          f"{us(theirs.median)} ({us(theirs_dev.median)} device-side), over "
          "an empty step.")
  return notes


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


def progress_section(p: ProgressResult | None) -> list[str]:
  if p is None:
    return ["jax-tqdm is not installed: nothing was measured."]
  rows = [
      "A scan of `carry + 1` with a bar drawn into an `io.StringIO` "
      "(`file=`), end to end (until the bar is complete and closed). A step "
      "costs (t(N steps) − t(S steps)) / (N − S), S = `print_rate` (one "
      "update; 20 with the defaults), minus the same for the plain scan, "
      "repetition by repetition. With `print_rate=None` each library "
      "picks its rate: host_callback updates 1,000 times (the host "
      "throttles redrawing), jax-tqdm 20 times.", "",
      "| `print_rate` | steps | updates | `progress.scan_tqdm` µs/step | "
      "jax-tqdm 0.4.0 µs/step | ratio | runs with complete bars |",
      "|---|---:|---:|---:|---:|---:|---:|"]
  for r in p.rows.values():
    ratio = r.ours.ratio(r.theirs)
    rate = "`None`" if r.print_rate is None else str(r.print_rate)
    rows.append(
        f"| {r.label}: {rate} | {r.steps} | {r.updates} | "
        f"{r.ours.map(lambda v: v * 1e6).text()} | "
        f"{r.theirs.map(lambda v: v * 1e6).text()} | "
        f"{'–' if ratio is None else f'{ratio:.3f}×'} | "
        f"{r.complete}/{r.runs} |")
  return rows


def dropins_section(d: DropinResult | None) -> list[str]:
  if d is None:
    return ["Not measured."]
  us_text = lambda s: s.map(lambda v: v * 1e6).text()  # noqa: E731
  rows = [
      f"A scan of {d.steps} steps, `carry = f(carry) + 1`, where `f` calls "
      "back with the carry (a float32 scalar) and returns it: through "
      "`pure_callback` an identity function, otherwise a function that "
      "counts its calls, or a print (`\"h x={x}\"` and `\"j x={x}\"`) "
      "into a null `sys.stdout` (redirected alike for both), or a log "
      "record into a null handler of the `jax._src.debugging` logger "
      "(which both log to). Measured as section 1: a step costs "
      "(t(N steps) − t(1 step)) / (N − 1), minus the empty step, "
      "repetition by repetition; device-side until the scan's result is "
      "ready, end to end until every callback has run. The ratio is "
      "JAX's end-to-end cost over ours (the target: ≥ 20×)."
      + ("" if d.has_log else
         " This JAX has no `jax.debug.log`: `debug.log` is not measured."),
      "",
      "| drop-in | JAX | ours µs/step device-side | ours µs/step end to end "
      "| JAX µs/step device-side | JAX µs/step end to end | JAX / ours "
      "| callbacks run (ours, JAX) |",
      "|---|---|---:|---:|---:|---:|---:|---:|"]
  for p in d.pairs:
    ours, theirs = p.excess(d.baseline)
    ours_dev, theirs_dev = p.excess(d.baseline, e2e=False)
    ratio = p.speedup(d.baseline)
    run = " ".join(
        "–" if r.delivered is None else f"{r.delivered}/{r.expected}"
        for r in (p.ours_result, p.theirs_result))
    rows.append(
        f"| {p.ours} | {p.theirs} | {us_text(ours_dev)} | {us_text(ours)} | "
        f"{us_text(theirs_dev)} | {us_text(theirs)} | "
        f"{'–' if ratio is None else f'{ratio:.1f}×'} | {run} |")
  base = d.baseline
  rows += ["", f"The empty step: {us_text(base.device)} µs device-side, "
           f"{us_text(base.end_to_end)} µs end to end."]
  return rows


def per_call_section(p: PerCallResult | None) -> list[str]:
  if p is None:
    return ["Not measured."]
  us_text = lambda s: s.map(lambda v: v * 1e6).text()  # noqa: E731
  rows = [
      f"`x * 2 + 1` on f32[16], jitted, with one callback of `x` (a print "
      f"of `x[0]`) or none; {p.calls} calls per repetition and condition, "
      "each until its result is ready (its callback has run by then, "
      "ours and JAX's), in blocks of calls back to back, the blocks of all "
      "variants interleaved. Busy: beside a process the benchmark starts "
      "(a Python loop that keeps one core busy) and stops. Added: a "
      "variant's time less the function without a callback's, repetition "
      "by repetition; the ratio is what JAX's adds over what ours adds "
      "(the target: ≥ 10×).", "",
      "| callback | JAX | machine | ours µs/call | JAX µs/call | ours adds "
      "µs | JAX adds µs | JAX / ours |",
      "|---|---|---|---:|---:|---:|---:|---:|"]
  for key, ours, theirs in PER_CALL_KINDS:
    for condition in CONDITIONS:
      row = p.seconds[condition]
      ratio = p.ratio(condition, key)
      rows.append(
          f"| {ours} | {theirs} | {condition} | "
          f"{us_text(row[f'{key}_ours'])} | {us_text(row[f'{key}_jax'])} | "
          f"{us_text(p.added(condition, f'{key}_ours'))} | "
          f"{us_text(p.added(condition, f'{key}_jax'))} | "
          f"{'–' if ratio is None else f'{ratio:.1f}×'} |")
  rows += ["", "Without a callback: " + ", ".join(
      f"{us_text(p.seconds[c]['plain'])} µs per call {c}"
      for c in CONDITIONS) + "."]
  return rows


def sharded_section(r: ShardedResult | None) -> list[str]:
  if r is None:
    return ["Not measured."]
  us_text = lambda s: s.map(lambda v: v * 1e6).text()  # noqa: E731
  ratio_text = lambda v: (  # noqa: E731
      "–" if v is None else "∞" if math.isinf(v) else f"{v:.1f}×")
  rows = [
      f"In child processes with {sharded_mod.DEVICES} CPU devices. "
      f"**Per step**: a `lax.scan` of {r.steps} steps whose step calls "
      "back with `jnp.sum` of its f32[4, 8] carry and uses the result "
      "(`carry * 0.5 + s * 1e-3`): on one device; under `shard_map` over "
      "the devices (each device's callback of its own shard's sum); under "
      "jit over the carry sharded across them (one callback of the whole "
      "sum, which the devices share: the function runs once, on "
      "`device_index`). Until every callback has run. Added: the scan's "
      "time per step less that of the same scan using the sum without a "
      "callback (so the collective the sum needs is the baseline's too), "
      f"repetition by repetition, over {r.step_reps} repetitions, each of "
      "which runs every scan once in an order of its own (shuffled). The "
      "ratio is what `jax.debug.callback` adds there (the median) over an "
      "upper bound of what ours adds (95%: of the medians of bootstrap "
      "resamples of its repetitions), the target under jit over sharded "
      "operands ≥ 20×; ∞ where that bound is at or below zero (nothing "
      "measurable): under jit over sharded operands what a callback adds is "
      "as small as the noise of the collective each step holds, and the "
      "scan with one of ours can run faster than the one without (why is "
      "not established).",
      "",
      "| callback | " + " | ".join(
          f"{label}: adds µs/step | ratio" for _, label in
          sharded_mod.PLACES) + " |",
      "|---|" + "---:|---:|" * len(sharded_mod.PLACES)]
  for key, label in (*sharded_mod.STEP_KINDS,
                     ("jax", "`jax.debug.callback` (JAX)")):
    cells = []
    for place, _ in sharded_mod.PLACES:
      cells.append(us_text(r.step_added(place, key)))
      cells.append("" if key == "jax" else ratio_text(
          r.step_ratio(place, key)))
    rows.append(f"| {label} | " + " | ".join(cells) + " |")
  rows += ["", "The scans without a callback: " + ", ".join(
      f"{us_text(r.step_seconds[place]['baseline'])} µs per step {label}"
      for place, label in sharded_mod.PLACES) + ".", "",
      f"**Per call**: as section 10 (one callback per jitted call, "
      f"{r.calls} calls per repetition and condition), on f32[64] sharded "
      "across the devices. Such a program of ours is dispatched by JAX's "
      "Python path, paced (see the unwaited loops below and "
      "docs/runtime.md): that path, not the callback, is most of what "
      "ours adds per call here.", "",
      "| callback | JAX | machine | ours adds µs | JAX adds µs | JAX / "
      "ours |", "|---|---|---|---:|---:|---:|"]
  for key, ours, theirs in sharded_mod.CALL_KINDS:
    for condition in CONDITIONS:
      rows.append(
          f"| {ours} | {theirs} | {condition} | "
          f"{us_text(r.call_added(condition, f'{key}_ours'))} | "
          f"{us_text(r.call_added(condition, f'{key}_jax'))} | "
          f"{ratio_text(r.call_ratio(condition, key))} |")
  rows += ["", "Without a callback: " + ", ".join(
      f"{us_text(r.call_seconds[c]['plain'])} µs per call {c}"
      for c in CONDITIONS) + ".", "",
      f"**Unwaited dispatch**: {r.unwaited_calls} calls of a jitted "
      "function of f32[64] sharded across the devices, dispatched without "
      "waiting for a result, then the last one waited for; each in a "
      f"process of its own, stuck when it has not finished in "
      f"{r.unwaited_timeout_s:g} s or XLA aborted it.", "",
      "| program | finished |", "|---|---|"]
  for key, label in sharded_mod.UNWAITED:
    seconds = r.unwaited[key]
    rows.append(f"| {label} | "
                f"{'stuck' if seconds is None else f'in {seconds:.2f} s'} |")
  return rows


def compile_section(c: CompileResult | None) -> list[str]:
  if c is None:
    return ["Not measured."]
  names = [(key, name) for key, name, _ in COMPILE_VARIANTS]
  rows = [
      "Seconds to trace, lower and compile a fresh `jax.jit` of a function "
      "of a list of float32 scalars (`jit(f).lower(t).compile()`), for "
      "each number of leaves; the variants of one size interleaved. Ours "
      "are compared with `jax.debug.callback` of the same leaves and the "
      "same outputs (none, or the leaves).", "",
      "| leaves | " + " | ".join(name for _, name in names) +
      " | ours / JAX's |",
      "|---:|" + "---:|" * (len(names) + 1)]
  for n in c.leaves:
    ratios = ", ".join(
        f"{key}: {'–' if c.ratio(key, n) is None else f'{c.ratio(key, n):.2f}×'}"
        for key in PAIRS)
    rows.append(f"| {n} | " + " | ".join(
        c.seconds[n][key].text() for key, _ in names) + f" | {ratios} |")
  return rows


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
      f"- Machine: {machine()}; one JAX CPU device (section 11: "
      f"{sharded_mod.DEVICES}, in child processes)",
      f"- Software: {versions}",
      f"- Every number is the median of {cfg.reps} repetitions, with "
      "[min–max]; the repetitions of all variants are interleaved; a ratio "
      "is the median of the ratios of the repetitions (each measured in "
      "one round), all within this run; section 11's per-step part has "
      "repetitions and a ratio of its own (see there).",
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
      "## 6. Progress bars", "",
      *progress_section(m.progress), "",
      "## 7. Drop-ins against JAX's callbacks", "",
      *dropins_section(m.dropins), "",
      "## 8. Compile time against the number of leaves tapped", "",
      *compile_section(m.compile_time), "",
      "## 9. Client libraries, patched against unpatched", "",
      *clients_section(m.clients), "",
      "## 10. One callback per call, idle and beside a busy process", "",
      *per_call_section(m.per_call), "",
      "## 11. Under jit over sharded operands", "",
      *sharded_section(m.sharded), "",
  ]
  if notes:
    lines += ["## What limits the missed targets", "",
              "This run's numbers for each missed target; what limits it, "
              "as profiles of these loops showed, and what was tried are in "
              "bench/README.md under the same names.", "", *notes, ""]
  return "\n".join(lines)

