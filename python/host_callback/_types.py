"""Public types shared by the API modules."""

from __future__ import annotations

import enum


class CallbackFlavor(enum.Enum):
  """How the compiler may treat a callback.

  ``IO_CALLBACK`` (the default): a side effect; never removed, duplicated or
  reordered against the data it depends on, even when its result is unused.
  ``PURE``: a pure function of its argument; the compiler may remove it when
  its result is unused, or merge identical calls.
  ``DEBUG``: like ``IO_CALLBACK`` for taps; a ``call`` with results cannot
  use it.
  """

  IO_CALLBACK = 1
  PURE = 2
  DEBUG = 3


class CallbackException(Exception):
  """Raised by :func:`barrier_wait` when a tap function raised since the
  previous barrier.  Its message holds the last exception's text and
  traceback, and ``__cause__`` is that exception."""


# The legacy module's other name for it.
TapFunctionException = CallbackException
