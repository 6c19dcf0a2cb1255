"""``make gpu-check`` (tools/gpu_check.py) where there is no GPU, as in CI:
it fails at once and says why instead of hanging or building for nothing,
and its probes (tests/gpu/probes) run on a CPU device in a dry run, which
checks the probes themselves.  On a GPU they check the GPU path."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import run_python

# The tool and its probes run on the GPU machine's one JAX; here they are
# checked on .venv's, as the repository's own (make test: not on the others).
pytestmark = pytest.mark.repo

REPO = pathlib.Path(__file__).resolve().parents[2]
PROBES = sorted((REPO / "tests" / "gpu" / "probes").glob("probe_*.py"))


def test_gpu_check_without_a_gpu_fails_at_once_and_says_why(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "HCB_GPU_DRY_RUN"}
  done = subprocess.run(
      [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out",
       str(tmp_path / "check")], capture_output=True, text=True, env=env,
      timeout=180)
  assert done.returncode == 1, done.stdout + done.stderr
  lines = done.stdout.splitlines()
  assert lines[1].startswith("FAIL  gpu ")
  assert "JAX sees no GPU here" in lines[1]
  # Nothing else runs, and every check still has its line.
  rest = lines[2:-1]
  assert [line.split()[1] for line in rest][:2] == ["build", "suite"]
  assert len(rest) == 3 + len(PROBES) + 1  # + the example, probes, bench
  assert all(line.startswith("SKIP") and "not run: gpu failed" in line
             for line in rest)
  assert lines[-1].startswith("gpu-check: 0 passed, 1 failed")
  summary = (tmp_path / "check" / "summary.txt").read_text()
  assert summary.splitlines() == lines
  assert (tmp_path / "check" / "gpu.log").exists()


def test_gpu_check_fails_for_checks_its_budget_left_no_time_for(tmp_path):
  # A budget spent before a check starts leaves that check unrun: a GPU run
  # that did not check everything must not pass, and the total says which
  # were not run.  (5 s: nothing starts, so no build touches this venv.)
  done = subprocess.run(
      [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out",
       str(tmp_path / "check"), "--budget", "5"], capture_output=True,
      text=True, env={**os.environ, "HCB_GPU_DRY_RUN": "1"}, timeout=120)
  assert done.returncode == 1, done.stdout + done.stderr
  lines = done.stdout.splitlines()
  checks = lines[1:-1]
  assert len(checks) == 4 + len(PROBES) + 1  # gpu, build, suite, example
  assert all(line.startswith("FAIL") and
             "not run: the 5 s budget is spent" in line for line in checks)
  names = [line.split()[1] for line in checks]
  assert lines[-1].startswith(f"gpu-check: 0 passed, {len(checks)} failed")
  assert lines[-1].endswith("; not run, out of time: " + ", ".join(names))


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_each_probe_runs_in_a_dry_run(probe):
  done = run_python(None, {"HCB_GPU_DRY_RUN": "1"}, 240, path=probe)
  last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
  assert (done.returncode, last[:5]) in ((0, "PASS:"), (3, "SKIP:")), (
      done.stdout + done.stderr)
