"""``call`` and the ``hcb_call`` primitive.

A call lowers to one XLA custom call, ``hcb_call`` (src/ffi/handlers.h),
whose operands are the flattened argument and whose results are the flattened
``result_shape``.  XLA runs it on the thread of the computation, which
waits: the C target (python/_hcb/call.c) takes the GIL, calls the function
with numpy copies of the operands, checks the result (call_result.c) against
``result_shape`` and copies it into XLA's result buffers.  Nothing else runs
in Python per call.  A call of a :func:`native_call` function lowers to
``hcb_buffer_call`` instead: its C function works in place on the device's
buffers (on CUDA, no staging through host memory).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad
from jax.interpreters import batching
from jax.interpreters import mlir

from host_callback import _args
from host_callback import _batching
from host_callback import _config
from host_callback import _containers
from host_callback import _devices
from host_callback import _hcb
from host_callback import _leaves
from host_callback import _lowering
from host_callback import _native
from host_callback import _runtime
from host_callback import _sites
from host_callback._native import NativeCallback
from host_callback._sites import CallSite
from host_callback._types import CallbackFlavor

call_p = Primitive("hcb_call")
call_p.multiple_results = True



def _name(site: CallSite) -> str:
  return _sites.callable_name(site.func)


def _call_impl(*args: Any, site: CallSite, **params: Any) -> Any:
  return _runtime.apply_eagerly(call_p, *args,
                                site=_sites.eager_site(site), **params)


def _call_abstract_eval(*avals: Any, site: CallSite, device_index: int,
                        flavor: CallbackFlavor, vmap_method: str | None,
                        api: str) -> list[ShapedArray]:
  del avals, device_index, flavor, vmap_method, api
  _containers.keep_containers()
  return [ShapedArray(shape, dtype)
          for shape, dtype in site.result_avals]


def _call_lowering(ctx: mlir.LoweringRuleContext, *args: Any,
                   site: CallSite, device_index: int, flavor: CallbackFlavor,
                   vmap_method: str | None, api: str) -> Any:
  del vmap_method, api
  target = _lowering.call_target(isinstance(site.func, NativeCallback))
  return _lowering.lower(
      ctx, target, args, what="call",
      has_side_effect=flavor is not CallbackFlavor.PURE,
      device_index=device_index,
      callback_id=np.uint64(_runtime.lowered_site_id(ctx, site)))


# The errors of JAX's own callbacks, raised by the drop-ins (_dropins.py)
# where JAX raises them: their users catch and search for these.
_JAX_JVP_ERRORS = {
    "pure_callback": "Pure callbacks do not support JVP. Please use "
                     "`jax.custom_jvp` to use callbacks while taking "
                     "gradients.",
    "io_callback": "IO callbacks do not support JVP."}
_JAX_TRANSPOSE_ERRORS = {
    "pure_callback": "Pure callbacks do not support transpose. Please use "
                     "`jax.custom_vjp` to use callbacks while taking "
                     "gradients.",
    "io_callback": "IO callbacks do not support transpose."}


def _call_jvp(primals: Sequence[Any], tangents: Sequence[Any], *,
              site: CallSite, api: str, **params: Any) -> Any:
  del primals, tangents, params
  if api in _JAX_JVP_ERRORS:
    raise ValueError(_JAX_JVP_ERRORS[api])
  raise NotImplementedError(
      f"host_callback.call of {_name(site)!r} cannot be differentiated: the "
      "JVP rule is implemented only for id_tap, not for call. Wrap the "
      "function that uses call in jax.custom_jvp or jax.custom_vjp and give "
      "its derivative there.")


def _call_transpose(cts: Any, *args: Any, site: CallSite, api: str,
                    **params: Any) -> Any:
  del cts, args, params
  if api in _JAX_TRANSPOSE_ERRORS:
    raise ValueError(_JAX_TRANSPOSE_ERRORS[api])
  raise NotImplementedError(
      f"host_callback.call of {_name(site)!r} cannot be transposed: "
      "differentiation rules are implemented only for id_tap, not for call.")


def _call_batching(args: Sequence[Any], dims: Sequence[Any], *,
                   site: CallSite, **params: Any
                   ) -> tuple[list[Any], list[int]]:
  if params["api"] == "io_callback" and params["vmap_method"] is None:
    raise ValueError("Cannot `vmap` ordered IO callback.")
  if params["api"] == "pure_callback" and params["vmap_method"] is None:
    raise NotImplementedError(
        "vmap is only supported for the pure_callback primitive when "
        "vmap_method is one of 'sequential', 'sequential_unrolled', "
        "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. Got "
        "vmap_method=None.")

  if not _leaves.any_tracer(args):  # an eager vmap: calls are eager
    site = _sites.eager_site(site)

  def bind_batched(batched_args: list[Any], size: int) -> Sequence[Any]:
    batched = site._replace(result_avals=tuple(
        ((size, *shape), dtype) for shape, dtype in site.result_avals))
    return call_p.bind(*batched_args, site=batched, **params)

  return _batching.batch_by_method(
      args, dims, vmap_method=params["vmap_method"],
      what=f"host_callback.call of {_name(site)!r}",
      nout=len(site.result_avals),
      bind_one=lambda full: call_p.bind(*full, site=site, **params),
      bind_batched=bind_batched,
      legacy_message="batching rules are implemented only for id_tap, not "
                     "for call. ")


call_p.def_impl(_call_impl)
call_p.def_abstract_eval(_call_abstract_eval)
_lowering.register_lowering(call_p, _call_lowering)
ad.primitive_jvps[call_p] = _call_jvp
ad.primitive_transposes[call_p] = _call_transpose
batching.primitive_batchers[call_p] = _call_batching
_containers.keep_when_unused(call_p)
_containers.refuse_in_batched_while(call_p)


# ---- result_shape -------------------------------------------------------------

def _leaf_aval(leaf: Any) -> tuple[tuple[int, ...], np.dtype]:
  if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    shape, dtype = tuple(int(d) for d in leaf.shape), leaf.dtype
  elif isinstance(leaf, (bool, int, float, complex, np.bool_, np.number)):
    shape, dtype = (), np.result_type(leaf)
  else:
    raise TypeError(f"the leaf {leaf!r} (a {type(leaf).__name__}) is "
                    "neither a numeric scalar nor has 'shape' and 'dtype'")
  dtype = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
  ShapedArray(shape, dtype)  # rejects what JAX cannot compute on
  return shape, dtype


def _declared_results(result_shape: Any
                      ) -> tuple[Any, tuple[tuple[tuple[int, ...], np.dtype],
                                            ...]]:
  """The treedef of ``result_shape`` and the canonical (shape, dtype) of
  each leaf; ``ValueError`` for anything else."""
  leaves, treedef = jax.tree_util.tree_flatten(result_shape)
  try:
    return treedef, tuple(_leaf_aval(leaf) for leaf in leaves)
  except Exception as e:
    # The removed module's words first: its users search for them.
    raise ValueError(
        "result_shape should be a pytree of values with structure matching "
        "the expected result of the callback function. The values must be "
        "either numeric scalars, or must have 'shape' and 'dtype' "
        f"attributes. Got {result_shape}. host_callback.call: {e}"
    ) from None


def _result_shape_hint(result_shape: Any, api: str) -> str:
  """What ``result_shape`` probably meant, when it looks like a shape (a
  tuple or list of Python ints, which declares that many int scalars):
  added to the message of a result that does not match it."""
  if (isinstance(result_shape, (tuple, list)) and result_shape
      and all(type(d) is int for d in result_shape)):
    shape = tuple(result_shape)
    by = "result_shape" if api == "call" else "result_shape_dtypes"
    hint = (f" ({by}={result_shape!r} declares {len(shape)} Python int "
            f"scalar{'s' if len(shape) > 1 else ''}, not a shape: for an "
            f"array of shape {shape} declare jax.ShapeDtypeStruct({shape}, "
            "dtype), or pass an array of that shape and dtype)")
    if len(hint) < 250:  # the C target keeps 255 characters
      return hint
    return (f" ({by} is a sequence of Python ints, each declaring a scalar, "
            "not a shape: for an array declare jax.ShapeDtypeStruct(shape, "
            "dtype))")
  return ""


# ---- inline mode ----------------------------------------------------------

def _inline_result(site: CallSite, result: Any) -> Any:
  """Checks a result in inline mode with the C checker of compiled calls
  (the same rules and messages), and returns it as JAX arrays."""
  outs = _hcb.check_results(site=site, name=_name(site), result=result)
  return site.result_treedef.unflatten([jax.numpy.asarray(a) for a in outs])


# ---- the API ----------------------------------------------------------------

@_args.keywords("call")
def call(callback_func: Callable[..., Any] | NativeCallback, arg: Any, *,
         result_shape: Any = None, call_with_device: bool = False,
         device_index: int = 0,
         callback_flavor: CallbackFlavor = CallbackFlavor.IO_CALLBACK,
         vmap_method: str | None = None) -> Any:
  """Calls ``callback_func(arg)`` on the host and returns its result.

  The device computation waits for the result.  ``callback_func`` receives
  ``arg`` as a pytree of numpy arrays (copies it may keep) and must return a
  pytree matching ``result_shape``: same structure, and for each leaf the
  declared shape and dtype (a 64-bit result may fill a declared 32-bit type
  when JAX runs without x64, as JAX's own canonicalisation does; a Python
  scalar may fill a declared scalar).  Anything else, or an exception in
  ``callback_func``, makes the computation fail with an error that names the
  function, what was declared and what came back; the error is also
  re-raised by :func:`barrier_wait`.

  Args:
    callback_func: the host function, ``callback_func(arg[, device=])``, or
      a C function from :func:`native_call` (it receives the flattened
      leaves and always the device, and writes XLA's result buffers).
    arg: a pytree of arrays (or values convertible to arrays).
    result_shape: the declared result: a numeric scalar (its shape and
      dtype), anything with ``.shape`` and ``.dtype`` (e.g.
      ``jax.ShapeDtypeStruct``, arrays), a pytree of those, or ``None``/
      ``()`` for no result.
    call_with_device: pass ``device=`` the calling ``jax.Device``.
    device_index: which device calls in a multi-device computation.
    callback_flavor: ``IO_CALLBACK`` (always runs, even with an unused
      result), ``PURE`` (may be removed or merged like
      ``jax.pure_callback``) or ``DEBUG`` (no result allowed).
    vmap_method: how ``vmap`` calls the function, as for
      ``jax.pure_callback``: ``"sequential"`` (once per batch element, in a
      loop), ``"sequential_unrolled"``, ``"expand_dims"`` (once, unbatched
      arguments get a leading axis of size 1) or ``"broadcast_all"`` (once,
      every argument broadcast to the batch size); the result must then have
      the batch as its leading axis.  ``None`` (default): ``vmap`` raises
      ``NotImplementedError``.

  Returns:
    The result of ``callback_func``, as JAX arrays with the structure of
    ``result_shape``.

  Raises:
    ValueError: ``result_shape`` is not a pytree of scalars or shaped
      values, or ``vmap_method`` is unknown.
    NotImplementedError: a ``DEBUG`` flavor call with a ``result_shape``;
      differentiation (wrap the caller in ``jax.custom_jvp``/``custom_vjp``);
      ``vmap`` without ``vmap_method``; an ``IO_CALLBACK`` call in a
      ``while_loop`` whose predicate ``vmap`` batches.
    jax.errors.JaxRuntimeError: ``callback_func`` raised or returned a
      wrong result (eagerly, every time; under ``jit`` JAX raises it, except
      that its C++ dispatch of a jitted function that has run before raises
      a computation that failed while it waited as ``ValueError`` with the
      same message, as it does for ``jax.pure_callback``).
  """
  return bind(callback_func, arg, result_shape=result_shape,
              call_with_device=call_with_device, device_index=device_index,
              callback_flavor=callback_flavor, vmap_method=vmap_method,
              api="call")


def bind(callback_func: Callable[..., Any] | NativeCallback, arg: Any, *,
         result_shape: Any, call_with_device: bool, device_index: int,
         callback_flavor: CallbackFlavor, vmap_method: str | None,
         api: str) -> Any:
  """:func:`call` for the API named ``api``: ``"call"``, or the drop-in
  ``"pure_callback"`` or ``"io_callback"`` (_dropins.py), which raise JAX's
  errors under differentiation and ``vmap`` (``io_callback`` with no
  ``vmap_method`` is an ordered one) and accept ``pure_callback``'s
  ``"legacy_vectorized"``."""
  native = _native.is_native(callback_func, NativeCallback,
                             "host_callback.call")
  if not native:
    _args.check_callable("host_callback.call", "callback_func", callback_func)
  _args.check_flavor("host_callback.call", callback_flavor)
  call_with_device = _args.check_bool("host_callback.call", "call_with_device",
                                      call_with_device)
  if vmap_method != "legacy_vectorized" or api != "pure_callback":
    _batching.check_vmap_method(vmap_method)
  device_index = _devices.checked_device_index(device_index,
                                               "host_callback.call")
  if callback_flavor is CallbackFlavor.DEBUG and result_shape is not None:
    raise NotImplementedError(
        "host_callback.call: the DEBUG flavor can be used only when "
        "result_shape is None (a debug callback returns nothing to the "
        "device); use IO_CALLBACK or PURE for a call with a result.")

  leaves, arg_treedef = _leaves.flatten(arg, "host_callback.call")
  sent = _leaves.key_data_of_keys(leaves)
  result_treedef, result_avals = _declared_results(result_shape)
  narrow = jax.dtypes.canonicalize_dtype(np.float64) != np.float64
  site = CallSite(callback_func if isinstance(callback_func, NativeCallback)
                  else _sites.hashable_callable(callback_func), arg_treedef,
                  result_treedef, result_avals, bool(call_with_device),
                  bool(narrow), "host_callback.call" if api == "call" else api,
                  _result_shape_hint(result_shape, api))

  if (_config.INLINE and not isinstance(callback_func, NativeCallback) and
      not _leaves.staging(sent)):
    value = arg_treedef.unflatten([np.asarray(x) for x in sent])
    if call_with_device:
      result = callback_func(value,
                             device=_devices.inline_device(
                                 device_index, "host_callback.call"))
    else:
      result = callback_func(value)
    return _inline_result(site, result)

  outs = call_p.bind(*sent, site=site, device_index=device_index,
                     flavor=callback_flavor, vmap_method=vmap_method,
                     api=api)
  return result_treedef.unflatten(outs)
