"""The errors of callbacks, kept for barrier_wait.

A tap function that raises cannot fail the computation that tapped (it has
moved on), so its error is logged and kept: the next ``barrier_wait``
raises it (:func:`raise_kept_error`).  A call's error fails its
computation and is kept too.  The extension reports each failure here, with
the GIL (:func:`on_callback_error`, given to ``_hcb.configure``); the
drop-ins of JAX's callbacks report theirs as JAX does
(:class:`~host_callback._sites.JaxErrorLog`).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from host_callback import _hcb
from host_callback._devices import device_for_key
from host_callback._sites import JaxErrorLog
from host_callback._sites import TapSite
from host_callback._state import state
from host_callback._types import CallbackException

logger = logging.getLogger("host_callback")


def _jax_error_log(site: Any) -> JaxErrorLog | None:
  """How the errors of ``site`` are reported, when it is one of the
  drop-ins of JAX's callbacks (a call site's ``api``; the ``jax_error_log``
  of a tap site's function, or of the object whose method it is, or of a
  buffer callback's site); None for host_callback's own APIs."""
  log = getattr(site, "jax_error_log", None)
  if log is None and isinstance(site, TapSite):
    log = getattr(site.func, "jax_error_log", None)
    if log is None:
      log = getattr(getattr(site.func, "__self__", None), "jax_error_log",
                    None)
  return log if isinstance(log, JaxErrorLog) else None


def on_callback_error(site: Any, exc: BaseException, raised: bool) -> str:
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
  _keep_failure_on(what, device_key, exc,
                   "a tap on device {} was not delivered: it could not be "
                   "queued", "tap not delivered")


def call_not_parked(what: str, device_key: int, exc: Exception) -> None:
  """A call that ran from Python (jit over operands sharded across
  processes) and failed where its failure could not be parked for the
  devices of its process (every slot busy, or it failed before it ran):
  the computation fails on every device with a message that points here,
  and the error itself is logged and kept for barrier_wait.  (Raised in
  JAX's Python callback, it would fail this device alone and leave the
  others waiting for it in the collective that spreads the results.)"""
  _keep_failure_on(what, device_key, exc, "a call on device {} failed",
                   "call failed")


def _keep_failure_on(what: str, device_key: int, exc: Exception,
                     happened: str, label: str) -> None:
  """Logs and keeps for barrier_wait that ``happened`` (its ``{}`` the
  device) because of ``exc``."""
  device = device_for_key(device_key)
  error = RuntimeError(
      f"{what}: {happened.format(f'{device.platform}:{device.id}')} "
      f"({type(exc).__name__}: {exc})")
  error.__cause__ = exc
  _keep_for_barrier(f"{what}: {label} (postponed to barrier_wait):", error)


def _report_as_jax(log: JaxErrorLog, exc: BaseException, raised: bool) -> str:
  """Reports a drop-in's error as JAX does (see :func:`on_callback_error`)
  and returns its formatted traceback (:func:`_jax_traceback`)."""
  formatted = _jax_traceback(exc)
  if raised and log.logger is not None:
    logging.getLogger(log.logger).error(
        log.message, exc_info=(type(exc), exc, exc.__traceback__))
  with state.lock:
    if log.keep:
      state.last_exception = (exc, formatted, log.logger is not None)
    else:
      # The runtime counts it among the errors barrier_wait raises: it
      # leaves this many out.
      state.reported_errors += 1
  return formatted


def _jax_traceback(exc: BaseException) -> str:
  """``exc``'s traceback as the text of JAX's error carries it: the line of
  the exception names its type by its ``__name__`` alone, as jaxlib's
  (CPython's type name), not module-qualified as Python's ``traceback``
  does (``_EquinoxRuntimeError: ...``, not
  ``equinox._errors._EquinoxRuntimeError: ...``): a program that reads the
  error's text reads the same line."""
  lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
  kind = type(exc)
  qualified = f"{kind.__module__}.{kind.__qualname__}"
  if kind.__module__ not in ("builtins", "__main__"):
    for i in range(len(lines) - 1, -1, -1):
      if lines[i].startswith(qualified):
        lines[i] = kind.__name__ + lines[i][len(qualified):]
        break
  return "".join(lines)


def _keep_for_barrier(header: str, exc: BaseException) -> str:
  """Logs ``exc`` under ``header`` and keeps it for barrier_wait; returns
  its formatted traceback."""
  formatted = "".join(
      traceback.format_exception(type(exc), exc, exc.__traceback__))
  logger.error("%s\n%s", header, formatted)
  with state.lock:
    state.last_exception = (exc, formatted, False)
  return formatted


def raise_kept_error() -> None:
  """Raises what barrier_wait raises once it has waited: the last error
  kept since the previous barrier, else one the runtime counted that no
  hook could keep; and forgets them.

  Raises:
    CallbackException: a callback failed since the previous barrier.
  """
  # The runtime counts every failed tap; the Python hook keeps the
  # exception object.  Prefer the object, but never lose an error the hook
  # could not record (e.g. the hook itself failed).
  count, message = _hcb.take_error()
  with state.lock:
    last, state.last_exception = state.last_exception, None
    # The runtime counts an error after the hook has reported it: what is
    # not yet counted is left for the next barrier.
    reported = min(count, state.reported_errors)
    state.reported_errors -= reported
    count -= reported
  prefix = "There were exceptions during callback processing. Last one was: "
  state.raised_as_jax = last is not None and last[2]
  if last is not None:
    exc, formatted, _ = last
    raise CallbackException(prefix + formatted) from exc
  if count:
    raise CallbackException(prefix + message)
