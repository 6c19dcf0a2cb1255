"""What every client workload shares: cases, what a case's run leaves
behind, and its encoding for the comparison.

A workload is a script (``python workloads/<library>.py RESULT.json``)
that uses one library's public API as its users do, unchanged.  The test
(tests/clients/test_clients.py) runs it twice, with JAX's callbacks and
patched to host_callback's (``python -m host_callback run``), and compares
the two JSON documents case by case.

Each case is a function registered with :func:`case`; :func:`main` runs
them in order and records, per case, its value (arrays by their bytes, so
that equal means bit-identical), the exception it raised (type and
message), and the text the case wrote to ``sys.stdout`` and ``sys.stderr``
while it ran (``contextlib.redirect_stdout``/``redirect_stderr``, as a user
captures a library's output).  No case waits for callbacks
(``jax.effects_barrier``) that a user's code would not: what a computation
prints must be there by the time its result has been read.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import traceback
from typing import Any, Callable

import numpy as np

CASES: list[Callable[[], Any]] = []


def case(fn: Callable[[], Any]) -> Callable[[], Any]:
  """Registers a case (run in the order registered)."""
  CASES.append(fn)
  return fn


def encode(value: Any) -> Any:
  """JSON for a case's value: arrays (and numpy/JAX scalars) as dtype,
  shape and the hex of their bytes (bit for bit), floats by ``float.hex``,
  containers element by element."""
  if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
    a = np.asarray(value)
    return {"dtype": str(a.dtype), "shape": list(a.shape),
            "bytes": np.ascontiguousarray(a).tobytes().hex(),
            "text": np.array2string(a, threshold=8)}
  if isinstance(value, float):
    return {"float": value.hex(), "text": repr(value)}
  if isinstance(value, dict):
    return {str(k): encode(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [encode(v) for v in value]
  return value


# A tqdm bar as drawn: "desc: 100%|####| 10000/10000 [00:01<00:00, ...]",
# or without a count: "100.00%|##########| [00:00<00:00, 399.39%/s]".
# fastprogress's (blackjax's bars), on stdout: "|####----| 50.00% [150/300
# 00:01<00:01]".
_BAR = re.compile(r"^(?P<desc>.*?)(?::\s*)?\s*(?P<pct>[\d.]+)%\|[^|]*\|"
                  r"(?:\s*(?P<n>[\d.]+[kMG]?)/(?P<total>[\d.]+[kMG]?))?")
_FASTPROGRESS = re.compile(r"^(?P<desc>)\s*\|[^|]*\|\s*(?P<pct>[\d.]+)% "
                           r"\[(?P<n>\d+)/(?P<total>\d+)")


def _bar(segment: str) -> re.Match[str] | None:
  segment = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", segment)
  return _BAR.search(segment) or _FASTPROGRESS.search(segment)


def bars(text: str) -> dict[str, str]:
  """The last state each bar in ``text`` drew, ``"n/total"`` (or the
  percentage, for a bar without a count), by description (``""`` for a
  bar without one): what a user sees once the bars are done, without the
  timings and the redraw count, which differ from run to run."""
  last: dict[str, str] = {}
  for segment in re.split(r"[\r\n]", text):
    m = _bar(segment)
    if m:
      last[m.group("desc").strip()] = (
          f"{m.group('n')}/{m.group('total')}" if m.group("n") else
          f"{m.group('pct')}%")
  return last


def without_frames(text: str) -> str:
  """``text`` without the frames of tracebacks (``File "...", line N``,
  the source line and the carets under it), which name the files of the
  run (``python -m host_callback run`` adds runpy's), and without progress
  bars (compared by :func:`bars`) and blank lines."""
  kept: list[str] = []
  skip_source = False
  for line in re.split(r"(?<=\n)", text):
    stripped = line.strip()
    if re.match(r'\s*File "[^"]*", line \d+', line):
      skip_source = True
      continue
    if skip_source and line.startswith("    ") and stripped:
      skip_source = False
      continue
    skip_source = False
    if stripped and set(stripped) <= set("^~"):
      continue
    kept.append(line)
  segments = re.split(r"[\r\n]", "".join(kept))
  # Bars are redrawn a number of times that depends on timing (tqdm's
  # mininterval): their segments go, and with them the blank lines and the
  # cursor movements they leave.
  lines = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", s) for s in segments
           if not _bar(s))
  return "\n".join(line for line in lines if line.strip())


def run_case(fn: Callable[[], Any]) -> dict[str, Any]:
  out, err = io.StringIO(), io.StringIO()
  value = error = None
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      value = encode(fn())
    except Exception as e:  # noqa: BLE001 -- recorded for the comparison
      error = f"{type(e).__name__}: {e}"
      err.write(traceback.format_exc())
  return {"value": value, "error": error, "stdout": out.getvalue(),
          "stderr": err.getvalue()}


def main(whose: Callable[[], dict[str, str]] | None = None) -> None:
  """Runs every case; writes the results (and ``whose()``: where the
  library's callback functions come from) to the JSON file ``argv[1]``."""
  results = {fn.__name__: run_case(fn) for fn in CASES}
  doc = {"cases": results, "whose": whose() if whose else {}}
  with open(sys.argv[1], "w") as f:
    json.dump(doc, f, indent=1)


def module_of(fn: Any) -> str:
  """The top-level package of a function's module: ``jax`` or
  ``host_callback``."""
  return str(getattr(fn, "__module__", "?")).split(".")[0]
