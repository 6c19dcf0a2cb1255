"""JAX's callback APIs, and the removed module, served by host_callback.

:func:`patch_jax` puts host_callback's drop-ins under JAX's public names
(``_jax_names``), so that code one does not own -- a library that calls
``jax.pure_callback`` or ``jax.debug.print`` -- runs on this runtime
unchanged.  :func:`install_legacy_module` makes ``import
jax.experimental.host_callback`` give host_callback's module of the removed
API.  Each returns a :class:`Patch`, whose ``undo()`` (or the end of a
``with`` block) takes it back.

Both are counted: the names stay host_callback's while any patch of the
kind is applied, and the last undo restores what JAX had, exactly (the
same objects; a name someone else replaced since is left as it is).
Applying is idempotent (the names are replaced once) and thread-safe (one
lock).

A name bound before the patch keeps what it had: ``from
jax.experimental import io_callback`` at the top of a library imported
earlier holds JAX's function.  :func:`patch_jax` warns about every such
module it finds; the start-up hook (``HOST_CALLBACK_PATCH``, the top-level
module ``_host_callback_startup``) and ``python -m host_callback run``
patch before anything imports those names.  Undoing cannot reach names
bound while patched either: they keep host_callback's.

host_callback's own modules never call JAX's callback APIs through these
names (tests/python/test_patch.py checks it): the drop-ins do not reach
each other, nor themselves, when patched.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
import warnings
from typing import Any

import jax

from _host_callback_startup import LEGACY_NAME
from _host_callback_startup import LegacyLoader
from _host_callback_startup import jax_version_problem

__all__ = ["Patch", "install_legacy_module", "patch_jax", "unpatch_jax",
           "uninstall_legacy_module"]

_MISSING = object()  # a name the module did not have before the patch

# The public API of the removed jax.experimental.host_callback, which
# install_legacy_module serves.
LEGACY_API = ("barrier_wait", "call", "id_print", "id_tap",
              "stop_outfeed_receiver", "CallbackException", "CallbackFlavor",
              "TapFunctionException")

# Where a module's names are not the program's own: JAX's modules hold its
# callbacks by design, host_callback's hold its own.
_OWN_PREFIXES = ("jax.", "jaxlib.", "host_callback.")
_OWN_NAMES = ("jax", "jaxlib", "host_callback", "_host_callback_startup")


def _jax_names() -> list[tuple[types.ModuleType, str, Any]]:
  """(JAX's module, name, host_callback's object) for every public name
  that reaches one of JAX's callback APIs in the JAX installed
  (``jax.debug.log`` from JAX 0.8)."""
  import jax.debug
  import jax.experimental
  import jax.experimental.buffer_callback as jax_buffer_callback

  from host_callback import _buffer
  from host_callback import _dropins
  from host_callback import debug
  log = [(jax.debug, "log", debug.log)] if hasattr(jax.debug, "log") else []
  return [
      (jax, "pure_callback", _dropins.pure_callback),
      (jax.experimental, "io_callback", _dropins.io_callback),
      (jax.debug, "callback", debug.callback),
      (jax.debug, "print", debug.print),
      *log,
      (jax_buffer_callback, "buffer_callback", _buffer.buffer_callback),
      (jax_buffer_callback, "Buffer", _buffer.Buffer),
      (jax_buffer_callback, "ExecutionContext", _buffer.ExecutionContext),
      (jax_buffer_callback, "ExecutionStage", _buffer.ExecutionStage),
  ]


class Patch:
  """One applied :func:`patch_jax` or :func:`install_legacy_module`.

  ``undo()`` takes it back (a second ``undo()`` does nothing); as a
  context manager, the end of the ``with`` block does.  JAX's names come
  back when the last patch of the kind is undone."""

  __slots__ = ("kind", "_state")

  def __init__(self, kind: str, state: _State):
    self.kind = kind  # "jax" or "legacy"
    self._state = state

  @property
  def active(self) -> bool:
    """Whether this patch is applied (not yet undone)."""
    with _lock:
      return self in self._state.patches

  def undo(self) -> None:
    """Takes this patch back; JAX's own objects return with the last."""
    with _lock:
      state = self._state
      if self not in state.patches:
        return
      state.patches.remove(self)
      if not state.patches:
        state.restore()

  def __enter__(self) -> Patch:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.undo()

  def __repr__(self) -> str:
    return (f"<host_callback patch of {self.kind}: "
            f"{'active' if self.active else 'undone'}>")


class _State:
  """The patches of one kind that are applied, and what the first one
  replaced: (namespace, name, JAX's object or _MISSING, ours)."""

  def __init__(self) -> None:
    self.patches: list[Patch] = []
    self.saved: list[tuple[Any, str, Any, Any]] = []

  def replace(self, namespace: Any, name: str, ours: Any) -> None:
    """Sets ``namespace.name`` (a module, or the ``sys.modules`` dict) to
    ``ours``, remembering what was there."""
    self.saved.append((namespace, name, _get(namespace, name), ours))
    _set(namespace, name, ours)

  def add(self, kind: str) -> Patch:
    """A new patch of this kind, applied (the caller holds the lock and
    has made the replacements if it is the first)."""
    patch = Patch(kind, self)
    self.patches.append(patch)
    return patch

  def undo_all(self) -> None:
    with _lock:
      for patch in list(self.patches):
        patch.undo()

  def restore(self) -> None:
    """Puts back what :meth:`replace` replaced, where it is still ours."""
    for namespace, name, original, ours in reversed(self.saved):
      if _get(namespace, name) is not ours:
        continue  # replaced by someone else since: theirs stays
      if original is _MISSING:
        _delete(namespace, name)
      else:
        _set(namespace, name, original)
    self.saved.clear()


def _get(namespace: Any, name: str) -> Any:
  if isinstance(namespace, dict):
    return namespace.get(name, _MISSING)
  return namespace.__dict__.get(name, _MISSING)


def _set(namespace: Any, name: str, value: Any) -> None:
  if isinstance(namespace, dict):
    namespace[name] = value
  else:
    setattr(namespace, name, value)


def _delete(namespace: Any, name: str) -> None:
  if isinstance(namespace, dict):
    namespace.pop(name, None)
  elif name in namespace.__dict__:
    delattr(namespace, name)


_lock = threading.RLock()
_jax_state = _State()
_legacy_state = _State()


def _check_jax(api: str) -> None:
  problem = jax_version_problem(jax.__version__)
  if problem is not None:
    raise RuntimeError(f"host_callback.{api}(): {problem}")


def _stale_modules(originals: dict[int, str]) -> list[str]:
  """``module (name)`` for every module outside JAX and host_callback
  whose globals hold one of JAX's objects that the patch replaces
  (``originals``: id -> JAX's name): they imported it before the patch and
  keep calling JAX's."""
  found = []
  for mod_name, module in list(sys.modules.items()):
    if (mod_name in _OWN_NAMES or mod_name.startswith(_OWN_PREFIXES) or
        not isinstance(module, types.ModuleType)):
      continue
    names = sorted({originals[id(value)]
                    for value in list(getattr(module, "__dict__", {}).values())
                    if id(value) in originals})
    if names:
      found.append(f"{mod_name} ({', '.join(names)})")
  return found


def patch_jax() -> Patch:
  """Makes JAX's callback APIs host_callback's until undone.

  ``jax.pure_callback``, ``jax.experimental.io_callback``,
  ``jax.debug.callback``, ``jax.debug.print``, ``jax.debug.log`` and
  ``jax.experimental.buffer_callback``'s ``buffer_callback``, ``Buffer``,
  ``ExecutionContext`` and ``ExecutionStage`` become host_callback's:
  every call made through those names from now on runs on this runtime.
  JAX's other debugging tools (``jax.debug.breakpoint``, the sharding
  visualisers) and its internals (``jax._src``) are left alone.

  A module that bound one of these names before (``from jax.experimental
  import io_callback``) keeps JAX's: a ``RuntimeWarning`` names each one
  found.  Patch before such imports, or at start-up with no edit at all:
  ``HOST_CALLBACK_PATCH=jax`` or ``python -m host_callback run``
  (docs/migrating.md, "Speed up code you don't own").

  Returns:
    The :class:`Patch`: ``undo()`` it, or use ``with
    host_callback.patch_jax(): ...``.  Patches nest: JAX's objects are back
    when the last one is undone.

  Raises:
    RuntimeError: the installed JAX is outside the supported range.
  """
  with _lock:
    _check_jax("patch_jax")
    state = _jax_state
    if not state.patches:
      names = _jax_names()
      originals = {id(_get(m, n)): f"{m.__name__}.{n}" for m, n, _ in names
                   if _get(m, n) is not _MISSING}
      for module, name, ours in names:
        state.replace(module, name, ours)
      stale = _stale_modules(originals)
      if stale:
        warnings.warn(
            "host_callback.patch_jax(): these modules imported JAX's "
            "callbacks before the patch and keep calling JAX's: "
            f"{'; '.join(stale)}.  Patch before importing them, or at "
            "start-up (HOST_CALLBACK_PATCH=jax, or python -m host_callback "
            "run)", RuntimeWarning, stacklevel=2)
    return state.add("jax")


def unpatch_jax() -> None:
  """Undoes every :func:`patch_jax` at once: JAX's objects are back."""
  _jax_state.undo_all()


def _legacy_getattr(name: str) -> Any:
  raise AttributeError(
      f"module {LEGACY_NAME!r} (host_callback's) has no attribute "
      f"{name!r}; it has the removed module's API: {', '.join(LEGACY_API)}")


def fill_legacy_module(module: types.ModuleType) -> None:
  """Makes ``module`` host_callback's ``jax.experimental.host_callback``:
  the removed module's public API (``LEGACY_API``), host_callback's
  objects."""
  from host_callback import _barrier
  from host_callback import _call
  from host_callback import _tap
  from host_callback import _types
  home = {"barrier_wait": _barrier, "call": _call, "id_print": _tap,
          "id_tap": _tap, "stop_outfeed_receiver": _barrier,
          "CallbackException": _types, "CallbackFlavor": _types,
          "TapFunctionException": _types}
  module.__doc__ = (
      "jax.experimental.host_callback, served by host_callback (the "
      "removed module's API on its C runtime; see host_callback's "
      "docs/migrating.md).")
  for name in LEGACY_API:
    setattr(module, name, getattr(home[name], name))
  module.__all__ = list(LEGACY_API)  # type: ignore[attr-defined]
  module.__getattr__ = _legacy_getattr  # type: ignore[method-assign]
  module.__host_callback__ = True  # type: ignore[attr-defined]


def install_legacy_module() -> Patch:
  """Makes ``jax.experimental.host_callback`` host_callback's until undone.

  ``import jax.experimental.host_callback as hcb`` and ``from
  jax.experimental import host_callback as hcb`` give a module with the
  removed module's API (``id_tap``, ``id_print``, ``call``,
  ``barrier_wait``, ``stop_outfeed_receiver``, ``CallbackException``,
  ``TapFunctionException``, ``CallbackFlavor``), host_callback's objects.
  What was there comes back with the last undo: nothing from JAX 0.8 on;
  before, JAX's own module of that name (whose functions raise), or
  nothing if it had not been imported.

  Returns:
    The :class:`Patch` (``undo()``, or a ``with`` block).

  Raises:
    RuntimeError: the installed JAX is outside the supported range.
  """
  import jax.experimental
  with _lock:
    _check_jax("install_legacy_module")
    state = _legacy_state
    if not state.patches:
      module = sys.modules.get(LEGACY_NAME)
      if not getattr(module, "__host_callback__", False):
        # The module the start-up hook's import makes.
        loader = LegacyLoader()
        spec = importlib.util.spec_from_loader(LEGACY_NAME, loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
      state.replace(sys.modules, LEGACY_NAME, module)
      state.replace(jax.experimental, "host_callback", module)
    return state.add("legacy")


def uninstall_legacy_module() -> None:
  """Undoes every :func:`install_legacy_module` at once."""
  _legacy_state.undo_all()
