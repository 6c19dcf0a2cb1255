"""The bridge between the Python API and the C runtime (``_hcb``).

It owns what is process-wide on the Python side: the registry of tap sites
(each gets the id that compiled programs carry), the registration of the FFI
handlers with XLA, the last exception raised by a tap function, and the
``atexit`` flush.  ``barrier_wait``, ``stop_outfeed_receiver`` and ``stats``
live here too.
"""

from __future__ import annotations

import atexit
import logging
import threading
import traceback
from typing import Any, Callable, NamedTuple

import jax
import ml_dtypes
import numpy as np

from host_callback import _config
from host_callback import _hcb
from host_callback._types import CallbackException

logger = logging.getLogger("host_callback")

_PLATFORM_CPU = 0


class TapSite(NamedTuple):
  """What a compiled tap refers to by id: the function, how to rebuild its
  argument, the transformations applied around it, and whether it wants the
  device.  Equal sites share an id, so re-tracing the same function hits
  JAX's compilation cache."""

  func: Callable[..., Any]
  treedef: Any
  transforms: tuple[Any, ...]
  with_device: bool


class _ByIdentity:
  """Wraps an unhashable callable so that a site can be hashed by it."""

  __slots__ = ("func",)

  def __init__(self, func: Callable[..., Any]):
    self.func = func

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    return self.func(*args, **kwargs)

  def __hash__(self) -> int:
    return id(self.func)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _ByIdentity) and other.func is self.func

  def __repr__(self) -> str:
    return repr(self.func)


def hashable_callable(func: Callable[..., Any]) -> Callable[..., Any]:
  try:
    hash(func)
    return func
  except TypeError:
    return _ByIdentity(func)


def _dtype_table() -> tuple[Any, ...]:
  table: list[Any] = [None] * 64
  named = {
      1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
      6: np.uint8, 7: np.uint16, 8: np.uint32, 9: np.uint64,
      10: np.float16, 11: np.float32, 12: np.float64, 15: np.complex64,
      16: ml_dtypes.bfloat16, 18: np.complex128,
      19: ml_dtypes.float8_e5m2, 20: ml_dtypes.float8_e4m3fn,
      23: ml_dtypes.float8_e4m3b11fnuz, 24: ml_dtypes.float8_e5m2fnuz,
      25: ml_dtypes.float8_e4m3fnuz,
  }
  for code, name in (28, "float8_e4m3"), (29, "float8_e3m4"), (
      33, "float8_e8m0fnu"):
    if hasattr(ml_dtypes, name):
      named[code] = getattr(ml_dtypes, name)
  for code, dtype in named.items():
    table[code] = np.dtype(dtype)
  return tuple(table)


def _device_for_key(key: int) -> jax.Device:
  """The jax.Device a record came from (called once per device, then
  cached in C)."""
  platform, ordinal = key >> 32, key & 0xFFFFFFFF
  if platform == _PLATFORM_CPU:
    for dev in jax.devices("cpu"):
      if dev.id == ordinal:
        return dev
  raise LookupError(f"no JAX device for platform {platform} ordinal {ordinal}")


class _State:
  """The Python side's process-wide state, guarded by ``lock``."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.site_ids: dict[TapSite, int] = {}
    self.handlers_registered = False
    self.atexit_registered = False
    self.exiting = False
    # (exception, formatted traceback) of the last failing tap function.
    self.last_exception: tuple[BaseException, str] | None = None


_state = _State()


def _on_tap_error(site: TapSite, exc: BaseException) -> None:
  """Called by the C consumer (with the GIL) when a tap function raised."""
  formatted = "".join(
      traceback.format_exception(type(exc), exc, exc.__traceback__))
  logger.error("exception in tap function %r (postponed to barrier_wait):\n%s",
               site.func, formatted)
  with _state.lock:
    _state.last_exception = (exc, formatted)


_hcb.configure(_dtype_table(), _device_for_key, _on_tap_error)
_hcb.set_max_queue_bytes(_config.MAX_QUEUE_BYTES)


def _register_handlers() -> None:
  """Registers the C FFI handlers with XLA (once per process)."""
  for name, capsule in _hcb.ffi_handlers().items():
    jax.ffi.register_ffi_target(name, capsule, platform="cpu")


def ensure_started() -> None:
  """Makes the runtime usable from compiled code: registers the handlers
  and the at-exit flush.  Cheap after the first call."""
  if _state.handlers_registered and _state.atexit_registered:
    return
  with _state.lock:
    if not _state.handlers_registered:
      _register_handlers()
      _state.handlers_registered = True
    if not _state.atexit_registered:
      # Initialise the backends first: their own atexit hooks then run
      # after ours (atexit is LIFO), so the flush can still run JAX.
      jax.devices()
      atexit.register(_at_exit)
      _state.atexit_registered = True


def site_id(site: TapSite) -> int:
  """The runtime id of a tap site, registering it on first use."""
  found = _state.site_ids.get(site)
  if found is not None:
    return found
  ensure_started()
  with _state.lock:
    found = _state.site_ids.get(site)
    if found is None:
      name = getattr(site.func, "__qualname__", None) or repr(site.func)
      found = _hcb.register_tap(site, str(name))
      _state.site_ids[site] = found
    return found


@jax.jit
def _touch(x: jax.Array) -> jax.Array:
  return x + 1


def _refuse_inside_tap(what: str) -> None:
  if _hcb.in_tap():
    raise RuntimeError(
        f"{what} was called from inside a tap function; it would wait for "
        "the very thread that runs it. Call it from the main program.")


def _wait_for_devices() -> None:
  """Runs a tiny computation on every local device and waits for it.  A
  device runs its computations in dispatch order, so once these are done
  every computation started earlier has issued all of its taps."""
  pending = [_touch(jax.device_put(np.int32(0), dev))
             for dev in jax.local_devices(backend="cpu")]
  for out in pending:
    out.block_until_ready()


def barrier_wait(logging_name: str | None = None) -> None:
  """Blocks until every callback of every computation already started on
  every local device has run.

  Then, if any tap function raised since the previous ``barrier_wait``,
  raises :class:`CallbackException` with the last exception's text and
  traceback (as ``__cause__``) and forgets it.

  Args:
    logging_name: a name for this barrier in the debug logs of logger
      ``host_callback``.

  Raises:
    CallbackException: a tap function raised since the previous barrier.
    RuntimeError: called from inside a tap function (it would wait for
      itself).
  """
  _refuse_inside_tap("barrier_wait")
  name = logging_name or ""
  logger.debug("barrier_wait[%s]: start", name)
  if _state.handlers_registered:
    _wait_for_devices()
    _hcb.barrier()
  logger.debug("barrier_wait[%s]: done", name)
  # The runtime counts every failed tap; the Python hook keeps the
  # exception object.  Prefer the object, but never lose an error the hook
  # could not record (e.g. the hook itself failed).
  count, message = _hcb.take_error()
  with _state.lock:
    last, _state.last_exception = _state.last_exception, None
  prefix = "There were exceptions during callback processing. Last one was: "
  if last is not None:
    exc, formatted = last
    raise CallbackException(prefix + formatted) from exc
  if count:
    raise CallbackException(prefix + message)


def stop_outfeed_receiver() -> None:
  """Waits for every pending callback, then stops the runtime's consumer
  threads.  The next tap starts them again.  Exceptions of tap functions
  stay recorded for the next :func:`barrier_wait`."""
  _refuse_inside_tap("stop_outfeed_receiver")
  if _state.handlers_registered:
    _wait_for_devices()
  _hcb.stop()


def stats() -> dict[str, Any]:
  """Counters of the runtime: totals, and one entry per device that has
  had a tap (keyed by ``str(jax.Device)``).

  Keys: ``records_in``/``bytes_in`` (taps issued, bytes copied),
  ``records_out``/``bytes_out`` (taps delivered), ``queued_records``/
  ``queued_bytes``, ``high_water_bytes``, ``producer_waits`` and
  ``producer_wait_ns`` (how often and how long devices waited on a full
  queue), ``errors`` (failed tap functions).
  """
  result: dict[str, Any] = dict(_hcb.stats())
  per_device = {}
  for key in sorted(_hcb.devices()):
    try:
      label = str(_device_for_key(key))
    except LookupError:
      label = f"device-key-{key}"
    per_device[label] = _hcb.stats(key)
  result["devices"] = per_device
  result["max_queue_bytes"] = _config.MAX_QUEUE_BYTES
  return result


def _at_exit() -> None:
  """Delivers every pending tap before the interpreter exits."""
  _state.exiting = True
  try:
    barrier_wait("at_exit")
  except CallbackException as e:
    logger.error("host_callback: %s", e)
  except Exception:  # JAX may already be shutting down: still stop.
    logger.exception("host_callback: at-exit barrier failed")
  finally:
    _hcb.shutdown()
