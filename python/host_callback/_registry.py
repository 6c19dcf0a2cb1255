"""The registry of sites: the id each one gets, and when it is released.

The life of a site's id (DESIGN.md section 4: callables are kept while
something can still call them).  Two things hold a Python site's id:

- the compiled executables that embed it: the custom calls that carry a
  callback id count them (python/_hcb/lifetime.c: XLA's INSTANTIATE stage
  takes a hold, destroying the executable drops it).  XLA keeps an
  executable alive while a computation of it runs and while JAX's C++
  dispatch cache holds it, so no computation can reach a site with no
  hold.  (On CPU; the CUDA handlers count no holds: see below);
- Python: the site's :class:`Registration`, which :func:`lowered_site_id`
  makes a keepalive of each lowering (JAX keeps it with the lowering caches
  and the executable's Python object).  It covers what the holds do not:
  the lowered but not yet compiled program, and jit over sharded operands,
  where the id travels in JAX's own Python callback.

The registry refers to registrations weakly, so while either lives the same
site gets the same id (and re-tracing the same function hits JAX's
compilation cache).  When the registration is finalised the id is retired;
once it has no hold either, the computations JAX ran with runtime tokens
from the retiring thread have finished and every record queued by then has
been delivered, the C target drops its references (``_hcb.release``): the
function, its closure, the treedefs.  A background thread (``hcb-release``)
does that as soon as it can, and ``barrier_wait`` does it for what was
retired before it.  A record or call that still reached a released id would
be an error naming the function, never a call to freed memory.  Native (C)
targets are kept for the process: they hold no Python.

On CUDA no hold counts the executables (python/_hcb/handlers.c), and a GPU
computation can still be running, its taps not yet queued, when its
executable's Python object and so the registration are gone.  So where
JAX has CUDA devices a retired id is released only after the CUDA devices
have finished every computation dispatched before (the probes of
_probes.py) and the records they issued are delivered.

The registry's tables and the retired ids are fields of
``_state.state`` (``registrations``, ``native``, ``by_id``, ``retired``,
``release_thread``), under its ``lock``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from host_callback import _hcb
from host_callback import _jax
from host_callback import _probes
from host_callback._native import NativeCallback
from host_callback._native import NativeTap
from host_callback._state import state

logger = logging.getLogger("host_callback")

# Retired ids, each with the runtime tokens of the thread that retired it.
Retired = list[tuple[int, list[Any]]]


class Registration:
  """Keeps a site's runtime id registered while it lives: compiled programs
  that embed the id hold it (a keepalive of their lowering); the registry
  holds it weakly.  Finalising it retires the id (see the module's
  docstring)."""

  __slots__ = ("id", "releasable", "__weakref__")

  def __init__(self, site_id: int, releasable: bool):
    self.id = site_id
    self.releasable = releasable

  def __del__(self) -> None:
    if self.releasable:
      try:
        _retire(self.id)
      except Exception:  # pylint: disable=broad-except
        pass  # the interpreter is exiting: nothing needs releasing

  def __repr__(self) -> str:
    return f"host_callback site id {self.id}"


def _is_native(site: Any) -> bool:
  return isinstance(site, (NativeTap, NativeCallback)) or isinstance(
      getattr(site, "func", None), (NativeTap, NativeCallback))


def _register(site: Any) -> int:
  """Registers ``site`` with the runtime and returns its new id: the sites
  of a native function all share the function's own id."""
  func = getattr(site, "func", None)
  if isinstance(func, (NativeTap, NativeCallback)):  # whatever the site
    return site_id(func)
  return site.register()


def _registration(site: Any) -> Registration:
  """The registration of a tap, call or buffer-callback site (anything with
  a ``register() -> id`` method), registering it on first use."""
  key = (type(site), site)
  table: Any = state.native if _is_native(site) else state.registrations
  found = table.get(key)
  if found is not None:
    return found
  with state.lock:
    found = table.get(key)
    if found is None:
      found = Registration(_register(site), not _is_native(site))
      table[key] = found
      state.by_id[found.id] = found
  return found


def registration_of(site_id: int) -> Registration | None:
  """The live registration of ``site_id``, for a lowering that carries the
  id in an object JAX keeps with the runtime executable (its own Python
  callback under jit over sharded operands): holding it there keeps the
  site for exactly as long as that executable."""
  return state.by_id.get(site_id)


def site_id(site: Any) -> int:
  """The runtime id of a site (see :func:`_registration`).  Kept registered
  only while something holds it: programs get theirs from
  :func:`lowered_site_id`."""
  return _registration(site).id


def lowered_site_id(ctx: Any, site: Any) -> int:
  """The runtime id of ``site`` for the program being lowered in ``ctx``
  (an ``mlir.LoweringRuleContext``): the id's registration becomes a
  keepalive of the lowering, which JAX keeps with the executable, so the
  site stays registered as long as a compiled program embeds its id.

  ``ModuleContext.add_keepalive`` is JAX's public-by-convention lowering
  API (``jax.interpreters.mlir``), the way JAX kept its own CPU callbacks
  alive; ``add_host_callback`` would cost the C++ fast dispatch path.

  The lowering rules call it through ``_runtime.lowered_site_id``, which
  starts the runtime first."""
  registration = _registration(site)
  ctx.module_context.add_keepalive(registration)
  return registration.id


def _retire(site_id: int) -> None:
  """Called when no compiled program holds ``site_id`` any more (from a
  finaliser: on any thread, at any time, so it only takes note)."""
  if state.exiting:
    return
  # The thread that drops a program is mostly the one that dispatched it:
  # JAX's tokens of its computations with host callbacks (jit over sharded
  # operands) are thread-local, so take them now.
  from host_callback import _jax
  tokens = _jax.output_runtime_tokens()
  if (not tokens and not state.cuda_devices and _hcb.holds(site_id) <= 0 and
      _hcb.stats()["queued_records"] == 0):
    # Nothing can reach it any more, nothing for it waits to be delivered:
    # release it now, as the executable's own references go now.
    _hcb.release(site_id)
    return
  state.retired.append((site_id, tokens))
  _hcb.notify_unused()
  thread = state.release_thread
  if thread is None or not thread.is_alive():  # also in a forked child
    with state.lock:
      thread = state.release_thread
      if thread is None or not thread.is_alive():
        state.release_thread = threading.Thread(
            target=_release_loop, name="hcb-release", daemon=True)
        state.release_thread.start()


def _take_retired() -> Retired:
  taken = []
  while True:
    try:
      taken.append(state.retired.popleft())
    except IndexError:
      return taken


def wait_for_tokens(retired: Retired) -> None:
  """Waits for the computations behind the runtime tokens of ``retired``
  (their errors are for their own thread's ``jax.effects_barrier``)."""
  for _, tokens in retired:
    for token in tokens:
      try:
        token.block_until_ready()
      except Exception:  # pylint: disable=broad-except
        pass


def release(retired: Retired) -> None:
  """Releases the ids of ``retired``: their C targets drop their
  references (see the module's docstring)."""
  for site_id, _ in retired:
    _hcb.release(site_id)


def _unheld(retired: Retired) -> tuple[Retired, Retired]:
  """Splits retired ids into those no live executable holds and the rest."""
  free: Retired = []
  held: Retired = []
  for entry in retired:
    (free if _hcb.holds(entry[0]) <= 0 else held).append(entry)
  return free, held


def take_unheld() -> Retired:
  """Takes the retired ids that no live executable holds now (every record
  of theirs is queued); the others stay retired."""
  free, held = _unheld(_take_retired())
  state.retired.extend(held)
  return free


def put_back(retired: Retired) -> None:
  """Gives back ids taken by :func:`take_unheld` and not released."""
  state.retired.extend(retired)


def _release_loop() -> None:
  """The release thread: releases retired ids as soon as nothing holds
  them (see the module's docstring)."""
  pending: Retired = []
  while not state.exiting:
    pending += _take_retired()
    free, pending = _unheld(pending)
    if free:
      try:
        # Free now: no computation of theirs runs (on CPU; on CUDA once
        # the devices have finished what was dispatched before), so all
        # their records are queued; deliver them first.
        wait_for_tokens(free)
        _probes.wait_for_cuda_devices()
        if _hcb.stats()["queued_records"]:
          _hcb.barrier()
      except Exception:  # pylint: disable=broad-except
        logger.debug("host_callback: release wait failed", exc_info=True)
        pending += free
      else:
        if state.exiting:
          return
        release(free)
        continue
    # Woken when a hold drops to zero or an id is retired.
    _hcb.wait_unused(10.0)
