"""Barriers: waiting until the callbacks of what was dispatched before have
run.

``barrier_wait`` (and ``jax.effects_barrier()``, which this module
extends) waits for the devices with the probes of _probes.py, then for the
runtime's queues (``_hcb.barrier``), releases the retired ids nothing holds
(_registry.py), and raises the error kept since the previous barrier
(_errors.py).  An eager debug callback waits for its device's earlier
taps here too (:func:`wait_before_eager_callback`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import jax

from host_callback import _errors
from host_callback import _hcb
from host_callback import _jax
from host_callback import _probes
from host_callback import _registry
from host_callback._state import state

logger = logging.getLogger("host_callback")


def _refuse_inside_tap(what: str) -> None:
  if _hcb.in_tap():
    raise RuntimeError(
        f"{what} was called from inside a tap function; it would wait for "
        "the very thread that runs it. Call it from the main program.")


def watch_barriers(watcher: Callable[[], Callable[[], None]]) -> None:
  """Has ``barrier_wait`` and ``jax.effects_barrier()`` call ``watcher()``
  as they start to wait, and the callable it returns once they have waited
  for every computation dispatched before (not inside a device callback,
  where they wait only for the taps already issued).  progress.py closes
  there the bars of loops that ended short of their length."""
  state.barrier_watchers.append(watcher)


def _wait_for_callbacks() -> None:
  """Waits until every callback of every computation dispatched before the
  call has run, on every local device.  Errors of tap functions stay
  recorded (for barrier_wait).

  Inside a device callback (``_probes.in_device_callback``) it waits only
  for the taps already issued."""
  if _probes.in_device_callback():
    _hcb.barrier()
    return
  after = [watcher() for watcher in state.barrier_watchers]
  _probes.wait_for_devices()
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
  device (``_probes.wait_for_devices``), not one per device and one over
  all of them: multi-device computations still running may call back
  later, as JAX's own callbacks of a running computation may.  Errors stay
  recorded for barrier_wait.  Nothing to wait for before the first
  compiled callback, nor inside a tap (its own thread) or a device
  callback.  On a GPU the probe runs on the device's stream after its
  earlier computations, whose taps have then all landed in the queue."""
  if (not state.handlers_registered or state.exiting or _hcb.in_tap() or
      _probes.in_device_callback()):
    return
  if device.platform == "cpu" or (device in state.cuda_devices and
                                  not state.forked):
    _probes.wait_for_device(device)
  _hcb.barrier()


def eager_callback_context() -> contextlib.ExitStack:
  """The context in which JAX calls an eager debug callback, for ours:
  the first CPU device as default device whatever the caller's
  (``jax.default_device``), and from JAX 0.8 on no mesh whatever the
  caller's (``jax.set_mesh``; 0.6 and 0.7 keep it).  The mesh is left as
  it is under an eager ``vmap``/``grad`` (``jax.set_mesh`` refuses to run
  in a trace)."""
  stack = contextlib.ExitStack()
  stack.enter_context(jax.default_device(jax.local_devices(backend="cpu")[0]))
  if _jax.eager_debug_callback_clears_mesh and _jax.trace_state_clean():
    stack.enter_context(_jax.no_mesh())
  return stack


def on_effects_barrier() -> None:
  """Added to ``jax.effects_barrier()`` (see ``_jax.extend_effects_barrier``):
  it also waits for host_callback's callbacks, and leaves their errors for
  barrier_wait to raise.  It waits for nothing inside a tap function (that
  would wait for its own thread) and after the at-exit flush."""
  if state.exiting or _hcb.in_tap():
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
  retired = _registry.take_unheld()
  if state.handlers_registered:
    try:
      _registry.wait_for_tokens(retired)
      _wait_for_callbacks()
    except BaseException:
      _registry.put_back(retired)
      raise
  logger.debug("barrier_wait[%s]: done", name)
  _registry.release(retired)
  _errors.raise_kept_error()


def stop_outfeed_receiver() -> None:
  """Waits for every pending callback, then stops the runtime's consumer
  threads.  The next tap starts them again.  Exceptions of tap functions
  stay recorded for the next :func:`barrier_wait`."""
  _refuse_inside_tap("stop_outfeed_receiver")
  if state.handlers_registered and not _probes.in_device_callback():
    _probes.wait_for_devices()
  _hcb.stop()
