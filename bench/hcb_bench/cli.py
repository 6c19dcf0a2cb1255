"""The command line of bench/run.py: every measurement in turn, then
RESULTS.md and the plots."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
import time
from typing import Sequence

from hcb_bench import gpu
from hcb_bench import sharded
from hcb_bench.backpressure import measure_backpressure
from hcb_bench.backpressure import worker_main
from hcb_bench.cases import measure_dispatch
from hcb_bench.cases import measure_payload
from hcb_bench.cases import measure_per_step
from hcb_bench.cases import measure_printing
from hcb_bench.clients import clients_section
from hcb_bench.clients import measure_clients
from hcb_bench.compile_time import measure_compile_time
from hcb_bench.dropins import measure_dropins
from hcb_bench.harness import BENCH_DIR
from hcb_bench.harness import FULL
from hcb_bench.harness import SMOKE
from hcb_bench.harness import Config
from hcb_bench.harness import progress
from hcb_bench.native import Native
from hcb_bench.per_call import measure_per_call
from hcb_bench.plots import plot_dispatch
from hcb_bench.plots import plot_payload
from hcb_bench.progress_bars import measure_progress
from hcb_bench.plots import plot_per_step
from hcb_bench.report import report
from hcb_bench.targets import Measurements
from hcb_bench.targets import Target
from hcb_bench.targets import targets


def run(cfg: Config, out_dir: str, clients_python: str | None = None
        ) -> list[Target]:
  """Every measurement, then RESULTS.md and the plots in ``out_dir``."""
  os.makedirs(out_dir, exist_ok=True)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="hcb-bench-") as build_dir:
    native = Native(build_dir)
    progress("1/11 per-step cost in a scan")
    steps = measure_per_step(cfg, native)
    progress("2/11 payload sweep")
    payload = measure_payload(cfg, native)
    progress("3/11 dispatch")
    dispatch = measure_dispatch(cfg, native)
  progress("4/11 printing")
  printing = measure_printing(cfg)
  progress("5/11 back-pressure (child process)")
  backpressure = measure_backpressure(cfg)
  progress("6/11 progress bars")
  bars = measure_progress(cfg)
  progress("7/11 drop-ins against JAX's callbacks")
  dropins = measure_dropins(cfg)
  progress("8/11 compile time against the number of leaves tapped")
  compile_time = measure_compile_time(cfg)
  progress("9/11 client libraries, patched against unpatched (children)")
  clients = measure_clients(cfg, clients_python)
  progress("10/11 one callback per call, idle and beside a busy process")
  per_call = measure_per_call(cfg)
  progress("11/11 under jit over sharded operands (children, 4 devices)")
  m = Measurements(steps, payload, dispatch, printing, backpressure, bars,
                   dropins, compile_time, clients, per_call,
                   sharded.measure_sharded(cfg))
  goals = targets(m)
  plot_per_step(m.steps, os.path.join(out_dir, "per_step.png"))
  plot_payload(m.payload, os.path.join(out_dir, "payload.png"))
  plot_dispatch(m.dispatch, os.path.join(out_dir, "dispatch.png"))
  text = report(cfg, m, goals, time.perf_counter() - start)
  with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
    f.write(text)
  return goals


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description="Benchmarks of host_callback against JAX's own callbacks "
      "(``make bench``).")
  parser.add_argument("--smoke", action="store_true",
                      help="a seconds-long run for CI (numbers mean nothing)")
  parser.add_argument("--out", default=os.path.join(BENCH_DIR, "results"),
                      help="where RESULTS.md and the plots go")
  parser.add_argument("--reps", type=int,
                      help=f"repetitions (default {FULL.reps}; "
                      f"{SMOKE.reps} with --smoke)")
  parser.add_argument("--steps", type=int, help="scan length of item 1")
  parser.add_argument("--gpu", action="store_true",
                      help="the GPU targets instead (``make bench-gpu``): "
                      "writes RESULTS-gpu.md; needs a GPU and CuPy, but "
                      "with --smoke, which also runs on the CPU")
  parser.add_argument("--clients-python", metavar="PY",
                      help="the Python of the client libraries' environment "
                      "(.venv-clients): measurement 9 runs their workloads "
                      "there, patched against unpatched; without it, not "
                      "measured")
  parser.add_argument("--clients-only", action="store_true",
                      help="measurement 9 alone (``make bench-clients``): "
                      "prints its section, writes no RESULTS.md")
  parser.add_argument("--backpressure-worker", metavar="CONFIG",
                      help=argparse.SUPPRESS)
  parser.add_argument("--sharded-worker", metavar="CONFIG",
                      help=argparse.SUPPRESS)
  parser.add_argument("--sharded-unwaited", metavar="KEY,CALLS",
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.backpressure_worker:
    return worker_main(args.backpressure_worker)
  if args.sharded_worker:
    return sharded.worker_main(args.sharded_worker)
  if args.sharded_unwaited:
    return sharded.unwaited_main(args.sharded_unwaited)
  if args.gpu:
    return gpu.main(args.smoke, args.out, args.reps)
  cfg = SMOKE if args.smoke else FULL
  if args.reps is not None:
    cfg = dataclasses.replace(cfg, reps=max(1, args.reps))
  if args.steps is not None:
    cfg = dataclasses.replace(cfg, steps=max(2, args.steps))
  if args.clients_only:
    print("\n".join(clients_section(measure_clients(cfg,
                                                     args.clients_python))))
    return 0
  goals = run(cfg, args.out, args.clients_python)
  for t in goals:
    measured = ("-" if t.value is None else "nothing measurable"
                if math.isinf(t.value) else f"{t.value:.2f}x")
    progress(f"{t.status}: {t.text} ({measured})")
  progress(f"wrote {os.path.join(args.out, 'RESULTS.md')}")
  return 0

