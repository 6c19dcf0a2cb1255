"""``make gpu-check``: the one command a GPU machine runs (docs/gpu.md).

On a machine with an NVIDIA GPU and JAX's CUDA plugin (the project's GPU
machines: offline, Python 3.12, JAX 0.11.2 with its CUDA 13 plugin, CuPy),
with the Python that has them (``make gpu-check GPU_PY=...``), it checks
that JAX sees a GPU, builds and installs the package into that Python
(``pip install --no-build-isolation``, nothing downloaded), then runs the
GPU test suite (tests/gpu), the CuPy example, the probes of the GPU path's
risks (tests/gpu/probes) and the GPU benchmarks (bench-gpu, three
repetitions), each in its own process under its own timeout, all within
BUDGET_S seconds.  One summary line per check, as each ends, then a total;
every check's output goes to a log in the output folder, with the
benchmark's RESULTS-gpu.md (also copied to bench/results/) and
summary.txt: the folder to bring back.  Exit status 0 when no check
failed; a check the budget left no time for is a failure (the summary
names those), since a GPU run that did not run everything proves nothing
about the rest.

Without a GPU it stops after the first check, saying so.  With
``HCB_GPU_DRY_RUN=1`` it runs everything it can on a second CPU device
instead (tests/gpu's and the probes' dry runs, the benchmark's --smoke):
a check of the checks, not of the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parents[1]
PROBES = REPO / "tests" / "gpu" / "probes"
WHEELS = REPO / "build" / "gpu-wheels"
WHEEL_PACKAGES = ["scikit-build-core", "pytest", "pytest-timeout"]
BUDGET_S = 480.0  # 8 minutes on one H100, for everything
DRY_RUN = os.environ.get("HCB_GPU_DRY_RUN") == "1"
SKIPPED = 3  # a probe's exit status when it does not apply (probe.py)
# A test of the suite that runs longer has every thread's stack logged.
STACKS_AFTER_S = 60.0


@dataclasses.dataclass
class Result:
  status: str  # PASS, FAIL or SKIP
  detail: str
  seconds: float = 0.0


@dataclasses.dataclass
class Check:
  name: str
  timeout_s: float
  run: Callable[["Runner", float], Result]


class Runner:
  """Runs commands with logs in ``out`` and a deadline for all of them."""

  def __init__(self, python: str, out: pathlib.Path,
               budget_s: float = BUDGET_S) -> None:
    # a path relative to here, or a name looked up on PATH
    self.python = os.path.abspath(python) if os.sep in python else python
    self.out = out
    self.deadline = time.monotonic() + budget_s
    self.env = dict(os.environ)
    # Several processes share the GPU (the suite starts its own): none
    # may take most of its memory up front, as JAX does by default.
    self.env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

  def remaining(self) -> float:
    return self.deadline - time.monotonic()

  def command(self, name: str, args: list[str], timeout: float,
              env: dict[str, str] | None = None,
              cwd: pathlib.Path = REPO) -> tuple[int | None, str]:
    """Runs ``args`` in a session of its own (so that a timeout ends its
    children too), its output appended to ``name``.log.  Returns its exit
    status (None: timed out) and its output."""
    full_env = dict(self.env)
    full_env.update(env or {})
    log = self.out / f"{name}.log"
    with open(log, "a") as f:
      f.write(f"$ {' '.join(args)}\n")
      f.flush()
      try:
        proc = subprocess.Popen(args, cwd=cwd, env=full_env, stdout=f,
                                stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
      except OSError as e:  # no such Python, say
        f.write(f"cannot start {args[0]}: {e}\n")
        return 127, log.read_text()
      try:
        status: int | None = proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        status = None
        f.write(f"\n[gpu-check: killed after {timeout:.0f} s]\n")
    return status, log.read_text()


def last_line(text: str, prefixes: tuple[str, ...] = ()) -> str:
  """The last non-empty line of ``text`` (that starts with one of
  ``prefixes``, if given)."""
  lines = [line.strip() for line in text.splitlines() if line.strip()
           and not line.startswith("$ ")]
  if prefixes:
    lines = [line for line in lines if line.startswith(prefixes)] or lines
  return lines[-1][:160] if lines else "(no output)"


def timed_out(timeout: float) -> Result:
  return Result("FAIL", f"no result within {timeout:.0f} s (killed: a hang?)")


# ---- the checks ----------------------------------------------------------

def check_gpu(r: Runner, timeout: float) -> Result:
  code = ("import jax\n"
          "print('JAX', jax.__version__, 'sees', jax.devices(), "
          "'default backend', jax.default_backend())\n"
          "import sys; sys.exit(0 if jax.default_backend() == 'gpu' else 9)\n")
  status, text = r.command("gpu", [r.python, "-c", code], timeout)
  if status is None:
    return timed_out(timeout)
  if DRY_RUN and status in (0, 9):
    return Result("PASS", "dry run: " + last_line(text))
  if status == 0:
    return Result("PASS", last_line(text))
  if status == 9:
    return Result("FAIL", "JAX sees no GPU here: " + last_line(text))
  return Result("FAIL", f"{r.python} cannot start JAX: " + last_line(text))


def check_build(r: Runner, timeout: float) -> Result:
  start = time.monotonic()
  if WHEELS.is_dir():  # what `make gpu-wheels` brought (docs/gpu.md)
    status, text = r.command(
        "build", [r.python, "-m", "pip", "install", "-q", "--no-index",
                  "--find-links", str(WHEELS), *WHEEL_PACKAGES], timeout)
    if status != 0:
      return (timed_out(timeout) if status is None else
              Result("FAIL", "installing build/gpu-wheels: " + last_line(text)))
  left = timeout - (time.monotonic() - start)
  status, text = r.command(
      "build", [r.python, "-m", "pip", "install", "-q", "--no-index",
                "--no-build-isolation", "--no-deps",
                "--config-settings=build-dir=build/py-gpu", "."], left)
  if status is None:
    return timed_out(timeout)
  if status != 0:
    return Result("FAIL", "pip install: " + last_line(text))
  status, text = r.command(
      "build", [r.python, "-c", "import host_callback, sys; "
                "print('host_callback', host_callback.__file__)"], 60,
      cwd=r.out)
  if status != 0:
    return Result("FAIL", "the installed package does not import: " +
                  last_line(text))
  return Result("PASS", last_line(text))


def check_suite(r: Runner, timeout: float) -> Result:
  env = {"HCB_REQUIRE_GPU": "1"} if not DRY_RUN else {}
  # A test that hangs gets the suite killed: every thread's stack goes to
  # the log first, naming the test and where it waits.
  status, text = r.command(
      "suite", [r.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-rfE", "-o", f"faulthandler_timeout={STACKS_AFTER_S:.0f}",
                "tests/gpu"], timeout, env)
  if status is None:
    return timed_out(timeout)
  summary = last_line(text, ("=",)).strip("= ")
  return Result("PASS" if status == 0 else "FAIL", summary)


def check_example(r: Runner, timeout: float) -> Result:
  if DRY_RUN:
    return Result("SKIP", "dry run: the example needs a GPU and CuPy")
  status, text = r.command(
      "cupy-example", [r.python, "examples/cupy_buffer_callback.py"], timeout)
  if status is None:
    return timed_out(timeout)
  return Result("PASS" if status == 0 else "FAIL", last_line(text))


def probe_check(script: pathlib.Path) -> Callable[[Runner, float], Result]:
  def run(r: Runner, timeout: float) -> Result:
    # stacks in the log before a hanging probe is killed (probe.py)
    stacks_after = max(timeout - 10, 1)
    status, text = r.command(
        script.stem, [r.python, str(script)], timeout,
        {"HCB_PROBE_STACKS_AFTER_S": f"{stacks_after:.0f}"})
    if status is None:
      return timed_out(timeout)
    line = last_line(text, ("PASS", "FAIL", "SKIP"))
    detail = line.split(": ", 1)[-1]
    if status == 0 and line.startswith("PASS"):
      return Result("PASS", detail)
    if status == SKIPPED:
      return Result("SKIP", detail)
    return Result("FAIL", line if status != 1 else detail)
  return run


def check_bench(r: Runner, timeout: float) -> Result:
  args = [r.python, "bench/run.py", "--gpu", "--out", str(r.out)]
  args += ["--smoke"] if DRY_RUN else ["--reps", "3"]
  status, text = r.command("bench-gpu", args, timeout,
                           {} if DRY_RUN else {"JAX_PLATFORMS": "cuda,cpu"})
  if status is None:
    return timed_out(timeout)
  results = r.out / "RESULTS-gpu.md"
  if status != 0 or not results.exists():
    return Result("FAIL", last_line(text))
  if not DRY_RUN:
    shutil.copy(results, REPO / "bench" / "results" / "RESULTS-gpu.md")
  targets = [line for line in results.read_text().splitlines()
             if line.startswith("- **")]
  met = sum(line.startswith("- **met**") for line in targets)
  return Result("PASS", f"RESULTS-gpu.md: {met} of {len(targets)} targets "
                "met" + (" (smoke: numbers mean nothing)" if DRY_RUN else ""))


def checks() -> list[Check]:
  probes = [Check(p.stem.removeprefix("probe_").replace("_", "-"), 60,
                  probe_check(p))
            for p in sorted(PROBES.glob("probe_*.py"))]
  return [Check("gpu", 120, check_gpu), Check("build", 240, check_build),
          Check("suite", 200, check_suite),
          Check("cupy-example", 60, check_example), *probes,
          Check("bench-gpu", 180, check_bench)]


# ---- main ----------------------------------------------------------------

def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--python", default=sys.executable,
                      help="the Python with JAX's CUDA plugin (GPU_PY)")
  parser.add_argument("--out", default=str(REPO / "build" / "gpu-check"),
                      help="the folder of the logs, summary and results")
  parser.add_argument("--budget", type=float, default=BUDGET_S,
                      help="seconds for everything (default %(default).0f)")
  args = parser.parse_args()
  out = pathlib.Path(args.out).resolve()
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  runner = Runner(args.python, out, args.budget)
  lines = [f"gpu-check{' (HCB_GPU_DRY_RUN=1)' if DRY_RUN else ''}: "
           f"{args.python}, budget {args.budget:.0f} s, logs in {out}"]
  print(lines[0], flush=True)
  counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
  stop = None
  out_of_time: list[str] = []
  for check in checks():
    start = time.monotonic()
    if stop is not None:
      result = Result("SKIP", f"not run: {stop}")
    elif runner.remaining() < 10:
      # a failure: what it checks is unchecked
      out_of_time.append(check.name)
      result = Result("FAIL", f"not run: the {args.budget:.0f} s budget is "
                      "spent")
    else:
      result = check.run(runner, min(check.timeout_s, runner.remaining()))
    result.seconds = time.monotonic() - start
    counts[result.status] += 1
    line = (f"{result.status:4}  {check.name:28} {result.seconds:5.0f} s  "
            f"{result.detail}")
    lines.append(line)
    print(line, flush=True)
    if (check.name in ("gpu", "build") and result.status == "FAIL" and
        check.name not in out_of_time):
      stop = f"{check.name} failed"
  total = args.budget - runner.remaining()
  lines.append(f"gpu-check: {counts['PASS']} passed, {counts['FAIL']} failed, "
               f"{counts['SKIP']} skipped in {total:.0f} s" +
               (f"; not run, out of time: {', '.join(out_of_time)}"
                if out_of_time else ""))
  print(lines[-1], flush=True)
  (out / "summary.txt").write_text("\n".join(lines) + "\n")
  return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
  sys.exit(main())
