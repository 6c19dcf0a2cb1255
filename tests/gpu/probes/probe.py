"""What the probes of ``make gpu-check`` share (tools/gpu_check.py runs
each in a fresh interpreter, under its own timeout).

A probe checks one risk of the GPU path on a real GPU and ends with one
line: ``PASS: ...`` (exit 0), ``FAIL: ...`` (exit 1) or ``SKIP: ...``
(exit 3).  With ``HCB_GPU_DRY_RUN=1`` it runs on a second CPU device
instead, where that means something (a check of the probe itself on a
machine without a GPU, as tests/gpu's dry run), and skips where it does
not.  A probe that sets environment variables read when JAX or
host_callback start sets them before it imports this module's
:func:`device` users (jax, host_callback).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from typing import Any, NoReturn

DRY_RUN = os.environ.get("HCB_GPU_DRY_RUN") == "1"
if DRY_RUN:
  os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")

# A probe that hangs is killed by tools/gpu_check.py; shortly before, it
# writes every thread's stack to its log (where it waits: the GPU, the
# queue, the pool, the GIL), which gpu_check asks for with this variable.
if os.environ.get("HCB_PROBE_STACKS_AFTER_S"):
  faulthandler.dump_traceback_later(
      float(os.environ["HCB_PROBE_STACKS_AFTER_S"]), exit=False)

SKIPPED = 3  # the exit status of a skipped probe


def device() -> Any:
  """The device under test: the first GPU, or the second CPU device in a
  dry run."""
  import jax  # pylint: disable=import-outside-toplevel
  if DRY_RUN:
    return jax.devices("cpu")[1]
  return jax.devices("gpu")[0]


def done(ok: bool, message: str) -> NoReturn:
  """Ends the probe: PASS or FAIL, with what it saw."""
  prefix = "PASS" if ok else "FAIL"
  if DRY_RUN:
    message += " (dry run on a CPU device)"
  print(f"{prefix}: {message}", flush=True)
  sys.exit(0 if ok else 1)


def skip(message: str) -> NoReturn:
  print(f"SKIP: {message}", flush=True)
  sys.exit(SKIPPED)
