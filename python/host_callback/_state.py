"""The one list of the Python side's process-wide state.

Every module of the runtime's Python side (the map is in _runtime.py)
keeps what must outlive a call here, in :data:`state`, and nowhere else:
each field is listed below under the module that owns it, the only one
that writes it (the others may read it), except for the reset of a forked
child (_process.py, ``_after_fork_in_child``), which gives the fields a
fork leaves stale fresh values.  ``lock`` guards the fields that
say so; the others are written once, or by one thread, or by atomic
operations.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
  import jax

  from host_callback._probes import Probe
  from host_callback._registry import Registration


class State:
  """The Python side's process-wide state (see the module's docstring)."""

  def __init__(self) -> None:
    # A re-entrant lock: the registry re-enters it for native sites.
    self.lock = threading.RLock()

    # ---- _runtime.py and _handlers.py: starting the runtime ----
    # The FFI handlers are registered with XLA (under lock).
    self.handlers_registered = False
    # The at-exit flush and the effects-barrier hook are in place (under
    # lock).
    self.atexit_registered = False
    # The local CUDA devices, when the handlers are registered for CUDA.
    self.cuda_devices: list[jax.Device] = []

    # ---- _registry.py: the ids of sites and their release ----
    # Sites of Python functions, while a compiled program embeds their id
    # (under lock).
    self.registrations: weakref.WeakValueDictionary[
        tuple[type, Any], Registration] = weakref.WeakValueDictionary()
    # Sites of native (C) functions: for the process (under lock).
    self.native: dict[tuple[type, Any], Registration] = {}
    # The same registrations by id (under lock).
    self.by_id: weakref.WeakValueDictionary[int, Registration] = (
        weakref.WeakValueDictionary())
    # (id, runtime tokens of the thread that retired it) of finalised
    # registrations, to be released: appended from any thread, taken by the
    # release thread or barrier_wait (a deque's append and popleft are
    # atomic).
    self.retired: collections.deque[tuple[int, list[Any]]] = (
        collections.deque())
    # The release thread ("hcb-release"), once an id has been retired
    # (started under lock).
    self.release_thread: threading.Thread | None = None

    # ---- _probes.py: the probe computations ----
    # The probes compiled so far, by their devices.
    self.probes: dict[tuple[jax.Device, ...], Probe] = {}

    # ---- _barrier.py ----
    # What a barrier runs around its wait (watch_barriers).
    self.barrier_watchers: list[Callable[[], Callable[[], None]]] = []

    # ---- _errors.py: the errors kept for barrier_wait ----
    # (exception, formatted traceback, whether JAX's record of it was
    # logged) of the last failing callback (under lock).
    self.last_exception: tuple[BaseException, str, bool] | None = None
    # Whether the error barrier_wait raised last was logged in JAX's words
    # (a drop-in's): the at-exit flush does not log it again.
    self.raised_as_jax = False
    # Errors the runtime counted that a failed computation has raised
    # already (drop-ins of JAX's callbacks): barrier_wait leaves them out
    # (under lock).
    self.reported_errors = 0

    # ---- _process.py: fork, multiprocessing, exit ----
    # The at-exit flush has started: nothing waits or releases any more.
    self.exiting = False
    # The probes are compiled on every device (before a fork).
    self.probe_compiled = False
    # In a child of os.fork.
    self.forked = False


state = State()
