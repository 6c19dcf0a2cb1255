"""Progress bars for JAX loops: jax-tqdm 0.4's API on host_callback's taps.

Migrating from jax-tqdm is one import line::

    from host_callback.progress import PBar, loop_tqdm, scan_tqdm
    # was: from jax_tqdm import PBar, loop_tqdm, scan_tqdm

``scan_tqdm(n)`` decorates the body of a ``lax.scan`` over ``jnp.arange(n)``
(or over a tuple whose first element is it), ``loop_tqdm(n)`` the body of a
``lax.fori_loop(0, n, ...)``; both take ``print_rate``, ``tqdm_type`` and
tqdm's keyword arguments.  A carry wrapped in :class:`PBar` names the bar,
so a loop under ``vmap`` draws one bar per id.  Beyond jax-tqdm:

- under ``pmap``/``shard_map`` every device draws its own bar, whose
  description names the device when the loop runs on several devices;
- a bar counts the steps done, from wherever the loop starts
  (``fori_loop(3, 10)``: 7 steps), and a barrier closes the bars of loops
  that ended short of their length (a scan over fewer than ``n`` steps);
- :func:`while_loop` is ``lax.while_loop`` with a bar, whose total may be
  unknown;
- updates are taps (about a microsecond each on CPU), so by default a bar
  is updated often (every step, or 1,000 times over a loop of more than
  1,000 steps; jax-tqdm: 20 times) and the host throttles
  redrawing with tqdm's own ``mininterval``/``miniters``, which are passed
  through (jax-tqdm drops them);
- bars are drawn with positions that no other open bar uses, so
  concurrent and nested loops do not draw over each other.

How it works.  The loop's body taps ``(index, id)``, where ``index`` is the
loop's index after the steps done: 0 before step 0 (so the bar appears
when the loop starts), and after every ``print_rate``-th step and the last
one (which closes the bar).  Taps of one device run in program order, so
the bar sees its updates in order.  On the host a registry keyed by (loop,
id, device) holds the open bars; a bar counts steps from the index its
run started at.  A bar is complete and closed once its last tap has run:
the taps run inside the computation, in its thread, before it goes on
(``_tap.tap(..., deliver=Delivery.NOW)``, as jax-tqdm's ``jax.debug``
callbacks run), so a bar is complete when the loop's result is read, and
a bar whose tap raises fails the loop's computation, as jax-tqdm's.  :func:`host_callback.barrier_wait` and
``jax.effects_barrier()`` also close the bars of loops that ended before
their last index (a scan shorter than its bar).

tqdm is an optional dependency (``pip install tqdm``, or ``pip install
'.[progress]'`` in host_callback's checkout);
importing this module without it raises an ImportError that says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import threading
from typing import Any, Callable, Generic, TypeVar

try:
  import tqdm as _tqdm  # noqa: F401  (the check; bars import a submodule)
except ImportError as e:
  raise ImportError(
      "host_callback.progress needs tqdm, an optional dependency of "
      "host_callback: install it with pip install tqdm (or, in "
      "host_callback's checkout, pip install '.[progress]')") from e

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from host_callback import _args
from host_callback import _barrier
from host_callback import _jax
from host_callback import _sites
from host_callback._tap import Delivery
from host_callback._tap import tap

__all__ = ["PBar", "loop_tqdm", "scan_tqdm", "while_loop"]

C = TypeVar("C")

# With print_rate=None a bar is updated at most this many times per loop
# (every step of shorter loops).  A tap costs about a microsecond on CPU;
# tqdm redraws at most every ``mininterval`` seconds whatever the rate.
_DEFAULT_UPDATES = 1_000

_TQDM_TYPES = ("auto", "std", "notebook")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PBar(Generic[C]):
  """A loop's carry with the id of its progress bar.

  Wrap a loop's initial value in ``PBar(id=i, carry=init)`` and the loop
  draws the bar of id ``i``; under ``vmap`` with a batch of ids, one bar per
  id.  The loop returns a ``PBar`` too; its ``carry`` is the loop's value.

  Attributes
  ----------
  id : int or jax.Array
    The bar's id, an integer; bars are drawn at position ``id`` (plus the
    ``position`` given to the decorator) unless another open bar is there.
  carry : Any
    The loop's carry.
  """

  id: Any
  carry: C


# ---- the host side: the open bars -------------------------------------------

def _tqdm_class(tqdm_type: str) -> Any:
  if tqdm_type not in _TQDM_TYPES:
    raise ValueError(
        'tqdm_type should be one of "auto", "std", or "notebook" but got '
        f'"{tqdm_type}"')
  return importlib.import_module(f"tqdm.{tqdm_type}").tqdm


class _GuardedFile:
  """The stream a bar draws on, as tqdm sees it: a write or flush that
  raises (a closed terminal, a broken pipe) is kept, not raised inside
  tqdm, which holds its global lock while it draws and, on an exception,
  never releases it (every later bar of the process would then wait for
  it forever); the bar's tap raises it once tqdm has returned
  (:meth:`raise_failure`).  Anything else is the stream's."""

  def __init__(self, stream: Any):
    self._stream = stream
    self._failure: BaseException | None = None

  def write(self, text: str) -> int:
    try:
      written: int = self._stream.write(text)
      return written
    except Exception as exc:  # pylint: disable=broad-except
      if self._failure is None:
        self._failure = exc
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except Exception as exc:  # pylint: disable=broad-except
      if self._failure is None:
        self._failure = exc

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stream, name)

  def raise_failure(self) -> None:
    """Raises what the stream raised since the last call, if anything."""
    failure, self._failure = self._failure, None
    if failure is not None:
      raise failure


def _checked(bar: Any) -> Any:
  """``bar``, after raising what its stream raised meanwhile."""
  guard = getattr(bar, "_hcb_file", None)
  if guard is not None:
    guard.raise_failure()
  return bar


class _Registry:
  """The open bars of every loop, keyed by (loop, bar id, device id), and
  the positions they are drawn at.

  Taps of different devices run in different threads (each device's
  computation runs its own), so the registry has a lock.  Lock order: this lock, then tqdm's own (taken while
  a bar is created, redrawn or closed).  A bar itself is updated only by
  the thread of its device, and by a barrier that closes it once every
  loop it waited for has ended (:meth:`close_all`)."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.bars: dict[tuple[_Spec, int, int], Any] = {}
    self.positions: set[int] = set()

  def get(self, spec: _Spec, bar_id: int, device: Any) -> Any:
    """The open bar of ``(spec, bar_id, device)``, or None."""
    return self.bars.get((spec, bar_id, device.id))

  def open(self, spec: _Spec, bar_id: int, device: Any, named: bool) -> Any:
    """A new bar for ``(spec, bar_id, device)``; its description names the
    device when ``named`` (the loop runs on several devices)."""
    key = (spec, bar_id, device.id)
    with self.lock:
      position = spec.position + max(bar_id, 0)
      while position in self.positions:
        position += 1
      desc = spec.desc + f" ({device})" if named else spec.desc
      kwargs = spec.kwargs
      guard = None
      if not spec.tqdm.__module__.startswith("tqdm.notebook"):
        # A notebook's bar is a widget: no stream to guard.
        guard = _GuardedFile(kwargs.get("file") or sys.stderr)
        kwargs = {**kwargs, "file": guard}
      bar = spec.tqdm(total=spec.total, position=position, desc=desc,
                      **kwargs)
      bar._hcb_file = guard
      bar._hcb_position = position
      self.positions.add(position)
      self.bars[key] = bar
    return _checked(bar)

  def close(self, spec: _Spec, bar_id: int, device: Any) -> None:
    self._close((spec, bar_id, device.id))

  def _close(self, key: tuple[_Spec, int, int], check: bool = True) -> None:
    """Closes the bar of ``key``, if it is open; raises what its stream
    raised, with ``check``."""
    with self.lock:
      bar = self.bars.pop(key, None)
      if bar is None:
        return
      self.positions.discard(bar._hcb_position)
    bar.close()
    if check:
      _checked(bar)

  def close_all(self) -> None:
    """Closes every open bar, showing the steps it counted.  A barrier
    calls it once it has waited for every computation dispatched before
    it: the loops of the open bars have ended, so a bar left open (a scan
    shorter than its bar's ``n``) has nothing more to count.  (A loop that
    another thread dispatched while the barrier waited may still be
    running: its bar is then drawn anew by its next update.)"""
    with self.lock:
      keys = list(self.bars)
    for key in keys:  # a stream that fails now fails no loop: left alone
      self._close(key, check=False)


_registry = _Registry()


def _watch_barrier() -> Callable[[], None]:
  """Run as a barrier starts to wait: once it has waited, every loop with
  an open bar has ended, and the bars are closed."""
  return _registry.close_all


_barrier.watch_barriers(_watch_barrier)


def _elements(arrays: tuple[np.ndarray, ...], transforms: Any
              ) -> list[tuple[int, ...]]:
  """The tapped scalars, one tuple per element of the batch.

  Under ``vmap`` a tap receives arrays batched along the axes that
  ``transforms`` names (``('batch', {'batch_dims': ...})`` per vmap,
  innermost first, ``None`` for a leaf that vmap does not batch).  The
  leaves are aligned on those axes and broadcast together."""
  if not transforms:
    return [tuple(int(a) for a in arrays)]
  labels: list[list[int]] = [[] for _ in arrays]
  nbatch = 0
  for name, params in transforms:
    if name != "batch":
      continue
    for leaf, dim in enumerate(params["batch_dims"]):
      if dim is not None:
        labels[leaf].insert(dim, nbatch)
    nbatch += 1
  aligned = []
  for a, axes in zip(arrays, labels):
    a = np.asarray(a)
    order = sorted(range(len(axes)), key=lambda k: axes[k])
    a = np.transpose(a, order) if order else a
    present = sorted(axes)
    shape = [a.shape[present.index(t)] if t in present else 1
             for t in range(nbatch)]
    aligned.append(a.reshape(shape))
  flat = [b.ravel() for b in np.broadcast_arrays(*aligned)]
  return [tuple(int(x) for x in row) for row in zip(*flat)]


@dataclasses.dataclass(eq=False)
class _Spec:
  """One decorated loop: its bars' settings and the tap functions.

  Compared by identity: the tap functions are bound methods of it, so a
  loop's taps get one site each (and its compilation is reused)."""

  total: int | None
  print_rate: int
  tqdm: Any
  desc: str
  position: int
  kwargs: dict[str, Any]
  # Whether the bar closes when its count reaches ``total`` (a scan or a
  # fori_loop), or only at the loop's end (while_loop).
  close_at_total: bool = True

  # A bar's tap that raises (tqdm's error, a closed stream) fails the
  # loop's computation, reported as jax-tqdm's, which are jax.debug
  # callbacks, would be (the functions' attribute: _errors.py).
  jax_error_log = _sites.DEBUG_CALLBACK_ERRORS

  def update(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any, *,
             device: Any) -> None:
    """The tap of ``(index, bar id)`` of a loop on one device: creates the
    bar if needed and moves it on (tqdm decides whether to redraw); a loop
    of known length closes its bar when the index reaches it."""
    self._update(arg, transforms, device, named=False)

  def update_named(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any,
                   *, device: Any) -> None:
    """:meth:`update` of a loop that runs on several devices (``pmap``,
    ``shard_map``): each device's bar names the device."""
    self._update(arg, transforms, device, named=True)

  def _update(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any,
              device: Any, named: bool) -> None:
    if not transforms:  # the common case, kept short: this runs every step
      self._move(int(arg[0]), int(arg[1]), device, named)
      return
    for index, bar_id in _elements(arg, transforms):
      self._move(index, bar_id, device, named)

  def _move(self, index: int, bar_id: int, device: Any, named: bool) -> None:
    """Moves the bar of ``bar_id`` to ``index``: the loop index after the
    steps done (0 before the first).  The bar counts steps, not the index:
    a loop that starts at ``lower`` (``fori_loop(3, 10)``) has done
    ``index - lower`` steps.  The first tap of a run tells ``lower``: 0
    before step 0, else its index less the steps it reports (one, or
    ``print_rate``).  An index that goes back starts a new run of the loop:
    the old run's bar is closed as it stands."""
    bar = _registry.get(self, bar_id, device)
    if bar is not None and (index < bar._hcb_index or
                            (index == 0 and bar._hcb_index > 0)):
      _registry.close(self, bar_id, device)
      bar = None
    if bar is None:
      bar = _registry.open(self, bar_id, device, named)
      bar._hcb_start = index - min(self.print_rate, index)
    bar._hcb_index = index
    steps = index - bar._hcb_start
    if self.close_at_total and index >= (self.total or 0) > 0:
      bar.n = steps
      _registry.close(self, bar_id, device)
    elif steps > bar.n:
      bar.update(steps - bar.n)
      _checked(bar)

  def close(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any, *,
            device: Any) -> None:
    """The tap after the loop's last step: the bar shows the final count
    and is closed."""
    self._close(arg, transforms, device, named=False)

  def close_named(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any,
                  *, device: Any) -> None:
    """:meth:`close` of a loop that runs on several devices."""
    self._close(arg, transforms, device, named=True)

  def _close(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any,
             device: Any, named: bool) -> None:
    for count, bar_id in _elements(arg, transforms):
      bar = _registry.get(self, bar_id, device)
      if bar is None:
        bar = _registry.open(self, bar_id, device, named)
      if count != bar.n:
        bar.n = count
      _registry.close(self, bar_id, device)

  # -- the device side ---------------------------------------------------------

  def __post_init__(self) -> None:
    # One callable each for the life of the loop: a tap site's function.
    self.update_taps = (self.update, self.update_named)
    self.close_taps = (self.close, self.close_named)

  def tap_update(self, count: Any, bar_id: Any) -> None:
    tap(self.update_taps[_on_several_devices()],
        (jnp.asarray(count, jnp.int32), jnp.asarray(bar_id, jnp.int32)),
        tap_with_device=True, deliver=Delivery.NOW,
        api="host_callback.progress")

  def tap_close(self, count: Any, bar_id: Any) -> None:
    tap(self.close_taps[_on_several_devices()],
        (jnp.asarray(count, jnp.int32), jnp.asarray(bar_id, jnp.int32)),
        tap_with_device=True, deliver=Delivery.NOW,
        api="host_callback.progress")

  def step(self, iter_num: Any, bar_id: Any, body: Callable[[], Any]) -> Any:
    """Runs ``body()`` as loop step ``iter_num`` of ``total``, with its taps:
    before step 0 (the bar appears before the loop's first step runs), and
    after every ``print_rate``-th step and the last (the count of steps
    done; the last closes the bar).  With ``print_rate`` 1 the tap after
    the step needs no ``cond``."""
    assert self.total is not None
    lax.cond(iter_num == 0, lambda: self.tap_update(0, bar_id), lambda: None)
    out = body()
    done = iter_num + 1
    if self.print_rate == 1:
      self.tap_update(done, bar_id)
    else:
      lax.cond((done % self.print_rate == 0) | (done == self.total),
               lambda: self.tap_update(done, bar_id), lambda: None)
    return out


def _check_tqdm_keywords(api: str, tqdm_class: Any,
                         kwargs: dict[str, Any]) -> None:
  """tqdm's keyword arguments, checked where the loop is decorated: tqdm
  itself refuses an unknown one only when the bar is created, on the
  host, when the loop runs."""
  valid = {name for cls in tqdm_class.__mro__ if "__init__" in vars(cls)
           for name, p in inspect.signature(cls.__init__).parameters.items()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  valid -= {"self", "iterable"}
  valid |= {"message"}  # jax-tqdm's alias of desc
  for name in kwargs:
    if name not in valid:
      raise TypeError(_args.unexpected_keyword(
          api, name, valid | {"print_rate", "tqdm_type"}) +
          f" (it passes its other keyword arguments to {tqdm_class.__module__}"
          f".{tqdm_class.__name__}, which takes: {', '.join(sorted(valid))})")


def _on_several_devices() -> bool:
  """Whether the loop being traced runs on several devices, each with its
  own copy (``pmap``, ``shard_map``): the mesh's manual axes, known when
  the loop is traced, span more than one device.  Each device's bar then
  names its device from the start (deciding it when a second device's
  bar appears left the first bar unnamed when it had closed by then).
  A ``pmap`` of JAX 0.6 or 0.7 is no ``shard_map``: its devices are found
  apart."""
  mesh = jax.sharding.get_abstract_mesh()
  manual = getattr(mesh, "manual_axes", ())
  devices = int(np.prod([mesh.shape[a] for a in manual]))
  return devices * _jax.pmap_devices_tracing() > 1


def _spec(n: int | None, print_rate: int | None, tqdm_type: str,
          kwargs: dict[str, Any], api: str) -> _Spec:
  """The settings of a decorated loop, checked as jax-tqdm checks them,
  and each parameter where the loop is decorated, by name."""
  tqdm_class = _tqdm_class(tqdm_type)
  _check_tqdm_keywords(api, tqdm_class, kwargs)
  if n is not None:
    n = _args.check_index(api, "total" if api == "while_loop" else "n", n)
  if print_rate is not None:
    if isinstance(print_rate, bool) or not isinstance(
        print_rate, (int, np.integer)):
      raise TypeError(f"{api}: print_rate must be an int or None, got "
                      f"{print_rate!r} ({type(print_rate).__name__})")
  kwargs = dict(kwargs)
  if n is None:
    desc = kwargs.pop("desc", "Running")
  else:
    desc = kwargs.pop("desc", f"Running for {n:,} iterations")
  desc = kwargs.pop("message", desc)
  position = _args.check_index(api, "position", kwargs.pop("position", 0))
  kwargs.pop("total", None)  # the loop's length is the total
  if print_rate is None:
    rate = 1 if n is None else max(1, n // _DEFAULT_UPDATES)
  else:
    if print_rate < 1:
      raise ValueError(f"Print rate should be > 0 got {print_rate}")
    if n is not None and print_rate > n:
      raise ValueError("Print rate should be less than the number of steps "
                       f"{n}, got {print_rate}")
    rate = int(print_rate)
  return _Spec(total=n, print_rate=rate, tqdm=tqdm_class, desc=desc,
               position=position, kwargs=kwargs)


# ---- the API ----------------------------------------------------------------

def scan_tqdm(n: int, print_rate: int | None = None,
              tqdm_type: str = "auto", **kwargs: Any
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """A tqdm progress bar for a ``lax.scan`` (jax-tqdm's ``scan_tqdm``).

  Decorates the scan's body, ``body(carry, x) -> (carry, y)``; the scan
  must run over ``jnp.arange(n)``, or over a tuple whose first element is
  ``jnp.arange(n)``: that element is the step's index.  A carry wrapped in
  :class:`PBar` selects the bar by id.

  Parameters
  ----------
  n : int
    Number of steps of the scan.
  print_rate : int, optional
    Update the bar every ``print_rate`` steps.  By default every step of
    a scan of up to 1,000 steps, and 1,000 times over a longer one
    (jax-tqdm: 20 times); redrawing is throttled on the host.
  tqdm_type : str
    ``"auto"``, ``"std"`` or ``"notebook"``: the tqdm submodule whose bar
    is drawn.
  **kwargs
    Passed to tqdm's constructor (``desc``, ``position`` as the offset of
    bar positions, ``leave``, ``file``, ``ncols``, ``mininterval``, ...;
    ``message`` is an alias of ``desc``; ``total`` is ignored).

  Returns
  -------
  Callable
    The decorator.
  """
  spec = _spec(n, print_rate, tqdm_type, kwargs, "scan_tqdm")

  def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
    def body(carry: Any, x: Any) -> tuple[Any, Any]:
      iter_num = x[0] if isinstance(x, tuple) else x
      if isinstance(carry, PBar):
        bar_id = carry.id
        new, y = spec.step(iter_num, bar_id, lambda: func(carry.carry, x))
        return PBar(id=bar_id, carry=new), y
      return spec.step(iter_num, 0, lambda: func(carry, x))

    return body

  return decorate


def loop_tqdm(n: int, print_rate: int | None = None,
              tqdm_type: str = "auto", **kwargs: Any
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """A tqdm progress bar for a ``lax.fori_loop`` (jax-tqdm's ``loop_tqdm``).

  Decorates the loop's body, ``body(i, val) -> val``, of a
  ``lax.fori_loop(0, n, body, init)``.  An initial value wrapped in
  :class:`PBar` selects the bar by id.

  Parameters
  ----------
  n : int
    Number of iterations.
  print_rate : int, optional
    Update the bar every ``print_rate`` iterations (default as in
    :func:`scan_tqdm`).
  tqdm_type : str
    ``"auto"``, ``"std"`` or ``"notebook"``.
  **kwargs
    Passed to tqdm's constructor, as in :func:`scan_tqdm`.

  Returns
  -------
  Callable
    The decorator.
  """
  spec = _spec(n, print_rate, tqdm_type, kwargs, "loop_tqdm")

  def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
    def body(i: Any, val: Any) -> Any:
      if isinstance(val, PBar):
        bar_id = val.id
        new = spec.step(i, bar_id, lambda: func(i, val.carry))
        return PBar(id=bar_id, carry=new)
      return spec.step(i, 0, lambda: func(i, val))

    return body

  return decorate


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any],
               init_val: Any, *, total: int | None = None,
               tqdm_type: str = "auto", **kwargs: Any) -> Any:
  """``lax.while_loop`` with a tqdm progress bar of its iterations.

  The bar counts iterations; its total is ``total`` when given (an
  estimate: the bar closes when the loop ends, whatever the count), else
  unknown (tqdm then shows the count and the rate).  Every iteration taps
  its count; the host throttles redrawing.  An ``init_val`` wrapped in
  :class:`PBar` selects the bar by id (one bar per id under ``vmap``), and
  the loop then returns a ``PBar``.

  Parameters
  ----------
  cond_fun, body_fun, init_val
    As for ``lax.while_loop``.
  total : int, optional
    The expected number of iterations, if known.
  tqdm_type : str
    ``"auto"``, ``"std"`` or ``"notebook"``.
  **kwargs
    Passed to tqdm's constructor, as in :func:`scan_tqdm` (``desc``
    defaults to ``"Running"``).

  Returns
  -------
  Any
    The loop's final value (a ``PBar`` when ``init_val`` is one).
  """
  spec = _spec(total, None, tqdm_type, {"desc": "Running", **kwargs},
               "while_loop")
  spec.print_rate = 1
  spec.close_at_total = False
  wrapped = isinstance(init_val, PBar)
  bar_id = init_val.id if wrapped else 0
  value = init_val.carry if wrapped else init_val

  def cond(state: tuple[Any, Any]) -> Any:
    return cond_fun(state[1])

  def body(state: tuple[Any, Any]) -> tuple[Any, Any]:
    count, val = state
    val = body_fun(val)
    spec.tap_update(count + 1, bar_id)
    return count + 1, val

  spec.tap_update(0, bar_id)
  count, value = lax.while_loop(cond, body, (jnp.int32(0), value))
  spec.tap_close(count, bar_id)
  return PBar(id=bar_id, carry=value) if wrapped else value
