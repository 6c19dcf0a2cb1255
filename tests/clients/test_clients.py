"""Real libraries, unchanged, on host_callback (``make test-clients``).

Each workload (workloads/<name>.py) uses one pinned release's public API
(requirements/clients.txt, clients-legacy.txt).  A library that runs on
current JAX runs twice, with JAX's callbacks and patched to host_callback's
(``python -m host_callback run --patch jax``), and every case must give the
same values (bit for bit), the same errors, the same text on stdout and
stderr (without traceback frames and bar timings) and the same final state
of every progress bar.  Code written for the removed
``jax.experimental.host_callback`` (pyPESTO 0.3.3, jax-tqdm 0.1.2) runs
through the legacy module (``HOST_CALLBACK_PATCH=legacy``), in its own
environment, and is checked against the values it must compute; without
the patch it does not import at all.

Each workload runs once per mode, in a subprocess (cached for the
session); each case is a test of its own, whose failure says what
differs.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

# A test that runs a workload first waits for both of its runs (minutes for
# the MCMC libraries on two cores).
pytestmark = pytest.mark.timeout(1800)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKLOADS = HERE / "workloads"
sys.path.insert(0, str(WORKLOADS))

from _case import bars  # noqa: E402
from _case import without_frames  # noqa: E402

# The legacy environment's interpreter (make test-clients builds it).
LEGACY_PYTHON = os.environ.get(
    "HCB_CLIENTS_LEGACY_PYTHON",
    str(ROOT / ".venv-clients-legacy" / "bin" / "python"))

# Workloads of libraries that run on current JAX: compared with JAX's run.
COMPARED = {
    "jax_tqdm_readme": ["scan", "scan_with_data", "fori_loop",
                        "vmap_of_scans", "print_rate_2", "print_rate_1_std"],
    "diffrax_solves": ["text_progress_meter", "tqdm_progress_meter",
                       "tqdm_progress_meter_jit_vmap",
                       "clip_controller_rejections"],
    "equinox_errors": ["error_if_passes", "error_if_raises_under_filter_jit",
                       "error_if_raises_twice",
                       "error_if_raises_under_jax_jit",
                       "branched_error_if_under_vmap", "filter_pure_callback",
                       "text_progress_meter", "tqdm_progress_meter"],
    "optax_linesearch": ["not_a_descent_direction",
                         "max_learning_rate_too_small", "jitted_search_twice",
                         "lbfgs_rosenbrock"],
    "optimistix_verbose": ["bfgs_verbose", "bfgs_verbose_redirected",
                           "levenberg_marquardt_verbose"],
    "numpyro_mcmc": ["parallel_chains_with_bars",
                     "parallel_chains_bars_against_none"],
    "blackjax_adaptation": ["window_adaptation_with_bar", "sampling_with_bar",
                            "chains_under_vmap_with_bars"],
}

# Cases where host_callback deliberately does more than JAX: what JAX's
# run must raise (the start of its error); host_callback's run is checked
# by the function named here instead.
MORE_THAN_JAX = {
    ("blackjax_adaptation", "chains_under_vmap_with_bars"):
        "NotImplementedError: IO effect not supported in vmap-of-cond.",
}

# Workloads of code written for the removed module: cases, and the
# top-level names whose import fails without the patch.
LEGACY = {
    "pypesto_jax_objective": ["value_gradient_hessian",
                              "gradient_only_then_value",
                              "deepcopy_and_optimize"],
    "jax_tqdm_legacy": ["scan", "fori_loop", "scan_print_rate_3_jit"],
}


@functools.cache
def run(workload: str, mode: str) -> dict[str, Any]:
  """The results of ``workload`` run in ``mode``: ``jax`` (unpatched),
  ``patched`` (python -m host_callback run --patch jax) or ``legacy``
  (HOST_CALLBACK_PATCH=legacy, in the legacy environment) or
  ``legacy-unpatched``."""
  out = ROOT / "build" / "clients" / f"{workload}-{mode}.json"
  if os.environ.get("HCB_CLIENTS_REUSE") == "1" and out.exists():
    # (developing the comparison: the last run's results, not a new run)
    return json.loads(out.read_text())
  out.parent.mkdir(parents=True, exist_ok=True)
  out.unlink(missing_ok=True)
  env = {k: v for k, v in os.environ.items()
         if k not in ("HOST_CALLBACK_PATCH", "JAX_NUM_CPU_DEVICES",
                      "XLA_FLAGS", "PYTHONPATH")}
  env["JAX_PLATFORMS"] = "cpu"
  script = str(WORKLOADS / f"{workload}.py")
  python = LEGACY_PYTHON if mode.startswith("legacy") else sys.executable
  if mode == "patched":
    cmd = [python, "-m", "host_callback", "run", "--patch", "jax", script]
  else:
    cmd = [python, script]
    if mode == "legacy":
      env["HOST_CALLBACK_PATCH"] = "legacy"
  done = subprocess.run([*cmd, str(out)], env=env, capture_output=True,
                        text=True, timeout=1200)
  assert done.returncode == 0 and out.exists(), (
      f"{' '.join(cmd)} failed ({done.returncode}):\n"
      f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
  doc: dict[str, Any] = json.loads(out.read_text())
  doc["process_stderr"] = done.stderr
  return doc


def _excerpt(text: str, limit: int = 1500) -> str:
  return text if len(text) <= limit else "..." + text[-limit:]


def _differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
  """What a user would see differ between two runs of a case."""
  found = []
  if theirs["error"] != ours["error"]:
    found.append(f"error: JAX's run {theirs['error']!r:.600}, "
                 f"host_callback's {ours['error']!r:.600}\n"
                 f"host_callback's traceback:\n{_excerpt(ours['stderr'])}")
  if theirs["value"] != ours["value"]:
    found.append(f"value: JAX's run {str(theirs['value'])[:600]}, "
                 f"host_callback's {str(ours['value'])[:600]}")
  for stream in ("stdout", "stderr"):
    a, b = bars(theirs[stream]), bars(ours[stream])
    if a != b:
      found.append(f"final state of the bars on {stream}: JAX's run {a}, "
                   f"host_callback's {b}")
    a, b = without_frames(theirs[stream]), without_frames(ours[stream])
    if a != b:
      found.append(f"text on {stream} during the case:\n--- JAX's run:\n"
                   f"{_excerpt(a)}\n--- host_callback's:\n{_excerpt(b)}")
  return found


# ---- libraries that run on current JAX ---------------------------------------

@pytest.mark.parametrize("workload", sorted(COMPARED))
def test_patched_run_uses_host_callback(workload):
  """The proof that the patched run is host_callback's: the callback
  functions the library holds (imported before any code of the program
  ran) are host_callback's, and JAX's in the unpatched run."""
  theirs, ours = run(workload, "jax")["whose"], run(workload, "patched")[
      "whose"]
  assert set(theirs) == set(ours)
  for name in theirs:
    if name != "devices":
      assert (theirs[name], ours[name]) == ("jax", "host_callback"), name
  assert set(run(workload, "jax")["cases"]) == set(COMPARED[workload])


@pytest.mark.parametrize("workload,name", [
    (w, c) for w in sorted(COMPARED) for c in COMPARED[w]
    if (w, c) not in MORE_THAN_JAX])
def test_same_as_jax(workload, name):
  theirs = run(workload, "jax")["cases"][name]
  ours = run(workload, "patched")["cases"][name]
  found = _differences(theirs, ours)
  assert not found, (f"{workload}: {name}, patched to host_callback, is not "
                     "what JAX gives:\n\n" + "\n\n".join(found))


@pytest.mark.parametrize("workload,name", sorted(MORE_THAN_JAX))
def test_where_jax_refuses_host_callback_runs(workload, name):
  theirs = run(workload, "jax")["cases"][name]
  ours = run(workload, "patched")["cases"][name]
  assert (theirs["error"] or "").startswith(MORE_THAN_JAX[workload, name])
  assert ours["error"] is None, _excerpt(ours["stderr"])
  # blackjax: two chains of 200 steps; the bars (fastprogress's, on
  # stdout) end complete
  assert bars(ours["stdout"]) == {"": "200/200"}, _excerpt(ours["stdout"])
  assert ours["value"]["shape"] == [2, 200, 3]


# ---- code written for the removed module -------------------------------------

@pytest.mark.parametrize("workload", sorted(LEGACY))
def test_legacy_code_needs_the_legacy_module(workload):
  """Without the patch the library cannot run on current JAX at all."""
  doc = run(workload, "legacy-unpatched")
  assert "import" in doc["whose"], doc["whose"]
  for name, result in doc["cases"].items():
    assert result["error"] is not None and "Error" in result["error"], name
  ours = run(workload, "legacy")["whose"]
  assert list(ours.values()) == ["jax.experimental.host_callback",
                                 "host_callback"], ours


def _decoded(value: Any) -> Any:
  if isinstance(value, dict) and "bytes" in value:
    return np.frombuffer(bytes.fromhex(value["bytes"]), value["dtype"]
                         ).reshape(value["shape"])
  if isinstance(value, dict) and "float" in value:
    return float.fromhex(value["float"])
  if isinstance(value, list):
    return [_decoded(v) for v in value]
  if isinstance(value, dict):
    return {k: _decoded(v) for k, v in value.items()}
  return value


@pytest.mark.parametrize("name", LEGACY["pypesto_jax_objective"])
def test_pypesto(name):
  result = run("pypesto_jax_objective", "legacy")["cases"][name]
  assert result["error"] is None, _excerpt(result["stderr"])
  value = _decoded(result["value"])
  if "expected" in value:
    for got, want in zip(value["pypesto"], value["expected"], strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-12)
  else:
    assert value == {"converged": True, "at_minimum": True}


@pytest.mark.parametrize("name,expected,bar", [
    ("scan", [10_000, 50_005_000],
     ("Running for 10,000 iterations", "10000/10000")),
    ("fori_loop", 10_000, ("Running for 10,000 iterations", "10000/10000")),
    ("scan_print_rate_3_jit", 499_500, ("three at a time", "1000/1000")),
])
def test_jax_tqdm_legacy(name, expected, bar):
  result = run("jax_tqdm_legacy", "legacy")["cases"][name]
  assert result["error"] is None, _excerpt(result["stderr"])
  got = _decoded(result["value"])
  assert np.asarray(got).tolist() == expected
  desc, state = bar
  assert bars(result["stderr"]).get(desc) == state, _excerpt(
      result["stderr"])


# ---- make bench's section 9 --------------------------------------------------

def test_bench_measures_every_workload_patched_and_unpatched():
  """bench/hcb_bench/clients.py, at its smoke size: every workload runs
  with JAX's callbacks and patched, and gets a speed-up (the numbers
  themselves mean nothing here)."""
  code = (
      "import sys; sys.path.insert(0, sys.argv[1])\n"
      "from hcb_bench import clients, harness\n"
      "r = clients.measure_clients(harness.SMOKE, sys.executable)\n"
      "print('\\n'.join(clients.clients_section(r)))\n")
  env = {k: v for k, v in os.environ.items() if k != "HOST_CALLBACK_PATCH"}
  done = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench")],
                        capture_output=True, text=True, env=env, timeout=1500)
  assert done.returncode == 0, done.stderr[-4000:]
  rows = [line for line in done.stdout.splitlines()
          if line.startswith("| ") and "---" not in line][1:]
  assert len(rows) == 3, done.stdout
  for row in rows:
    assert "not measured" not in row and row.endswith("× |"), row
