"""The GPU test suite (``make test-gpu``): every API of host_callback on a
real NVIDIA GPU with JAX's CUDA plugin, no mocks.  CI has no GPU and never
runs it (``make test`` collects tests/python only).

Without a GPU every test is skipped, unless HCB_REQUIRE_GPU=1 (which
``make test-gpu`` sets): then they fail, so that a GPU run that silently
fell back to the CPU cannot pass.

HCB_GPU_DRY_RUN=1 runs the suite on a second CPU device instead, without
CuPy, nvcc or the GPU-only assertions: a check of the tests themselves on
a machine without a GPU, not of the GPU.

Shared here: the GPU and CPU devices, a thread-safe collector of tap calls,
a clean barrier around every test, a runner of Python snippets in a fresh
interpreter, and C sources built with the machine's compilers.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
from typing import Any

DRY_RUN = os.environ.get("HCB_GPU_DRY_RUN") == "1"
if DRY_RUN:
  os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")

import jax  # noqa: E402
import pytest  # noqa: E402

import host_callback as hcb  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
# The platform of the devices under test ("gpu"; "cpu" in a dry run).
PLATFORM = "cpu" if DRY_RUN else "gpu"


def gpu_devices() -> list[jax.Device]:
  if DRY_RUN:
    return jax.devices("cpu")[1:]
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


def needs_real_gpu() -> None:
  """Skips the calling test in a dry run."""
  if DRY_RUN:
    pytest.skip("needs a real GPU (HCB_GPU_DRY_RUN=1)")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
  del config
  if gpu_devices():
    return
  reason = (f"no GPU: JAX's backends here are {jax.default_backend()!r} "
            "(tests/gpu run on a machine with an NVIDIA GPU: make test-gpu)")
  if os.environ.get("HCB_REQUIRE_GPU") == "1":
    raise pytest.UsageError(reason)
  for item in items:
    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def gpu() -> jax.Device:
  """The first GPU."""
  return gpu_devices()[0]


@pytest.fixture
def cpu() -> jax.Device:
  """The first CPU device, to compare the GPU's behaviour with."""
  return jax.devices("cpu")[0]


class Collector:
  """A tap function that records (arg, transforms, device) per call."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.calls: list[tuple[Any, Any, Any]] = []

  def __call__(self, arg: Any, transforms: Any, *, device: Any = None) -> None:
    with self.lock:
      self.calls.append((arg, transforms, device))

  @property
  def args(self) -> list[Any]:
    with self.lock:
      return [c[0] for c in self.calls]


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
  try:
    hcb.barrier_wait("test teardown")
  except hcb.CallbackException:
    pass


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
  """Runs ``code`` in a fresh interpreter (for settings read when the
  runtime starts)."""
  full_env = dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                        capture_output=True, text=True, env=full_env,
                        timeout=timeout)


def build_shared(tmp: pathlib.Path, name: str, source: str, *,
                 cuda: bool = False) -> pathlib.Path:
  """``source`` built into ``tmp``/lib``name``.so against include/hcb and
  XLA's FFI header: with nvcc (CUDA C++) when ``cuda``, else with cc (C11).
  Skips the test when the compiler is missing."""
  compiler = "nvcc" if cuda else os.environ.get("CC", "cc")
  if shutil.which(compiler) is None:
    pytest.skip(f"{compiler} is not installed")
  src = tmp / (name + (".cu" if cuda else ".c"))
  src.write_text(source)
  out = tmp / f"lib{name}.so"
  # The installed package's headers (hcb.h, ffi.h, XLA's) and libhcb.
  flags = subprocess.run(
      [sys.executable, "-m", "host_callback", "--cflags", "--libs"],
      capture_output=True, text=True, check=True).stdout.split()
  if cuda:  # nvcc hands -Wl,... to the host linker through -Xlinker
    flags = [f for flag in flags for f in (
        ["-Xlinker", flag[4:].replace(",", "=", 1)]
        if flag.startswith("-Wl,") else [flag])]
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O2", str(src), *flags,
           "-o", str(out)]
  else:
    cmd = [compiler, "-std=c11", "-shared", "-fPIC", "-O2", str(src), *flags,
           "-o", str(out)]
  done = subprocess.run(cmd, capture_output=True, text=True)
  assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}{done.stderr}"
  return out
