"""The custom calls that ``hcb_tap`` and ``hcb_call`` lower to, and which
devices run them.

- Single-device programs and ``pmap``: every device runs the custom call on
  its own values; no annotation.
- ``shard_map`` with every mesh axis manual: every device runs it on its own
  shard; the custom call is marked MANUAL as JAX marks its own callbacks.
- ``jit`` with operands sharded over several devices (automatic SPMD): not
  supported yet.  XLA's Shardy partitioner keeps a single-device (maximal)
  sharding only on JAX's own callback custom calls, so the callback cannot be
  pinned to ``device_index``; lowering raises a clear error instead of
  XLA's internal one.
"""

from __future__ import annotations

from typing import Any, Sequence

from jax._src import callback as jax_callback
from jax._src import ffi as jax_ffi
from jax._src import sharding_impls
from jax._src.interpreters import mlir


def _op_sharding(ctx: mlir.LoweringRuleContext, what: str) -> Any:
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, sharding_impls.SPMDAxisContext):
    return jax_callback._callback_op_sharding(axis_context, None,
                                              ctx.avals_out)
  if (isinstance(axis_context, sharding_impls.ShardingContext) and
      axis_context.num_devices > 1):
    raise NotImplementedError(
        f"host_callback {what} inside jit with operands sharded over "
        f"{axis_context.num_devices} devices is not supported yet: use "
        "shard_map or pmap (every device calls with its own shard), or "
        "replicate the operands onto one device first.")
  return None


def lower(ctx: mlir.LoweringRuleContext, target: str, args: Sequence[Any], *,
          what: str, has_side_effect: bool,
          operand_output_aliases: dict[int, int] | None = None,
          **attributes: Any) -> Sequence[Any]:
  """Emits the custom call ``target`` with ``attributes`` (and the sharding
  annotation the context needs); returns its results."""
  sharding = _op_sharding(ctx, what)
  op = jax_ffi.build_ffi_lowering_function(
      target, has_side_effect=has_side_effect,
      operand_output_aliases=operand_output_aliases)(ctx, *args, **attributes)
  if sharding is not None:
    mlir.set_sharding(ctx.module_context, op, sharding)
  return op.results
