"""The bridge between the Python API and the C runtime (``_hcb``).

It owns what is process-wide on the Python side: the registry of tap and
call sites (each gets the id that compiled programs carry), the registration
of the FFI handlers with XLA, the last exception raised by a callback, and
the ``atexit`` flush.  ``barrier_wait``, ``stop_outfeed_receiver`` and ``stats``
live here too.

The life of a site's id (DESIGN.md section 4: callables are kept while
something can still call them).  Two things hold a Python site's id:

- the compiled executables that embed it: the custom calls that carry a
  callback id count them (python/_hcb/lifetime.c: XLA's INSTANTIATE stage
  takes a hold, destroying the executable drops it).  XLA keeps an
  executable alive while a computation of it runs and while JAX's C++
  dispatch cache holds it, so no computation can reach a site with no
  hold.  (On CPU; the CUDA handlers count no holds: see below);
- Python: the site's :class:`_Registration`, which :func:`lowered_site_id`
  makes a keepalive of each lowering (JAX keeps it with the lowering caches
  and the executable's Python object).  It covers what the holds do not:
  the lowered but not yet compiled program, and jit over sharded operands,
  where the id travels in JAX's own Python callback.

The registry refers to registrations weakly, so while either lives the same
site gets the same id (and re-tracing the same function hits JAX's
compilation cache).  When the registration is finalised the id is retired;
once it has no hold either, the computations JAX ran with runtime tokens
from the retiring thread have finished and every record queued by then has
been delivered, the C target drops its references (``_hcb.release``): the
function, its closure, the treedefs.  A background thread (``hcb-release``)
does that as soon as it can, and ``barrier_wait`` does it for what was
retired before it.  A record or call that still reached a released id would
be an error naming the function, never a call to freed memory.  Native (C)
targets are kept for the process: they hold no Python.

On CUDA no hold counts the executables (python/_hcb/handlers.c), and a GPU
computation can still be running, its taps not yet queued, when its
executable's Python object and so the registration are gone.  So where
JAX has CUDA devices a retired id is released only after the CUDA devices
have finished every computation dispatched before (the probes of
:func:`_wait_for_devices`) and the records they issued are delivered.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib.util
import logging
import os
import re
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, NamedTuple

import jax
import ml_dtypes
import numpy as np

from host_callback import _config
from host_callback import _hcb
from host_callback import _jax
from host_callback._native import NativeCallback
from host_callback._native import NativeTap
from host_callback._types import CallbackException

logger = logging.getLogger("host_callback")

_PLATFORM_CPU = _hcb.PLATFORM_CPU
_PLATFORM_CUDA = _hcb.PLATFORM_CUDA


class Transforms(tuple):
  """The ``transforms`` a tap function receives: ``(name, params)`` pairs,
  innermost transformation first, e.g. ``(('batch', {'batch_dims': (0,
  None)}),)``.  A tuple that hashes its dict params, so that it can be part
  of a tap site."""

  __slots__ = ()

  def __hash__(self) -> int:
    return hash(tuple((name, tuple(sorted(params.items())))
                      for name, params in self))

  def add(self, name: str, params: dict[str, Any]) -> Transforms:
    """These transforms with ``(name, params)`` applied around them."""
    return Transforms((*self, (name, params)))


class JaxErrorLog(NamedTuple):
  """How an error of a drop-in of JAX's callbacks is reported: JAX's log
  record (``logger``, ``message``, level ERROR, with the exception; a
  ``logger`` of None logs nothing, as JAX's buffer_callback), only for an
  exception the function raised (JAX logs none for a wrong result); and
  whether ``barrier_wait`` raises it afterwards (``keep``: the asynchronous
  debug callbacks, whose computation does not fail) or not (a failed
  computation has raised it already)."""

  logger: str | None
  message: str
  keep: bool


class TapSite(NamedTuple):
  """What a compiled tap refers to by id: the function, how to rebuild its
  argument, the transformations applied around it, and whether it wants the
  device.  Equal sites share an id, so re-tracing the same function hits
  JAX's compilation cache."""

  func: Callable[..., Any] | NativeTap
  treedef: Any
  transforms: Transforms
  with_device: bool

  def register(self) -> int:
    if isinstance(self.func, NativeTap):  # one id, whatever the site
      return site_id(self.func)
    register = getattr(self.func, "register_tap_site", None)
    if register is not None:  # id_print's Printer: a C target of its own
      return register(self)
    return _hcb.register_tap(site=self, name=callable_name(self.func))


class CallSite(NamedTuple):
  """What a compiled ``call`` refers to by id: the function, how to rebuild
  its argument, the declared result (treedef and ``(shape, dtype)`` per
  leaf), whether it wants the device, whether a 64-bit result may fill a
  declared 32-bit one (JAX without x64), and the API the user called
  (``"host_callback.call"``, or the drop-in ``"pure_callback"`` or
  ``"io_callback"``, whose errors and logs are JAX's: see
  :func:`_on_callback_error`).  The C target reads the fields by name when
  it is registered (python/_hcb/call.c, hcb_py_call_site_read)."""

  func: Callable[..., Any] | NativeCallback
  arg_treedef: Any
  result_treedef: Any
  result_avals: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
  with_device: bool
  narrow_x64: bool
  api: str

  @property
  def jax_error_log(self) -> JaxErrorLog | None:
    """How a drop-in's failure is logged (None: ``call``'s own way)."""
    if self.api in ("pure_callback", "io_callback"):
      # The computation fails with the error, as JAX's does: nothing is
      # kept for barrier_wait.
      return JaxErrorLog("jax._src.callback", f"jax.{self.api} failed",
                         keep=False)
    return None

  def register(self) -> int:
    if isinstance(self.func, NativeCallback):  # one id, whatever the site
      return site_id(self.func)
    return _hcb.register_call(site=self, name=callable_name(self.func))


class _CallableKey:
  """Stands for a callable that cannot itself be a primitive parameter: one
  that is unhashable (compared by identity) or that takes no weak
  references (numpy ufuncs, builtins; compared like the callable)."""

  __slots__ = ("func", "by_identity", "__weakref__")

  def __init__(self, func: Callable[..., Any], by_identity: bool):
    self.func = func
    self.by_identity = by_identity

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    return self.func(*args, **kwargs)

  def __hash__(self) -> int:
    return id(self.func) if self.by_identity else hash(self.func)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, _CallableKey):
      return False
    if self.by_identity or other.by_identity:
      return other.func is self.func
    return bool(other.func == self.func)

  def __repr__(self) -> str:
    return repr(self.func)


def eager_site(site: Any) -> Any:
  """``site`` (a tap or call site) as an eager bind makes it: with the
  ``eager_variant()`` of its function where the function's type has one
  (the drop-ins of JAX's callbacks: JAX passes ``jax.Array``s to eager
  callbacks)."""
  variant = getattr(type(site.func), "eager_variant", None)
  return site if variant is None else site._replace(func=variant(site.func))


def hashable_callable(func: Callable[..., Any]) -> Callable[..., Any]:
  """``func``, or a stand-in that JAX can hash and weakly reference."""
  try:
    hash(func)
  except TypeError:
    return _CallableKey(func, by_identity=True)
  try:
    weakref.ref(func)
  except TypeError:
    return _CallableKey(func, by_identity=False)
  return func


def hash_key(value: Any) -> Any:
  """``value`` if it hashes, else a stand-in compared by identity: a part
  of a site's key (print options, static arguments, callbacks)."""
  try:
    hash(value)
    return value
  except TypeError:
    return ("id", id(value))


def callable_name(func: Callable[..., Any] | NativeTap | NativeCallback
                  ) -> str:
  """The name messages use for a callback (the runtime keeps
  ``_hcb.NAME_MAX`` bytes: a longer name keeps its end)."""
  most = _hcb.NAME_MAX
  func = func.func if isinstance(func, _CallableKey) else func
  if isinstance(func, (NativeTap, NativeCallback)):
    return func.name[-most:]
  name = str(getattr(func, "__qualname__", None) or repr(func))
  return name if len(name) <= most else "..." + name[3 - most:]


def _dtype_table() -> tuple[Any, ...]:
  """The numpy dtype of each XLA element type code (None where numpy, or
  this ml_dtypes, has none), as ``_hcb.configure`` takes it.  The codes and
  names are the runtime's (``hcb_dtype_name``).  The sub-byte types (int2,
  uint2, int4, uint4, float4_e2m1fn) are packed in XLA's buffers and one
  element per byte in numpy: the extension converts them."""
  table: list[Any] = [None] * _hcb.NDTYPES
  for code in range(_hcb.NDTYPES):
    name = _hcb.dtype_name(code)
    dtype = None if name is None else (
        getattr(np, name, None) or getattr(ml_dtypes, name, None))
    if dtype is not None:
      table[code] = np.dtype(dtype)
  return tuple(table)


def checked_device_index(device_index: Any, what: str) -> int:
  """``device_index`` as an int, or a clear error: it indexes the devices of
  the computation, so it must be below ``jax.device_count()`` (this
  process's devices, and under ``jax.distributed`` every process's: a
  global computation counts them all).  Checked where the callback is
  bound, so that a program on one device (or under ``pmap``/``shard_map``,
  where every device calls) does not silently accept it; jit over sharded
  operands checks it against the computation's own devices when lowering
  (_lowering.py)."""
  if isinstance(device_index, bool) or not isinstance(
      device_index, (int, np.integer)):
    raise TypeError(f"{what}: device_index must be an int, got "
                    f"{device_index!r}")
  count = jax.device_count()
  if not 0 <= device_index < count:
    raise ValueError(
        f"{what}: device_index={int(device_index)} is out of range: JAX has "
        f"{count} device{'s' if count != 1 else ''}, so device_index must be "
        f"from 0 to {count - 1}")
  return int(device_index)


def inline_device(device_index: int, what: str) -> jax.Device:
  """The device an inline callback (HOST_CALLBACK_INLINE) is given: the
  ``device_index``-th of this process's devices.  A ``device_index`` that
  passed :func:`checked_device_index` can still name another process's
  device under ``jax.distributed``: a clear error then."""
  devices = jax.local_devices()
  if device_index >= len(devices):
    count = len(devices)
    raise ValueError(
        f"{what}: device_index={device_index} is out of range for an inline "
        f"callback, which runs in this process: it has {count} local "
        f"device{'s' if count != 1 else ''}, so device_index must be from 0 "
        f"to {count - 1}")
  return devices[device_index]


def device_key(device: jax.Device) -> int:
  """The runtime's key of a CPU or local CUDA device (HCB_DEVICE in
  include/hcb/hcb.h): the platform in the high 32 bits, the ordinal that
  XLA's FFI gives the handlers in the low ones (a CPU device's id, a CUDA
  device's process-local hardware id)."""
  if device.platform == "cpu":
    return (_PLATFORM_CPU << 32) | device.id
  if device.platform == "gpu" and device.local_hardware_id is not None:
    return (_PLATFORM_CUDA << 32) | device.local_hardware_id
  raise ValueError(f"host_callback: {device} is neither a CPU device nor a "
                   "CUDA device of this process")


def keyed_devices() -> list[jax.Device]:
  """The devices whose callbacks reach this process's runtime: the CPU
  devices and the local CUDA devices (once the runtime has started)."""
  return [*jax.devices("cpu"), *_state.cuda_devices]


def _device_for_key(key: int) -> jax.Device:
  """The jax.Device a record came from (called once per device, then
  cached in C)."""
  platform, ordinal = key >> 32, key & 0xFFFFFFFF
  if platform == _PLATFORM_CPU:
    for dev in jax.devices("cpu"):
      if dev.id == ordinal:
        return dev
  if platform == _PLATFORM_CUDA:
    for dev in _local_cuda_devices():
      if dev.local_hardware_id == ordinal:
        return dev
  raise LookupError(f"no JAX device for platform {platform} ordinal {ordinal}")


def _local_cuda_devices() -> list[jax.Device]:
  """This process's CUDA devices; none when JAX has no CUDA backend (no
  plugin, a plugin that failed to initialise, ``JAX_PLATFORMS`` without
  it).  Initialises JAX's backends if they are not yet."""
  try:
    return list(jax.local_devices(backend="cuda"))
  except RuntimeError:  # "Unknown backend", "Backend 'cuda' failed ..."
    return []


class _Registration:
  """Keeps a site's runtime id registered while it lives: compiled programs
  that embed the id hold it (a keepalive of their lowering); the registry
  holds it weakly.  Finalising it retires the id (see the module's
  docstring)."""

  __slots__ = ("id", "releasable", "__weakref__")

  def __init__(self, site_id: int, releasable: bool):
    self.id = site_id
    self.releasable = releasable

  def __del__(self) -> None:
    if self.releasable:
      try:
        _retire(self.id)
      except Exception:  # pylint: disable=broad-except
        pass  # the interpreter is exiting: nothing needs releasing

  def __repr__(self) -> str:
    return f"host_callback site id {self.id}"


class _State:
  """The Python side's process-wide state, guarded by ``lock``."""

  def __init__(self) -> None:
    self.lock = threading.RLock()  # site_id re-enters for native sites
    # Sites of Python functions, while a compiled program embeds their id.
    self.registrations: weakref.WeakValueDictionary[
        tuple[type, Any], _Registration] = weakref.WeakValueDictionary()
    # Sites of native (C) functions: for the process.
    self.native: dict[tuple[type, Any], _Registration] = {}
    # The same registrations by id.
    self.by_id: weakref.WeakValueDictionary[int, _Registration] = (
        weakref.WeakValueDictionary())
    # (id, runtime tokens of the thread that retired it) of finalised
    # registrations, to be released: appended from any thread, taken by the
    # release thread or barrier_wait (a deque's append and popleft are
    # atomic).
    self.retired: collections.deque[tuple[int, list[Any]]] = (
        collections.deque())
    self.release_thread: threading.Thread | None = None
    self.handlers_registered = False
    # The local CUDA devices, when the handlers are registered for CUDA.
    self.cuda_devices: list[jax.Device] = []
    self.atexit_registered = False
    self.exiting = False
    self.probe_compiled = False  # _touch, on every device (_before_fork)
    # The probes compiled so far, by their devices (_probe).
    self.probes: dict[tuple[jax.Device, ...], _Probe] = {}
    self.forked = False  # in a child of os.fork (_after_fork_in_child)
    # (exception, formatted traceback, whether JAX's record of it was
    # logged) of the last failing callback.
    self.last_exception: tuple[BaseException, str, bool] | None = None
    # Whether the error barrier_wait raised last was logged in JAX's words
    # (a drop-in's): the at-exit flush does not log it again.
    self.raised_as_jax = False
    # Errors the runtime counted that a failed computation has raised
    # already (drop-ins of JAX's callbacks): barrier_wait leaves them out.
    self.reported_errors = 0


_state = _State()


def _before_fork() -> None:
  """In the parent, before a fork: compiles the probes of barrier_wait (a
  forked child cannot compile: XLA's compiler threads are not in it), so
  that the child's barrier_wait and at-exit flush work.  Not from inside a
  device callback: the probes could wait for the computation that runs it
  (the child of such a fork compiles them itself, if it can)."""
  if (not _state.handlers_registered or _state.probe_compiled
      or _in_device_callback()):
    return
  try:
    for out in _dispatch_probes():
      out.block_until_ready()
    _state.probe_compiled = True
  except Exception:  # never break the fork itself
    logger.debug("host_callback: probe compilation before fork failed",
                 exc_info=True)


def _flush_at_process_end(_: object = None) -> None:
  """Delivers the taps a multiprocessing child issued before it ends (its
  end skips ``atexit``)."""
  try:
    barrier_wait("process end")
  except CallbackException as e:
    logger.error("host_callback: %s", e)


def _at_multiprocessing_start(_: object) -> None:
  """Run by a forked multiprocessing child as it starts (after it clears the
  finalizers it inherited): flushes the taps when the child's work ends."""
  import multiprocessing.util
  multiprocessing.util.Finalize(None, _flush_at_process_end, exitpriority=0)


def _after_fork_in_child() -> None:
  """In the child of a fork: a lock of its own (a parent thread that held it
  is not in the child) and no exception of the parent's taps (the parent
  reports those); the parent's release thread is not there either, the next
  retirement starts one.  The C runtime resets itself (src/runtime/runtime.c,
  "Fork").  A multiprocessing child ends without ``atexit``: it flushes its
  taps with a multiprocessing finalizer instead."""
  _state.lock = threading.RLock()
  _state.last_exception = None
  _state.reported_errors = 0
  _state.release_thread = None
  _state.forked = True
  mp_util = sys.modules.get("multiprocessing.util")
  if mp_util is not None and _state.handlers_registered:
    mp_util.register_after_fork(_state, _at_multiprocessing_start)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _jax_error_log(site: Any) -> JaxErrorLog | None:
  """How the errors of ``site`` are reported, when it is one of the
  drop-ins of JAX's callbacks (a call site's ``api``; the ``jax_error_log``
  of a tap site's function or of a buffer callback's site); None for
  host_callback's own APIs."""
  log = getattr(site, "jax_error_log", None)
  if log is None and isinstance(site, TapSite):
    log = getattr(site.func, "jax_error_log", None)
  return log if isinstance(log, JaxErrorLog) else None


def _on_callback_error(site: Any, exc: BaseException, raised: bool) -> str:
  """Called from C (with the GIL) when a tap or call function raised
  (``raised``) or a call returned a wrong result: reports it and returns
  the formatted traceback (for the message of a failed call).

  host_callback's own APIs (id_tap, id_print, call, native functions) log
  it on logger ``host_callback`` and keep it for barrier_wait.  A drop-in of
  JAX's logs what JAX logs, on JAX's logger, and nothing else (libraries
  filter JAX's records and fail on any other: equinox's error_if), and
  keeps it for barrier_wait only where the computation goes on
  (:class:`JaxErrorLog`)."""
  log = _jax_error_log(site)
  if log is not None:
    return _report_as_jax(log, exc, raised)
  if isinstance(site, TapSite):
    header = (f"exception in tap function {site.func!r} (postponed to "
              "barrier_wait):")
  else:  # a call or a buffer callback
    func = getattr(site, "func", None) or getattr(site, "callback", site)
    header = (f"error in call function {func!r} (also raised by the "
              "computation and by barrier_wait):")
  return _keep_for_barrier(header, exc)


def tap_not_queued(what: str, device_key: int, exc: Exception) -> None:
  """A tap that reached the runtime from Python (jit over sharded operands)
  and could not be queued: its error is logged and kept for barrier_wait,
  as a tap function's is.  (Raised in JAX's Python callback, it would fail
  this device alone and leave the others waiting for it in the program's
  collectives.)"""
  device = _device_for_key(device_key)
  error = RuntimeError(
      f"{what}: a tap on device {device.platform}:{device.id} was not "
      f"delivered: it could not be queued ({type(exc).__name__}: {exc})")
  error.__cause__ = exc
  _keep_for_barrier(f"{what}: tap not delivered (postponed to barrier_wait):",
                    error)


def _report_as_jax(log: JaxErrorLog, exc: BaseException, raised: bool) -> str:
  """Reports a drop-in's error as JAX does (see :func:`_on_callback_error`)
  and returns its formatted traceback."""
  formatted = "".join(
      traceback.format_exception(type(exc), exc, exc.__traceback__))
  if raised and log.logger is not None:
    logging.getLogger(log.logger).error(
        log.message, exc_info=(type(exc), exc, exc.__traceback__))
  with _state.lock:
    if log.keep:
      _state.last_exception = (exc, formatted, log.logger is not None)
    else:
      # The runtime counts it among the errors barrier_wait raises: it
      # leaves this many out.
      _state.reported_errors += 1
  return formatted


def _keep_for_barrier(header: str, exc: BaseException) -> str:
  """Logs ``exc`` under ``header`` and keeps it for barrier_wait; returns
  its formatted traceback."""
  formatted = "".join(
      traceback.format_exception(type(exc), exc, exc.__traceback__))
  logger.error("%s\n%s", header, formatted)
  with _state.lock:
    _state.last_exception = (exc, formatted, False)
  return formatted


_hcb.configure(_dtype_table(), _device_for_key, _on_callback_error,
               jax.tree_util.tree_flatten, logger.warning)
_hcb.set_max_queue_bytes(_config.MAX_QUEUE_BYTES)


def _register_handlers() -> None:
  """Registers the C FFI handlers with XLA (once per process), and the type
  of the state by which the custom calls that carry a callback id count the
  live executables that embed it (python/_hcb/lifetime.c): for CPU, and
  for CUDA when JAX has a CUDA backend."""
  jax.ffi.register_ffi_type("hcb_target_hold", _hcb.hold_type(),
                            platform="cpu")
  for name, handler in _hcb.ffi_handlers("cpu").items():
    jax.ffi.register_ffi_target(name, handler, platform="cpu")
  # Whether JAX has a CUDA backend is known for sure only once its backends
  # are initialised (a plugin can be installed and fail to initialise, or
  # be left out by JAX_PLATFORMS); ensure_started initialises them anyway.
  cuda_devices = _local_cuda_devices()
  if cuda_devices:
    _register_cuda_handlers()
  _state.cuda_devices = cuda_devices


def _cudart_path() -> str | None:
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


def _register_cuda_handlers() -> None:
  """Registers the CUDA handlers.  libhcb finds the CUDA
  runtime at run time (``_hcb.cuda_load``): the NVIDIA wheel's, else the
  system's.  If it cannot load it now, the handlers are registered anyway:
  they try again when first run, and fail with a clear error then.  The
  size of the pinned pool is read from the environment here, where the
  pool is set up: on a machine without CUDA it is never read."""
  _hcb.cuda_set_pinned_bytes(_config.cuda_pinned_bytes())
  try:
    _hcb.cuda_load(_cudart_path())
  except Exception as e:  # pylint: disable=broad-except
    logger.warning("host_callback: the CUDA runtime could not be loaded "
                   "(%s); host callbacks on CUDA devices will fail", e)
  # No hold type: the CUDA handlers count no holds (see the module's
  # docstring).
  for name, handler in _hcb.ffi_handlers("cuda").items():
    jax.ffi.register_ffi_target(name, handler, platform="CUDA")


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
      # With one CPU device every tap and call runs on it: the handlers
      # then need not ask XLA for the device of each call.
      cpu = jax.local_devices(backend="cpu")
      _hcb.set_only_cpu_device(cpu[0].id if len(cpu) == 1 else -1)
      atexit.register(_at_exit)
      _jax.extend_effects_barrier(_on_effects_barrier)
      _state.atexit_registered = True


def _is_native(site: Any) -> bool:
  return isinstance(site, (NativeTap, NativeCallback)) or isinstance(
      getattr(site, "func", None), (NativeTap, NativeCallback))


def _registration(site: Any) -> _Registration:
  """The registration of a tap, call or buffer-callback site (anything with
  a ``register() -> id`` method), registering it on first use."""
  key = (type(site), site)
  table: Any = _state.native if _is_native(site) else _state.registrations
  found = table.get(key)
  if found is not None:
    return found
  ensure_started()
  with _state.lock:
    found = table.get(key)
    if found is None:
      found = _Registration(site.register(), not _is_native(site))
      table[key] = found
      _state.by_id[found.id] = found
  return found


def registration_of(site_id: int) -> _Registration | None:
  """The live registration of ``site_id``, for a lowering that carries the
  id in an object JAX keeps with the runtime executable (its own Python
  callback under jit over sharded operands): holding it there keeps the
  site for exactly as long as that executable."""
  return _state.by_id.get(site_id)


def site_id(site: Any) -> int:
  """The runtime id of a site (see :func:`_registration`).  Kept registered
  only while something holds it: programs get theirs from
  :func:`lowered_site_id`."""
  return _registration(site).id


def lowered_site_id(ctx: Any, site: Any) -> int:
  """The runtime id of ``site`` for the program being lowered in ``ctx``
  (an ``mlir.LoweringRuleContext``): the id's registration becomes a
  keepalive of the lowering, which JAX keeps with the executable, so the
  site stays registered as long as a compiled program embeds its id.

  ``ModuleContext.add_keepalive`` is JAX's public-by-convention lowering
  API (``jax.interpreters.mlir``), the way JAX kept its own CPU callbacks
  alive; ``add_host_callback`` would cost the C++ fast dispatch path."""
  registration = _registration(site)
  ctx.module_context.add_keepalive(registration)
  return registration.id


# How XLA's status prints: "INVALID_ARGUMENT: ...", "UNKNOWN: ...".
_XLA_STATUS = re.compile(r"[A-Z_]+: ")


def apply_eagerly(prim: Any, *args: Any, **params: Any) -> Any:
  """``prim`` applied outside ``jit`` (its impl rule).  A failed call or
  buffer callback raises ``jax.errors.JaxRuntimeError`` every time: JAX's
  C++ dispatch, which runs the cached program from the second time on,
  reports any failed computation as ``ValueError`` (jaxlib's
  PjitFunction_tp_vectorcall turns every error status into one)."""
  from host_callback import _jax
  try:
    return _jax.apply_primitive(prim, *args, **params)
  except ValueError as e:
    message = str(e)
    if _XLA_STATUS.match(message) and "host_callback" in message:
      raise jax.errors.JaxRuntimeError(message) from None
    raise


def _retire(site_id: int) -> None:
  """Called when no compiled program holds ``site_id`` any more (from a
  finaliser: on any thread, at any time, so it only takes note)."""
  if _state.exiting:
    return
  # The thread that drops a program is mostly the one that dispatched it:
  # JAX's tokens of its computations with host callbacks (jit over sharded
  # operands) are thread-local, so take them now.
  from host_callback import _jax
  tokens = _jax.output_runtime_tokens()
  if (not tokens and not _state.cuda_devices and _hcb.holds(site_id) <= 0 and
      _hcb.stats()["queued_records"] == 0):
    # Nothing can reach it any more, nothing for it waits to be delivered:
    # release it now, as the executable's own references go now.
    _hcb.release(site_id)
    return
  _state.retired.append((site_id, tokens))
  _hcb.notify_unused()
  thread = _state.release_thread
  if thread is None or not thread.is_alive():  # also in a forked child
    with _state.lock:
      thread = _state.release_thread
      if thread is None or not thread.is_alive():
        _state.release_thread = threading.Thread(
            target=_release_loop, name="hcb-release", daemon=True)
        _state.release_thread.start()


def _take_retired() -> list[tuple[int, list[Any]]]:
  taken = []
  while True:
    try:
      taken.append(_state.retired.popleft())
    except IndexError:
      return taken


def _wait_for_tokens(retired: list[tuple[int, list[Any]]]) -> None:
  """Waits for the computations behind the runtime tokens of ``retired``
  (their errors are for their own thread's ``jax.effects_barrier``)."""
  for _, tokens in retired:
    for token in tokens:
      try:
        token.block_until_ready()
      except Exception:  # pylint: disable=broad-except
        pass


def _release(retired: list[tuple[int, list[Any]]]) -> None:
  for site_id, _ in retired:
    _hcb.release(site_id)


def _unheld(retired: list[tuple[int, list[Any]]]
            ) -> tuple[list[tuple[int, list[Any]]],
                       list[tuple[int, list[Any]]]]:
  """Splits retired ids into those no live executable holds and the rest."""
  free: list[tuple[int, list[Any]]] = []
  held: list[tuple[int, list[Any]]] = []
  for entry in retired:
    (free if _hcb.holds(entry[0]) <= 0 else held).append(entry)
  return free, held


def _release_loop() -> None:
  """The release thread: releases retired ids as soon as nothing holds
  them (see the module's docstring)."""
  pending: list[tuple[int, list[Any]]] = []
  while not _state.exiting:
    pending += _take_retired()
    free, pending = _unheld(pending)
    if free:
      try:
        # Free now: no computation of theirs runs (on CPU; on CUDA once
        # the devices have finished what was dispatched before), so all
        # their records are queued; deliver them first.
        _wait_for_tokens(free)
        _wait_for_cuda_devices()
        if _hcb.stats()["queued_records"]:
          _hcb.barrier()
      except Exception:  # pylint: disable=broad-except
        logger.debug("host_callback: release wait failed", exc_info=True)
        pending += free
      else:
        if _state.exiting:
          return
        _release(free)
        continue
    # Woken when a hold drops to zero or an id is retired.
    _hcb.wait_unused(10.0)


def _touch(x: jax.Array) -> jax.Array:
  return x + 1


class _Probe(NamedTuple):
  """A probe computation (:func:`_wait_for_devices`) compiled for fixed
  devices, and its operand, already on them."""

  compiled: Any  # jax.stages.Compiled
  operand: jax.Array


def _pinned_settings() -> contextlib.ExitStack:
  """JAX's settings as the runtime's own computations need them, whatever
  the user set, also globally (``jax.config.update``): transfers allowed,
  jit on, no mesh (a concrete, abstract or explicit-sharding one)."""
  stack = contextlib.ExitStack()
  stack.enter_context(jax.transfer_guard("allow"))
  stack.enter_context(jax.disable_jit(False))
  if _jax.trace_state_clean():  # jax.set_mesh refuses to run under a trace
    stack.enter_context(jax.set_mesh(None))
  return stack


def _made_apart(make: Callable[[], Any]) -> Any:
  """``make()``, run where none of the calling thread's JAX contexts apply:
  the user's ``set_mesh``, ``default_device``, ``transfer_guard``,
  ``enable_x64``, ``disable_jit``, a trace in progress, and any context
  JAX adds later, are all thread-local; so it runs in a thread of its own,
  with the settings that can also be global pinned.  Where Python starts
  no more threads (late in interpreter shutdown), it runs in this thread
  with those settings pinned."""
  done: list[Any] = []
  finished = threading.Event()

  def run() -> None:
    try:
      with _pinned_settings():
        done.append((True, make()))
    except BaseException as e:  # pylint: disable=broad-except
      done.append((False, e))
    finally:
      finished.set()

  try:
    threading.Thread(target=run, name="hcb-probe-compile").start()
  except RuntimeError:  # "can't create new thread at interpreter shutdown"
    run()
  # Ctrl-C waits for the compilation, as it would in this thread (XLA's
  # compiler does not return to Python before it is done): a thread left
  # compiling while the interpreter exits aborts the process.  (An Event,
  # not Thread.join: a join that Ctrl-C interrupts may no longer tell
  # whether the thread is alive.)
  interrupted: KeyboardInterrupt | None = None
  while not finished.is_set():
    try:
      finished.wait()
    except KeyboardInterrupt as e:
      interrupted = e
  if interrupted is not None:
    raise interrupted
  ok, value = done[0]
  if not ok:
    raise value
  return value


def _probe(devices: tuple[jax.Device, ...]) -> _Probe:
  """The probe on ``devices`` (one device, or all of them: an array sharded
  over them), compiled and placed once, apart from the user's contexts
  (:func:`_made_apart`)."""
  probe = _state.probes.get(devices)
  if probe is None:
    def make() -> _Probe:
      if len(devices) == 1:
        operand = jax.device_put(np.int32(0), devices[0])
      else:
        mesh = jax.sharding.Mesh(np.array(devices), ("d",))
        operand = jax.device_put(
            np.zeros(len(devices), np.int32),
            jax.sharding.NamedSharding(mesh,
                                       jax.sharding.PartitionSpec("d")))
      return _Probe(jax.jit(_touch).lower(operand).compile(), operand)
    probe = _state.probes.setdefault(devices, _made_apart(make))
  return probe


def _run_probes(probes: list[_Probe]) -> list[jax.Array]:
  """Dispatches ``probes``.  A compiled program ignores the user's
  contexts when called, except ``disable_jit``, which it refuses."""
  with jax.disable_jit(False):
    return [p.compiled(p.operand) for p in probes]


def _refuse_inside_tap(what: str) -> None:
  if _hcb.in_tap():
    raise RuntimeError(
        f"{what} was called from inside a tap function; it would wait for "
        "the very thread that runs it. Call it from the main program.")


def _probes_on(devices: list[jax.Device]) -> list[jax.Array]:
  """One probe computation on each of ``devices`` and, with several, one
  over all of them."""
  probes = [_probe((d,)) for d in devices]
  if len(devices) > 1:
    probes.append(_probe(tuple(devices)))
  return _run_probes(probes)


def _dispatch_probes() -> list[jax.Array]:
  """The probes of :func:`_wait_for_devices`, on the local CPU devices and
  the local CUDA devices (:func:`_probes_on`) -- except in a forked child:
  there a CPU computation over several devices never finishes (PJRT's CPU
  client runs it on threads the child does not have), so the child has
  none to wait for either, and the parent's CUDA context is unusable (a
  CUDA device has no computation of the child's)."""
  cpu = jax.local_devices(backend="cpu")
  if _state.forked:
    return _run_probes([_probe((d,)) for d in cpu])
  return _probes_on(cpu) + (_probes_on(_state.cuda_devices)
                            if _state.cuda_devices else [])


def _wait_for_cuda_devices() -> None:
  """Returns once the local CUDA devices have finished every computation
  dispatched before the call (none to wait for without CUDA devices, or in
  a forked child)."""
  if _state.cuda_devices and not _state.forked:
    for out in _probes_on(_state.cuda_devices):
      out.block_until_ready()


def _wait_for_devices() -> None:
  """Returns once every computation dispatched (by any thread) before the
  call has finished on every local device (CPU and CUDA), so that each has
  issued all of its callbacks: taps are then in the runtime's queues
  (which ``_hcb.barrier`` drains), calls have run, and the taps that go
  through JAX's Python callback (jit over sharded operands) have been
  submitted.

  It dispatches probe computations and waits for them.  What orders them
  after the computations dispatched earlier is how PJRT's CPU client
  schedules (JAX 0.10-0.12; tests/python/test_barrier.py checks it on the
  JAX installed):

  - a computation on one device waits for the previous one-device
    computation dispatched to that device (the device's last enqueue
    event), even when its own inputs are ready;
  - a computation on several devices (pmap, shard_map, jit over sharded
    operands) waits until the previous multi-device computation of the
    client has finished on all of its devices (the last collective launch
    event), whichever devices either runs on; one-device computations do
    not wait for these, nor these for them.

  So one probe per device covers the one-device computations, and one
  probe over all local devices covers every multi-device computation.  (A
  probe on each device alone is not enough: it can finish while a
  multi-device computation dispatched before it still waits for its
  inputs or its turn -- the early returns of issue 16.)  Under
  ``jax.distributed`` the same holds for this process's part of a global
  computation; every process waits for its own devices.

  On a CUDA device a computation runs on the device's compute stream
  after everything launched there before it, its part of a multi-device
  computation included; and a tap's record enters the runtime's queue
  from a host function enqueued on that stream.  So when a CUDA device's
  probe completes, every earlier host function on its stream has run and
  every record is queued; its probes are made as the CPU's are (one per
  device, one over all), which also covers a multi-device computation
  that PJRT has not yet launched on every device.

  The probes are compiled once, apart from the user's JAX contexts
  (:func:`_probe`), and called as compiled programs, which ignore them:
  a barrier works inside ``jax.set_mesh``, ``jax.default_device``,
  ``jax.transfer_guard``, ``jax.disable_jit``, whatever the caller set.
  """
  for out in _dispatch_probes():
    out.block_until_ready()  # interruptible: jaxlib checks for Ctrl-C
  # Computations that JAX runs with runtime tokens (with JAX effects, e.g.
  # io_callback) finish here too.  A token of a failed one holds an error
  # its caller has already seen: forget it rather than have JAX print it
  # at exit.
  try:
    _jax.wait_for_runtime_tokens()
  except jax.errors.JaxRuntimeError:
    _jax.forget_runtime_tokens()


def _in_device_callback() -> bool:
  """Whether this thread runs a callback for a running computation: a
  call or buffer_callback function of ours, or JAX's own io_callback,
  pure_callback or debug.callback (XLA's threads, which Python knows only
  as ``threading._DummyThread``).  That computation cannot finish before
  the callback returns, and the probes of :func:`_wait_for_devices` may
  wait for it (always under pmap, shard_map and jit over sharded operands,
  and on its own device): there the probes would never finish."""
  return _hcb.in_call() or isinstance(threading.current_thread(),
                                      threading._DummyThread)


# What a barrier runs around its wait, once it has waited for every
# computation dispatched before it (see watch_barriers).
_barrier_watchers: list[Callable[[], Callable[[], None]]] = []


def watch_barriers(watcher: Callable[[], Callable[[], None]]) -> None:
  """Has ``barrier_wait`` and ``jax.effects_barrier()`` call ``watcher()``
  as they start to wait, and the callable it returns once they have waited
  for every computation dispatched before (not inside a device callback,
  where they wait only for the taps already issued).  progress.py closes
  there the bars of loops that ended short of their length."""
  _barrier_watchers.append(watcher)


def _wait_for_callbacks() -> None:
  """Waits until every callback of every computation dispatched before the
  call has run, on every local device.  Errors of tap functions stay
  recorded (for barrier_wait).

  Inside a device callback (:func:`_in_device_callback`) it waits only for
  the taps already issued."""
  if _in_device_callback():
    _hcb.barrier()
    return
  after = [watcher() for watcher in _barrier_watchers]
  _wait_for_devices()
  _hcb.barrier()
  for done in after:
    try:
      done()
    except Exception:  # pylint: disable=broad-except
      logger.exception("host_callback: a barrier's watcher failed")


def wait_before_eager_callback(device: jax.Device) -> None:
  """Waits until the callbacks of the one-device computations dispatched
  to ``device`` before have run, and every tap queued by then, so that an
  eager debug callback (host_callback.debug), which runs at once in the
  calling thread as JAX's do, comes after them: program order on its
  device (an eager ``vmap`` taps the batched values in such a computation,
  then calls a function of the unbatched ones eagerly).  One probe on the
  device (see :func:`_wait_for_devices`), not one per device and one over
  all of them: multi-device computations still running may call back
  later, as JAX's own callbacks of a running computation may.  Errors stay
  recorded for barrier_wait.  Nothing to wait for before the first
  compiled callback, nor inside a tap (its own thread) or a device
  callback.  On a GPU the probe runs on the device's stream after its
  earlier computations, whose taps have then all landed in the queue."""
  if (not _state.handlers_registered or _state.exiting or _hcb.in_tap() or
      _in_device_callback()):
    return
  if device.platform == "cpu" or (device in _state.cuda_devices and
                                  not _state.forked):
    _run_probes([_probe((device,))])[0].block_until_ready()
  _hcb.barrier()


def eager_callback_context() -> contextlib.ExitStack:
  """The context in which JAX calls an eager debug callback, for ours:
  the first CPU device as default device and no mesh, whatever the
  caller's (``jax.set_mesh``, ``jax.default_device``).  The mesh is
  left as it is under an eager ``vmap``/``grad`` (``jax.set_mesh``
  refuses to run in a trace)."""
  stack = contextlib.ExitStack()
  stack.enter_context(jax.default_device(jax.local_devices(backend="cpu")[0]))
  if _jax.trace_state_clean():
    stack.enter_context(jax.set_mesh(None))
  return stack


def _on_effects_barrier() -> None:
  """Added to ``jax.effects_barrier()`` (see ``_jax.extend_effects_barrier``):
  it also waits for host_callback's callbacks, and leaves their errors for
  barrier_wait to raise.  It waits for nothing inside a tap function (that
  would wait for its own thread) and after the at-exit flush."""
  if _state.exiting or _hcb.in_tap():
    return
  _wait_for_callbacks()


def barrier_wait(logging_name: str | None = None) -> None:
  """Blocks until every callback of every computation dispatched before it
  (by any thread), on every local device, has run: single-device programs,
  ``pmap``, ``shard_map`` and ``jit`` over sharded operands alike.
  ``jax.effects_barrier()`` waits for them too, but raises none of their
  errors.

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
  # Retired ids that no executable holds now: every record of theirs is
  # queued, so the barrier delivers them and they can go after it.
  retired, held = _unheld(_take_retired())
  _state.retired.extend(held)
  if _state.handlers_registered:
    try:
      _wait_for_tokens(retired)
      _wait_for_callbacks()
    except BaseException:
      _state.retired.extend(retired)
      raise
  logger.debug("barrier_wait[%s]: done", name)
  _release(retired)
  # The runtime counts every failed tap; the Python hook keeps the
  # exception object.  Prefer the object, but never lose an error the hook
  # could not record (e.g. the hook itself failed).
  count, message = _hcb.take_error()
  with _state.lock:
    last, _state.last_exception = _state.last_exception, None
    # The runtime counts an error after the hook has reported it: what is
    # not yet counted is left for the next barrier.
    reported = min(count, _state.reported_errors)
    _state.reported_errors -= reported
    count -= reported
  prefix = "There were exceptions during callback processing. Last one was: "
  _state.raised_as_jax = last is not None and last[2]
  if last is not None:
    exc, formatted, _ = last
    raise CallbackException(prefix + formatted) from exc
  if count:
    raise CallbackException(prefix + message)


def stop_outfeed_receiver() -> None:
  """Waits for every pending callback, then stops the runtime's consumer
  threads.  The next tap starts them again.  Exceptions of tap functions
  stay recorded for the next :func:`barrier_wait`."""
  _refuse_inside_tap("stop_outfeed_receiver")
  if _state.handlers_registered and not _in_device_callback():
    _wait_for_devices()
  _hcb.stop()


def stats() -> dict[str, Any]:
  """Counters of the runtime: the totals over every device, and under
  ``devices`` one entry per device that has had a tap (keyed by
  ``str(jax.Device)``), each with these keys:

  - ``records_in``/``bytes_in``: taps submitted to the device's queue (on a
    GPU, once their copy has landed on the host), and their bytes;
  - ``records_out``/``bytes_out``: taps delivered (their tap function
    returned);
  - ``queued_records``/``queued_bytes``: submitted and not yet delivered
    (both count the same records);
  - ``reserved_records``/``reserved_bytes``: GPU taps on their way, whose
    room in the queue is taken but whose copy has not landed yet (in no
    other key until they are submitted);
  - ``high_water_bytes``: the most bytes the queue has held under its
    bound, queued and reserved together;
  - ``producer_waits``/``producer_wait_ns``: how often and how long devices
    waited for room in a full queue;
  - ``errors``: failed tap functions and records for unknown ids.

  A GPU's entry also has ``pinned_pool``, what its pool of pinned host
  memory has done: ``capacity``, ``used_bytes``, ``in_flight_bytes``
  (records on their way, calls' staging), ``kept_bytes`` (records a tap
  function kept), ``waits`` (the device waited for room), ``refusals`` and
  ``syncs`` (a tap or call waited for the stream because the pool could
  not serve it), ``pin_failures`` (the pool could not be pinned: its taps
  and calls then copy through ordinary memory, each a sync).  The totals
  also have ``max_queue_bytes``, the queue's bound.
  """
  result: dict[str, Any] = dict(_hcb.stats())
  per_device: dict[str, Any] = {}
  for key in sorted(_hcb.devices()):
    try:
      label = str(_device_for_key(key))
    except LookupError:
      label = f"device-key-{key}"
    per_device[label] = _hcb.stats(key)
  for dev in _state.cuda_devices:
    ordinal = dev.local_hardware_id
    pool = None if ordinal is None else _hcb.cuda_pool_stats(ordinal)
    if pool is not None:
      per_device.setdefault(str(dev), {})["pinned_pool"] = pool
  result["devices"] = per_device
  result["max_queue_bytes"] = _config.MAX_QUEUE_BYTES
  return result


def _at_exit() -> None:
  """Delivers every pending tap before the interpreter exits."""
  _state.exiting = True
  _hcb.notify_unused()
  try:
    barrier_wait("at_exit")
  except CallbackException as e:
    if not _state.raised_as_jax:  # else logged in JAX's words already
      logger.error("host_callback: %s", e)
  except KeyboardInterrupt:
    # Ctrl-C while the flush waits (a tap function that never returns):
    # exit now, without the taps still pending and without joining the
    # consumer threads, which would wait for that tap function again.
    logger.warning("host_callback: exit interrupted: %d queued taps are "
                   "left undelivered", _hcb.stats()["queued_records"])
    _hcb.abandon()
    return
  except Exception:  # JAX may already be shutting down: still stop.
    logger.exception("host_callback: at-exit barrier failed")
  # The release thread may be waiting on the devices: let it finish before
  # JAX's own exit hooks tear the backends down.
  thread = _state.release_thread
  if thread is not None and thread.is_alive():
    thread.join(timeout=5)
  _hcb.shutdown()
