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
from jax.extend.core import Primitive
from jax.interpreters import mlir

from host_callback import _config
from host_callback import _dce
from host_callback import _leaves
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


_dce.keep_when_unused(tap_p)


# ---- the API ----------------------------------------------------------------

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

  leaves, treedef = _leaves.flatten(arg)
  tapped = _leaves.key_data_of_keys(leaves)
  site = _runtime.TapSite(_runtime.hashable_callable(tap_func), treedef, (),
                          bool(tap_with_device))

  if result is not None:
    res_leaves, res_treedef = _leaves.flatten(result)
  else:
    res_leaves, res_treedef = [], None

  if _config.INLINE and not _leaves.any_tracer(tapped + res_leaves):
    _tap_inline(site, tapped, device_index)
    return arg if result is None else result

  outs = tap_p.bind(*tapped, *_leaves.key_data_of_keys(res_leaves), site=site,
                    ntapped=len(tapped),
                    device_index=int(device_index), flavor=callback_flavor)
  if result is None:
    return treedef.unflatten(_leaves.rewrap_keys(leaves, outs[:len(tapped)]))
  return res_treedef.unflatten(_leaves.rewrap_keys(res_leaves, outs[len(tapped):]))
