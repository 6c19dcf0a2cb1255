"""Sites: what a compiled callback refers to by id, and their keys.

A site is a NamedTuple of the user's function and what the runtime needs to
call it (how to rebuild its argument, its declared result, its
transformations).  Equal sites share an id, so re-tracing the same
function hits JAX's compilation cache: every part of a site must hash, and
:func:`hashable_callable` and :func:`hash_key` make the parts that do not.
A site registers itself with the C runtime (``register() -> id``); which
sites share an id, and for how long an id lives, is _registry.py's.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from host_callback import _hcb
from host_callback._native import NativeCallback
from host_callback._native import NativeTap


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
  whether ``barrier_wait`` raises it afterwards (``keep``: a callback whose
  computation does not fail) or not (a failed computation has raised it
  already)."""

  logger: str | None
  message: str
  keep: bool


#: How the failure of a ``jax.debug`` callback is reported, in JAX and in
#: the drop-ins that run as one (debug.py, and progress.py's bars, as
#: jax-tqdm's are ``jax.debug`` callbacks): JAX's record on its debugging
#: logger, and the computation fails (nothing kept for barrier_wait).
DEBUG_CALLBACK_ERRORS = JaxErrorLog("jax._src.debugging",
                                    "jax.debug.callback failed", keep=False)


class TapSite(NamedTuple):
  """What a compiled tap refers to by id: the function, how to rebuild its
  argument, the transformations applied around it, and whether it wants the
  device.  Equal sites share an id, so re-tracing the same function hits
  JAX's compilation cache."""

  func: Callable[..., Any] | NativeTap
  treedef: Any
  transforms: Transforms
  with_device: bool
  # The drop-in of JAX's callbacks this tap serves ("debug.callback"), which
  # its errors name; "" for host_callback's own taps.
  api: str = ""

  def register(self) -> int:
    """Registers this site with the runtime (a native function's sites
    share the function's id instead: _registry.py)."""
    register = getattr(self.func, "register_tap_site", None)
    if register is not None:  # id_print's Printer: a C target of its own
      return register(self)
    return _hcb.register_tap(site=self, name=callable_name(self.func))


class CallSite(NamedTuple):
  """What a compiled ``call`` refers to by id: the function, how to rebuild
  its argument, the declared result (treedef and ``(shape, dtype)`` per
  leaf), whether it wants the device, whether a 64-bit result may fill a
  declared 32-bit one (JAX without x64), the API the user called
  (``"host_callback.call"``, or the drop-in ``"pure_callback"`` or
  ``"io_callback"``, whose errors and logs are JAX's: see
  ``_errors.on_callback_error``), and a hint of what ``result_shape``
  probably meant.  The C target reads the fields by name
  when it is registered (python/_hcb/call.c, hcb_py_call_site_read)."""

  func: Callable[..., Any] | NativeCallback
  arg_treedef: Any
  result_treedef: Any
  result_avals: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
  with_device: bool
  narrow_x64: bool
  api: str
  # What result_shape probably meant, added to a wrong result's message
  # ("" when it looks as meant).
  hint: str = ""

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
    """Registers this site with the runtime (a native function's sites
    share the function's id instead: _registry.py)."""
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
