"""The benchmark harness (bench/run.py) keeps working: its smoke mode runs in
a fresh interpreter and writes RESULTS.md, with one line per target, and the
plots.  No timing is asserted: speed is measured by ``make bench``, never by
tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import pytest

import host_callback as hcb

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# + the drop-ins', the dispatch of a debug.print, the compile times, one
# callback per call (4 drop-ins, idle and busy), per step under jit over
# sharded operands (5 callbacks)
TARGETS = 13 + 5 + hasattr(jax.debug, "log") + 1 + 3 + 8 + 5
TARGET_LINE = re.compile(r"^- \*\*(met|NOT MET|NOT MEASURED)\*\* — \S")
COUNT = re.compile(r"^(\d+)/(\d+)$")


def section(text: str, heading: str) -> list[str]:
  """The non-empty lines under ``heading``, up to the next heading."""
  lines = text.splitlines()
  start = lines.index(heading) + 1
  end = next((i for i in range(start, len(lines))
              if lines[i].startswith("## ")), len(lines))
  return [line for line in lines[start:end] if line.strip()]


def table_column(lines: list[str], column: int) -> list[str]:
  """One column of the first markdown table among ``lines`` (header
  excluded)."""
  start = next(i for i, line in enumerate(lines) if line.startswith("|"))
  end = next((i for i in range(start, len(lines))
              if not lines[i].startswith("|")), len(lines))
  return [row.strip("|").split("|")[column].strip()
          for row in lines[start + 2:end]]


# make bench runs the harness on .venv alone: make test runs these tests
# there, not on the other JAX versions (pyproject.toml's markers).
pytestmark = pytest.mark.bench


def test_smoke_run_writes_results_and_plots(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(
      "HOST_CALLBACK_")}
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "bench", "run.py"), "--smoke",
       "--out", str(tmp_path)],
      capture_output=True, text=True, env=env, timeout=240)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
  text = (tmp_path / "RESULTS.md").read_text()

  targets = section(text, "## Targets")
  assert len(targets) == TARGETS, targets
  for line in targets:
    assert TARGET_LINE.match(line), line
  printing = [line for line in targets if "`id_print`" in line]
  assert len(printing) == 1
  assert ("NOT MEASURED" in printing[0]) == (not hasattr(hcb, "id_print"))

  headings = [line for line in text.splitlines() if line.startswith("## ")]
  for n in range(1, 12):
    assert any(h.startswith(f"## {n}. ") for h in headings), headings
  # Without --clients-python (make bench passes .venv-clients'), the client
  # libraries' section says why it has no numbers.
  clients = section(text, next(h for h in headings if h.startswith("## 9.")))
  assert clients[0].startswith("Not measured: no clients environment"), clients

  # Every callback the harness counted ran: "run/expected" cells match.
  per_step = section(text, next(h for h in headings if h.startswith("## 1.")))
  payload = section(text, next(h for h in headings if h.startswith("## 2.")))
  dropins = section(text, next(h for h in headings if h.startswith("## 7.")))
  cells = (table_column(per_step, -1) + table_column(payload, -1) +
           [c for cell in table_column(dropins, -1) for c in cell.split()])
  counted = [COUNT.match(c) for c in cells if c != "–"]
  assert counted and all(m and m[1] == m[2] for m in counted), cells

  for name in ("per_step.png", "payload.png", "dispatch.png"):
    assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name


GPU_TARGETS = 6  # issue 18's five, the bandwidth one at 4 MiB and 64 MiB
GPU_COUNT = re.compile(r"^(\d+)/(\d+)$")


def test_gpu_smoke_run_on_the_cpu_writes_results_gpu(tmp_path):
  # `make bench-gpu` needs a GPU; its --smoke mode runs the same code on
  # the CPU with host stand-ins, and says so.
  env = {k: v for k, v in os.environ.items() if not k.startswith(
      "HOST_CALLBACK_")}
  env["JAX_PLATFORMS"] = "cpu"
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "bench", "run.py"), "--gpu",
       "--smoke", "--out", str(tmp_path)],
      capture_output=True, text=True, env=env, timeout=240)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
  text = (tmp_path / "RESULTS-gpu.md").read_text()
  assert "A dry run on the CPU" in text
  assert "- Device: **cpu**" in text
  targets = section(text, "## Targets")
  assert len(targets) == GPU_TARGETS, targets
  for line in targets:
    assert TARGET_LINE.match(line), line
  cells = [row.rsplit("|", 2)[-2].strip() for row in text.splitlines()
           if row.startswith("|") and "/" in row.rsplit("|", 2)[-2]]
  counted = [GPU_COUNT.match(c) for c in cells]
  assert counted and all(m and m[1] == m[2] for m in counted), cells


def test_a_full_gpu_run_refuses_without_a_gpu(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "bench", "run.py"), "--gpu",
       "--out", str(tmp_path)], capture_output=True, text=True, env=env,
      timeout=120)
  assert done.returncode == 2
  assert "--gpu needs a GPU" in done.stderr
  assert not (tmp_path / "RESULTS-gpu.md").exists()
