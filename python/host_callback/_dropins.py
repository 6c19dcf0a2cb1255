"""``pure_callback`` and ``io_callback``: JAX's APIs on ``call``'s runtime.

Each is one ``hcb_call`` (_call.py): the device waits while the function
runs on XLA's thread, and its results are checked in C and copied into
XLA's buffers.  What the drop-ins add is JAX's calling convention: the
function takes ``*args, **kwargs`` (``_FlatCallback`` rebuilds them from the
flat leaves), its result counts by leaves as in JAX (each leaf converted
with ``numpy.asarray``), and differentiation, ``vmap`` and bad declarations
raise JAX's errors (``api`` of the ``hcb_call`` primitive names the
drop-in).

Where JAX and host_callback differ (docs/api.md):

- inside a trace (``jit``, ``scan``, ...) the function receives numpy
  arrays, not ``jax.Array``s on the CPU device: the same values, shapes and
  dtypes, at no cost per call (JAX copies every argument onto its CPU
  device first).  Called eagerly (also under an eager ``vmap``) it receives
  ``jax.Array``s on the first CPU device, as JAX's does, and runs with that
  device as JAX's default (``_FlatCallback.eager_variant``);
- ``ordered`` io_callbacks work under ``pmap``/``shard_map`` (every
  callback runs in program order on its device), where JAX refuses ordered
  effects on more than one device.

Failures are JAX's (``CallSite.jax_error_log``, python/_hcb/call_result.c): a
function that raises logs JAX's one record (``"jax.pure_callback failed"``
or ``"jax.io_callback failed"`` on logger ``jax._src.callback``) and fails
the computation with an error that names the drop-in and the function; a
wrong result is described in JAX's words first (``Incorrect output shape
for return value #0: ...``) and logs nothing; neither is raised again by
``barrier_wait``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from host_callback import _call
from host_callback import _hcb
from host_callback import _jax
from host_callback import _sites
from host_callback._types import CallbackFlavor

_VMAP_METHODS = ["sequential", "sequential_unrolled", "expand_dims",
                 "broadcast_all", "legacy_vectorized", None]


class _FlatCallback:
  """The host function of a drop-in call: called with the list of flat
  leaves, it calls ``callback(*args, **kwargs)`` and returns the leaves of
  its result as numpy arrays (JAX's ``tree_leaves`` then ``np.asarray``).
  Equal for the same function and argument structure, so that re-tracing
  reuses the compiled call, as JAX's own ``_FlatCallback`` does."""

  __slots__ = ("callback", "in_tree", "positional", "one_result", "as_jax",
               "__weakref__")

  def __init__(self, callback: Callable[..., Any], in_tree: Any,
               one_result: bool, as_jax: bool = False):
    self.callback = callback
    self.in_tree = in_tree
    # Called eagerly: the arguments as jax.Arrays on the CPU device, as JAX
    # passes them (eager_variant).
    self.as_jax = as_jax
    # Only positional array arguments: the leaves are the arguments (no
    # unflattening per call).
    n = in_tree.num_leaves
    self.positional = in_tree == jax.tree_util.tree_structure(
        ((0,) * n, {}))
    # One declared result: the call declares the leaf itself, not a list.
    self.one_result = one_result

  def eager_variant(self) -> _FlatCallback:
    """This callback as an eager call makes it (the impl and the eager
    ``vmap`` rules of the ``hcb_call`` primitive ask for it): the function
    gets ``jax.Array``s on the first CPU device and runs with that device
    as JAX's default, as JAX's eager callbacks do."""
    return _EagerFlatCallback(self.callback, self.in_tree, self.one_result,
                              as_jax=True)

  def __call__(self, flat: list[Any]) -> Any:
    if self.positional:
      result = self.callback(*flat)
    else:
      args, kwargs = self.in_tree.unflatten(flat)
      result = self.callback(*args, **kwargs)
    if self.one_result and isinstance(result, np.ndarray):
      return result
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(result)]
    # A wrong count stays a list: the call's check reports it.
    return leaves[0] if self.one_result and len(leaves) == 1 else leaves

  def __hash__(self) -> int:
    return hash((_sites.hash_key(self.callback), self.in_tree,
                 self.one_result, self.as_jax))

  def __eq__(self, other: object) -> bool:
    # == rather than is: a bound method is a new object each time.
    return (isinstance(other, _FlatCallback) and
            _sites.hash_key(other.callback) == _sites.hash_key(self.callback) and
            other.in_tree == self.in_tree and
            other.one_result == self.one_result and
            other.as_jax == self.as_jax)

  def __repr__(self) -> str:
    return _sites.callable_name(self.callback)


class _EagerFlatCallback(_FlatCallback):
  """A :class:`_FlatCallback` called eagerly: its function gets
  ``jax.Array``s on the first CPU device and runs with that device as
  JAX's default (a class of its own: the call under ``jit`` pays nothing
  for it)."""

  __slots__ = ()

  def __call__(self, flat: list[Any]) -> Any:
    cpu = jax.local_devices(backend="cpu")[0]
    with jax.default_device(cpu):
      return super().__call__(jax.device_put(flat, cpu))


def _result_shapes(result_shape_dtypes: Any) -> tuple[list[Any], Any]:
  """The flat declared results (``jax.ShapeDtypeStruct``s) and their
  treedef, with JAX's checks."""
  leaves, treedef = jax.tree_util.tree_flatten(result_shape_dtypes)
  flat = []
  for leaf in leaves:
    dtype = np.dtype(leaf.dtype)
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
      raise ValueError("result_shape_dtypes cannot specify 64-bit types when "
                       "`jax_enable_x64` is disabled")
    flat.append(jax.ShapeDtypeStruct(tuple(leaf.shape), dtype))
  return flat, treedef


def _device_index(sharding: Any, what: str) -> int:
  """The index (among ``jax.devices()``) of the device that ``sharding``
  names for the callback (None: the first)."""
  if sharding is None:
    return 0
  if isinstance(sharding, jax.sharding.NamedSharding):
    if sharding.mesh.size != 1:
      raise NotImplementedError(
          f"{what} only supports SingleDeviceSharding, but got "
          f"{type(sharding)}")
  elif not isinstance(sharding, jax.sharding.SingleDeviceSharding):
    raise NotImplementedError(
        f"{what} only supports SingleDeviceSharding, but got "
        f"{type(sharding)}")
  device = next(iter(sharding.device_set))
  devices = jax.devices()
  if device not in devices:
    raise ValueError(f"Sharding provided to {what} specifies a device "
                     f"{device} that is not in the device assignment "
                     f"({devices})")
  return devices.index(device)


def _bind(api: str, callback: Callable[..., Any], result_shape_dtypes: Any,
          args: tuple[Any, ...], kwargs: dict[str, Any], *, sharding: Any,
          flavor: CallbackFlavor, vmap_method: str | None) -> Any:
  if not callable(callback):
    raise TypeError(f"callback must be callable, got {callback!r}")
  flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  flat_results, out_tree = _result_shapes(result_shape_dtypes)
  one = len(flat_results) == 1
  outs = _call.bind(_sites.hashable_callable(_FlatCallback(callback,
                                                            in_tree, one)),
                    flat_args, result_shape=flat_results[0] if one else
                    flat_results,
                    call_with_device=False,
                    device_index=_device_index(sharding, api),
                    callback_flavor=flavor, vmap_method=vmap_method, api=api)
  return jax.tree_util.tree_unflatten(out_tree, [outs] if one else outs)


def pure_callback(callback: Callable[..., Any], result_shape_dtypes: Any,
                  *args: Any, sharding: jax.sharding.Sharding | None = None,
                  vmap_method: str | None = None, **kwargs: Any) -> Any:
  """``jax.pure_callback`` on host_callback's runtime.

  Calls ``callback(*args, **kwargs)`` on the host, with the array leaves of
  ``args`` and ``kwargs`` as numpy arrays (eagerly: ``jax.Array``s on the
  CPU device, as JAX), and returns its result as JAX arrays with the
  structure of ``result_shape_dtypes``.  The call is pure: the compiler may
  remove it when its result is unused, or merge identical calls.  A
  failure is reported as JAX reports it (see the module's docstring).

  Args:
    callback: the host function; it returns a pytree whose leaves (each
      converted with ``numpy.asarray``, 64-bit values narrowed without x64)
      match the leaves of ``result_shape_dtypes`` in shape and dtype.
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``
      (e.g. ``jax.ShapeDtypeStruct``).
    *args: arguments of ``callback`` (pytrees of arrays).
    sharding: a ``SingleDeviceSharding`` (or a ``NamedSharding`` over one
      device): the device that calls, in a computation over several.
    vmap_method: ``"sequential"``, ``"sequential_unrolled"``,
      ``"expand_dims"``, ``"broadcast_all"`` or ``"legacy_vectorized"``, as
      for ``jax.pure_callback``; ``None``: ``vmap`` raises
      ``NotImplementedError``.
    **kwargs: keyword arguments of ``callback``.

  Returns:
    The result, as JAX arrays with the structure of ``result_shape_dtypes``.

  Raises:
    ValueError: an unknown ``vmap_method``; a 64-bit declared result without
      x64; differentiation (JAX's message: wrap in ``jax.custom_jvp``).
    NotImplementedError: ``vmap`` without ``vmap_method``; a sharding over
      several devices.
    jax.errors.JaxRuntimeError: ``callback`` raised (logged as JAX logs it)
      or returned a wrong result (described in JAX's words first).
  """
  if vmap_method not in _VMAP_METHODS:
    raise ValueError(
        f"vmap_method must be on of the allowed methods {_VMAP_METHODS}, "
        f"but got: {vmap_method}")
  return _bind("pure_callback", callback, result_shape_dtypes, args, kwargs,
               sharding=sharding, flavor=CallbackFlavor.PURE,
               vmap_method=vmap_method)


_hcb.set_byte_order_refused(_jax.refuses_byte_swapped_results)

# JAX 0.9's pure_callback still names the argument JAX 0.6 removed,
# ``vectorized``, to refuse it: the drop-in takes the signature of the JAX it
# runs on.
_JAX_VECTORIZED = _jax.pure_callback_vectorized
if _JAX_VECTORIZED is not None:
  _pure_callback = pure_callback
  _NOT_VECTORIZED = _JAX_VECTORIZED.default

  def pure_callback(callback: Callable[..., Any],  # noqa: F811
                    result_shape_dtypes: Any, *args: Any,
                    sharding: jax.sharding.Sharding | None = None,
                    vectorized: Any = _NOT_VECTORIZED,
                    vmap_method: str | None = None, **kwargs: Any) -> Any:
    if vectorized is not _NOT_VECTORIZED:
      raise ValueError(
          "The 'vectorized' argument of jax.pure_callback was removed in "
          "JAX v0.6.0. Use 'vmap_method' instead.")
    return _pure_callback(callback, result_shape_dtypes, *args,
                          sharding=sharding, vmap_method=vmap_method,
                          **kwargs)

  pure_callback.__doc__ = _pure_callback.__doc__


def io_callback(callback: Callable[..., Any], result_shape_dtypes: Any,
                *args: Any, sharding: jax.sharding.Sharding | None = None,
                ordered: bool = False, **kwargs: Any) -> Any:
  """``jax.experimental.io_callback`` on host_callback's runtime.

  Calls the impure ``callback(*args, **kwargs)`` on the host (numpy
  arrays in, eagerly ``jax.Array``s, checked result out, as
  :func:`pure_callback`); it always runs,
  even when its result is unused.  Under ``vmap`` it runs once per batch
  element, in order (``ValueError`` for an ``ordered`` one, as in JAX).
  Every io_callback runs in program order on its device, ``ordered`` or
  not.

  Args:
    callback: the host function.
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``.
    *args: arguments of ``callback`` (pytrees of arrays).
    sharding: a ``SingleDeviceSharding``: the device that calls.
    ordered: JAX's ordered effect: refuses ``vmap``.
    **kwargs: keyword arguments of ``callback``.

  Returns:
    The result, as JAX arrays with the structure of ``result_shape_dtypes``.

  Raises:
    ValueError: differentiation; ``vmap`` of an ordered callback; a 64-bit
      declared result without x64.
    NotImplementedError: in a ``while_loop`` whose predicate ``vmap``
      batches (it would run for elements already finished), as in JAX.
    jax.errors.JaxRuntimeError: ``callback`` raised or returned a wrong
      result.
  """
  return _bind("io_callback", callback, result_shape_dtypes, args, kwargs,
               sharding=sharding, flavor=CallbackFlavor.IO_CALLBACK,
               vmap_method=None if ordered else "sequential")
