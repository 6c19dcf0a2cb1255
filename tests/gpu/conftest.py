"""The GPU test suite (``make test-gpu``, and ``make gpu-check`` with the
probes of probes/): every API of host_callback on a real NVIDIA GPU with
JAX's CUDA plugin, no mocks.  CI has no GPU and never runs it (``make
test`` collects tests/python only, which runs the probes' dry run).

Without a GPU every test is skipped, unless HCB_REQUIRE_GPU=1 (which
``make test-gpu`` sets): then they fail, so that a GPU run that silently
fell back to the CPU cannot pass.

HCB_GPU_DRY_RUN=1 runs the suite on a second CPU device instead, without
CuPy, nvcc or the GPU-only assertions: a check of the tests themselves on
a machine without a GPU, not of the GPU.

Fixtures here: the GPU and CPU devices, a thread-safe collector of tap
calls, a clean barrier around every test; helpers in gpu_support.py.
"""

from __future__ import annotations

import os
import threading
from typing import Any

# First: in a dry run it sets the CPU device count before JAX starts.
from gpu_support import gpu_devices  # isort: skip

import jax  # noqa: E402
import pytest  # noqa: E402

import host_callback as hcb  # noqa: E402


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


