"""Pacing of the programs with callbacks under jit over sharded operands.

Under ``jit`` over operands sharded across several devices a callback is
one call shared by every device (_lowering.py, ``_lower_shared``) or goes
through JAX's Python callback (``_lower_through_python``).  Such a
program takes each device a little longer to run than JAX's C++ fast path
takes to dispatch it (the devices meet at the callback; the operands cross
devices in collectives).  A loop that dispatches it without waiting piles
up computations, and XLA's CPU client lets at most 32 be in flight per
device: the next dispatch then waits for room on one of the client's
threads, which can be one that the running computation's collective
needs: XLA's rendezvous waits for a device that never comes and aborts
the process (after 40 s).  Not only with more devices than cores: 3000 unwaited
calls on 2 devices of a 2-core machine aborted so too, plain JAX and ours
unpaced (measured 2026-11-28).  Plain JAX programs with collectives meet
the same limit (measured: bench section 11's unsynced loop); JAX's own
``io_callback(ordered=True)`` never does, because its ordered token makes
each dispatch wait for the previous computation.

So these programs are paced: they are dispatched by JAX's Python path
(the C++ fast path cannot wait), and a dispatch that finds
:data:`MAX_IN_FLIGHT` of them still running waits for the oldest to finish
first -- on the runtime tokens JAX gives programs with host callbacks
(a shared call's program gets them from _lowering.py,
``_with_runtime_tokens``: without them 4 of 8 trial loops of 3000
unwaited calls got stuck; with them, none).  The C++ fast path, which
cannot wait, is what the pacing costs: most of what such a callback adds
to a call (bench section 11, per call).  Every other program keeps JAX's
C++ fast dispatch.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Sequence

from host_callback import _jax
from host_callback import _probes

# Paced programs in flight at most (XLA's CPU client allows 32 per device).
MAX_IN_FLIGHT = 8


class _Mark:
  """What a lowering keeps alive to mark its program as one to pace."""

  __slots__ = ()

  def __repr__(self) -> str:
    return "host_callback: paced dispatch"


_MARK = _Mark()


def mark(module_context: Any) -> None:
  """Marks the program being lowered in ``module_context`` (a callback of
  it goes through JAX's Python callback) as one to pace."""
  if not any(k is _MARK for k in module_context.keepalives):
    module_context.add_keepalive(_MARK)


class _Pending:
  """The completion tokens of the paced computations dispatched, oldest
  first, from every thread."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.tokens: collections.deque[list[Any]] = collections.deque()

  def add(self, tokens: list[Any]) -> list[Any] | None:
    """Notes a computation's tokens; returns the oldest's to wait for when
    more than MAX_IN_FLIGHT are noted."""
    with self.lock:
      self.tokens.append(tokens)
      if len(self.tokens) > MAX_IN_FLIGHT:
        return self.tokens.popleft()
    return None


_pending = _Pending()


class _PacedCall:
  """JAX's callable of a marked program, paced: after each dispatch it
  notes the computation's runtime tokens (JAX gives a program with host
  callbacks one per device) and waits for the oldest noted computation
  when more than MAX_IN_FLIGHT are.  Anything else is JAX's callable's."""

  __slots__ = ("call",)

  def __init__(self, call: Callable[..., Any]):
    self.call = call

  def __getattr__(self, name: str) -> Any:
    return getattr(self.call, name)

  def __call__(self, *args: Any) -> Any:
    out = self.call(*args)
    oldest = _pending.add(_jax.output_runtime_tokens())
    # Inside a callback of a running computation, waiting could wait for
    # that computation itself.
    if oldest is not None and not _probes.in_device_callback():
      for token in oldest:
        try:
          token.block_until_ready()
        except Exception:  # pylint: disable=broad-except
          pass  # that computation's error is its caller's
    return out


def _wrap(keepalive: Sequence[Any], call: Callable[..., Any]
          ) -> Callable[..., Any]:
  if any(k is _MARK for k in keepalive or ()):
    return _PacedCall(call)
  return call


_jax.wrap_program_calls(_wrap)
