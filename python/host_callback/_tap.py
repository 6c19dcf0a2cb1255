"""``id_tap`` and the ``hcb_tap`` primitive.

A tap lowers to one XLA custom call, ``hcb_tap`` (src/ffi_tap.c), whose
operands are the tapped arrays followed by the arrays of ``result``, and
whose results alias those operands: the computation continues with the same
buffers, and the data dependence orders the tap (after its inputs are
computed, before its outputs are used).  The custom call carries
``has_side_effect`` and the primitive has no JAX effect, so jitted functions
with taps keep JAX's C++ fast dispatch path.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import dispatch
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import Primitive
from jax.interpreters import mlir

from host_callback import _config
from host_callback import _runtime
from host_callback._types import CallbackFlavor

tap_p = Primitive("hcb_tap")
tap_p.multiple_results = True


def _tap_impl(*args: Any, **params: Any) -> Any:
  return dispatch.apply_primitive(tap_p, *args, **params)


def _tap_abstract_eval(*avals: Any, site: _runtime.TapSite, ntapped: int,
                       device_index: int, flavor: CallbackFlavor) -> Any:
  del site, ntapped, device_index, flavor
  return avals


def _tap_lowering(ctx: mlir.LoweringRuleContext, *args: Any,
                  site: _runtime.TapSite, ntapped: int, device_index: int,
                  flavor: CallbackFlavor) -> Any:
  del device_index  # used by the multi-device lowering (sharded jit)
  rule = jax.ffi.ffi_lowering(
      "hcb_tap",
      operand_output_aliases={i: i for i in range(len(args))},
      has_side_effect=flavor is not CallbackFlavor.PURE,
  )
  return rule(ctx, *args, callback_id=np.uint64(_runtime.site_id(site)),
              ntapped=np.int64(ntapped))


tap_p.def_impl(_tap_impl)
tap_p.def_abstract_eval(_tap_abstract_eval)
mlir.register_lowering(tap_p, _tap_lowering, platform="cpu")


# ---- keeping taps whose results are unused ---------------------------------
#
# JAX removes an equation whose outputs are unused unless it has an effect,
# and our primitive deliberately has none (effects would cost the fast
# dispatch path).  Our own DCE rule keeps the tap; the wrapped rules of the
# primitives that hold sub-jaxprs (scan, while, cond, jit, remat, custom
# derivatives, shard_map) keep a container whose body holds a tap.

def _keeps(eqn: jax_core.JaxprEqn) -> bool:
  return (eqn.primitive is tap_p and
          eqn.params["flavor"] is not CallbackFlavor.PURE)


_holds_tap_cache: dict[int, tuple[Any, bool]] = {}


def _jaxpr_holds_tap(jaxpr: jax_core.Jaxpr) -> bool:
  cached = _holds_tap_cache.get(id(jaxpr))
  if cached is not None and cached[0] is jaxpr:
    return cached[1]
  found = any(_keeps(eqn) or _eqn_holds_tap(eqn) for eqn in jaxpr.eqns)
  if len(_holds_tap_cache) > 4096:
    _holds_tap_cache.clear()
  _holds_tap_cache[id(jaxpr)] = (jaxpr, found)
  return found


def _eqn_holds_tap(eqn: jax_core.JaxprEqn) -> bool:
  for sub in jax_core.jaxprs_in_params(eqn.params):
    if _jaxpr_holds_tap(sub):
      return True
  return False


def _tap_dce_rule(used_outputs: list[bool], eqn: jax_core.JaxprEqn
                  ) -> tuple[list[bool], jax_core.JaxprEqn | None]:
  if _keeps(eqn) or any(used_outputs):
    return [True] * len(eqn.invars), eqn
  return [False] * len(eqn.invars), None


def _keep_tapping_containers(rule: Callable[..., Any]) -> Callable[..., Any]:
  def rule_keeping_taps(used_outputs: list[bool], eqn: jax_core.JaxprEqn):
    if not any(used_outputs) and _eqn_holds_tap(eqn):
      # Nothing downstream needs the container, but its taps must run:
      # keep it whole (XLA still removes dead code that is not a tap).
      return [True] * len(eqn.invars), eqn
    return rule(used_outputs, eqn)

  rule_keeping_taps.__wrapped__ = rule  # type: ignore[attr-defined]
  return rule_keeping_taps


def _install_dce_rules() -> None:
  from jax._src.lax.control_flow import loops

  pe.dce_rules[tap_p] = _tap_dce_rule
  containers = [p for p in pe.dce_rules if p is not tap_p]
  for prim in containers:
    if not hasattr(pe.dce_rules[prim], "__wrapped__"):
      pe.dce_rules[prim] = _keep_tapping_containers(pe.dce_rules[prim])
  if loops.while_p not in pe.dce_rules:
    pe.dce_rules[loops.while_p] = _keep_tapping_containers(
        pe._default_dce_rule)


_install_dce_rules()


# ---- the API ----------------------------------------------------------------

def _is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype,
                                                     jax.dtypes.prng_key)


def _key_data_of_keys(leaves: list[Any]) -> list[Any]:
  """The leaves as the custom call carries them: typed keys as key data."""
  return [jax.random.key_data(x) if _is_key(x) else x for x in leaves]


def _as_array(x: Any) -> Any:
  return x if isinstance(x, (jax.Array, jax_core.Tracer)) else jax.numpy.asarray(x)


def _tap_inline(site: _runtime.TapSite, leaves: list[Any],
                device_index: int) -> None:
  value = site.treedef.unflatten([np.asarray(x) for x in leaves])
  if site.with_device:
    site.func(value, site.transforms, device=jax.local_devices()[device_index])
  else:
    site.func(value, site.transforms)


def id_tap(tap_func: Callable[..., Any], arg: Any, *, result: Any = None,
           tap_with_device: bool = False, device_index: int = 0,
           callback_flavor: CallbackFlavor = CallbackFlavor.IO_CALLBACK,
           **kwargs: Any) -> Any:
  """Identity function that also sends ``arg`` to ``tap_func`` on the host.

  ``tap_func(arg, transforms)`` is called asynchronously on the host, with
  ``arg`` as a pytree of numpy arrays of the same structure, and
  ``transforms`` the tuple of ``(name, params)`` transformations applied
  around the tap (empty when none).  With ``tap_with_device=True`` it also
  receives ``device=`` the ``jax.Device`` the value comes from.  Typed PRNG
  keys are sent as their key data.

  The tap runs after ``arg`` (and ``result``) are computed and before the
  returned value is used.  It runs even when the returned value is unused
  (unless ``callback_flavor`` is ``PURE``).  Exceptions in ``tap_func`` are
  logged and re-raised by :func:`barrier_wait`.

  Args:
    tap_func: the host function, ``tap_func(arg, transforms[, device=])``.
    arg: a pytree of arrays (or values convertible to arrays).
    result: if given, returned instead of ``arg``; it is not sent to the
      host, but the tap still happens before it is used.
    tap_with_device: pass ``device=`` to ``tap_func``.
    device_index: which device taps in a multi-device computation.
    callback_flavor: see :class:`CallbackFlavor`.

  Returns:
    ``arg``, or ``result`` if given.
  """
  if kwargs:
    raise TypeError(
        "Support for **kwargs in ``id_tap`` has been removed. Instead, "
        "pre-apply keyword arguments, either by using a closure or by "
        "passing ``functools.partial(tap_func, **kwargs)``.")
  if not callable(tap_func):
    raise TypeError(f"tap_func must be callable, got {tap_func!r}")
  if not isinstance(callback_flavor, CallbackFlavor):
    raise TypeError("callback_flavor must be a CallbackFlavor, got "
                    f"{callback_flavor!r}")

  leaves, treedef = jax.tree_util.tree_flatten(arg)
  leaves = [_as_array(x) for x in leaves]
  tapped = _key_data_of_keys(leaves)
  site = _runtime.TapSite(_runtime.hashable_callable(tap_func), treedef, (),
                          bool(tap_with_device))

  if result is not None:
    res_leaves, res_treedef = jax.tree_util.tree_flatten(result)
    res_leaves = [_as_array(x) for x in res_leaves]
  else:
    res_leaves, res_treedef = [], None

  if _config.INLINE and not any(
      isinstance(x, jax_core.Tracer) for x in tapped + res_leaves):
    _tap_inline(site, tapped, device_index)
    return arg if result is None else result

  outs = tap_p.bind(*tapped, *_key_data_of_keys(res_leaves), site=site,
                    ntapped=len(tapped),
                    device_index=int(device_index), flavor=callback_flavor)
  if result is None:
    return treedef.unflatten(_rewrap_keys(leaves, outs[:len(tapped)]))
  return res_treedef.unflatten(_rewrap_keys(res_leaves, outs[len(tapped):]))


def _rewrap_keys(originals: list[Any], outs: list[Any]) -> list[Any]:
  return [jax.random.wrap_key_data(o, impl=jax.random.key_impl(x))
          if _is_key(x) else o for x, o in zip(originals, outs)]
