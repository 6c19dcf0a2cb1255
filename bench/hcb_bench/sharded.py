"""Measurement 11: callbacks under jit over operands sharded across
devices, in child processes with 4 CPU devices (bench/run.py
--sharded-worker, --sharded-unwaited; the benchmark's own process has
one).

Per step: a ``lax.scan`` whose step calls back with the sum of its carry,
f32[4, 8], on one device, under ``shard_map`` over the 4 devices (each
device's callback of its own shard's sum) and under jit over the carry
sharded across them (one callback of the whole sum, on our own path: one
call shared by the devices, src/runtime/shared.c; JAX's on its Python
callback).  What each adds over the same scan using the sum without a
callback (so the collective the sum needs is the baseline's too), against
what ``jax.debug.callback`` adds there.

Per call: as measurement 10 (per_call.py), one callback per jitted call,
idle and beside a busy process, on f32[64] sharded across the devices.

Unwaited dispatch: a loop that dispatches such a program without waiting
for a result, then waits for the last; each variant in a process of its
own, watched.  XLA's CPU client gets stuck in a collective when executions
pile up, and aborts the process (a JAX program with no callback too), so
what is measured is whether it finished, and in how long -- ours paced
(_pacing.py) and, to show why, not paced."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from hcb_bench.harness import BENCH_DIR
from hcb_bench.harness import Config
from hcb_bench.harness import Sample

RUN_PY = os.path.join(BENCH_DIR, "run.py")  # the children run this
DEVICES = 4

# Where the scan runs (per step): (key, label).
PLACES = (
    ("one", "one device"),
    ("shard_map", "`shard_map`, 4 devices"),
    ("jit", "jit over sharded operands, 4 devices"),
)
# The callbacks of the per-step scan, ours: (key, label); JAX's reference
# is `jax.debug.callback`.
STEP_KINDS = (
    ("id_tap", "`id_tap`"),
    ("debug_callback", "`debug.callback`"),
    ("debug_print", "`debug.print`"),
    ("pure_callback", "`pure_callback`"),
    ("io_callback", "`io_callback`"),
)
# The callbacks of the per-call measurement: (key, ours, JAX's).
CALL_KINDS = (
    ("id_tap", "`id_tap`", "`jax.debug.callback`"),
    ("pure_callback", "`pure_callback`", "`jax.pure_callback`"),
    ("io_callback", "`io_callback`", "`jax.experimental.io_callback`"),
    ("debug_callback", "`debug.callback`", "`jax.debug.callback`"),
    ("debug_print", "`debug.print`", "`jax.debug.print`"),
)
# The unwaited loops: (key, what it is).
UNWAITED = (
    ("plain", "JAX, no callback (a sum over the devices)"),
    ("jax_debug_callback", "`jax.debug.callback`"),
    ("ours_debug_callback", "our `debug.callback`"),
    ("ours_id_tap", "our `id_tap`"),
    ("ours_id_tap_unpaced", "our `id_tap`, not paced"),
)


@dataclasses.dataclass(frozen=True)
class ShardedResult:
  """Seconds per scan step by place and variant ("baseline", each
  STEP_KINDS key, "jax"), end to end; seconds per call by condition and
  variant (as per_call.PerCallResult); and the unwaited loops: seconds to
  finish, or None when stuck."""

  steps: int
  step_reps: int
  step_seconds: dict[str, dict[str, Sample]]
  calls: int
  call_seconds: dict[str, dict[str, Sample]]
  unwaited_calls: int
  unwaited_timeout_s: float
  unwaited: dict[str, float | None]

  def step_added(self, place: str, variant: str) -> Sample:
    """What ``variant`` adds to a scan step at ``place`` over the
    baseline."""
    row = self.step_seconds[place]
    return row[variant].minus(row["baseline"])

  def step_bound(self, place: str, key: str) -> float:
    """An upper bound of what ours adds per step: the 95th percentile of
    the medians of bootstrap resamples of its repetitions (seeded)."""
    return upper_median(self.step_added(place, key).values)

  def step_ratio(self, place: str, key: str) -> float | None:
    """What ``jax.debug.callback`` adds per step (the median) over the
    upper bound of what ours adds (:meth:`step_bound`): infinite when that
    bound is at or below zero (nothing measurable), None when JAX's adds
    nothing measurable either.  Not the median of per-repetition ratios
    (harness.Sample.ratio): what ours adds here is as small as the
    repetitions' noise, and those ratios would keep only the repetitions
    where the noise made it positive."""
    theirs = self.step_added(place, "jax").median
    if theirs <= 0:
      return None
    ours = self.step_bound(place, key)
    return theirs / ours if ours > 0 else math.inf

  def call_added(self, condition: str, variant: str) -> Sample:
    """What ``variant`` adds to a call over the plain function."""
    row = self.call_seconds[condition]
    return row[variant].minus(row["plain"])

  def call_ratio(self, condition: str, key: str) -> float | None:
    """What JAX's adds per call over what ours adds."""
    return self.call_added(condition, f"{key}_jax").ratio(
        self.call_added(condition, f"{key}_ours"))


def upper_median(values: tuple[float, ...], confidence: float = 0.95,
                 resamples: int = 2000) -> float:
  """The ``confidence`` quantile of the medians of ``resamples`` bootstrap
  resamples of ``values`` (seeded: the same values give the same bound)."""
  rng = random.Random(0)
  medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                   for _ in range(resamples))
  return medians[int(confidence * (resamples - 1))]


# ---- the child: per step and per call ----------------------------------------

def _step_programs(steps: int) -> dict[str, tuple[Callable[[Any], Any], Any]]:
  """``{f"{place}/{variant}": (jitted scan, its carry)}``."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import io_callback as jax_io_callback
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import host_callback as hcb
  from host_callback import debug

  from hcb_bench.harness import Counter

  counter = Counter()
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  uses: dict[str, Callable[[Any], Any]] = {
      "baseline": lambda s: s,
      "id_tap": lambda s: hcb.id_tap(counter.tap, s),
      "debug_callback": lambda s: (debug.callback(counter.effect, s), s)[1],
      "debug_print": lambda s: (debug.print("s={}", s), s)[1],
      "pure_callback": lambda s: hcb.pure_callback(counter.identity, scalar,
                                                   s),
      "io_callback": lambda s: hcb.io_callback(counter.identity, scalar, s),
      "jax": lambda s: (jax.debug.callback(counter.effect, s), s)[1],
  }

  def scan(use: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def step(c: Any, _: Any) -> tuple[Any, None]:
      s = use(jnp.sum(c))
      return c * 0.5 + s * 1e-3, None
    return lambda c: jax.lax.scan(step, c, None, length=steps)[0]

  mesh = Mesh(np.array(jax.devices()), ("d",))
  carry = np.arange(32, dtype=np.float32).reshape(4, 8)
  one = jax.device_put(carry, jax.devices()[0])
  sharded = jax.device_put(carry, NamedSharding(mesh, P("d")))
  out: dict[str, tuple[Callable[[Any], Any], Any]] = {}
  for name, use in uses.items():
    out[f"one/{name}"] = (jax.jit(scan(use)), one)
    out[f"shard_map/{name}"] = (jax.jit(jax.shard_map(
        scan(use), mesh=mesh, in_specs=P("d"), out_specs=P("d"))), sharded)
    out[f"jit/{name}"] = (jax.jit(scan(use)), sharded)
  return out


def _time_steps(cfg: Config) -> dict[str, dict[str, list[float]]]:
  """Seconds per step of every scan, end to end (every callback run),
  per repetition.  Each repetition runs every program once, in an order
  of its own (shuffled, seeded by the repetition): a program that always
  ran right after another would carry that one's after-effects (threads
  still waking, caches) into every one of its repetitions."""
  from hcb_bench.cases import NullOut
  from hcb_bench.harness import time_run

  programs = _step_programs(cfg.sharded_steps)
  seconds: dict[str, dict[str, list[float]]] = {}
  with contextlib.redirect_stdout(NullOut()):
    for fn, x in programs.values():  # compiled, and warm
      time_run(fn, x)
    for rep in range(cfg.sharded_step_reps):
      order = list(programs.items())
      random.Random(rep).shuffle(order)
      for name, (fn, x) in order:
        place, variant = name.split("/")
        _, e2e = time_run(fn, x)
        seconds.setdefault(place, {}).setdefault(variant, []).append(
            e2e / cfg.sharded_steps)
  return seconds


def _call_programs() -> tuple[dict[str, Callable[[Any], Any]], Any]:
  """The jitted functions of the per-call measurement and their operand,
  f32[64] sharded across the devices."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import host_callback as hcb

  from hcb_bench.harness import Counter
  from hcb_bench.per_call import variants

  counter = Counter()
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(64, dtype=jnp.float32),
                     NamedSharding(mesh, P("d")))
  fns = variants(counter, jax.ShapeDtypeStruct(x.shape, x.dtype))
  fns["id_tap_ours"] = jax.jit(
      lambda v: hcb.id_tap(counter.tap, v) * 2 + 1)
  fns["id_tap_jax"] = jax.jit(
      lambda v: (jax.debug.callback(counter.effect, v), v)[1] * 2 + 1)
  return fns, x


def worker_main(config: str) -> int:
  """The child's entry (``run.py --sharded-worker CONFIG``): the per-step
  and per-call measurements with the Config that ``config`` holds as JSON;
  prints their seconds as JSON on the last line."""
  from hcb_bench.per_call import time_variants

  fields: dict[str, Any] = {
      k: tuple(v) if isinstance(v, list) else v
      for k, v in json.loads(config).items()}
  cfg = Config(**fields)
  steps = _time_steps(cfg)
  fns, x = _call_programs()
  calls = time_variants(cfg, fns, x, cfg.sharded_calls)
  print(json.dumps({
      "steps": steps,
      "calls": {c: {k: list(s.values) for k, s in row.items()}
                for c, row in calls.items()}}))
  return 0


# ---- the children: unwaited loops ---------------------------------------------

def unwaited_main(spec: str) -> int:
  """The entry of one unwaited loop (``run.py --sharded-unwaited
  KEY,CALLS``): prints the seconds it took."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import host_callback as hcb
  from host_callback import _pacing
  from host_callback import debug

  key, calls = spec.split(",")
  if key.endswith("_unpaced"):  # what the pacing prevents (private)
    _pacing.mark = lambda module_context: None
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(64, dtype=jnp.float32),
                     NamedSharding(mesh, P("d")))
  programs: dict[str, Callable[[Any], Any]] = {
      "plain": lambda v: v + jnp.sum(v),
      "jax_debug_callback": lambda v: (
          jax.debug.callback(lambda a: None, v), v + 1)[1],
      "ours_debug_callback": lambda v: (
          debug.callback(lambda a: None, v), v + 1)[1],
      "ours_id_tap": lambda v: hcb.id_tap(lambda a, t: None, v + 1),
      "ours_id_tap_unpaced": lambda v: hcb.id_tap(lambda a, t: None, v + 1),
  }
  f = jax.jit(programs[key])
  f(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(int(calls)):
    out = f(x)
  out.block_until_ready()
  hcb.barrier_wait()
  print(json.dumps(time.perf_counter() - start))
  return 0


# ---- the parent ---------------------------------------------------------------

def _child_env() -> dict[str, str]:
  return dict(os.environ, HCB_BENCH_DEVICES=str(DEVICES))


def _unwaited(key: str, calls: int, timeout_s: float) -> float | None:
  """Seconds the loop ``key`` took, or None when it got stuck: killed
  after ``timeout_s`` (Config.unwaited_timeout_s: 90 s, more than the
  minute after which XLA's rendezvous gives up and aborts the process; 15 s
  in a smoke run, whose numbers mean nothing and which would otherwise wait
  out that minute for each loop that gets stuck), or aborted by XLA."""
  try:
    done = subprocess.run(
        [sys.executable, RUN_PY, "--sharded-unwaited", f"{key},{calls}"],
        capture_output=True, text=True, env=_child_env(),
        timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return None
  if done.returncode != 0:
    return None
  return float(done.stdout.strip().splitlines()[-1])


def measure_sharded(cfg: Config) -> ShardedResult:
  """Item 11, in child processes of 4 CPU devices."""
  done = subprocess.run(
      [sys.executable, RUN_PY, "--sharded-worker",
       json.dumps(dataclasses.asdict(cfg))],
      capture_output=True, text=True, env=_child_env(), check=False)
  if done.returncode != 0:
    raise RuntimeError(f"measurement 11's child failed:\n{done.stderr}")
  raw = json.loads(done.stdout.strip().splitlines()[-1])
  sample = lambda rows: {  # noqa: E731
      outer: {k: Sample(tuple(v)) for k, v in row.items()}
      for outer, row in rows.items()}
  unwaited = {key: _unwaited(key, cfg.sharded_unwaited,
                             cfg.unwaited_timeout_s)
              for key, _ in UNWAITED}
  return ShardedResult(cfg.sharded_steps, cfg.sharded_step_reps,
                       sample(raw["steps"]),
                       cfg.sharded_calls, sample(raw["calls"]),
                       cfg.sharded_unwaited, cfg.unwaited_timeout_s,
                       unwaited)
