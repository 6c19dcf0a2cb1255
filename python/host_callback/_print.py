"""What ``id_print`` prints: its tap function, a ``Printer``, formatted in C.

``id_print`` itself (in _tap.py) is ``id_tap`` with a ``Printer`` as its tap.

Each tap writes up to two chunks, each with ``output_stream.write(s +
"\\n")`` (or to ``sys.stdout``, as ``print`` would):

* the ``k: v`` pairs of the keyword arguments, sorted by key, with
  ``transforms`` (when the tap is under a transformation) and ``device``
  (with ``tap_with_device=True``) among them; left out when there are none;
* the value: tuples ``( a b )``, lists ``[ a b ]``, dicts ``{ k=a l=b }``
  with sorted keys, on one line when they fit in 80 columns, else one
  element per line indented by two per level (JAX's pretty printer), and
  each array exactly as ``numpy.array2string(a, threshold=threshold)``
  prints it.

The arrays are formatted by libhcb's printer (src/print/) on the device's
consumer thread, without the GIL; the GIL is taken only to write.  What
stays fixed for a tap site is prepared once, when it is traced: the layout
of the value (from its treedef), the ``k: v`` line (the keyword values are
``str()``-ed then), numpy's print options (``numpy.get_printoptions()``) and
the names of the devices.

Which path a site takes is decided when it is registered (at lowering),
never per record: the C target when the C printer prints the value (libhcb
answers for the dtypes of its leaves, ``hcb_print_supports``; register_print
registers nothing when it does not), else a plain Python tap, on the
consumer thread, whose Printer formats in Python.  That is the path of
values the C printer cannot lay out by itself (custom pytree nodes), of
dtypes it does not print (the float8 types: numpy's own text), and of numpy
print options it does not implement (``legacy`` or ``formatter``).  There,
too, the C printer formats the arrays whose dtypes it prints and lays out
the containers; numpy formats every other array.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from host_callback import _devices
from host_callback import _hcb
from host_callback import _leaves
from host_callback import _sites
from host_callback._types import CallbackFlavor

if TYPE_CHECKING:
  from _typeshed import SupportsWrite

# hcb_print_kind, hcb_floatmode and the precision bound (include/hcb/hcb.h)
_ARRAY, _TEXT, _TUPLE, _LIST, _DICT = (
    _hcb.PRINT_ARRAY, _hcb.PRINT_TEXT, _hcb.PRINT_TUPLE, _hcb.PRINT_LIST,
    _hcb.PRINT_DICT)
_FLOATMODES = {"maxprec": _hcb.FLOATMODE_MAXPREC,
               "fixed": _hcb.FLOATMODE_FIXED,
               "unique": _hcb.FLOATMODE_UNIQUE,
               "maxprec_equal": _hcb.FLOATMODE_MAXPREC_EQUAL}
_MAX_PRECISION = _hcb.PRINT_MAX_PRECISION

# numpy's dtype names and their XLA element type codes, as libhcb names
# them: which of them the C printer prints is libhcb's to say.
_DTYPE_CODES = {name: code for code in range(_hcb.NDTYPES)
                if (name := _hcb.dtype_name(code)) is not None}


def dtype_code(leaf: Any) -> int:
  """The XLA element type code of a leaf of id_print's value (-1: none): of
  its key data for a typed PRNG key, which taps as its key data."""
  if _leaves.is_key(leaf):
    leaf = jax.eval_shape(jax.random.key_data, leaf)
  dtype = getattr(leaf, "dtype", None)
  if dtype is None:
    dtype = np.result_type(leaf)
  return _DTYPE_CODES.get(np.dtype(dtype).name, -1)



class PrintNode(NamedTuple):
  """One node of a printed value, in preorder, as the C printer takes it
  (``hcb_print_node``; _hcb reads the fields by name)."""

  kind: int  # _hcb.PRINT_ARRAY, PRINT_TEXT, PRINT_TUPLE, PRINT_LIST, ...
  children: int  # how many a container has
  key: str | None  # the dict key this node is the value of
  text: str | None  # PRINT_TEXT's text


class PrintOptions(NamedTuple):
  """numpy's print options as the C printer takes them
  (``hcb_print_options``; _hcb reads the fields by name)."""

  threshold: int
  edgeitems: int
  linewidth: int
  precision: int
  floatmode: int  # _hcb.FLOATMODE_*
  sign: str
  suppress: bool
  nanstr: str
  infstr: str


def c_options(numpy_options: Mapping[str, Any],
              threshold: int | None) -> PrintOptions | None:
  """numpy's print options as the C printer takes them, or None when the
  C printer does not implement them."""
  o = numpy_options
  if (o.get("legacy") not in (False, None) or o.get("formatter") is not None
      or o["floatmode"] not in _FLOATMODES
      or not 0 <= o["precision"] <= _MAX_PRECISION
      or len(o["nanstr"].encode()) > 15 or len(o["infstr"].encode()) > 15
      or "\x00" in o["nanstr"] + o["infstr"]):  # C keeps them NUL-ended
    return None
  return PrintOptions(
      threshold=int(o["threshold"] if threshold is None else threshold),
      edgeitems=int(o["edgeitems"]), linewidth=int(o["linewidth"]),
      precision=int(o["precision"]), floatmode=_FLOATMODES[o["floatmode"]],
      sign=str(o["sign"]), suppress=bool(o["suppress"]),
      nanstr=o["nanstr"], infstr=o["infstr"])


# numpy's defaults: the layout options when every array is numpy's text.
_DEFAULT_OPTIONS = PrintOptions(
    threshold=1000, edgeitems=3, linewidth=75, precision=8,
    floatmode=_hcb.FLOATMODE_MAXPREC, sign="-", suppress=False, nanstr="nan",
    infstr="inf")


class Printer:
  """The tap function of an ``id_print`` site: what to print besides the
  value, where, and with which numpy print options (taken when the site
  was traced).  Equal printers share a compiled tap.

  Called like any tap function (``printer(arg, transforms, device=None)``)
  it formats in Python (``format``); registered with a tap site
  (``register_tap_site``) it becomes a C target that formats without the
  GIL, when the C printer prints the value.
  """

  __slots__ = ("kwargs", "threshold", "output_stream", "numpy_options",
               "options", "dtypes", "path", "broken", "_key", "__weakref__")

  def __init__(self, kwargs: dict[str, Any],
               output_stream: SupportsWrite[str] | logging.Logger | None,
               threshold: int | None, dtypes: tuple[int, ...] = ()):
    self.kwargs = tuple(sorted((str(k), str(v)) for k, v in kwargs.items()))
    self.threshold = None if threshold is None else int(threshold)
    self.output_stream = output_stream
    self.numpy_options = np.get_printoptions()
    self.options = c_options(self.numpy_options, self.threshold)
    # The element type codes of the value's leaves, for register_print.
    self.dtypes = dtypes
    # How the last site registered with this printer prints: "c" (the C
    # target) or "python" (a Python tap); None before any.
    self.path: str | None = None
    # A write failed (a closed pipe, a closed file): report that once and
    # write nothing more, rather than one error per tap.
    self.broken = False
    self._key = (self.kwargs, self.threshold, id(output_stream), dtypes,
                 tuple((k, _sites.hash_key(v))
                       for k, v in sorted(self.numpy_options.items())))

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return (isinstance(other, Printer) and other._key == self._key and
            other.output_stream is self.output_stream)

  def __repr__(self) -> str:
    return "id_print"

  # ---- the Python path -------------------------------------------------------

  def __call__(self, arg: Any, transforms: Sequence[Any],
               device: Any = None) -> None:
    if self.broken:
      return
    texts = []
    kv = self.kv_line(transforms, device)
    if kv:
      texts.append(kv + "\n")
    texts.append(self.format(arg) + "\n")
    if isinstance(self.output_stream, logging.Logger):
      self.output_stream.log(logging.INFO, "".join(texts)[:-1],
                             extra={"device": device})
      return
    try:
      _hcb.print_write(self.output_stream, tuple(texts))
    except Exception as e:
      self.broken = True
      raise RuntimeError(
          "id_print's write failed: its stream is broken, this id_print "
          f"writes nothing more ({type(e).__name__}: {e})") from e

  def kv_pairs(self, transforms: Sequence[Any], device: Any) -> list[str]:
    """The ``k: v`` pairs of one tap, sorted by key."""
    pairs = dict(self.kwargs)
    if transforms:
      pairs["transforms"] = _transforms_text(transforms)
    if device is not None:
      pairs["device"] = str(device)
    return [f"{k}: {v}" for k, v in sorted(pairs.items())]

  def kv_line(self, transforms: Sequence[Any], device: Any) -> str:
    """The ``k: v`` line of one tap (empty when there is nothing)."""
    return " ".join(self.kv_pairs(transforms, device))

  def format(self, value: Any) -> str:
    """The text of one value (a pytree of numpy arrays): the C printer's
    for the arrays whose dtypes it prints and the containers, numpy's for
    the other arrays (C tells which: ``_hcb.format_value`` asks
    ``numpy_text`` for them)."""
    nodes: list[PrintNode] = []
    arrays: list[np.ndarray] = []
    self._walk(value, None, nodes, arrays)
    return _hcb.format_value(nodes, arrays, self.options or _DEFAULT_OPTIONS,
                             self.numpy_text)

  def numpy_text(self, array: np.ndarray) -> str:
    """numpy's text of one array, with the print options of this site."""
    with np.printoptions(**self.numpy_options):
      return np.array2string(array, threshold=self.threshold)

  def _walk(self, value: Any, key: str | None, nodes: list[PrintNode],
            arrays: list[np.ndarray]) -> None:
    """Appends the print nodes of ``value`` in preorder (with a stack, not
    recursion: any nesting that JAX flattens is printed)."""
    stack: list[tuple[Any, str | None]] = [(value, key)]
    while stack:
      value, key = stack.pop()
      if isinstance(value, (tuple, list)):
        nodes.append(PrintNode(_TUPLE if isinstance(value, tuple) else _LIST,
                               len(value), key, None))
        stack.extend((v, None) for v in reversed(value))
      elif isinstance(value, dict):
        items = sorted(value.items())
        nodes.append(PrintNode(_DICT, len(items), key, None))
        stack.extend((v, str(k)) for k, v in reversed(items))
      elif isinstance(value, np.ndarray):
        if self.options is not None:
          nodes.append(PrintNode(_ARRAY, 0, key, None))
          arrays.append(value)
        else:
          nodes.append(PrintNode(_TEXT, 0, key, self.numpy_text(value)))
      else:
        nodes.append(PrintNode(_TEXT, 0, key, str(value)))

  # ---- the C path ------------------------------------------------------------

  def register_tap_site(self, site: _sites.TapSite) -> int:
    """Registers ``site`` (whose func is this printer) with the runtime:
    as a C print target when its layout is fixed and the C printer prints
    its dtypes, else as a Python tap."""
    nodes: list[PrintNode] = []
    target = None
    if (self.options is not None and
        not isinstance(self.output_stream, logging.Logger) and
        _treedef_nodes(site.treedef, None, nodes)):
      target = self._register_print(site, nodes)
    self.path = "python" if target is None else "c"
    if target is None:
      return _hcb.register_tap(site=site, name="id_print")
    return target

  def _register_print(self, site: _sites.TapSite,
                      nodes: list[PrintNode]) -> int | None:
    """The id of the C target of ``site``, or None when the C printer does
    not print one of the value's dtypes."""
    # The line with an empty device name, split after "device: ": the C
    # target puts each record's device name in between.
    pairs = self.kv_pairs(site.transforms, "" if site.with_device else None)
    split = pairs.index("device: ") + 1 if site.with_device else len(pairs)
    before = " ".join(pairs[:split])
    after = "".join(" " + p for p in pairs[split:])
    devices = {_devices.device_key(d): str(d)
               for d in _devices.keyed_devices()}
    assert self.options is not None
    assert not isinstance(self.output_stream, logging.Logger)
    return _hcb.register_print(site=site, name="id_print", nodes=nodes,
                               kv_before=before, kv_after=after,
                               with_device=site.with_device, devices=devices,
                               options=self.options,
                               stream=self.output_stream, dtypes=self.dtypes,
                               log=None)


def _transforms_text(transforms: Sequence[Any]) -> str:
  return str([(name, params) if params else name
              for name, params in transforms])


def _treedef_nodes(treedef: Any, key: str | None, out: list[PrintNode]) -> bool:
  """Appends the print nodes of a treedef's value (in preorder, with a
  stack, not recursion); False when the layout depends on more than the
  treedef (custom pytree nodes)."""
  stack: list[tuple[Any, str | None]] = [(treedef, key)]
  while stack:
    treedef, key = stack.pop()
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
      out.append(PrintNode(_ARRAY, 0, key, None))
      continue
    node_type, aux = treedef.node_data()
    children = treedef.children()
    if node_type is type(None):
      out.append(PrintNode(_TEXT, 0, key, "None"))
      continue
    if node_type is tuple or (issubclass(node_type, tuple) and
                              hasattr(node_type, "_fields")):
      out.append(PrintNode(_TUPLE, len(children), key, None))
      keys: Sequence[str | None] = [None] * len(children)
    elif node_type is list:
      out.append(PrintNode(_LIST, len(children), key, None))
      keys = [None] * len(children)
    elif node_type is dict:  # JAX sorts the keys, as id_print does
      out.append(PrintNode(_DICT, len(children), key, None))
      keys = [str(k) for k in aux]
    else:
      return False
    stack.extend(reversed(list(zip(children, keys))))
  return True

