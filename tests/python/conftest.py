"""Shared fixtures: a thread-safe collector of tap calls, the dtypes every
callback must carry, and helpers that run a Python snippet in a process of
its own (for settings that must be in place before JAX or host_callback
initialise; warm_python.py says how those processes start).

The test session has 4 CPU devices (set before JAX initialises)."""

from __future__ import annotations

import inspect
import os
import re
import threading
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "4")

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import host_callback as hcb  # noqa: E402
from warm_python import run_python, start_python  # noqa: E402,F401

# How often the tests that hunt rare races repeat their scenario, and how
# many random inputs the tests that sample draw: as written at 1 (make
# pytest, the main combination), fewer at the HOST_CALLBACK_TEST_REPEAT
# that make pytest-matrix sets for the other combinations (each still runs
# every test; a scenario that holds on the main combination's hundreds of
# runs is checked there for the version).
REPEAT = float(os.environ.get("HOST_CALLBACK_TEST_REPEAT", "1"))


def repeats(n: int) -> int:
  """``n`` repetitions, scaled by ``HOST_CALLBACK_TEST_REPEAT``: at least
  one."""
  return max(1, round(n * REPEAT))


# jax.debug.log is new in JAX 0.8: on an older JAX neither JAX's nor ours
# exists (test_debug_namespace_is_jax_debugs checks that ours is absent
# there), and a test of log has nothing to run.
needs_debug_log = pytest.mark.skipif(
    not hasattr(jax.debug, "log"),
    reason="jax.debug.log is new in JAX 0.8 (and so is ours)")


# The mesh and x64 APIs of the running JAX, for the tests that use them:
# jax.set_mesh (a context, or for the rest of the program) is new in 0.7,
# where 0.6 has jax.sharding.use_mesh and jax.sharding.set_mesh;
# jax.sharding.get_mesh is new in 0.8; jax.enable_x64 in 0.9, where older
# ones have jax.experimental.enable_x64.
SET_MESH, MESH_CONTEXT = (
    ("jax.set_mesh", "jax.set_mesh") if hasattr(jax, "set_mesh")
    else ("jax.sharding.set_mesh", "jax.sharding.use_mesh"))


def flush() -> None:
  """Waits until every callback has run, JAX's and ours."""
  jax.effects_barrier()
  hcb.barrier_wait()


def devices_mesh() -> jax.sharding.Mesh:
  """Every device of the session along one axis, "d"."""
  return jax.sharding.Mesh(np.array(jax.devices()), ("d",))


def mesh_context(mesh: jax.sharding.Mesh) -> Any:
  """``with jax.set_mesh(mesh):`` on the running JAX."""
  if hasattr(jax, "set_mesh"):
    return jax.set_mesh(mesh)
  return jax.sharding.use_mesh(mesh)


def no_concrete_mesh() -> bool:
  """Whether no mesh is set (``jax.sharding.get_mesh().empty``)."""
  if hasattr(jax.sharding, "get_mesh"):
    return bool(jax.sharding.get_mesh().empty)
  from jax._src import mesh  # JAX 0.6 and 0.7; 0.6 gives None for none
  found = mesh.get_concrete_mesh()
  return found is None or bool(found.empty)


# jax.debug.print(..., skip_format_check=True) is new in JAX 0.7: before,
# a format must use every argument (so there is no print of arguments
# after a format without placeholders to compare with).
HAS_SKIP_FORMAT_CHECK = "skip_format_check" in inspect.signature(
    jax.debug.print).parameters


def enable_x64_context() -> Any:
  """``with jax.enable_x64(True):`` on the running JAX."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64
  return enable_x64(True)


# Every dtype a callback carries without x64 (the 64-bit ones need x64 and
# are tested in subprocesses).
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16,
          np.uint32, np.float16, ml_dtypes.bfloat16, np.float32, np.complex64]


class Collector:
  """A tap function that records (arg, transforms, device) per call."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.calls: list[tuple[Any, Any, Any]] = []
    self.threads: set[int] = set()

  def __call__(self, arg: Any, transforms: Any, *, device: Any = None) -> None:
    with self.lock:
      self.calls.append((arg, transforms, device))
      self.threads.add(threading.get_ident())

  @property
  def args(self) -> list[Any]:
    with self.lock:
      return [c[0] for c in self.calls]


# `make check`, the fast loop: the tests of the API that most changes touch
# (docs/contributing.md).  The rest -- id_print's differential test of
# 20,000 arrays, the runtime's robustness, lifetimes, several processes, the
# benchmarks' smoke runs, the docs, the Makefile -- runs in `make test`.
CHECK_FILES = {"test_id_tap.py", "test_call.py", "test_buffer_callback.py",
               "test_dropins.py", "test_dropins_pure_io.py",
               "test_transforms.py", "test_native.py",
               "test_arguments.py", "test_layers.py",
               "test_jax_internals.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  for item in items:
    if item.path.name in CHECK_FILES:
      item.add_marker(pytest.mark.check)


@pytest.fixture
def collect() -> Collector:
  return Collector()


@pytest.fixture(autouse=True)
def clean_barrier():
  """Every test starts and ends with no pending taps or exceptions."""
  try:
    hcb.barrier_wait("test setup")
  except hcb.CallbackException:
    pass
  yield
  hcb.barrier_wait("test teardown")


def run_python_until(code: str, pattern: str, stream: str,
                     env: dict[str, str] | None = None,
                     timeout: float = 60) -> tuple[str, str, int | None]:
  """Runs ``code`` as :func:`run_python` does, until ``pattern`` (a regular
  expression, multiline) matches what it wrote to ``stream`` ("stdout" or
  "stderr") so far, or it ends, or ``timeout`` seconds pass; a process
  still running then is killed.  For a program that must say something
  and then hang (a deadlock diagnosed): the test waits for the words, not
  for the timeout.  Returns (stdout, stderr, the exit status, or None when
  it was killed)."""
  proc = start_python(code, env)
  text = {"stdout": "", "stderr": ""}
  seen = threading.Event()
  lock = threading.Lock()

  def read(name: str) -> None:
    for line in getattr(proc, name):
      with lock:
        text[name] += line
        if name == stream and re.search(pattern, text[name], re.M):
          seen.set()
    if name == stream:
      seen.set()  # it ended: nothing more will come

  readers = [threading.Thread(target=read, args=(n,), daemon=True)
             for n in text]
  for r in readers:
    r.start()
  seen.wait(timeout)
  status = proc.poll()
  if status is None:
    proc.kill()
  proc.wait()
  for r in readers:
    r.join()
  return text["stdout"], text["stderr"], status
