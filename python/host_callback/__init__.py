"""Host callbacks for JAX programs, with a C runtime.

The API of the removed ``jax.experimental.host_callback``; migrating is one
line::

    import host_callback as hcb   # was: from jax.experimental import host_callback as hcb

``id_tap`` sends values from compiled code to a Python function on the host,
asynchronously, through per-device bounded queues served by C consumer
threads.  ``call`` calls a Python function synchronously and returns its
checked result to the computation.  ``barrier_wait`` waits for every
pending tap and reports exceptions raised by callbacks.  ``native_tap`` and
``native_call`` make C functions callbacks (no Python, no GIL per call);
``get_include``/``get_library`` locate the C API.  ``pure_callback``,
``io_callback`` and the ``debug`` module (``callback``, ``print``, ``log``)
are JAX's modern callback APIs on the same runtime; ``patch_jax`` puts them
under JAX's own names (for code one does not own) and
``install_legacy_module`` serves ``import jax.experimental.host_callback``
(also at start-up, without edits: ``HOST_CALLBACK_PATCH=jax,legacy`` or
``python -m host_callback run``).  ``host_callback.progress``
(imported on first use; it needs tqdm, the ``progress`` extra) has
jax-tqdm's progress bars.  See README.md and docs/ (docs/api.md: all of it).
"""

from typing import TYPE_CHECKING

from host_callback._buffer import Buffer
from host_callback._buffer import ExecutionContext
from host_callback._buffer import ExecutionStage
from host_callback._buffer import buffer_callback
from host_callback import debug
from host_callback._call import call
from host_callback._dropins import io_callback
from host_callback._dropins import pure_callback
from host_callback._install import get_cmake_dir
from host_callback._install import get_include
from host_callback._install import get_library
from host_callback._install import get_pkgconfig_dir
from host_callback._native import NativeCallback
from host_callback._native import NativeTap
from host_callback._native import native_call
from host_callback._native import native_tap
from host_callback._patch import Patch
from host_callback._patch import install_legacy_module
from host_callback._patch import patch_jax
from host_callback._patch import uninstall_legacy_module
from host_callback._patch import unpatch_jax
from host_callback._barrier import barrier_wait
from host_callback._barrier import stop_outfeed_receiver
from host_callback._runtime import stats
from host_callback._tap import id_print
from host_callback._tap import id_tap
from host_callback._types import CallbackException
from host_callback._types import CallbackFlavor
from host_callback._types import TapFunctionException

__version__ = "0.1.0"

if TYPE_CHECKING:
  from host_callback import progress as progress
else:
  def __getattr__(name: str):
    # host_callback.progress imports tqdm, an optional dependency: only
    # when it is first used, never with the package.
    if name == "progress":
      import importlib
      return importlib.import_module("host_callback.progress")
    raise AttributeError(f"module 'host_callback' has no attribute {name!r}")

__all__ = [
    "Buffer",
    "CallbackException",
    "CallbackFlavor",
    "ExecutionContext",
    "ExecutionStage",
    "NativeCallback",
    "NativeTap",
    "Patch",
    "TapFunctionException",
    "barrier_wait",
    "buffer_callback",
    "call",
    "debug",
    "get_cmake_dir",
    "get_include",
    "get_library",
    "get_pkgconfig_dir",
    "id_print",
    "id_tap",
    "install_legacy_module",
    "io_callback",
    "native_call",
    "native_tap",
    "patch_jax",
    "pure_callback",
    "stats",
    "stop_outfeed_receiver",
    "uninstall_legacy_module",
    "unpatch_jax",
]
