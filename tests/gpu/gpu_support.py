"""What the GPU tests share beside their fixtures (conftest.py): the
devices under test (a GPU, or a second CPU device with HCB_GPU_DRY_RUN=1),
a runner of Python snippets in a fresh interpreter, and C sources built
with the machine's compilers.  A module of its own name, so that the tests
import it as such (``conftest`` is also tests/python's)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

DRY_RUN = os.environ.get("HCB_GPU_DRY_RUN") == "1"
if DRY_RUN:
  os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")

import jax  # noqa: E402
import pytest  # noqa: E402

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
