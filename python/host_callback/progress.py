"""Progress bars for JAX loops: jax-tqdm 0.4's API on host_callback's taps.

Migrating from jax-tqdm is one import line::

    from host_callback.progress import PBar, loop_tqdm, scan_tqdm
    # was: from jax_tqdm import PBar, loop_tqdm, scan_tqdm

``scan_tqdm(n)`` decorates the body of a ``lax.scan`` over ``jnp.arange(n)``
(or over a tuple whose first element is it), ``loop_tqdm(n)`` the body of a
``lax.fori_loop(0, n, ...)``; both take ``print_rate``, ``tqdm_type`` and
tqdm's keyword arguments.  A carry wrapped in :class:`PBar` names the bar,
so a loop under ``vmap`` draws one bar per id.  Beyond jax-tqdm:

- under ``pmap``/``shard_map`` every device draws its own bar (the device
  is added to the description when several devices draw the bar of one id);
- :func:`while_loop` is ``lax.while_loop`` with a bar, whose total may be
  unknown;
- updates are taps (about a microsecond each on CPU), so by default a bar
  is updated often (every step, or 1,000 times over a loop of more than
  1,000 steps; jax-tqdm: 20 times) and the host throttles
  redrawing with tqdm's own ``mininterval``/``miniters``, which are passed
  through (jax-tqdm drops them);
- bars are drawn with positions that no other open bar uses, so
  concurrent and nested loops do not draw over each other.

How it works.  The loop's body taps ``(count, id)`` with a tap, where
``count`` is the number of steps done: before step 0 (so the bar appears
when the loop starts), and after every ``print_rate``-th step and the
last one (which closes the bar).  Taps of one device run in program order,
so the bar sees its updates in order.  On the host a registry keyed
by (loop, id, device) holds the open bars.  A bar is complete and closed
once its last tap has run: the taps ask for delivery before the program's
results are ready (``_tap.tap(..., deliver=True)``), so a bar is complete
when the loop's result is read, as jax-tqdm's.

tqdm is an optional dependency (``pip install 'host_callback[progress]'``);
importing this module without it raises an ImportError that says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from typing import Any, Callable, Generic, TypeVar

try:
  import tqdm as _tqdm  # noqa: F401  (the check; bars import a submodule)
except ImportError as e:
  raise ImportError(
      "host_callback.progress needs tqdm, an optional dependency of "
      "host_callback: install it with pip install 'host_callback[progress]' "
      "(or pip install tqdm)") from e

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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


class _Registry:
  """The open bars of every loop, keyed by (loop, bar id, device id), and
  the positions they are drawn at.

  Taps of different devices run on different consumer threads, so the
  registry has a lock.  Lock order: this lock, then tqdm's own (taken while
  a bar is created, redrawn or closed).  A bar itself is updated only by
  the thread of its device."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.bars: dict[tuple[_Spec, int, int], Any] = {}
    self.positions: set[int] = set()

  def open(self, spec: _Spec, bar_id: int, device: Any) -> Any:
    """The open bar of ``(spec, bar_id, device)``, created if needed."""
    key = (spec, bar_id, device.id)
    bar = self.bars.get(key)
    if bar is not None:
      return bar
    with self.lock:
      position = spec.position + max(bar_id, 0)
      while position in self.positions:
        position += 1
      seen = spec.devices.setdefault(bar_id, set())
      seen.add(device.id)
      several = len(seen) > 1
      desc = spec.desc + f" ({device})" if several else spec.desc
      bar = spec.tqdm(total=spec.total, position=position, desc=desc,
                      **spec.kwargs)
      bar._hcb_position = position
      if several:  # name the other devices' open bars of this id too
        for (s, b, d), other in self.bars.items():
          if s is spec and b == bar_id and d != device.id:
            other.set_description_str(
                spec.desc + f" ({_device_name(d)})", refresh=False)
      self.positions.add(position)
      self.bars[key] = bar
    return bar

  def close(self, spec: _Spec, bar_id: int, device: Any) -> None:
    with self.lock:
      bar = self.bars.pop((spec, bar_id, device.id), None)
      if bar is not None:
        self.positions.discard(bar._hcb_position)
    if bar is not None:
      bar.close()


_registry = _Registry()


def _device_name(device_id: int) -> str:
  for d in jax.devices():
    if d.id == device_id:
      return str(d)
  return f"device {device_id}"


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
  # bar id -> the devices that have drawn its bar (under the registry's
  # lock): with several, each bar names its device.
  devices: dict[int, set[int]] = dataclasses.field(default_factory=dict)

  def update(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any, *,
             device: Any) -> None:
    """The tap of ``(steps done, bar id)``: creates the bar if needed and
    moves it on (tqdm decides whether to redraw); a loop of known length
    closes its bar when the count reaches it."""
    if not transforms:  # the common case, kept short: this runs every step
      self._move(int(arg[0]), int(arg[1]), device)
      return
    for count, bar_id in _elements(arg, transforms):
      self._move(count, bar_id, device)

  def _move(self, count: int, bar_id: int, device: Any) -> None:
    bar = _registry.open(self, bar_id, device)
    if count > bar.n:
      if self.close_at_total and count >= (self.total or 0):
        bar.n = count
        _registry.close(self, bar_id, device)
      else:
        bar.update(count - bar.n)

  def close(self, arg: tuple[np.ndarray, np.ndarray], transforms: Any, *,
            device: Any) -> None:
    """The tap after the loop's last step: the bar shows the final count
    and is closed."""
    for count, bar_id in _elements(arg, transforms):
      bar = _registry.open(self, bar_id, device)
      if count != bar.n:
        bar.n = count
      _registry.close(self, bar_id, device)

  # -- the device side ---------------------------------------------------------

  def __post_init__(self) -> None:
    # One callable each for the life of the loop: a tap site's function.
    self.update_tap = self.update
    self.close_tap = self.close

  def tap_update(self, count: Any, bar_id: Any) -> None:
    tap(self.update_tap,
        (jnp.asarray(count, jnp.int32), jnp.asarray(bar_id, jnp.int32)),
        tap_with_device=True, deliver=True)

  def tap_close(self, count: Any, bar_id: Any) -> None:
    tap(self.close_tap,
        (jnp.asarray(count, jnp.int32), jnp.asarray(bar_id, jnp.int32)),
        tap_with_device=True, deliver=True)

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


def _spec(n: int | None, print_rate: int | None, tqdm_type: str,
          kwargs: dict[str, Any]) -> _Spec:
  """The settings of a decorated loop, checked as jax-tqdm checks them."""
  tqdm_class = _tqdm_class(tqdm_type)
  kwargs = dict(kwargs)
  if n is None:
    desc = kwargs.pop("desc", "Running")
  else:
    desc = kwargs.pop("desc", f"Running for {n:,} iterations")
  desc = kwargs.pop("message", desc)
  position = int(kwargs.pop("position", 0))
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
  spec = _spec(n, print_rate, tqdm_type, kwargs)

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
  spec = _spec(n, print_rate, tqdm_type, kwargs)

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
  spec = _spec(total, None, tqdm_type, {"desc": "Running", **kwargs})
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
