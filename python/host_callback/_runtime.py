"""The runtime's entry: what starts host_callback's C runtime (``_hcb``)
from Python.

Importing this module configures the extension (the numpy dtype of each
XLA element type, and the functions it calls back); the first lowering of
a callback starts the runtime (:func:`ensure_started`: the FFI handlers
registered with XLA, the at-exit flush, the hook in
``jax.effects_barrier()``).  The public ``stats`` lives here.

The runtime's Python side is one module per concern; of these, each
imports only those listed before it:

- _state.py: the one list of the process-wide state;
- _sites.py: sites (what a compiled callback refers to by id) and the keys
  that make them hashable;
- _devices.py: the runtime's key of a device, and ``device_index``;
- _probes.py: probe computations, by which Python knows that the devices
  have finished what was dispatched before;
- _errors.py: the errors of callbacks, kept for barrier_wait;
- _registry.py: the id of each site, and its release once nothing can
  call it (the life of a site's id);
- _barrier.py: ``barrier_wait``, ``jax.effects_barrier()``,
  ``stop_outfeed_receiver``, and what an eager debug callback waits for;
- _process.py: fork, multiprocessing and the at-exit flush;
- _handlers.py: the FFI handlers registered with XLA, and the CUDA runtime
  found;
- this module: configuring, starting, ``stats``.
"""

from __future__ import annotations

import atexit
import logging
import re
from typing import Any

import jax
import ml_dtypes
import numpy as np

from host_callback import _barrier
from host_callback import _config
from host_callback import _errors
from host_callback import _handlers
from host_callback import _hcb
from host_callback import _jax
from host_callback import _process
from host_callback import _registry
from host_callback._devices import device_for_key
from host_callback._state import state

logger = logging.getLogger("host_callback")


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


_hcb.configure(_dtype_table(), device_for_key, _errors.on_callback_error,
               jax.tree_util.tree_flatten, logger.warning)
_hcb.set_max_queue_bytes(_config.MAX_QUEUE_BYTES)


def ensure_started() -> None:
  """Makes the runtime usable from compiled code: registers the handlers
  and the at-exit flush.  Cheap after the first call."""
  if state.handlers_registered and state.atexit_registered:
    return
  with state.lock:
    if not state.handlers_registered:
      _handlers.register_handlers()
      state.handlers_registered = True
    if not state.atexit_registered:
      # Initialise the backends first: their own atexit hooks then run
      # after ours (atexit is LIFO), so the flush can still run JAX.
      jax.devices()
      # With one CPU device every tap and call runs on it: the handlers
      # then need not ask XLA for the device of each call.
      cpu = jax.local_devices(backend="cpu")
      _hcb.set_only_cpu_device(cpu[0].id if len(cpu) == 1 else -1)
      atexit.register(_process.at_exit)
      _jax.extend_effects_barrier(_barrier.on_effects_barrier)
      state.atexit_registered = True


def lowered_site_id(ctx: Any, site: Any) -> int:
  """The runtime started (:func:`ensure_started`: a program that carries
  an id of ours can call our handlers), then the id of ``site`` for the
  program being lowered in ``ctx``, kept while that program lives
  (``_registry.lowered_site_id``).  The lowering rules of the primitives
  call it."""
  ensure_started()
  return _registry.lowered_site_id(ctx, site)


# How XLA's status prints: "INVALID_ARGUMENT: ...", "UNKNOWN: ...".
_XLA_STATUS = re.compile(r"[A-Z_]+: ")


def apply_eagerly(prim: Any, *args: Any, **params: Any) -> Any:
  """``prim`` applied outside ``jit`` (its impl rule).  A failed call or
  buffer callback raises ``jax.errors.JaxRuntimeError`` every time: JAX's
  C++ dispatch, which runs the cached program from the second time on,
  reports any failed computation as ``ValueError`` (jaxlib's
  PjitFunction_tp_vectorcall turns every error status into one)."""
  try:
    return _jax.apply_primitive(prim, *args, **params)
  except ValueError as e:
    message = str(e)
    if _XLA_STATUS.match(message) and "host_callback" in message:
      raise jax.errors.JaxRuntimeError(message) from None
    raise


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
      label = str(device_for_key(key))
    except LookupError:
      label = f"device-key-{key}"
    per_device[label] = _hcb.stats(key)
  for dev in state.cuda_devices:
    ordinal = dev.local_hardware_id
    pool = None if ordinal is None else _hcb.cuda_pool_stats(ordinal)
    if pool is not None:
      per_device.setdefault(str(dev), {})["pinned_pool"] = pool
  result["devices"] = per_device
  result["max_queue_bytes"] = _config.MAX_QUEUE_BYTES
  return result
