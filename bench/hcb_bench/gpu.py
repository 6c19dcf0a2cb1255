"""``make bench-gpu``: the GPU targets of issue 18, each a ratio against
JAX's (or CUDA's) counterpart measured in the same run, written to
RESULTS-gpu.md with the GPU's name (what each number means:
bench/README.md, "GPU").

Every quantity is measured once per repetition, the variants of one
measurement interleaved in each repetition (so that a slow moment of the
machine slows all of them); ratios are medians of the per-repetition
ratios.  CuPy (preinstalled on the GPU machines) gives the pinned
``cudaMemcpy`` baseline and the buffer callbacks' views.

On a machine without a GPU, ``--smoke`` runs every measurement on the CPU
with host stand-ins (numpy for CuPy) so that the code is exercised; those
numbers mean nothing and the report says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import buffer_callback as jax_buffer_callback

import host_callback as hcb

from hcb_bench.harness import BENCH_DIR
from hcb_bench.harness import MiB
from hcb_bench.harness import Counter
from hcb_bench.harness import Sample
from hcb_bench.harness import finish_callbacks
from hcb_bench.harness import num
from hcb_bench.harness import progress
from hcb_bench.harness import size_label
from hcb_bench.native import Native
from hcb_bench.targets import Target
from hcb_bench.targets import us


@dataclasses.dataclass(frozen=True)
class GpuConfig:
  """How much of everything to run."""

  smoke: bool
  reps: int              # repetitions of every measurement
  small_steps: int       # scan length of the small-kernel scans
  small_size: int        # float32 elements of their carry
  call_steps: int        # scan length of the call / buffer_callback scans
  matmul_n: int          # the matmuls are n x n float32
  matmul_steps: int      # scan length of the matmul scans
  tap_sizes: tuple[int, ...]  # bytes per tap of the bandwidth measurement
  tap_bytes: int         # bytes tapped per repetition of one size


FULL = GpuConfig(smoke=False, reps=7, small_steps=2000, small_size=256,
                 call_steps=1000, matmul_n=4096, matmul_steps=50,
                 tap_sizes=(4 * MiB, 64 * MiB), tap_bytes=1024 * MiB)
SMOKE = GpuConfig(smoke=True, reps=1, small_steps=50, small_size=256,
                  call_steps=50, matmul_n=256, matmul_steps=4,
                  tap_sizes=(4 * MiB, 64 * MiB), tap_bytes=128 * MiB)


def load_cupy() -> Any:
  """CuPy, or None where it is not installed (typed Any: no stubs)."""
  try:
    return importlib.import_module("cupy")
  except ImportError:
    return None


def on_gpu() -> bool:
  return jax.default_backend() == "gpu"


# ---- timing -------------------------------------------------------------

def seconds(fn: Callable[[], Any], *, e2e: bool = False) -> float:
  """Seconds of one call of ``fn`` until its result is ready (device-side)
  or, with ``e2e``, until every callback it started has run too."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  if e2e:
    finish_callbacks()
  return time.perf_counter() - start


def interleaved(runs: dict[str, Callable[[], float]], reps: int
                ) -> dict[str, Sample]:
  """Each run once per repetition, in turn; a warm-up round first."""
  for run in runs.values():
    run()
  values: dict[str, list[float]] = {k: [] for k in runs}
  for _ in range(reps):
    for k, run in runs.items():
      values[k].append(run())
  return {k: Sample(tuple(v)) for k, v in values.items()}


def device_timer(fn: Callable[[jax.Array], jax.Array], x: jax.Array
                 ) -> Callable[[], float]:
  """A run for :func:`interleaved`: device-side seconds of ``fn(x)``."""
  return lambda: seconds(lambda: fn(x))


def per_step(sample: Sample, base: Sample, steps: int) -> Sample:
  """(time with the callback - time without) / steps, per repetition."""
  return sample.minus(base).map(lambda s: s / steps)


def scan(body: Callable[[jax.Array], jax.Array], steps: int
         ) -> Callable[[jax.Array], jax.Array]:
  """A jitted ``lax.scan`` of ``steps`` steps of ``body`` on the carry."""

  def run(x: jax.Array) -> jax.Array:
    return jax.lax.scan(lambda c, _: (body(c), None), x, None,
                        length=steps)[0]

  return jax.jit(run)


# ---- the measurements ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Seconds per step over the baseline scan, per variant."""

  steps: int
  base: Sample                # seconds per whole baseline scan
  costs: dict[str, Sample]
  delivered: dict[str, int]   # callbacks run, where counted
  expected: int               # callbacks each counted variant should run


def measure_small_kernels(cfg: GpuConfig) -> StepCosts:
  """Target 1: id_tap and jax.debug.callback in a scan of small kernels
  (elementwise on a small carry), each tapping the carry every step."""
  tap, debug = Counter(), Counter()

  def kernel(c: jax.Array) -> jax.Array:
    return jnp.cos(c) * 0.5 + 0.25

  def with_tap(c: jax.Array) -> jax.Array:
    return kernel(hcb.id_tap(tap.tap, c))

  def with_debug(c: jax.Array) -> jax.Array:
    jax.debug.callback(debug.effect, c)
    return kernel(c)

  x = jnp.zeros(cfg.small_size, jnp.float32)
  fns = {"base": scan(kernel, cfg.small_steps),
         "id_tap": scan(with_tap, cfg.small_steps),
         "debug_callback": scan(with_debug, cfg.small_steps)}
  samples = interleaved(
      {k: device_timer(f, x) for k, f in fns.items()},
      cfg.reps)
  finish_callbacks()
  base = samples.pop("base")
  return StepCosts(cfg.small_steps, base,
                   {k: per_step(s, base, cfg.small_steps)
                    for k, s in samples.items()},
                   {"id_tap": tap.n, "debug_callback": debug.n},
                   (cfg.reps + 1) * cfg.small_steps)


@dataclasses.dataclass(frozen=True)
class MatmulResult:
  """Seconds of the matmul scan without and with a 4-byte tap per step
  (end to end: the taps delivered too)."""

  n: int
  steps: int
  plain: Sample
  tapped: Sample
  delivered: int
  expected: int


def measure_matmul(cfg: GpuConfig) -> MatmulResult:
  """Target 2: a scan of n x n matmuls, with and without a 4-byte tap of
  one element every step."""
  counter = Counter()
  key = jax.random.key(0)
  w = jax.random.normal(key, (cfg.matmul_n, cfg.matmul_n), jnp.float32)
  w = w / np.sqrt(cfg.matmul_n)

  def step(c: jax.Array) -> jax.Array:
    return jnp.tanh(c @ w)

  def tapped_step(c: jax.Array) -> jax.Array:
    c = step(c)
    hcb.id_tap(counter.tap, c[0, 0])  # 4 bytes; kept although unused
    return c

  x = jnp.ones((cfg.matmul_n, cfg.matmul_n), jnp.float32)
  plain, tapped = scan(step, cfg.matmul_steps), scan(tapped_step,
                                                     cfg.matmul_steps)
  samples = interleaved(
      {"plain": lambda: seconds(lambda: plain(x), e2e=True),
       "tapped": lambda: seconds(lambda: tapped(x), e2e=True)}, cfg.reps)
  return MatmulResult(cfg.matmul_n, cfg.matmul_steps, samples["plain"],
                      samples["tapped"], counter.n,
                      (cfg.reps + 1) * cfg.matmul_steps)


@dataclasses.dataclass(frozen=True)
class BandwidthResult:
  """GB/s at one tap size: taps end to end, and the pinned memcpy."""

  size: int
  taps: int
  tap: Sample
  memcpy: Sample
  delivered: int
  expected: int


def memcpy_run(cupy: Any, size: int, count: int) -> Callable[[], float]:
  """GB/s of ``count`` device-to-host ``cudaMemcpy`` of ``size`` bytes into
  pinned memory (on the CPU: numpy copies between host buffers)."""
  if cupy is None:
    src_h, dst_h = np.ones(size, np.uint8), np.zeros(size, np.uint8)

    def host_copies() -> float:
      start = time.perf_counter()
      for _ in range(count):
        np.copyto(dst_h, src_h)
      return size * count / (time.perf_counter() - start) / 1e9

    return host_copies
  src = cupy.ones(size, cupy.uint8)
  pinned = cupy.cuda.alloc_pinned_memory(size)
  d2h = cupy.cuda.runtime.memcpyDeviceToHost

  def copies() -> float:
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(count):
      cupy.cuda.runtime.memcpy(pinned.ptr, src.data.ptr, size, d2h)
    cupy.cuda.Device().synchronize()
    return size * count / (time.perf_counter() - start) / 1e9

  return copies


def measure_bandwidth(cfg: GpuConfig, cupy: Any) -> list[BandwidthResult]:
  """Target 3: GB/s of taps of 4 MiB and 64 MiB, end to end (from the call
  until the tap function has run for every tap), against pinned
  ``cudaMemcpy`` device to host."""
  results = []
  for size in cfg.tap_sizes:
    count = max(1, cfg.tap_bytes // size)
    counter = Counter()

    def loop(x: jax.Array, counter: Counter = counter) -> jax.Array:
      return jax.lax.scan(lambda c, _: (hcb.id_tap(counter.tap, c), None),
                          x, None, length=count)[0]

    taps = jax.jit(loop, donate_argnums=0)

    def tap_run(taps: Any = taps, size: int = size, count: int = count
                ) -> float:
      x = jnp.zeros(size // 4, jnp.float32).block_until_ready()
      return size * count / seconds(lambda: taps(x), e2e=True) / 1e9

    samples = interleaved({"tap": tap_run,
                           "memcpy": memcpy_run(cupy, size, count)},
                          cfg.reps)
    results.append(BandwidthResult(size, count, samples["tap"],
                                   samples["memcpy"], counter.n,
                                   (cfg.reps + 1) * count))
  return results


def buffer_touch(cupy: Any) -> Callable[..., None]:
  """The buffer callbacks of target 5: what every real callback does before
  its kernels -- read XLA's stream and view the result -- and no more, so
  that the two differ only in how they are called.  The result aliases the
  operand, so it is the identity."""
  if cupy is None or not on_gpu():
    def touch_host(ctx: Any, out: Any, x: Any) -> None:
      del ctx, x
      np.asarray(out)
    return touch_host

  def touch(ctx: Any, out: Any, x: Any) -> None:
    del x
    with cupy.cuda.ExternalStream(ctx.stream):
      cupy.from_dlpack(out)  # on XLA's stream: nothing to synchronise
  return touch


def measure_calls(cfg: GpuConfig, cupy: Any,
                  native: hcb.NativeCallback | None) -> StepCosts:
  """Targets 4 and 5 (and the options of ``call``): per-step cost of
  synchronous callbacks of a 4-byte value in a scan, over the scan
  without."""
  spec = jax.ShapeDtypeStruct((), jnp.float32)
  c = {k: Counter() for k in ("call", "pure", "device")}

  def with_device(x: Any, *, device: Any) -> Any:
    del device
    return c["device"].identity(x)

  touch = buffer_touch(cupy)
  bodies: dict[str, Callable[[jax.Array], jax.Array]] = {
      "base": lambda x: x + 1,
      "call": lambda x: hcb.call(c["call"].identity, x, result_shape=spec) + 1,
      "pure_callback": lambda x: jax.pure_callback(
          c["pure"].identity, spec, x) + 1,
      "buffer_callback": lambda x: hcb.buffer_callback(
          touch, spec, input_output_aliases={0: 0})(x) + 1,
      "jax_buffer_callback": lambda x: jax_buffer_callback.buffer_callback(
          touch, spec, input_output_aliases={0: 0})(x) + 1,
      "call_with_device": lambda x: hcb.call(
          with_device, x, result_shape=spec, call_with_device=True) + 1,
  }
  if native is not None:
    bodies["native_call"] = lambda x: hcb.call(
        native, x, result_shape=spec) + 1
  x = jnp.zeros((), jnp.float32)
  fns = {k: scan(b, cfg.call_steps) for k, b in bodies.items()}
  samples = interleaved(
      {k: device_timer(f, x) for k, f in fns.items()},
      cfg.reps)
  finish_callbacks()
  base = samples.pop("base")
  return StepCosts(cfg.call_steps, base,
                   {k: per_step(s, base, cfg.call_steps)
                    for k, s in samples.items()},
                   {"call": c["call"].n, "pure_callback": c["pure"].n,
                    "call_with_device": c["device"].n},
                   (cfg.reps + 1) * cfg.call_steps)


# ---- targets and report --------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GpuMeasurements:
  """Everything one run measured."""

  small: StepCosts
  matmul: MatmulResult
  bandwidth: list[BandwidthResult]
  calls: StepCosts


def gpu_targets(m: GpuMeasurements) -> list[Target]:
  """The five targets of issue 18 (the bandwidth one per size)."""
  small, calls = m.small.costs, m.calls.costs
  out = [
      Target("tap_vs_debug",
             "`id_tap` device-side cost per step in a `lax.scan` of small "
             "kernels ≤ 0.1× `jax.debug.callback`'s",
             small["id_tap"].ratio(small["debug_callback"]), 0.1, False,
             f"{us(small['id_tap'].median)} vs "
             f"{us(small['debug_callback'].median)} per step"),
      Target("matmul_tap",
             f"a scan of {m.matmul.n}×{m.matmul.n} matmuls with a 4-byte tap "
             "every step ≤ 1.1× the same scan without taps",
             m.matmul.tapped.ratio(m.matmul.plain), 1.1, False,
             f"{us(m.matmul.tapped.median / m.matmul.steps)} vs "
             f"{us(m.matmul.plain.median / m.matmul.steps)} per step, end "
             "to end"),
  ]
  for b in m.bandwidth:
    out.append(Target(
        f"bandwidth_{b.size}",
        f"{size_label(b.size)} taps ≥ 0.8× pinned `cudaMemcpy` "
        "device-to-host bandwidth, end to end", b.tap.ratio(b.memcpy), 0.8,
        True, f"{num(b.tap.median)} GB/s vs {num(b.memcpy.median)} GB/s"))
  out += [
      Target("call_vs_pure",
             "`call` with a Python function ≤ 0.5× `jax.pure_callback` per "
             "call", calls["call"].ratio(calls["pure_callback"]), 0.5, False,
             f"{us(calls['call'].median)} vs "
             f"{us(calls['pure_callback'].median)} per call"),
      Target("buffer_vs_jax",
             "`buffer_callback` ≤ 1.0× JAX's `buffer_callback` per call",
             calls["buffer_callback"].ratio(calls["jax_buffer_callback"]),
             1.0, False,
             f"{us(calls['buffer_callback'].median)} vs "
             f"{us(calls['jax_buffer_callback'].median)} per call"),
  ]
  return out


CALL_LABELS = {
    "call": "`call`, Python function",
    "pure_callback": "`jax.pure_callback`",
    "buffer_callback": "`buffer_callback` (reads ctx.stream, views out)",
    "jax_buffer_callback": "JAX's `buffer_callback` (the same callback)",
    "call_with_device": "`call(call_with_device=True)`, Python function",
    "native_call": "`call`, native function that copies its argument",
}


def machine_lines() -> list[str]:
  """The GPU, the host and the versions."""
  dev = jax.devices()[0]
  lines = [f"- Device: **{dev.device_kind}** ({dev.platform}, "
           f"{jax.device_count()} device(s))",
           f"- Host: {platform.machine()}, {os.cpu_count()} CPUs, Python "
           f"{platform.python_version()}",
           f"- jax {jax.__version__}, numpy {np.__version__}, host_callback "
           f"{hcb.__version__}"]
  cupy = load_cupy()
  if cupy is not None:
    with contextlib.suppress(Exception):
      lines.append(f"- CuPy {cupy.__version__}, CUDA runtime "
                   f"{cupy.cuda.runtime.runtimeGetVersion()}, driver "
                   f"{cupy.cuda.runtime.driverGetVersion()}")
  return lines


def delivered(n: int, expected: int) -> str:
  return f"{n}/{expected}" + ("" if n == expected else " **(lost some)**")


def report(cfg: GpuConfig, m: GpuMeasurements, goals: list[Target],
           elapsed: float) -> str:
  """RESULTS-gpu.md."""
  lines = ["# host_callback GPU benchmark results", ""]
  if not on_gpu():
    lines += ["**A dry run on the CPU (`--smoke` without a GPU): the code "
              "ran, the numbers mean nothing.**", ""]
  elif cfg.smoke:
    lines += ["**A smoke run: the numbers mean nothing.**", ""]
  lines += machine_lines()
  now = datetime.datetime.now(datetime.timezone.utc)
  lines += [f"- {now:%Y-%m-%d %H:%M} UTC; {cfg.reps} repetitions; "
            f"{elapsed:.0f} s", "",
            "## Targets", ""]
  lines += [t.line() for t in goals]
  lines += ["", "## Per-step cost in a scan of small kernels", "",
            f"{m.small.steps} steps of elementwise kernels on a float32"
            f"[{cfg.small_size}] carry; the baseline scan takes "
            f"{us(m.small.base.median)}.", "",
            "| variant | µs per step over the baseline | callbacks run |",
            "|---|---|---|"]
  for k, label in (("id_tap", "`id_tap`"),
                   ("debug_callback", "`jax.debug.callback`")):
    lines.append(f"| {label} | {m.small.costs[k].map(lambda s: s * 1e6).text()}"
                 f" | {delivered(m.small.delivered[k], m.small.expected)} |")
  mm = m.matmul
  lines += ["", "## Matmul scan with a 4-byte tap per step", "",
            "| variant | ms per scan, end to end | taps run |", "|---|---|---|",
            f"| {mm.steps} matmuls {mm.n}×{mm.n} | "
            f"{mm.plain.map(lambda s: s * 1e3).text()} | - |",
            f"| the same with a tap per step | "
            f"{mm.tapped.map(lambda s: s * 1e3).text()} | "
            f"{delivered(mm.delivered, mm.expected)} |",
            "", "## Tap bandwidth", "",
            "| tap size | taps | taps, GB/s end to end | pinned cudaMemcpy "
            "D2H, GB/s | taps run |", "|---|---|---|---|---|"]
  for b in m.bandwidth:
    lines.append(f"| {size_label(b.size)} | {b.taps} | {b.tap.text()} | "
                 f"{b.memcpy.text()} | {delivered(b.delivered, b.expected)} |")
  lines += ["", "## Synchronous callbacks per call", "",
            f"{m.calls.steps} steps, a float32 scalar each; the baseline scan "
            f"takes {us(m.calls.base.median)}.", "",
            "| variant | µs per call over the baseline | callbacks run |",
            "|---|---|---|"]
  for k, s in m.calls.costs.items():
    n = m.calls.delivered.get(k)
    lines.append(f"| {CALL_LABELS[k]} | {s.map(lambda v: v * 1e6).text()} | "
                 f"{'-' if n is None else delivered(n, m.calls.expected)} |")
  lines += ["", "Numbers are medians [min–max] over the repetitions; ratios "
            "are medians of the per-repetition ratios.  What each measures: "
            "bench/README.md, \"GPU\".", ""]
  return "\n".join(lines)


GPU_NATIVE_SOURCE = os.path.join(BENCH_DIR, "native", "bench_native_gpu.cu")


def gpu_native_call(build_dir: str) -> hcb.NativeCallback:
  """native/bench_native_gpu.cu built with nvcc against the installed
  package: a native call on a GPU gets XLA's device buffers and copies on
  XLA's stream."""
  flags = subprocess.run(
      [sys.executable, "-m", "host_callback", "--cflags", "--libs"],
      capture_output=True, text=True, check=True).stdout.split()
  # nvcc hands -Wl,... to the host linker through -Xlinker.
  flags = [f for flag in flags for f in (
      ["-Xlinker", flag[4:].replace(",", "=", 1)] if flag.startswith("-Wl,")
      else [flag])]
  path = os.path.join(build_dir, "libhcb_bench_gpu.so")
  cmd = ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", GPU_NATIVE_SOURCE,
         *flags, "-o", path]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}"
                       f"{done.stderr}")
  return hcb.native_call(ctypes.CDLL(path).hcb_bench_gpu_copy_call)


@contextlib.contextmanager
def native_call_or_none() -> Iterator[hcb.NativeCallback | None]:
  """The copying native call of the call table: on a GPU
  native/bench_native_gpu.cu's (built with nvcc), on the CPU
  native/bench_native.c's; None (the row left out) where it cannot be
  built."""
  with tempfile.TemporaryDirectory(prefix="hcb-bench-gpu-") as build_dir:
    native: hcb.NativeCallback | None = None
    try:
      if not on_gpu():
        native = Native(build_dir).call
      elif shutil.which("nvcc") is None:
        progress("no native call row: nvcc is not installed")
      else:
        native = gpu_native_call(build_dir)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
      progress(f"no native call row: {e}")
    yield native


def run(cfg: GpuConfig, out_dir: str) -> list[Target]:
  """Every measurement, then RESULTS-gpu.md in ``out_dir``."""
  os.makedirs(out_dir, exist_ok=True)
  cupy = load_cupy() if on_gpu() else None
  start = time.perf_counter()
  progress("gpu 1/4 small-kernel scan: id_tap vs jax.debug.callback")
  small = measure_small_kernels(cfg)
  progress("gpu 2/4 matmul scan with and without taps")
  matmul = measure_matmul(cfg)
  progress("gpu 3/4 tap bandwidth vs pinned cudaMemcpy")
  bandwidth = measure_bandwidth(cfg, cupy)
  progress("gpu 4/4 call, pure_callback, buffer_callback")
  with native_call_or_none() as native:
    calls = measure_calls(cfg, cupy, native)
  m = GpuMeasurements(small, matmul, bandwidth, calls)
  goals = gpu_targets(m)
  with open(os.path.join(out_dir, "RESULTS-gpu.md"), "w") as f:
    f.write(report(cfg, m, goals, time.perf_counter() - start))
  return goals


def main(smoke: bool, out_dir: str, reps: int | None = None) -> int:
  """``bench/run.py --gpu``: refuses a full run without a GPU."""
  if not on_gpu() and not smoke:
    progress(f"--gpu needs a GPU (JAX's default backend is "
             f"{jax.default_backend()!r}; the harness defaults JAX_PLATFORMS "
             "to cpu, so set JAX_PLATFORMS=cuda,cpu as make bench-gpu does); "
             "--smoke runs it on the CPU as a dry run")
    return 2
  if on_gpu() and load_cupy() is None:
    progress("--gpu needs CuPy for the pinned-memcpy baseline and the "
             "buffer callbacks (pip install cupy-cuda13x)")
    return 2
  cfg = SMOKE if smoke else FULL
  if reps is not None:
    cfg = dataclasses.replace(cfg, reps=max(1, reps))
  goals = run(cfg, out_dir)
  for t in goals:
    measured = "-" if t.value is None else f"{t.value:.2f}x"
    progress(f"{t.status}: {t.text} ({measured})")
  progress(f"wrote {os.path.join(out_dir, 'RESULTS-gpu.md')}")
  return 0

