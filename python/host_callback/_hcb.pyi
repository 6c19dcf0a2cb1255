"""Type stub of ``host_callback._hcb``, the CPython extension (python/_hcb/).

The C runtime (libhcb) as the Python package sees it: registration of tap,
call, buffer-callback and print sites as runtime targets, the FFI handlers
as capsules, the runtime's barrier, stop, stats and errors, and the
:class:`Buffer` type that buffer callbacks receive.  Functions of the method
table take their arguments by position only (``METH_VARARGS``, ``METH_O``,
``METH_FASTCALL``), but the ``register_*`` functions and ``check_results``,
which take keyword-only ones.  A site passed to a ``register_*`` function is
kept until ``release``; the C code reads the fields of sites, print nodes
and print options by name (a site's once, at registration).
"""

from collections.abc import Callable, Sequence
from typing import Any, Final, final

import jax
import numpy as np
import numpy.typing as npt
from _typeshed import SupportsWrite
from typing_extensions import CapsuleType

from host_callback._buffer import BufferSite
from host_callback._print import PrintNode, PrintOptions
from host_callback._sites import CallSite
from host_callback._sites import TapSite

# The runtime's version, "MAJOR.MINOR.PATCH" (hcb_version_string()).
version: str
# The C values the Python side uses (include/hcb/hcb.h, XLA's FFI): the
# device key that means every device (HCB_ALL_DEVICES), the most bytes of
# a name the runtime keeps (HCB_NAME_MAX), the size of
# configure()'s dtype table, a device key's platform, the print kinds and
# float modes of register_print, the printer's precision bound, and XLA's
# FFI execution stages.
ALL_DEVICES: Final[int]
NAME_MAX: Final[int]
NDTYPES: Final[int]
PLATFORM_CPU: Final[int]
PLATFORM_CUDA: Final[int]
PRINT_ARRAY: Final[int]
PRINT_TEXT: Final[int]
PRINT_TUPLE: Final[int]
PRINT_LIST: Final[int]
PRINT_DICT: Final[int]
PRINT_CONCAT: Final[int]
PRINT_STR: Final[int]
PRINT_FIELD: Final[int]
FLOATMODE_MAXPREC: Final[int]
FLOATMODE_FIXED: Final[int]
FLOATMODE_UNIQUE: Final[int]
FLOATMODE_MAXPREC_EQUAL: Final[int]
PRINT_MAX_PRECISION: Final[int]
STAGE_INSTANTIATE: Final[int]
STAGE_PREPARE: Final[int]
STAGE_INITIALIZE: Final[int]
STAGE_EXECUTE: Final[int]

def dtype_name(code: int, /) -> str | None:
  """numpy's name of XLA element type ``code`` (``hcb_dtype_name``), or
  None for a code that is no array element type."""

@final
class Buffer:
  """One XLA buffer seen by a buffer_callback: valid only while the callback
  runs (afterwards every use raises ``RuntimeError``).  Inputs are
  read-only.  Made only by the runtime."""

  @property
  def shape(self) -> tuple[int, ...]: ...
  @property
  def dtype(self) -> np.dtype[Any]: ...
  @property
  def ndim(self) -> int: ...
  @property
  def writeable(self) -> bool:
    """True for a result (the callback writes it), False for an operand."""
  # A GPU buffer's CUDA Array Interface (version 3: shape, typestr,
  # data=(pointer, read-only), strides None, stream: XLA's stream during
  # the call, else None); raises AttributeError for a CPU buffer.
  @property
  def __cuda_array_interface__(self) -> dict[str, Any]: ...
  def __array__(self, dtype: npt.DTypeLike | None = None,
                copy: bool | None = None) -> npt.NDArray[Any]:
    """A numpy view of the buffer (no copy), or a copy with ``dtype`` or
    ``copy=True``; ``TypeError`` for a GPU buffer (device memory)."""
  def __dlpack__(self, stream: int | None = None,
                 max_version: tuple[int, int] | None = None,
                 dl_device: tuple[int, int] | None = None,
                 copy: bool | None = None) -> CapsuleType:
    """A DLPack capsule viewing the buffer on its own device; ``copy=True``
    and another ``dl_device`` raise ``BufferError``.  For a GPU buffer,
    ``stream`` is the consumer's (None or 1: the legacy default stream, 2:
    the per-thread one, a cudaStream_t, or -1: none), ordered after XLA's
    stream; 0 raises ``BufferError``."""
  def __dlpack_device__(self) -> tuple[int, int]:
    """(device type, device id): (1, 0), kDLCPU, or (2, ordinal),
    kDLCUDA, for a GPU buffer."""
  # The buffer protocol (PEP 3118; memoryview(buf)): zero-copy for the
  # dtypes with a format code, BufferError for the others (bfloat16,
  # float8), for writable views of inputs and for GPU buffers.  Python
  # exposes the method itself from 3.12.
  def __buffer__(self, flags: int, /) -> memoryview: ...
  @classmethod
  def _test_view(cls, array: npt.NDArray[Any], device_key: int,
                 writable: bool, /) -> Buffer:
    """For tests only: a Buffer over ``array``'s memory that says it is on
    ``device_key`` (never invalidated)."""

def configure(dtypes: tuple[np.dtype[Any] | None, ...],
              device_lookup: Callable[[int], jax.Device],
              on_error: Callable[[TapSite | CallSite | BufferSite,
                                  BaseException, bool], str],
              tree_flatten: Callable[[Any], tuple[list[Any], Any]],
              warn: Callable[[str], object], /) -> None:
  """Sets the Python hooks: the numpy dtype of each hcb_dtype code (64
  entries, None where there is none), the jax.Device of a device key, the
  handler of a failing callback (site, exception, whether the function
  raised it) -> formatted traceback,
  jax.tree_util.tree_flatten, and where the runtime's warnings go."""

def in_tap() -> bool:
  """Whether this thread is running a tap function."""

def in_call() -> bool:
  """Whether this thread is running a call or buffer_callback function
  (inside the computation that waits for it)."""

def register_tap(*, site: TapSite, name: str) -> int:
  """Registers a Python tap site; returns its id.  The site's fields are
  read by name, once."""

def register_call(*, site: CallSite, name: str) -> int:
  """Registers a Python call site; returns its id.  The site's fields are
  read by name, once."""

def register_buffer_callback(*, site: BufferSite, name: str) -> int:
  """Registers a Python buffer callback site; returns its id.  The site's
  fields are read by name, once."""

def set_byte_order_refused(flag: bool) -> None:
  """Whether the drop-ins refuse a result in the other byte order in JAX
  0.10's words (the default) or report its dtype as any other, as JAX 0.9
  does."""

def check_results(*, site: CallSite, name: str,
                  result: Any) -> list[np.ndarray[Any, Any]]:
  """Checks what call function ``name`` returned against the site's
  declaration with the rules and messages of compiled calls, and returns
  it as one new array per declared leaf; raises (TypeError, ValueError)
  where a compiled call would fail.  For inline mode."""

def release(callback_id: int, /) -> bool:
  """Drops the Python references of Python target ``callback_id`` (now, or
  when its running deliveries return); False when it is no live Python
  target.  A record or call for it afterwards is an error."""

def hold_type() -> Any:
  """The FFI type of a hold on a target, for jax.ffi.register_ffi_type."""

def holds(callback_id: int, /) -> int:
  """Live executables that embed Python target ``callback_id`` (-1: no
  such target)."""

def wait_unused(timeout_s: float, /) -> None:
  """Returns when a hold count dropped to zero or notify_unused() was
  called since the previous call, or after ``timeout_s``."""

def notify_unused() -> None:
  """Wakes wait_unused."""

def register_print(*, site: TapSite, name: str, nodes: Sequence[PrintNode],
                   kv_before: str, kv_after: str, with_device: bool,
                   devices: dict[int, str],
                   options: PrintOptions,
                   stream: SupportsWrite[str] | None,
                   dtypes: Sequence[int],
                   log: Callable[[str, jax.Device], object] | None
                   ) -> int | None:
  """Registers id_print's C target for ``site`` (whose func is a
  host_callback._print.Printer, or debug.print's and debug.log's tap);
  returns its id, or None, registering nothing, when libhcb's printer does
  not print one of ``dtypes`` (the codes of the value's leaves; it decides,
  ``hcb_print_supports``).  ``devices`` maps device keys to names;
  ``stream`` None means ``sys.stdout``.  With ``log`` the target writes
  nothing: each record is one call ``log(text, device)`` (the text
  without its newline, the record's ``jax.Device``)."""

def format_value(nodes: Sequence[PrintNode],
                 arrays: Sequence[npt.ArrayLike],
                 options: PrintOptions,
                 text_of: Callable[[Any], str] | None = None, /) -> str:
  """The text of one value, laid out by ``nodes``, by the C printer; with
  ``text_of``, an array whose dtype the C printer does not print is
  ``text_of(array)`` instead of an error."""

def print_write(stream: SupportsWrite[str] | None, texts: tuple[str, ...],
                /) -> None:
  """Writes ``texts`` to ``stream`` (None: ``sys.stdout``) under id_print's
  lock."""

def register_native_tap(fn: int, user: int, name: str, /) -> int:
  """Registers the C ``hcb_tap_fn`` at address ``fn`` with its ``void
  *user``; returns its id."""

def register_native_call(fn: int, user: int, name: str, /) -> int:
  """Registers the C ``hcb_call_fn`` at address ``fn`` with its ``void
  *user``; returns its id."""

def submit_tap(callback_id: int, device_key: int,
               arrays: Sequence[npt.ArrayLike], deliver: int = 0, /) -> None:
  """Queues a tap record of ``arrays`` (any number) for ``device_key``, or
  with ``deliver`` 1 or 2 delivers it now, in this thread, without the GIL
  while it waits (``hcb_runtime_deliver``): 1 raises the tap function's
  failure, 2 only records it."""

def run_call(callback_id: int, device_key: int,
             args: Sequence[npt.ArrayLike],
             outs: Sequence[npt.NDArray[Any]], ndevices: int, /) -> str | None:
  """Runs a call target on ``args``, writing ``outs`` (C-contiguous,
  writable) in place.  With ``ndevices`` > 0 a failure is parked for the
  ``ndevices`` devices of a sharded computation and its message returned;
  None when the call succeeded."""

def ffi_handlers(
    platform: str = "cpu", /) -> dict[str, CapsuleType | dict[str, CapsuleType]]:
  """{name: capsule, or {stage: capsule}} of the XLA FFI handlers of
  ``platform`` ('cpu' or 'cuda'), for jax.ffi.register_ffi_target."""

def cuda_load(path: str | None, /) -> None:
  """Loads the CUDA runtime the CUDA handlers use: from ``path``, or with
  None the one already in the process, else libcudart by name.  Raises
  RuntimeError naming what was tried when none loads."""

def cuda_set_pinned_bytes(n: int, /) -> None:
  """Sets the size of the pinned pool GPU taps and calls copy into (before
  its first use, or while none of it is in use: else RuntimeError)."""

def cuda_pool_stats(ordinal: int, /) -> dict[str, int] | None:
  """What the pinned pool of CUDA device ``ordinal`` has done (capacity,
  used_bytes, in_flight_bytes, kept_bytes, waits, refusals, syncs,
  pin_failures), or None when it has none (no GPU callback ran there)."""

def call_stream() -> int:
  """In a call target that the CUDA handler ``hcb_buffer_call`` runs: XLA's
  cudaStream_t, as an int; 0 anywhere else."""

def barrier(device_key: int | None = None, /) -> None:
  """Waits (without the GIL) until the records submitted so far to
  ``device_key`` (None: every device) are consumed."""

def stop() -> None:
  """Drains the queues and joins the consumer threads."""

def shutdown() -> None:
  """Stops, and never calls Python taps again (interpreter exit)."""

def abandon() -> None:
  """Never calls Python taps again, without waiting for the consumer
  threads (exit after an interrupted flush)."""

def set_max_queue_bytes(n: int, /) -> None:
  """The per-device queue bound in bytes."""

def set_only_cpu_device(ordinal: int, /) -> None:
  """The only CPU device's id, or -1 when there are several."""

def stats(device_key: int | None = None, /) -> dict[str, int]:
  """The runtime's counters, of ``device_key`` or (None) of every device."""

def devices() -> list[int]:
  """The device keys that have a queue."""

def take_error() -> tuple[int, str]:
  """(count, last message) of the callback errors since the last call."""
