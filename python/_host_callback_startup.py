"""host_callback's start-up hook: ``HOST_CALLBACK_PATCH=jax,legacy``.

The wheel installs ``host_callback_patch.pth`` beside this module.  Python
runs its one line at every start of the interpreter; that line only looks
the variable up in ``os.environ`` (``os`` is imported by then), and imports
this module only when the variable is set and not empty.  So a process
without the variable pays for one dictionary look-up, and this module, JAX
and host_callback are never imported by it.

With the variable set, :func:`install` puts a finder first on
``sys.meta_path``.  It imports nothing either: it waits for the program's
own ``import jax`` (``jax``: JAX's callbacks become host_callback's as soon
as the ``jax`` package has run, before any library imports names from it)
and for ``import jax.experimental.host_callback`` (``legacy``: the removed
module, served by host_callback).  A process that never imports JAX (pip,
a build tool) never imports host_callback.  A patch that cannot apply (JAX
outside the supported range, or an error) writes one line that says why to
stderr and leaves JAX as it was: the program goes on with JAX's callbacks.

This is a top-level module, not part of the ``host_callback`` package,
because importing anything of the package imports JAX.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Any, Callable, Sequence

ENV = "HOST_CALLBACK_PATCH"
WHAT = ("jax", "legacy")
LEGACY_NAME = "jax.experimental.host_callback"

# The JAX releases host_callback supports: pyproject.toml's dependency on
# jax (tests/python/test_patch.py checks that they agree).
SUPPORTED_JAX = ">=0.6.2,<0.13"
_LOW = (0, 6, 2)
_HIGH = (0, 13)


def _release(version: str) -> tuple[int, ...]:
  """The leading numbers of a version string: "0.12.0.1" -> (0, 12, 0, 1),
  "0.11.0rc1" -> (0, 11, 0)."""
  numbers: list[int] = []
  for part in version.split("."):
    digits = ""
    for c in part:
      if not c.isdigit():
        break
      digits += c
    if not digits:
      break
    numbers.append(int(digits))
    if digits != part:
      break
  return tuple(numbers)


def jax_version_problem(version: str) -> str | None:
  """None when JAX ``version`` is one host_callback supports, else the
  sentence that says it is not."""
  release = _release(version)
  if _LOW <= release < _HIGH:
    return None
  return (f"JAX {version} is installed; host_callback supports "
          f"jax{SUPPORTED_JAX} (install one of those, or unset {ENV})")


def parse(value: str) -> tuple[list[str], list[str]]:
  """The parts of a ``HOST_CALLBACK_PATCH`` value, and the words in it that
  are not parts (comma or space separated; case ignored)."""
  words = [w.strip().lower() for w in value.replace(",", " ").split()]
  return ([w for w in WHAT if w in words],
          [w for w in words if w not in WHAT])


def warn(message: str) -> None:
  """One line on stderr: the start-up hook has no caller to raise to."""
  sys.stderr.write(f"host_callback: {message}\n")


class _AfterExec(importlib.abc.Loader):
  """Wraps the loader of the ``jax`` package: runs the package, then
  ``after`` (the patch); then puts JAX's own loader back on the module and
  its spec, so that nothing of the wrapper remains."""

  def __init__(self, loader: Any,
               after: Callable[[types.ModuleType], None]):
    self._loader = loader
    self._after = after

  def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
    module: types.ModuleType | None = self._loader.create_module(spec)
    return module

  def exec_module(self, module: types.ModuleType) -> None:
    try:
      self._loader.exec_module(module)
    finally:
      module.__loader__ = self._loader
      if module.__spec__ is not None:
        module.__spec__.loader = self._loader
    self._after(module)

  def __getattr__(self, name: str) -> Any:  # anything else a loader has
    return getattr(self._loader, name)


class LegacyLoader(importlib.abc.Loader):
  """Makes ``jax.experimental.host_callback``: host_callback's module of
  the removed API (host_callback._patch.fill_legacy_module)."""

  def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
    del spec
    return None  # the import system's own module object

  def exec_module(self, module: types.ModuleType) -> None:
    from host_callback import _patch
    _patch.fill_legacy_module(module)

  def __repr__(self) -> str:  # the module's: <module '...' (host_callback)>
    return "host_callback"


class Finder:
  """The ``sys.meta_path`` finder of the start-up hook: does something for
  ``jax`` (once, with ``patch_jax``) and ``jax.experimental.host_callback``
  (with ``legacy``), and nothing for any other name."""

  def __init__(self, patch_jax: bool, legacy: bool):
    self.patch_jax = patch_jax
    self.legacy = legacy

  def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                target: types.ModuleType | None = None) -> ModuleSpec | None:
    if fullname == "jax" and self.patch_jax:
      self.patch_jax = False  # once: the patch re-imports nothing
      spec = self._others(fullname, path, target)
      if spec is not None and spec.loader is not None:
        spec.loader = _AfterExec(spec.loader, _patch_jax)
      return spec
    if fullname == LEGACY_NAME and self.legacy:
      jax = sys.modules.get("jax")
      problem = jax_version_problem(getattr(jax, "__version__", "unknown"))
      if problem is not None:
        warn(f"{ENV}=legacy: {LEGACY_NAME} is not host_callback's: "
             f"{problem}")
        return None
      return importlib.util.spec_from_loader(fullname, LegacyLoader())
    return None

  def _others(self, fullname: str, path: Sequence[str] | None,
              target: types.ModuleType | None) -> ModuleSpec | None:
    """The spec the finders after this one give."""
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec: ModuleSpec | None = finder.find_spec(fullname, path, target)
      if spec is not None:
        return spec
    return None


def _patch_jax(jax: types.ModuleType) -> None:
  """Right after the ``jax`` package has run: JAX's callbacks become
  host_callback's, for good (never raises: ``import jax`` must work)."""
  problem = jax_version_problem(getattr(jax, "__version__", "unknown"))
  if problem is not None:
    warn(f"{ENV}=jax not applied, JAX's callbacks stay: {problem}")
    return
  try:
    from host_callback import _patch
    _patch.patch_jax()
  except Exception as e:  # noqa: BLE001 -- JAX must still import
    warn(f"{ENV}=jax not applied, JAX's callbacks stay: "
         f"{type(e).__name__}: {e}")


def install(value: str) -> Finder | None:
  """Applies a ``HOST_CALLBACK_PATCH`` value: puts the finder first on
  ``sys.meta_path`` (or, where JAX is imported already, patches at once).
  Returns the finder, or None when the value asks for nothing."""
  what, unknown = parse(value)
  if unknown:
    warn(f"{ENV}={value!r}: ignoring {', '.join(map(repr, unknown))}; "
         f"the parts are {', '.join(WHAT)} (comma separated)")
  if not what:
    return None
  for finder in sys.meta_path:
    if isinstance(finder, Finder):  # installed already: add to it
      break
  else:
    finder = Finder(False, False)
    sys.meta_path.insert(0, finder)
  if "jax" in what:
    if "jax" in sys.modules:
      _patch_jax(sys.modules["jax"])
    else:
      finder.patch_jax = True
  if "legacy" in what:
    finder.legacy = True
  return finder


_started = False


def main() -> None:
  """What the ``.pth`` line calls when the variable is set (once: Python
  may process a site-packages directory twice, through a ``lib64`` link)."""
  global _started
  if _started:
    return
  _started = True
  try:
    install(os.environ.get(ENV, ""))
  except Exception as e:  # noqa: BLE001 -- never stop the interpreter
    warn(f"{ENV} not applied: {type(e).__name__}: {e}")
