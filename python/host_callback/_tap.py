"""``id_tap``, ``id_print`` and the ``hcb_tap`` primitive.

``id_print`` is ``id_tap`` with a tap that prints, an ``_print.Printer``
(which formats the text); ``id_tap`` of a ``logging.Logger`` taps with one
too.

Transformations: under ``vmap`` the tap runs once on the batched values and
``transforms`` gains ``('batch', {'batch_dims': ...})``; under ``jvp`` it
taps the primal values only and passes tangents through; transposed (a tap
on tangents, in a custom JVP rule, under ``grad``) it taps the cotangents
and ``transforms`` gains ``('transpose', {})``.

A tap lowers to one XLA custom call, ``hcb_tap`` (src/ffi/handlers.h), whose
operands are the tapped arrays and an order token, and whose one result is
the token.  Its function runs on the device's consumer thread, after the
computation has moved on (``id_tap``, ``id_print``: the removed module's
asynchronous taps), or inside the computation, in the thread that runs it,
before it goes on (:class:`Delivery`: the drop-ins of JAX's callbacks, which
run there as JAX's do).  Either way the computation goes on with its own
arrays, not the tap's results: the computation goes on with its own arrays, so the compiler
fuses and computes as without the tap (the same bits; a result aliased to
each operand, as the removed module had, stopped fusion across the tap
and made compile time grow with the square of the leaves).  The token
orders it after the program's previous callback and before its next one
(_order.py).  A ``PURE`` tap, which XLA may remove, returns its operands
(aliased) and runs where they are used.  The custom call carries
``has_side_effect`` and the primitive has no JAX effect, so jitted
functions with taps keep JAX's C++ fast dispatch path.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np
from jax import lax
from jax.extend.core import JaxprEqn
from jax.extend.core import Primitive
from jax.extend.core import Var
from jax.interpreters import ad
from jax.interpreters import batching
from jax.interpreters import mlir

from host_callback import _args
from host_callback import _config
from host_callback import _containers
from host_callback import _devices
from host_callback import _jax
from host_callback import _leaves
from host_callback import _lowering
from host_callback import _native
from host_callback import _print
from host_callback import _runtime
from host_callback import _sites
from host_callback._native import NativeTap
from host_callback._types import CallbackFlavor

if TYPE_CHECKING:
  from _typeshed import SupportsWrite

tap_p = Primitive("hcb_tap")
tap_p.multiple_results = True


class Delivery(enum.IntEnum):
  """Where and when a tap's function runs: the ``deliver`` attribute of its
  custom call (src/ffi/handlers.h), a parameter of ``hcb_tap``."""

  #: Queued; the device's consumer thread runs it while the computation
  #: goes on (``id_tap``, ``id_print``; ``barrier_wait`` waits for it and
  #: raises its error).
  QUEUED = 0
  #: In the computation's own thread, before it goes on (the drop-ins of
  #: JAX's callbacks, as JAX runs them): the computation's results are
  #: ready only once it has run, and its failure fails the computation.
  NOW = 1
  #: The same, with its failure kept for ``barrier_wait`` and the
  #: computation going on (``id_tap`` with
  #: ``HOST_CALLBACK_TAPS_BEFORE_RESULTS``).
  NOW_KEEP_ERROR = 2


def _tap_impl(*args: Any, site: _sites.TapSite, **params: Any) -> Any:
  return _jax.apply_primitive(tap_p, *args, site=_sites.eager_site(site),
                              **params)


class DifferentiatedTapEffect(_jax.Effect):
  """Carried by taps bound by differentiation rules (see _tap_jvp)."""

  def __repr__(self) -> str:
    return "HostCallbackTap"


_differentiated = DifferentiatedTapEffect()
_jax.allow_effect_everywhere(DifferentiatedTapEffect)


def _tap_abstract_eval(*avals: Any, site: _sites.TapSite, ntapped: int,
                       device_index: int, flavor: CallbackFlavor,
                       differentiated: bool, deliver: Delivery) -> Any:
  del site, ntapped, device_index, deliver
  _containers.keep_containers()
  keep = differentiated and flavor is not CallbackFlavor.PURE
  return avals, {_differentiated} if keep else _jax.no_effects


def _tap_lowering(ctx: mlir.LoweringRuleContext, *args: Any,
                  site: _sites.TapSite, ntapped: int, device_index: int,
                  flavor: CallbackFlavor, differentiated: bool,
                  deliver: Delivery) -> Any:
  del differentiated
  callback_id = np.uint64(_runtime.lowered_site_id(ctx, site))
  # jax.debug's partitioned=True (debug.py): under jit over sharded
  # operands every device taps its own shard.
  partitioned = bool(getattr(site.func, "partitioned", False))
  if flavor is CallbackFlavor.PURE:
    # No side effect: XLA may remove it, and keeps it where its results
    # (its operands, aliased) are used.
    return _lowering.lower(
        ctx, "hcb_tap", args, what="id_tap", has_side_effect=False,
        device_index=device_index,
        operand_output_aliases={i: i for i in range(len(args))},
        partitioned=partitioned, callback_id=callback_id,
        ntapped=np.int64(ntapped))
  # The tapped arrays in, the order token alone out: the program goes on
  # with the arrays themselves, as without the tap (the same fusions, the
  # same numbers).  The token orders it among the callbacks (_order.py).
  # A tap delivered now carries the attribute deliver (a queued one none).
  delivery: dict[str, Any] = {} if deliver is Delivery.QUEUED else {
      "deliver": np.int64(deliver)}
  _lowering.lower(
      ctx.replace(avals_in=ctx.avals_in[:ntapped], avals_out=()), "hcb_tap",
      args[:ntapped], what="id_tap", has_side_effect=True,
      device_index=device_index, partitioned=partitioned,
      callback_id=callback_id, ntapped=np.int64(ntapped), **delivery)
  return list(args)


def _tap_batching(args: Any, dims: Any, *, site: _sites.TapSite,
                  ntapped: int, **params: Any) -> tuple[Any, Any]:
  if getattr(site.func, "partitioned", False):
    # jax.debug's partitioned callback (debug.py) is batched as JAX batches
    # it: one tap per batch element, of that element's slices, so that
    # under jit over sharded operands every device taps its shard of each
    # element, as JAX's does (the batch itself is sharded differently).
    # The taps' results are their operands: the batch goes on unchanged.
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    for i in range(size):
      tap_p.bind(*[x if d is None else lax.index_in_dim(x, i, d, False)
                   for x, d in zip(args, dims)],
                 site=site, ntapped=ntapped, **params)
    return args, dims
  batched = site._replace(transforms=site.transforms.add(
      "batch", {"batch_dims": tuple(dims[:ntapped])}))
  return tap_p.bind(*args, site=batched, ntapped=ntapped, **params), dims


def _tap_jvp(primals: Any, tangents: Any, *, differentiated: bool,
             **params: Any) -> tuple[Any, Any]:
  # Primal values only; the tangents pass through untouched.  The tap now
  # carries an effect: differentiation (linearize, partial evaluation of
  # scan, ...) drops effect-free equations whose results are unused, and
  # the effect is what keeps it.  Only differentiated programs pay for it
  # (no C++ fast dispatch for them).
  del differentiated
  return tap_p.bind(*primals, differentiated=True, **params), list(tangents)


def _tap_transpose(cts: Any, *args: Any, site: _sites.TapSite,
                   differentiated: bool, **params: Any) -> list[Any]:
  del differentiated
  cts = [ad.instantiate_zeros(ct) for ct in cts]
  transposed = site._replace(transforms=site.transforms.add("transpose", {}))
  outs = tap_p.bind(*cts, site=transposed, differentiated=True, **params)
  return [ct if ad.is_undefined_primal(x) else None
          for x, ct in zip(args, outs)]


def _tap_partial_eval_custom(saveable: Any, unks_in: Any, inst_in: Any,
                             eqn: JaxprEqn) -> Any:
  """Partial evaluation for remat: a tap on known values runs in the
  forward pass and, unless the policy saves its outputs, again when the
  backward pass rematerialises (the order of the removed
  jax.experimental.host_callback); a tap on unknown values runs where they
  are computed.  A ``DEBUG`` tap (host_callback.debug) that the policy
  saves runs again in the backward pass all the same when all its inputs
  are there (recomputed anyway), as jax.debug's callbacks do: as much
  information as the rematerialisation gives, at no extra cost."""
  residuals = [v for v, inst in zip(eqn.invars, inst_in)
               if isinstance(v, Var) and not inst]
  n = len(eqn.outvars)
  if any(unks_in):
    return None, eqn, [True] * n, [True] * n, residuals
  policy = _jax.ensure_enum(saveable(
      eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params))
  if isinstance(policy, _jax.SaveableType) and not (
      eqn.params["flavor"] is CallbackFlavor.DEBUG and all(inst_in)):
    return eqn, None, [False] * n, [False] * n, []
  return eqn, eqn, [False] * n, [True] * n, residuals


def _tap_partial_eval(trace: Any, *tracers: Any, differentiated: bool,
                      flavor: CallbackFlavor, **params: Any) -> Any:
  """Partial evaluation (JaxprTrace: linearize and grad, and the partial
  evaluation of scan, while and cond under them).  A tap of values that
  carry no tangent (a loop's index: a progress bar) never meets _tap_jvp,
  so it has no effect, and JaxprTrace drops a staged equation that no
  output reaches unless it has one.  Staged here, it gets the effect of a
  differentiated tap (PURE taps excepted, which may go)."""
  keep = differentiated or flavor is not CallbackFlavor.PURE
  return trace.default_process_primitive(
      tap_p, tracers, dict(params, flavor=flavor, differentiated=keep))


tap_p.def_impl(_tap_impl)
tap_p.def_effectful_abstract_eval(_tap_abstract_eval)
_lowering.register_lowering(tap_p, _tap_lowering)
batching.primitive_batchers[tap_p] = _tap_batching
ad.primitive_jvps[tap_p] = _tap_jvp
ad.primitive_transposes[tap_p] = _tap_transpose
_jax.partial_eval_jaxpr_custom_rules[tap_p] = _tap_partial_eval_custom
_jax.custom_partial_eval_rules[tap_p] = _tap_partial_eval


_containers.keep_when_unused(tap_p)


def _mark_differentiated(eqn: JaxprEqn) -> JaxprEqn:
  """A tap equation with the effect that partial evaluation keeps."""
  if eqn.params["differentiated"]:
    return eqn
  return eqn.replace(params=dict(eqn.params, differentiated=True),
                     effects=set(eqn.effects) | {_differentiated})


_containers.mark_for_partial_eval(tap_p, _mark_differentiated)


# ---- the API ----------------------------------------------------------------

def _tap_inline(site: _sites.TapSite, leaves: list[Any],
                device_index: int) -> None:
  func = site.func
  assert not isinstance(func, NativeTap), "a native tap never runs inline"
  value = site.treedef.unflatten([np.asarray(x) for x in leaves])
  if site.with_device:
    func(value, site.transforms,
         device=_devices.inline_device(device_index, "id_tap"))
  else:
    func(value, site.transforms)


# id_tap's and id_print's parameters, but the value: a keyword close to one
# of them is taken for a misspelling.
_PARAMETERS = ("result", "tap_with_device", "device_index", "callback_flavor")
_PRINT_PARAMETERS = _PARAMETERS + ("output_stream", "threshold")


def _unexpected_keywords(kwargs: dict[str, Any]) -> None:
  """id_tap's error for keywords it does not take: a misspelled parameter
  is named with the right spelling; other keywords get the removed
  module's words (its users search for them)."""
  name = sorted(kwargs)[0]
  text = _args.unexpected_keyword("id_tap", name, _PARAMETERS)
  if _args.closest(name, _PARAMETERS) is None:
    text += (". Support for **kwargs in ``id_tap`` has been removed. "
             "Instead, pre-apply keyword arguments, either by using a "
             "closure or by passing "
             "``functools.partial(tap_func, **kwargs)``.")
  raise TypeError(text)


def id_tap(tap_func: Callable[..., Any] | NativeTap | logging.Logger,
           arg: Any, *,
           result: Any = None, tap_with_device: bool = False,
           device_index: int = 0,
           callback_flavor: CallbackFlavor = CallbackFlavor.IO_CALLBACK,
           **kwargs: Any) -> Any:
  """Identity function that also sends ``arg`` to ``tap_func`` on the host.

  ``tap_func(arg, transforms)`` is called asynchronously on the host, with
  ``arg`` as a pytree of numpy arrays of the same structure, and
  ``transforms`` the tuple of ``(name, params)`` transformations applied
  around the tap (empty when none).  With ``tap_with_device=True`` it also
  receives ``device=`` the ``jax.Device`` the value comes from.  Typed PRNG
  keys are sent as their key data.

  The tap runs after ``arg`` is computed, in program order with the
  program's other callbacks; the returned value is the program's own (no
  data dependence on the tap: it changes nothing the program computes).  It
  runs even when the returned value is unused (unless ``callback_flavor`` is
  ``PURE``).  A computation's results may be ready before its taps have
  run, as in the removed module (:func:`barrier_wait` waits for them;
  ``HOST_CALLBACK_TAPS_BEFORE_RESULTS=1`` makes the results wait).
  Exceptions in ``tap_func`` are logged and re-raised by
  :func:`barrier_wait`.

  Args:
    tap_func: the host function, ``tap_func(arg, transforms[, device=])``,
      or a C function from :func:`native_tap` (it receives the flattened
      leaves and always the device), or a ``logging.Logger``: each tap is
      then one ``INFO`` record of that logger, with :func:`id_print`'s text
      as its message and the device in its ``extra`` (``record.device``,
      with ``tap_with_device``).
    arg: a pytree of arrays (or values convertible to arrays).
    result: if given, returned instead of ``arg``; it is not sent to the
      host.
    tap_with_device: pass ``device=`` to ``tap_func``.
    device_index: which device taps in a multi-device computation.
    callback_flavor: see :class:`CallbackFlavor`.

  Returns:
    ``arg``, or ``result`` if given.
  """
  if kwargs:
    _unexpected_keywords(kwargs)
  return tap(tap_func, arg, result=result, tap_with_device=tap_with_device,
             device_index=device_index, callback_flavor=callback_flavor,
             deliver=(Delivery.NOW_KEEP_ERROR if _config.TAPS_BEFORE_RESULTS
                      else Delivery.QUEUED))


def tap(tap_func: Callable[..., Any] | NativeTap | logging.Logger, arg: Any,
        *, result: Any = None, tap_with_device: bool = False,
        device_index: int = 0,
        callback_flavor: CallbackFlavor = CallbackFlavor.IO_CALLBACK,
        deliver: Delivery, api: str = "") -> Any:
  """:func:`id_tap`, where ``deliver`` says where and when the tap's
  function runs under ``jit`` (:class:`Delivery`): queued, asynchronously,
  as the removed module's taps, or in the computation, before it goes on
  (the drop-ins: debug.py, progress.py; and ``id_tap`` with
  ``HOST_CALLBACK_TAPS_BEFORE_RESULTS``, _config.py); ``api`` names the
  drop-in in its errors."""
  tap_with_device = _args.check_bool("id_tap", "tap_with_device",
                                     tap_with_device)
  if isinstance(tap_func, logging.Logger):
    return id_print(arg, result=result, tap_with_device=tap_with_device,
                    device_index=device_index, output_stream=tap_func,
                    callback_flavor=callback_flavor)
  native = _native.is_native(tap_func, NativeTap, "id_tap")
  if not native:
    _args.check_callable("id_tap", "tap_func", tap_func)
    if not api:  # the user's own function (a drop-in's is ours)
      _args.check_tap_signature("id_tap", tap_func, tap_with_device)
  _args.check_flavor("id_tap", callback_flavor)

  device_index = _devices.checked_device_index(device_index, "id_tap")
  leaves, treedef = _leaves.flatten(arg, "id_tap")
  tapped = _leaves.key_data_of_keys(leaves)
  site = _sites.TapSite(tap_func if isinstance(tap_func, NativeTap) else
                        _sites.hashable_callable(tap_func), treedef,
                        _sites.Transforms(), bool(tap_with_device), api)

  if result is not None:
    res_leaves, res_treedef = _leaves.flatten(result, "id_tap")
  else:
    res_leaves, res_treedef = [], None

  if (_config.INLINE and not native and
      not _leaves.staging(tapped + res_leaves)):
    _tap_inline(site, tapped, device_index)
    return arg if result is None else result

  outs = tap_p.bind(*tapped, *_leaves.key_data_of_keys(res_leaves), site=site,
                    ntapped=len(tapped), device_index=device_index,
                    flavor=callback_flavor, differentiated=False,
                    deliver=Delivery(deliver))
  if result is None:
    return treedef.unflatten(_leaves.rewrap_keys(leaves, outs[:len(tapped)]))
  return res_treedef.unflatten(_leaves.rewrap_keys(res_leaves, outs[len(tapped):]))


def id_print(arg: Any, *, result: Any = None, tap_with_device: bool = False,
             device_index: int = 0,
             output_stream: SupportsWrite[str] | logging.Logger | None = None,
             threshold: int | None = None,
             callback_flavor: CallbackFlavor = CallbackFlavor.IO_CALLBACK,
             **kwargs: Any) -> Any:
  """Like :func:`id_tap` with a tap that prints ``arg`` on the host.

  Each tap prints the keyword arguments, if any, as ``k: v`` pairs sorted
  by key on one line (with ``transforms`` under a transformation and
  ``device`` with ``tap_with_device``), then ``arg``: tuples as ``( a b )``,
  lists as ``[ a b ]``, dicts as ``{ k=a }``, broken over lines when longer
  than 80 columns, and arrays exactly as ``numpy.array2string`` prints them
  with the print options in effect when the function is traced.  Lines of
  one tap are never interleaved with another's.

  Args:
    arg: the pytree of arrays to print; returned (unless ``result``).
    result: if given, returned instead of ``arg``, after the print.
    tap_with_device: also print the device the value comes from.
    device_index: which device prints in a multi-device computation.
    output_stream: an object with a ``write(str)`` method; each chunk is
      written as ``write(s + "\\n")``.  Default: ``sys.stdout``.  Or a
      ``logging.Logger``: each tap is one ``INFO`` record whose message is
      the text (its lines joined by newlines, no final one), with the
      device in the record's ``extra`` (``record.device``: the
      ``jax.Device`` with ``tap_with_device``, else None); formatted on the
      consumer thread in Python, not in C.
    threshold: ``numpy.array2string``'s threshold: arrays with more
      elements are summarised with ``...`` (default: numpy's, 1000).
    callback_flavor: see :class:`CallbackFlavor`.
    **kwargs: printed before the value, ``str()``-ed when traced.

  Returns:
    ``arg``, or ``result`` if given.
  """
  _args.near_misses("id_print", kwargs, _PRINT_PARAMETERS,
                    "labels to print")
  _args.check_stream("id_print", output_stream)
  threshold = _args.check_threshold("id_print", threshold)
  tap_with_device = _args.check_bool("id_print", "tap_with_device",
                                     tap_with_device)
  _args.check_flavor("id_print", callback_flavor)
  device_index = _devices.checked_device_index(device_index, "id_print")
  leaves, _ = _leaves.tree_flatten(arg, "id_print")
  printer = _print.Printer(kwargs, output_stream, threshold,
                           tuple(map(_print.dtype_code, leaves)))
  return id_tap(printer, arg, result=result, tap_with_device=tap_with_device,
                device_index=device_index, callback_flavor=callback_flavor)
