"""The FFI handlers registered with XLA: CPU's, and CUDA's where JAX has a
CUDA backend, with the CUDA runtime (libcudart) that libhcb loads.

Called once per process, by ``_runtime.ensure_started``.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import jax

from host_callback import _config
from host_callback import _hcb
from host_callback import _jax
from host_callback._devices import local_cuda_devices
from host_callback._state import state

logger = logging.getLogger("host_callback")


def register_handlers() -> None:
  """Registers the C FFI handlers with XLA (once per process), and the type
  of the state by which the custom calls that carry a callback id count the
  live executables that embed it (python/_hcb/lifetime.c): for CPU, and
  for CUDA when JAX has a CUDA backend."""
  _jax.register_ffi_state_type("hcb_target_hold", _hcb.hold_type(), "cpu")
  for name, handler in _hcb.ffi_handlers("cpu").items():
    jax.ffi.register_ffi_target(name, handler, platform="cpu")
  # Whether JAX has a CUDA backend is known for sure only once its backends
  # are initialised (a plugin can be installed and fail to initialise, or
  # be left out by JAX_PLATFORMS); ensure_started initialises them anyway.
  cuda_devices = local_cuda_devices()
  if cuda_devices:
    register_cuda_handlers()
  state.cuda_devices = cuda_devices


def cudart_path() -> str | None:
  """The CUDA runtime library of the NVIDIA wheels that JAX's CUDA plugin
  depends on (``nvidia-cuda-runtime``: ``nvidia/cu13/lib/libcudart.so.13``
  for CUDA 13, ``nvidia/cuda_runtime/lib/libcudart.so.12`` for CUDA 12;
  the plugin's own CUDA version first), or None when neither is
  installed."""
  candidates = [("nvidia.cu13", "libcudart.so.13"),
                ("nvidia.cuda_runtime", "libcudart.so.12")]
  if importlib.util.find_spec("jax_cuda13_plugin") is None:
    candidates.reverse()
  for package, library in candidates:
    try:
      spec = importlib.util.find_spec(package)
    except ImportError:  # no "nvidia" namespace package at all
      continue
    for folder in (spec.submodule_search_locations or []) if spec else []:
      path = os.path.join(folder, "lib", library)
      if os.path.isfile(path):
        return path
  return None


def register_cuda_handlers() -> None:
  """Registers the CUDA handlers.  libhcb finds the CUDA runtime at
  run time (``_hcb.cuda_load``): the NVIDIA wheel's, else the
  system's.  If it cannot load it now, the handlers are registered anyway:
  they try again when first run, and fail with a clear error then.  The
  size of the pinned pool is read from the environment here, where the
  pool is set up: on a machine without CUDA it is never read."""
  _hcb.cuda_set_pinned_bytes(_config.cuda_pinned_bytes())
  try:
    _hcb.cuda_load(cudart_path())
  except Exception as e:  # pylint: disable=broad-except
    logger.warning("host_callback: the CUDA runtime could not be loaded "
                   "(%s); host callbacks on CUDA devices will fail", e)
  # No hold type: the CUDA handlers count no holds (_registry.py, the
  # life of a site's id).
  for name, handler in _hcb.ffi_handlers("cuda").items():
    jax.ffi.register_ffi_target(name, handler, platform="CUDA")
