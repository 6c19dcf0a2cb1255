"""Native callbacks: C functions used where ``id_tap``, ``call`` and
``buffer_callback`` take a Python function.

A native tap is an ``hcb_tap_fn`` and a native call an ``hcb_call_fn``
(include/hcb/hcb.h).  They are registered directly as targets of the C
runtime, so nothing in Python runs when they are called: a native tap runs
on the device's consumer thread with the GIL free, a native call on XLA's
thread with views of XLA's own buffers (no copy in either direction).
"""

from __future__ import annotations

import ctypes
import os
from _ctypes import CFuncPtr
from typing import Any

import numpy as np

from host_callback import _args
from host_callback import _hcb

# A C function as native_tap and native_call take it: a ctypes function
# pointer (``ctypes.CDLL(path).name``, a ``ctypes.CFUNCTYPE`` instance), its
# address, or the path of a shared library (with the function's name apart).
CFunction = CFuncPtr | int | str | os.PathLike[str]


# The largest address of this process (a void * of 64 or 32 bits).
_MAX_ADDRESS = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1


def _checked_address(value: int, what: str, name: str, low: int) -> int:
  """``value`` if it can be an address (``low`` to the largest one), else
  a ValueError naming the parameter: a negative or larger int would wrap
  around to another address.  Whether an address in range points at what
  it should cannot be checked."""
  if not low <= value <= _MAX_ADDRESS:
    raise ValueError(f"{what}: {name} must be an address from {low} to "
                     f"2**{_MAX_ADDRESS.bit_length()}-1 ({_MAX_ADDRESS:#x}), "
                     f"got {value!r}")
  return int(value)


def _address_of(fn: CFunction, symbol: str | None,
                what: str) -> tuple[int, Any, str]:
  """(address, object to keep alive, default name) of a C function given as
  a ctypes function, an int address, or a library path and a symbol."""
  if isinstance(fn, (str, os.PathLike)):
    if symbol is None:
      raise TypeError(f"{what}: a library path needs the name of the C "
                      f"function too, e.g. {what}({os.fspath(fn)!r}, "
                      "'my_function')")
    try:
      lib = ctypes.CDLL(os.fspath(fn))
    except OSError as e:
      raise ValueError(f"{what}: cannot load the library {os.fspath(fn)!r}: "
                       f"{e}") from None
    try:
      func = getattr(lib, symbol)
    except AttributeError:
      raise ValueError(f"{what}: the library {os.fspath(fn)!r} has no symbol "
                       f"{symbol!r}") from None
    return ctypes.cast(func, ctypes.c_void_p).value or 0, lib, symbol
  if symbol is not None:
    raise TypeError(f"{what}: a symbol name goes with a library path, not "
                    f"with {fn!r}")
  if isinstance(fn, bool):
    raise TypeError(f"{what}: expected a C function, got {fn!r}")
  if isinstance(fn, int):
    # 0 is refused by the caller, as NULL
    address = _checked_address(fn, what, "fn", 1) if fn else 0
    return address, None, hex(address)
  if isinstance(fn, CFuncPtr):
    return (ctypes.cast(fn, ctypes.c_void_p).value or 0, fn,
            getattr(fn, "__name__", None) or "")
  raise TypeError(f"{what}: expected a ctypes function pointer, an address "
                  f"or a library path and symbol, got {fn!r}")


def _user_address(user: Any, what: str) -> int:
  """``user`` (None, an address or a ``ctypes.c_void_p``) as an address."""
  if isinstance(user, ctypes.c_void_p):
    user = user.value
  if user is None:
    return 0
  if isinstance(user, bool) or not isinstance(user, (int, np.integer)):
    raise TypeError(f"{what}: user must be an address (an int such as "
                    "ctypes.addressof(obj)), a ctypes.c_void_p or None, got "
                    f"{user!r} ({type(user).__name__})")
  return _checked_address(int(user), what, "user", 0)


class _Native:
  """A C function with its ``user`` pointer, as a callback."""

  _what = "native callback"
  _kind = "native callback"  # in messages: "X is a <kind>"

  def __init__(self, fn: CFunction, symbol: str | None = None, *,
               user: int | ctypes.c_void_p | None = None,
               name: str | None = None):
    _args.check_str(self._what, "symbol", symbol, optional=True)
    _args.check_str(self._what, "name", name, optional=True)
    address, keep, default_name = _address_of(fn, symbol, self._what)
    if not address:
      raise ValueError(f"{self._what}: {fn!r} is not a C function pointer "
                       "(NULL)")
    self.fn = keep  # keeps a ctypes library or function alive
    self.address = address
    self.user = _user_address(user, self._what)
    self.name = name or default_name or hex(address)

  def __hash__(self) -> int:
    return hash((type(self), self.address, self.user))

  def __eq__(self, other: object) -> bool:
    return (isinstance(other, _Native) and type(other) is type(self) and
            (other.address, other.user) == (self.address, self.user))

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.name})"


class NativeTap(_Native):
  """A C ``hcb_tap_fn`` as the ``tap_func`` of :func:`id_tap`.

  The function (include/hcb/hcb.h)::

      int fn(void *user, hcb_record *rec, hcb_error *err);

  runs on the consumer thread of the record's device, with no Python and
  no GIL, once per tap, in the order the device issued them.
  ``hcb_record_args(rec)`` are the flattened leaves of ``arg`` (batched
  under ``vmap``; there are no ``transforms``) and
  ``hcb_record_device(rec)`` the device.  Returning non-zero after filling
  ``err`` records the error: :func:`barrier_wait` raises it as
  :class:`CallbackException` with that message.  Make it with
  :func:`native_tap`.
  """

  _what = "native_tap"
  _kind = "native tap"

  def register(self) -> int:
    return _hcb.register_native_tap(self.address, self.user, self.name)


class NativeCallback(_Native):
  """A C ``hcb_call_fn`` as the callback of :func:`call` or
  :func:`buffer_callback`.

  The function (include/hcb/hcb.h)::

      int fn(void *user, hcb_device device, const hcb_array *args,
             size_t nargs, const hcb_array *results, size_t nresults,
             hcb_error *err);

  runs on the XLA thread that waits for it, with no Python and no GIL.
  ``args`` and ``results`` are XLA's own buffers (the flattened argument
  and ``result_shape``); it writes each ``results[i].data`` in place.
  Returning non-zero after filling ``err`` fails the computation with that
  message (and :func:`barrier_wait` raises it too).  Make it with
  :func:`native_call`.
  """

  _what = "native_call"
  _kind = "native call function"

  def register(self) -> int:
    return _hcb.register_native_call(self.address, self.user, self.name)


def is_native(func: Any, want: type[_Native], where: str) -> bool:
  """Whether ``func`` is a native callback of class ``want``; a
  ``TypeError`` for a native callback of the other kind (a tap given to
  ``call``, a call function given to ``id_tap``)."""
  if isinstance(func, _Native) and not isinstance(func, want):
    raise TypeError(f"{where}: {func!r} is a {func._kind}; a {want._kind} is "
                    f"made with host_callback.{want._what}")
  return isinstance(func, want)


@_args.keywords("native_tap")
def native_tap(fn: CFunction, symbol: str | None = None, *,
               user: int | ctypes.c_void_p | None = None,
               name: str | None = None) -> NativeTap:
  """A C tap function to pass to :func:`id_tap` in place of a Python one.

  Args:
    fn: the ``hcb_tap_fn``: a ctypes function (``ctypes.CDLL(path).f``), its
      address as an int, or the path of a shared library (then ``symbol``
      names the function).  It must stay loaded for the rest of the process.
      An int address must be from 1 to the largest pointer (``ValueError``
      otherwise); that it points at such a function cannot be checked.
    symbol: the function's name in the library ``fn``.
    user: the ``void *user`` it receives (an address as an int or a
      ``ctypes.c_void_p``, or None for NULL); what it points at must outlive
      every computation that taps with it.
    name: its name in error messages (default: the symbol's).

  Example::

      tap = hcb.native_tap("./libmytaps.so", "log_norms")
      y = hcb.id_tap(tap, x)   # inside jit, scan, vmap, ...
  """
  return NativeTap(fn, symbol, user=user, name=name)


@_args.keywords("native_call")
def native_call(fn: CFunction, symbol: str | None = None, *,
                user: int | ctypes.c_void_p | None = None,
                name: str | None = None) -> NativeCallback:
  """A C call function to pass to :func:`call` or :func:`buffer_callback`
  in place of a Python one.

  Arguments as for :func:`native_tap`; ``fn`` is an ``hcb_call_fn``.

  Example::

      solve = hcb.native_call("./libsolvers.so", "tridiagonal")
      x = hcb.call(solve, (a, b, c, d), result_shape=d)
  """
  return NativeCallback(fn, symbol, user=user, name=name)
