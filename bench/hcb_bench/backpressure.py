"""Measurement 5, back-pressure: a slow tap function against a small queue
bound, in a child process (bench/run.py --backpressure-worker), because
host_callback reads its queue bound once, when it starts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

import host_callback as hcb

from hcb_bench.harness import BENCH_DIR
from hcb_bench.harness import Config
from hcb_bench.harness import Sample
from hcb_bench.harness import time_run

RUN_PY = os.path.join(BENCH_DIR, "run.py")  # the child runs this


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
      [sys.executable, RUN_PY, "--backpressure-worker",
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
      slow_device=Sample(tuple(out["slow_device"])),
      fast_device=Sample(tuple(out["fast_device"])),
      slow_e2e=Sample(tuple(out["slow_e2e"])),
      wait=Sample(tuple(out["wait_s"])), waits=Sample(tuple(out["waits"])),
      high_water_bytes=out["high_water_bytes"], received_ok=out["ok"],
      reps=cfg.reps, sent=out["sent"], received=out["received"])


def worker_main(config: str) -> int:
  """The child's entry (``run.py --backpressure-worker CONFIG``): runs
  :func:`backpressure_worker` with the Config that ``config`` holds as
  JSON, and prints its result as JSON on the last line."""
  fields: dict[str, Any] = {
      k: tuple(v) if isinstance(v, list) else v
      for k, v in json.loads(config).items()}
  print(json.dumps(backpressure_worker(Config(**fields))))
  return 0

