"""The process's life: fork, multiprocessing and exit.

- Before a fork the parent compiles the probes of barrier_wait, which a
  child cannot compile (:func:`_before_fork`); the child starts with a
  lock of its own and none of the parent's errors or threads
  (:func:`_after_fork_in_child`), and a multiprocessing child flushes its
  taps as its work ends, since it ends without ``atexit``.
- At exit every pending tap is delivered and the runtime shut down
  (:func:`at_exit`, registered by ``_runtime.ensure_started``).

The C runtime resets itself in a forked child (src/runtime/runtime.c,
"Fork").
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from host_callback import _hcb
from host_callback import _probes
from host_callback._barrier import barrier_wait
from host_callback._state import state
from host_callback._types import CallbackException

logger = logging.getLogger("host_callback")


def _before_fork() -> None:
  """In the parent, before a fork: compiles the probes of barrier_wait (a
  forked child cannot compile: XLA's compiler threads are not in it), so
  that the child's barrier_wait and at-exit flush work.  Not from inside a
  device callback: the probes could wait for the computation that runs it
  (the child of such a fork compiles them itself, if it can)."""
  if (not state.handlers_registered or state.probe_compiled
      or _probes.in_device_callback()):
    return
  try:
    for out in _probes.dispatch_probes():
      out.block_until_ready()
    state.probe_compiled = True
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
  state.lock = threading.RLock()
  state.last_exception = None
  state.reported_errors = 0
  state.release_thread = None
  state.forked = True
  mp_util = sys.modules.get("multiprocessing.util")
  if mp_util is not None and state.handlers_registered:
    mp_util.register_after_fork(state, _at_multiprocessing_start)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _say_uncollected(e: CallbackException) -> None:
  """One line on stderr at exit: tap functions failed and no barrier_wait
  raised it (each was logged, with its traceback, when it failed).  The
  exit status is the program's, as for an exception of another thread."""
  cause = e.__cause__
  last = (f"{type(cause).__name__}: {cause}" if cause is not None else
          str(e).rpartition("Last one was: ")[2].strip().splitlines()[-1])
  try:
    sys.stderr.write(
        f"host_callback: at exit, a tap function's error was never raised "
        f"by barrier_wait (the last: {last}); call hcb.barrier_wait() to "
        "raise it where the program can handle it\n")
    sys.stderr.flush()
  except Exception:  # pylint: disable=broad-except
    pass  # stderr closed: nothing to say it on


def at_exit() -> None:
  """Delivers every pending tap before the interpreter exits."""
  state.exiting = True
  _hcb.notify_unused()
  try:
    barrier_wait("at_exit")
  except CallbackException as e:
    if not state.raised_as_jax:  # else the call raised it already
      _say_uncollected(e)
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
  thread = state.release_thread
  if thread is not None and thread.is_alive():
    thread.join(timeout=5)
  _hcb.shutdown()
