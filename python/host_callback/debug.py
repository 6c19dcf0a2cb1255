"""``jax.debug``'s ``callback``, ``print`` and ``log`` on host_callback's taps.

Migrating is one line: ``from host_callback import debug`` and
``debug.print(...)`` where the program had ``jax.debug.print(...)``.

Each is one tap (_tap.py) of the array arguments, whose result is
dropped, delivered in the computation (``Delivery.NOW``): the thread that
runs the computation copies the arguments into a record and runs the
function itself, before it goes on, as JAX runs its own debug callbacks.
So the computation's results are ready once it has run, a function that
runs JAX computations with callbacks of their own works (theirs run in
the threads that run them), and an exception fails the computation.  No
other thread is woken: on a busy machine a hand-off to another thread
would cost as much as JAX's whole callback.  The tap function
(``_DebugTap``) gives the tapped values the semantics of ``jax.debug``,
from the ``transforms`` the tap receives:

- under ``vmap`` the tap gets the batched values once, and calls the
  function once per batch element, in the order JAX's batching rule calls
  it (for nested ``vmap``s, the innermost map's index varies slowest);
  unbatched arguments are the same in every call;
- under ``jvp``/``grad`` the tap sees primal values only (_tap.py), as
  ``jax.debug`` does; a tap that differentiation transposes (one on
  tangents, in a ``custom_jvp`` rule) calls nothing, as JAX's transpose
  rule of debug callbacks does nothing;
- outside any trace (not within ``jit``, ``scan``, ...: a constant
  ``jax.Array`` closed over in a jitted function is printed by every
  execution, not once at trace time) the function is called at once,
  synchronously, as JAX's eager debug callbacks are, in JAX's context for
  them (default device the first CPU device, no mesh from JAX 0.8 on,
  the caller's before), once the
  callbacks issued before it on its device have run (an eager ``vmap`` taps
  the batched values, then calls a function of unbatched ones eagerly: its
  text comes after theirs, as in JAX); it gets ``jax.Array``s on the CPU
  device, typed PRNG keys as keys, as in JAX (so does the function of an
  eager ``vmap``: ``_DebugTap.eager_variant``).

Typed PRNG keys tap as their key data: traced, the function gets (and
``print`` prints) the key data, as JAX's do.  An exception in the function
is logged as JAX logs it (``"jax.debug.callback failed"`` on
``jax._src.debugging``) and fails the computation, as JAX's does (eagerly
it propagates).

Arguments that are not arrays (strings, ``None``, other objects) are static,
as in JAX: they are kept with the tap site and passed back unchanged.

A ``debug.print`` or ``debug.log`` whose fields are plain replacement
fields over arrays (``{}``, ``{0}``, ``{name}``) is formatted in C, without
the GIL, by id_print's C target (``_c_layout``; docs/printing.md), which
hands a log's text to ``_Print.log_text``; the rest is formatted in
Python, with the same text.

The module's public names are exactly ``jax.debug``'s (``_DebugModule``):
JAX's own ``breakpoint``, sharding helpers and effects where ours would add
nothing.

Where JAX and host_callback differ (docs/api.md):

- traced, the function receives numpy arrays (JAX: ``jax.Array``s copied
  onto its CPU device); ``debug.print`` formats what JAX's does, character for
  character: numpy arrays where their text is ``jax.Array``'s (``str`` and
  format specs of arrays), ``jax.Array``s where it is not (``!r``,
  attribute or index access in a field, containers, whose ``str`` is their
  elements' ``repr``);
- every callback runs in program order on its device, ``ordered`` or not,
  also under ``pmap``/``shard_map`` (JAX refuses ordered effects on more
  than one device);
- ``partitioned=True``, as in JAX, matters under ``jit`` over sharded
  operands only: every device calls the function on its own shard (JAX's
  partitioned callback hands each device's shard to the runtime, in that
  device's order); with ``False`` it gets the whole value, once.  Under
  ``vmap`` a partitioned callback is tapped per batch element, as JAX
  batches it, so that each device gets its shard of each element.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import string
import sys
import time
import types
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from host_callback import _barrier
from host_callback import _hcb
from host_callback import _jax
from host_callback import _leaves
from host_callback import _print as _id_print
from host_callback import _sites
from host_callback import _tap
from host_callback._types import CallbackFlavor

# jax.debug's names, exactly (the module's type hides the rest: see the
# end of the module).
__all__ = ["callback", "print", "log", "DebugEffect", "OrderedDebugEffect",
           "visualize_array_sharding", "inspect_array_sharding",
           "visualize_sharding", "breakpoint"]

# jax.debug.log's logger: handlers and filters set up for JAX's records get
# the drop-in's too.  JAX logs a failed debug callback there too, with
# _FAILED as the message.
_LOG = logging.getLogger("jax._src.debugging")
_FAILED = "jax.debug.callback failed"
# An empty LogRecord (debug.log's records are copies of one made at trace
# time: _Print.log_text), and logging's start in seconds (Python 3.13 keeps
# it in ns), from which a LogRecord's relativeCreated counts.
_new_record = functools.partial(logging.LogRecord.__new__, logging.LogRecord)
_LOG_START: float = getattr(logging, "_startTime", time.time())
if isinstance(_LOG_START, int):
  _LOG_START /= 1e9

# How the debug.print sites registered so far print: "c" (formatted in C,
# the GIL taken only to write) or "python" (the tap formats in Python).
# Tests read it to tell which path a format takes.
_print_paths: collections.Counter[str] = collections.Counter()

# Frames in these directories are not the user's (the source of a log
# record is the user's call of debug.log).
_INTERNAL_DIRS = (os.path.dirname(os.path.abspath(__file__)),
                  os.path.dirname(os.path.abspath(jax.__file__)))


def _is_array_like(x: Any) -> bool:
  """Whether JAX would make ``x`` an operand (``shaped_abstractify``
  succeeds): arrays, numpy and Python scalars, objects with
  ``__jax_array__``; anything else is a static argument."""
  return isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray, np.generic,
                        bool, int, float, complex)) or hasattr(
                            x, "__jax_array__")


def _split(args: tuple[Any, ...], kwargs: dict[str, Any]
           ) -> tuple[Any, list[Any], tuple[tuple[int, Any], ...]]:
  """The treedef of ``(args, kwargs)``, its array leaves, and its static
  leaves by position (JAX's ``_split_callback_args``)."""
  flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  dynamic, static = [], []
  for i, leaf in enumerate(flat):
    if _is_array_like(leaf):
      dynamic.append(leaf)
    else:
      static.append((i, leaf))
  return in_tree, dynamic, tuple(static)


def _merge(in_tree: Any, dynamic: Sequence[Any],
           static: tuple[tuple[int, Any], ...]) -> tuple[Any, Any]:
  """``(args, kwargs)`` from the dynamic leaves and the static ones."""
  flat: list[Any] = list(dynamic)
  for i, leaf in static:
    flat.insert(i, leaf)
  result: tuple[Any, Any] = in_tree.unflatten(flat)
  return result


def _index(x: np.ndarray, dim: int | None, i: int) -> np.ndarray:
  return x if dim is None else np.take(x, i, axis=dim)


def _elements(leaves: list[np.ndarray], batch_dims: list[tuple[Any, ...]]
              ) -> list[list[np.ndarray]]:
  """The unbatched leaves of each call, in JAX's order.  ``batch_dims``:
  one tuple per ``vmap``, innermost first.  JAX's batching rule of the
  innermost vmap loops over its axis, and each of its calls is batched by
  the next vmap out, which loops over its own: the outermost map's index
  varies fastest."""
  if not batch_dims:
    return [leaves]
  dims = batch_dims[-1]
  sizes = [x.shape[d] for x, d in zip(leaves, dims) if d is not None]
  if not sizes:
    return _elements(leaves, batch_dims[:-1])
  per_outer = [_elements([_index(x, d, j) for x, d in zip(leaves, dims)],
                         batch_dims[:-1]) for j in range(sizes[0])]
  if not per_outer:
    return []
  return [per_outer[j][m] for m in range(len(per_outer[0]))
          for j in range(len(per_outer))]


class _DebugTap:
  """The tap function of a ``debug.callback``/``print``/``log`` site: calls
  ``func(*args, **kwargs)`` (a ``_Print`` with the device) once per element of the tapped
  value (see the module's docstring).  Equal for the same function,
  argument structure and static arguments, so that re-tracing reuses the
  compiled tap."""

  __slots__ = ("func", "in_tree", "static", "with_device", "layout",
               "partitioned", "key_impls", "as_jax", "_key", "_positional",
               "__weakref__")

  # An exception in the function is logged as JAX logs its debug
  # callbacks', and fails the computation, as JAX's does.
  jax_error_log = _sites.DEBUG_CALLBACK_ERRORS

  def __init__(self, func: Callable[..., Any], in_tree: Any,
               static: tuple[tuple[int, Any], ...], with_device: bool,
               layout: _CLayout | None = None, partitioned: bool = False,
               key_impls: tuple[Any, ...] = (), as_jax: bool = False):
    self.func = func
    self.in_tree = in_tree
    self.static = static
    self.with_device = with_device
    # A debug.print formatted in C: the tap gets the leaves in field order.
    self.layout = layout
    # Under jit over sharded operands, every device taps its own shard (the
    # tap's lowering reads it: _tap.py).
    self.partitioned = partitioned
    # The PRNG implementation of each array leaf that is a typed key (None
    # for the others; () when none is): they tap as their key data.
    self.key_impls = key_impls
    # Bound eagerly (an eager vmap): the function gets jax.Arrays, typed
    # keys as keys, as JAX's eager debug callbacks do (eager_variant).
    self.as_jax = as_jax
    # A function (not a print) whose arguments are the leaves themselves,
    # in order (func(x, y), the usual call): no tree to rebuild per call.
    self._positional = (
        not isinstance(func, _Print) and not static
        and in_tree == jax.tree_util.tree_structure(
            (tuple(range(in_tree.num_leaves)), {})))
    self._key = (_sites.hash_key(func), in_tree,
                 tuple((i, _sites.hash_key(v)) for i, v in static),
                 with_device, layout, partitioned, key_impls, as_jax)

  def eager_variant(self) -> _DebugTap:
    """This tap as an eager bind makes it (the impl rule of the ``hcb_tap``
    primitive asks for it; see ``_sites.eager_site``)."""
    return _DebugTap(self.func, self.in_tree, self.static, self.with_device,
                     self.layout, self.partitioned, self.key_impls,
                     as_jax=True)

  def __call__(self, flat: list[np.ndarray], transforms: Sequence[Any],
               device: Any = None) -> None:
    if self.layout is not None:  # back from field order to argument order
      flat = [flat[k] for k in self.layout.first]
    if not transforms:  # the usual call: once, on the leaves
      self.call(flat, device)
      return
    batch_dims = []
    for name, params in transforms:
      if name == "transpose":  # a tap on cotangents: JAX calls nothing
        return
      if name == "batch":
        dims = tuple(params["batch_dims"])  # one per tapped leaf
        if self.layout is not None:
          dims = tuple(dims[k] for k in self.layout.first)
        batch_dims.append(dims)
    for leaves in _elements(list(flat), batch_dims):
      self.call(leaves, device)

  def call(self, leaves: Sequence[Any], device: Any) -> None:
    """Calls the function once, on unbatched leaves."""
    if self.as_jax:
      leaves = _as_jax_arrays(leaves, self.key_impls)
    if self._positional:
      self.func(*leaves)
      return
    args, kwargs = _merge(self.in_tree, leaves, self.static)
    if isinstance(self.func, _Print):
      self.func.emit(args, kwargs, device)
    else:
      self.func(*args, **kwargs)

  @property
  def api(self) -> str:
    """The API the user called, which its errors name."""
    if isinstance(self.func, _Print):
      return "debug.print" if self.func.log is None else "debug.log"
    return "debug.callback"

  def register_tap_site(self, site: _sites.TapSite) -> int:
    """Registers ``site`` (whose func is this tap): a debug.print with a C
    layout, untransformed, is id_print's C target (``_hcb.register_print``)
    when libhcb prints its dtypes; anything else a Python tap."""
    target = None
    log = self.func.log_text if (isinstance(self.func, _Print) and
                                 self.func.log is not None) else None
    if (self.layout is not None and not site.transforms and
        (log is not None or not site.with_device)):
      # debug.log's text goes to log_text with the device, not to a stream.
      target = _hcb.register_print(
          site=site, name="debug.print" if log is None else "debug.log",
          nodes=self.layout.nodes, kv_before="", kv_after="",
          with_device=False, devices={}, options=self.layout.options,
          stream=None, dtypes=self.layout.dtypes, log=log)
    if isinstance(self.func, _Print):
      _print_paths["python" if target is None else "c"] += 1
    if target is None:
      return _hcb.register_tap(site=site, name=_sites.callable_name(self))
    return target

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _DebugTap) and other._key == self._key

  def __repr__(self) -> str:
    return _sites.callable_name(self.func)


def _as_jax_arrays(leaves: Sequence[Any], key_impls: tuple[Any, ...]
                   ) -> list[Any]:
  """``leaves`` as JAX's eager debug callbacks pass them: ``jax.Array``s on
  the first CPU device, the key data of typed keys (``key_impls``) wrapped
  as keys again."""
  out = jax.device_put(list(leaves), jax.local_devices(backend="cpu")[0])
  for i, impl in enumerate(key_impls):
    if impl is not None:
      out[i] = jax.random.wrap_key_data(out[i], impl=impl)
  return out


def _call_eagerly(tap: _DebugTap, leaves: list[Any], device: Any) -> None:
  """Calls the function of an eager debug callback, as JAX does: with the
  arguments as ``jax.Array``s on the first CPU device (typed PRNG keys
  included), a failure logged on JAX's logger, then raised."""
  try:
    tap.call(jax.device_put(leaves, jax.local_devices(backend="cpu")[0]),
             device)
  except BaseException:
    _LOG.exception(_FAILED)
    raise


def _issue(func: Callable[..., Any], args: tuple[Any, ...],
           kwargs: dict[str, Any], *, with_device: bool = False,
           partitioned: bool = False) -> None:
  """Calls ``func(*args, **kwargs)`` on the host: eagerly now, or from a
  tap of the array leaves (``with_device``: a ``_Print`` also gets the
  device; ``partitioned``: under jit over sharded operands, once per
  device on its shard)."""
  in_tree, dynamic, static = _split(args, kwargs)
  leaves = [_leaves.as_array(x) for x in dynamic]
  layout = (_c_layout(func, args, kwargs, leaves, static)
            if isinstance(func, _Print) else None)
  key_impls = tuple(jax.random.key_impl(x) if _leaves.is_key(x) else None
                    for x in leaves)
  tap = _DebugTap(func, in_tree, static, with_device, layout, partitioned,
                  key_impls if any(key_impls) else ())
  if not _leaves.staging(leaves):
    # Eagerly, as JAX: at once, in this thread, after the callbacks
    # issued before (program order).
    device = next((d for x in leaves for d in x.devices()),
                  jax.local_devices()[0])
    _barrier.wait_before_eager_callback(device)
    with _barrier.eager_callback_context():
      _call_eagerly(tap, leaves, device if with_device else None)
    return
  if layout is not None:
    leaves = [leaves[j] for j in layout.order]
  # In the computation: its results are ready once it has run, as JAX's.
  _tap.tap(tap, leaves, tap_with_device=with_device,
           callback_flavor=CallbackFlavor.DEBUG, deliver=_tap.Delivery.NOW,
           api=tap.api)


def callback(callback: Callable[..., Any] | None = None, *args: Any,
             ordered: bool = False, partitioned: bool = False,
             **kwargs: Any) -> Any:
  """``jax.debug.callback`` on host_callback's taps.

  Calls ``callback(*args, **kwargs)`` on the host, inside the computation
  (in the thread that runs it, before it goes on), with the
  array leaves as numpy arrays (see the module's docstring for ``vmap``,
  ``grad`` and eager calls).  As in JAX, ``callback(ordered=...,
  partitioned=...)`` without a function returns the function that takes
  it (the two-call form).

  Args:
    callback: a Python function returning None.
    *args: its positional arguments (pytrees; non-array leaves are static).
    ordered: JAX's ordered effect.  Every callback of host_callback runs in
      program order on its device, ordered or not.
    partitioned: under ``jit`` over sharded operands, call the function
      once per device on its own shard (else once, on the whole value).
    **kwargs: its keyword arguments.

  Returns:
    None; in the two-call form, the function that takes the callback.

  Raises:
    TypeError: ``callback`` is not callable; arguments in the first call of
      the two-call form.
  """
  del ordered  # see the docstring

  def _callback(func: Callable[..., Any], *c_args: Any,
                **c_kwargs: Any) -> None:
    if not callable(func):
      raise TypeError("first argument to jax.debug.callback must be "
                      f"callable, but got an object of type {type(func)}")
    _issue(func, c_args, c_kwargs, partitioned=partitioned)

  return _two_call_form("debug_callback", _callback, callback, args, kwargs)


def _two_call_form(name: str, call: Callable[..., None], first: Any,
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
  """JAX's two forms of the debug APIs: ``call(first, *args, **kwargs)``
  now when ``first`` (the function or format) is given, else ``call``
  itself, for a second call that gives it."""
  if first is not None:
    call(first, *args, **kwargs)
    return None
  if args or kwargs:
    raise TypeError(f"{name} received unexpected arguments in the "
                    f"two-call form: {args=} {kwargs=}")
  return call


class _FormatChecker(string.Formatter):
  """JAX's check of a ``debug.print`` format: every argument is used."""

  def format_field(self, value: Any, format_spec: str) -> str:
    del value, format_spec
    return ""

  def check_unused_args(self, used_args: Any, args: Sequence[Any],
                        kwargs: Any) -> None:
    unused_args = [arg for i, arg in enumerate(args) if i not in used_args]
    unused_kwargs = [k for k in kwargs if k not in used_args]
    if unused_args:
      raise ValueError(
          f"Unused positional arguments to `jax.debug.print`: {unused_args}")
    if unused_kwargs:
      raise ValueError(
          f"Unused keyword arguments to `jax.debug.print`: {unused_kwargs}. "
          "You may be passing an f-string (i.e, `f\"{x}\"`) into "
          "`jax.debug.print` and instead should pass in a regular string.")


def _needs_jax_arrays(fmt: str, has_placeholders: bool,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
  """Whether the text of ``fmt`` formatted with numpy arrays may differ
  from its text with ``jax.Array``s: a field with a conversion other than
  ``!s``, with attribute or index access, or an argument that is not one
  array (a container's ``str`` is its elements' ``repr``)."""
  if any(not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(a))
         for a in (*args, *kwargs.values())):
    return True
  if not has_placeholders:
    return False
  for _, field, spec, conversion in string.Formatter().parse(fmt):
    if field is None:
      continue
    if conversion not in (None, "s") or "." in field or "[" in field:
      return True
    if spec and "{" in spec:  # a nested field
      return True
  return False


class _Print:
  """Formats and writes one ``debug.print``/``debug.log`` (JAX's
  ``_format_print_callback``): ``fmt.format(*args, **kwargs)`` with numpy's
  print options of the trace, or, without placeholders, ``fmt`` and the
  ``str`` of each argument joined by spaces; then one line to
  ``sys.stdout``, or one record to JAX's debug logger with the device in
  its ``extra`` (``record.device``)."""

  __slots__ = ("fmt", "np_printoptions", "has_placeholders", "as_jax", "log",
               "record", "_key", "__weakref__")

  def __init__(self, fmt: str, has_placeholders: bool, as_jax: bool,
               log: tuple[str, int] | None):
    self.fmt = fmt
    self.np_printoptions = np.get_printoptions()
    self.has_placeholders = has_placeholders
    self.as_jax = as_jax
    self.log = log  # (pathname, lineno) of the user's debug.log
    # debug.log: the record each print copies, made now, as JAX makes its
    # own when it traces (the file and line of the call, this thread).
    self.record = (None if log is None else _LOG.makeRecord(
        _LOG.name, logging.INFO, log[0], log[1], "", (), None))
    self._key = (fmt, has_placeholders, as_jax, log,
                 tuple((k, _sites.hash_key(v))
                       for k, v in sorted(self.np_printoptions.items())))

  def __call__(self, *args: Any, **kwargs: Any) -> None:
    self.emit(args, kwargs, None)

  def emit(self, args: tuple[Any, ...], kwargs: dict[str, Any],
           device: Any) -> None:
    """Formats ``args`` and ``kwargs`` and writes the text (or logs it,
    with ``device``)."""
    if self.as_jax:
      args, kwargs = _on_cpu((args, kwargs))
    if self.has_placeholders:
      if np.get_printoptions() == self.np_printoptions:
        # Mostly so (numpy's defaults): entering np.printoptions costs
        # several times the rest of a print.
        msg = self.fmt.format(*args, **kwargs)
      else:
        with np.printoptions(**self.np_printoptions):
          msg = self.fmt.format(*args, **kwargs)
    else:
      msg = " ".join((self.fmt, *(str(a) for a in args)))
    if self.log is None:
      sys.stdout.write(msg + "\n")
      return
    self.log_text(msg, device)

  def log_text(self, msg: str, device: Any) -> None:
    """debug.log's record of ``msg`` from ``device``, handed to the
    logger's handlers (``Logger.handle``, as JAX does): a copy of the
    record made at trace time, with the message, the device and the time
    now.  (Also called by the C print target, which formats ``msg``.)"""
    record = _new_record()
    record.__dict__.update(self.record.__dict__)
    now = time.time()
    record.created = now
    record.msecs = int((now - int(now)) * 1000) + 0.0
    record.relativeCreated = (now - _LOG_START) * 1000
    record.msg = msg
    record.device = device
    _LOG.handle(record)

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _Print) and other._key == self._key

  def __repr__(self) -> str:
    return "debug.log" if self.log else "debug.print"


def _on_cpu(tree: Any) -> Any:
  """``tree`` with its numpy arrays as ``jax.Array``s on the first CPU
  device, as JAX's debug callbacks receive them."""
  cpu = jax.local_devices(backend="cpu")[0]
  return jax.tree_util.tree_map(
      lambda x: jax.device_put(x, cpu) if isinstance(x, np.ndarray) else x,
      tree)


class _CLayout(NamedTuple):
  """How a debug.print is formatted in C (id_print's C target,
  ``_hcb.register_print``): a CONCAT of its literal text and the text of
  each replacement field (PRINT_FIELD: ``format(x, "")``), or of the format
  and the ``str`` of each argument (PRINT_STR) without placeholders.  The tap receives the
  array leaves in field order (``order``: for each field, its index among
  the call's array leaves; an argument used twice is tapped twice);
  ``first`` takes them back to argument order for the Python path."""

  nodes: tuple[_id_print.PrintNode, ...]
  order: tuple[int, ...]
  first: tuple[int, ...]
  options: _id_print.PrintOptions
  dtypes: tuple[int, ...]


def _c_layout(printer: _Print, args: tuple[Any, ...], kwargs: dict[str, Any],
              leaves: Sequence[Any], static: tuple[tuple[int, Any], ...]
              ) -> _CLayout | None:
  """The C layout of a debug.print or debug.log, or None where it formats
  in Python: a field with a conversion, a format spec, attribute or index
  access, or an argument that is not an array (static, or a container);
  numpy print options the C printer does not implement (``legacy``,
  ``formatter``); a format that fails (an unknown field, auto and manual
  numbering mixed: the Python path raises as JAX does).  Which dtypes C
  prints is libhcb's to say, at registration."""
  options = _id_print.c_options(printer.np_printoptions, None)
  if printer.as_jax or options is None:
    return None
  static_at = {i for i, _ in static}
  # Each argument is one leaf (as_jax is False): its flat index, then its
  # index among the array leaves.
  flat_of: dict[int | str, int] = {i: i for i in range(len(args))}
  flat_of.update((k, len(args) + i) for i, k in enumerate(sorted(kwargs)))
  dynamic_of = {f: n for n, f in enumerate(
      f for f in range(len(args) + len(kwargs)) if f not in static_at)}
  text = _id_print.PrintNode(_hcb.PRINT_TEXT, 0, None, "")
  # format(x, "") in a field; str(x) after a format without placeholders
  # (they differ for 0-d arrays: the Python scalar's str, numpy's).
  field_node = _id_print.PrintNode(_hcb.PRINT_FIELD, 0, None, None)
  str_node = _id_print.PrintNode(_hcb.PRINT_STR, 0, None, None)
  children: list[_id_print.PrintNode] = []
  fields: list[Any] = []
  if printer.has_placeholders:
    auto: int | None = 0
    try:
      parsed = list(string.Formatter().parse(printer.fmt))
    except ValueError:
      return None
    for literal, field, spec, conversion in parsed:
      if literal:
        children.append(text._replace(text=literal))
      if field is None:
        continue
      if conversion is not None or spec or "." in field or "[" in field:
        return None
      if field == "":
        if auto is None:
          return None
        field, auto = str(auto), auto + 1
      elif field.isdigit():
        if auto:
          return None
        auto = None
      key: Any = int(field) if field.isdigit() else field
      if (key not in kwargs) if isinstance(key, str) else key >= len(args):
        return None
      fields.append(key)
      children.append(field_node)
  else:  # fmt, then the str of each positional argument, space separated
    children.append(text._replace(text=printer.fmt))
    for i in range(len(args)):
      children.extend((text._replace(text=" "), str_node))
      fields.append(i)
  order = []
  for key in fields:
    flat = flat_of[key]
    if flat not in dynamic_of:
      return None
    order.append(dynamic_of[flat])
  if sorted(set(order)) != list(range(len(leaves))):
    return None  # an array argument no field uses
  return _CLayout(
      nodes=(_id_print.PrintNode(_hcb.PRINT_CONCAT, len(children), None,
                                 None), *children),
      order=tuple(order), first=tuple(order.index(j)
                                      for j in range(len(leaves))),
      options=options,
      dtypes=tuple(_id_print.dtype_code(leaves[j]) for j in order))


def _user_frame() -> tuple[str, int]:
  """The file and line of the user's call (the first frame outside
  host_callback and JAX)."""
  frame = sys._getframe(1)
  while frame is not None:
    path = os.path.abspath(frame.f_code.co_filename)
    if not path.startswith(_INTERNAL_DIRS):
      return frame.f_code.co_filename, frame.f_lineno
    frame = frame.f_back  # type: ignore[assignment]
  return "(unknown file)", 0


def _print(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any], *,
           skip_format_check: bool, use_logging: bool,
           partitioned: bool) -> None:
  if not skip_format_check:
    _FormatChecker().format(fmt, *args, **kwargs)
  # Any field (JAX looks at the first only, and fails on a format that
  # starts with an escaped brace, "{{x}} {y}").
  has_placeholders = any(field is not None
                         for _, field, _, _ in string.Formatter().parse(fmt))
  printer = _Print(fmt, has_placeholders,
                   _needs_jax_arrays(fmt, has_placeholders, args, kwargs),
                   _user_frame() if use_logging else None)
  _issue(printer, args, kwargs, with_device=use_logging,
         partitioned=partitioned)


def print(fmt: str | None = None, *args: Any, ordered: bool = False,
          partitioned: bool = False, skip_format_check: bool = False,
          **kwargs: Any) -> Any:
  """``jax.debug.print`` on host_callback's taps.

  Prints ``fmt.format(*args, **kwargs)`` (``str.format``, not an f-string:
  formatting is delayed), with numpy's print options of the trace, as one
  line to ``sys.stdout``, inside the computation, before it goes on (one
  line per batch element under ``vmap``).  The text is JAX's, character for character.  A format without
  placeholders prints ``fmt`` then each argument's ``str``, space
  separated.  As in JAX, ``print(ordered=...)`` without a format returns
  the function that takes it.

  Args:
    fmt: the format string, e.g. ``"x={x:.3f}"``.
    *args: positional arguments of ``fmt.format``.
    ordered: JAX's ordered effect (every print is in program order here).
    partitioned: under ``jit`` over sharded operands, print each device's
      shard (else the whole value, once).
    skip_format_check: do not check that every argument is used.
    **kwargs: keyword arguments of ``fmt.format``.

  Returns:
    None; in the two-call form, the function that takes the format.

  Raises:
    ValueError: an argument is unused by ``fmt`` (JAX's check).
  """
  return _print_api(fmt, args, kwargs, ordered=ordered,
                    partitioned=partitioned,
                    skip_format_check=skip_format_check, use_logging=False)


def log(fmt: str | None = None, *args: Any, ordered: bool = False,
        partitioned: bool = False, skip_format_check: bool = False,
        **kwargs: Any) -> Any:
  """``jax.debug.log`` on host_callback's taps: :func:`print`'s text as one
  ``logging`` record per print (level ``INFO``, logger
  ``jax._src.debugging`` as JAX's, the file and line of the call), handed
  to the logger's handlers (``Logger.handle``, as JAX does), with the
  device that printed in the record's ``extra``: ``record.device``.

  Args and Returns: as :func:`print`.
  """
  return _print_api(fmt, args, kwargs, ordered=ordered,
                    partitioned=partitioned,
                    skip_format_check=skip_format_check, use_logging=True)


def _print_api(fmt: str | None, args: tuple[Any, ...],
               kwargs: dict[str, Any], *, ordered: bool, partitioned: bool,
               skip_format_check: bool, use_logging: bool) -> Any:
  del ordered  # see the module's docstring

  def _debug_print(fmt: str, *c_args: Any, **c_kwargs: Any) -> None:
    _print(fmt, c_args, c_kwargs, skip_format_check=skip_format_check,
           use_logging=use_logging, partitioned=partitioned)

  return _two_call_form("debug_print", _debug_print, fmt, args, kwargs)



# ---- the forms of JAX 0.6 to 0.9 ---------------------------------------------

# JAX 0.9's jax.debug.callback and print take the function and the format
# as required arguments, with no two-call form (JAX 0.10 added it): the
# drop-ins take the signature of the JAX they run on.
if not _jax.debug_two_call_form:
  _callback_two_forms, _print_two_forms, _log_two_forms = callback, print, log

  def callback(callback: Callable[..., Any], *args: Any,  # type: ignore[misc]  # noqa: F811
               ordered: bool = False, partitioned: bool = False,
               **kwargs: Any) -> None:
    return _callback_two_forms(callback, *args, ordered=ordered,
                               partitioned=partitioned, **kwargs)

  def print(fmt: str, *args: Any, ordered: bool = False,  # type: ignore[misc]  # noqa: F811  # pylint: disable=redefined-builtin
            partitioned: bool = False, skip_format_check: bool = False,
            **kwargs: Any) -> None:
    return _print_two_forms(fmt, *args, ordered=ordered,
                            partitioned=partitioned,
                            skip_format_check=skip_format_check, **kwargs)

  def log(fmt: str, *args: Any, ordered: bool = False,  # type: ignore[misc]  # noqa: F811
          partitioned: bool = False, skip_format_check: bool = False,
          **kwargs: Any) -> None:
    return _log_two_forms(fmt, *args, ordered=ordered,
                          partitioned=partitioned,
                          skip_format_check=skip_format_check, **kwargs)

  for _new, _old in ((callback, _callback_two_forms), (print, _print_two_forms),
                     (log, _log_two_forms)):
    _new.__doc__ = _old.__doc__

# JAX 0.6's jax.debug.print has no skip_format_check (0.7 added it): there
# every format is checked, and a keyword argument of that name is one of
# the format's, as in JAX.
if not _jax.debug_print_skip_format_check:
  _print_skipping_check = print

  def print(fmt: str, *args: Any, ordered: bool = False,  # type: ignore[misc]  # noqa: F811  # pylint: disable=redefined-builtin
            partitioned: bool = False, **kwargs: Any) -> None:
    return _print_api(fmt, args, kwargs, ordered=ordered,
                      partitioned=partitioned, skip_format_check=False,
                      use_logging=False)

  print.__doc__ = (_print_skipping_check.__doc__ or "").replace(
      "    skip_format_check: do not check that every argument is used.\n",
      "")


# ---- the namespace: jax.debug's ----------------------------------------------

# JAX's own where ours adds nothing: sharding inspection and the debugger
# run no host callback of ours (breakpoint's is JAX's debug callback).
DebugEffect = _jax.DebugEffect
OrderedDebugEffect = _jax.OrderedDebugEffect
from jax.debug import breakpoint  # noqa: E402  # pylint: disable=redefined-builtin
from jax.debug import inspect_array_sharding  # noqa: E402
from jax.debug import visualize_array_sharding  # noqa: E402
from jax.debug import visualize_sharding  # noqa: E402

# jax.debug's public names are those of the JAX this runs on (log from JAX
# 0.8, OrderedDebugEffect from 0.9).
__all__ = [name for name in __all__ if hasattr(jax.debug, name)]
_PUBLIC = frozenset(__all__)


class _DebugModule(types.ModuleType):
  """The type of this module: from outside, its public names are exactly
  ``jax.debug``'s (``__all__``); the modules and helpers its code uses
  (``jax``, ``np``, ``os``, ``sys``, ...) are not attributes a user sees,
  in ``dir()`` or otherwise.  The module's own functions find them as
  globals, which this does not touch."""

  def __getattribute__(self, name: str) -> Any:
    if name[:1] != "_" and name not in _PUBLIC:
      raise AttributeError(
          f"module 'host_callback.debug' has no attribute {name!r} "
          "(its public names are jax.debug's)")
    return super().__getattribute__(name)

  def __dir__(self) -> list[str]:
    return sorted(n for n in super().__dir__()
                  if n[:1] == "_" or n in _PUBLIC)


sys.modules[__name__].__class__ = _DebugModule
