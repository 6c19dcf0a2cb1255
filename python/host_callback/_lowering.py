"""The custom calls that host_callback's primitives lower to, on which
platforms, and which devices run them.

Targets (the same names on every platform; src/ffi/): ``hcb_tap`` for taps
and prints, ``hcb_call`` for a Python ``call`` (on CUDA it stages operands
and results through host memory), ``hcb_buffer_call`` for a call whose
target works in place on the device's buffers (``buffer_callback``, and
``call`` of a :func:`native_call`; on CPU the same handler as
``hcb_call``).

Platforms: every primitive has one lowering rule, registered for each of
:data:`PLATFORMS` by :func:`register_lowering`.  The rule does not depend
on the platform but for the device key it names (below).

- Single-device programs and ``pmap``: every device runs the custom call on
  its own values; no annotation.
- ``shard_map`` with every mesh axis manual: every device runs it on its own
  shard; the custom call is marked MANUAL as JAX marks its own callbacks.
- ``jit`` with operands sharded over several devices (automatic SPMD): the
  callback runs once, on the ``device_index``-th device of the
  computation, with the whole operands, and its results are every
  device's, as JAX runs its own.  XLA's partitioners keep a single-device
  (maximal) sharding only on JAX's own callbacks, so :func:`_lower_shared`
  does it with what they do keep: a region where every device computes on
  its own (Shardy's manual computation, GSPMD's MANUAL sharding), into
  which the partitioner gathers the whole operands, as it does for JAX's
  callback.  There every device runs the custom call, whose attributes
  ``runner`` (the device key of the one that runs the function) and
  ``participants`` make the others take the runner's results, or its
  error, from the runtime (src/runtime/shared.c): one run of the function
  per call, no collective to spread what it returns, the order token kept.
  Such a program is dispatched paced, by JAX's Python path (_pacing.py
  says why).  A computation
  whose devices are in several processes (``jax.distributed``), and
  ``jax.debug``'s partitioned callbacks, go through JAX's Python callback
  instead (:func:`_lower_through_python`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, cast

import jax
import numpy as np
from jax.core import ShapedArray
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import sdy
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import mlir

from host_callback import _devices
from host_callback import _hcb
from host_callback import _errors
from host_callback import _jax
from host_callback import _order
from host_callback import _pacing
from host_callback import _registry

# The platforms (as JAX's lowering names them) host_callback lowers for.
PLATFORMS = ("cpu", "cuda")

# The device key's platform of each (HCB_PLATFORM_* in include/hcb/hcb.h).
_PLATFORM_CODES = {"cpu": _hcb.PLATFORM_CPU, "cuda": _hcb.PLATFORM_CUDA}


def register_lowering(prim: Any, rule: Callable[..., Any], *,
                      needs_devices: bool = True) -> None:
  """Registers ``rule`` as the lowering of ``prim`` on every platform of
  :data:`PLATFORMS`, and, with ``needs_devices``, ``prim`` as one whose
  lowering knows the devices.

  Each platform gets a rule object of its own: when one program is lowered
  for several platforms at once, JAX then emits the rule once per platform
  (in a ``case`` over the platform index), each time with that platform
  alone in ``ctx.platforms``, which :func:`_platform` reads.  (One shared
  rule object would be emitted once, for all platforms together.)"""
  # Its lowering is given the computation's devices, as JAX's own
  # callbacks' is: under jit over sharded operands it names the one that
  # runs the function (_lower_shared).  JAX then also requires every
  # NamedSharding of the program to be on one mesh.
  if needs_devices:
    _jax.prim_requires_devices_during_lowering.add(prim)
  for platform in PLATFORMS:
    def platform_rule(ctx: mlir.LoweringRuleContext, *args: Any,
                      **params: Any) -> Any:
      return rule(ctx, *args, **params)
    platform_rule.__name__ = f"{getattr(rule, '__name__', 'rule')}_{platform}"
    mlir.register_lowering(prim, platform_rule, platform=platform)


def _platform(ctx: mlir.LoweringRuleContext) -> str:
  """The one platform this rule is being lowered for: the context's own
  (one branch of a multi-platform lowering), else the module's."""
  platforms = tuple(getattr(ctx, "platforms", None)
                    or ctx.module_context.platforms)
  if len(platforms) != 1 or platforms[0] not in _PLATFORM_CODES:
    raise NotImplementedError(
        f"host_callback: cannot lower for platforms {platforms}; it lowers "
        f"for one of {PLATFORMS} at a time")
  return platforms[0]


def call_target(native: bool) -> str:
  """The custom-call target of a call: ``hcb_buffer_call`` for one whose
  function works in place on the device's buffers (a C function), else
  ``hcb_call``."""
  return "hcb_buffer_call" if native else "hcb_call"


def _sharded_devices(ctx: mlir.LoweringRuleContext) -> int:
  """How many devices an automatically partitioned program runs on (1 when
  it is not one)."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _jax.ShardingContext):
    return axis_context.num_devices
  return 1


def _maximal(ctx: mlir.LoweringRuleContext, device_index: int) -> Any:
  """The sharding that runs an op only on the ``device_index``-th device."""
  if _jax.use_shardy_partitioner():
    return _jax.SdyArrayList((_jax.SdyArray(
        mesh_shape=(), dim_shardings=(),
        logical_device_ids=(device_index,)),) * max(1, len(ctx.avals_out)))
  sharding = _jax.OpSharding()
  sharding.type = _jax.OpSharding.Type.MAXIMAL
  sharding.tile_assignment_dimensions = [1]
  sharding.tile_assignment_devices = [device_index]
  return sharding


def _device_assignment(ctx: mlir.LoweringRuleContext) -> Sequence[Any]:
  """The devices of an automatically partitioned program, in the order
  ``device_index`` counts them (empty when JAX does not give them)."""
  devices = getattr(ctx.module_context.axis_context, "device_assignment",
                    None)
  return () if devices is None else tuple(devices)


def _shared_here(ctx: mlir.LoweringRuleContext) -> bool:
  """Whether the devices of this automatically partitioned program are all
  this process's, as the runtime's shared calls need (their meetings are
  in one process's memory)."""
  devices = _device_assignment(ctx)
  here = jax.process_index()
  return bool(devices) and all(d.process_index == here for d in devices)


def _region_refused(ctx: mlir.LoweringRuleContext) -> bool:
  """Whether this JAX's XLA refuses the region of :func:`_lower_shared`:
  JAX 0.6's, under Shardy (opt-in there), for a callback that returns
  nothing but its token.  Such a callback takes JAX's Python callback
  there, as one of another process's devices does."""
  return (_jax.shardy_region_needs_a_value and not ctx.avals_out
          and _jax.use_shardy_partitioner())


def _no_host_callback() -> None:
  """What the program registers with JAX as a host callback (see
  :func:`_with_runtime_tokens`); never called."""
  raise AssertionError("host_callback: this host callback is never called")


def _with_runtime_tokens(module_context: Any) -> None:
  """Makes JAX give each run of the program being lowered runtime tokens,
  one per device, that tell when it has finished, as it does for programs
  with its own callbacks, which it recognises by their host callbacks --
  so the program gets one, never called.  The pacing of _pacing.py waits
  on them: without them it has nothing to wait for."""
  if not any(c is _no_host_callback
             for c in _jax.host_callbacks(module_context)):
    _jax.add_host_callback(module_context, _no_host_callback)


def _replicated_in_region(aval: Any, ndevices: int) -> Any:
  """Shardy's sharding of a whole value (or a token) in the region of
  :func:`_lower_shared`: replicated over its one axis of every device."""
  return _jax.SdyArray(
      mesh_shape=((_REGION_AXIS, ndevices),), dim_shardings=tuple(
          _jax.SdyDim(axes=(), is_open=False)
          for _ in getattr(aval, "shape", ())))


# The axis of the region of _lower_shared: every device of the program.
_REGION_AXIS = "hcb_devices"


def _with_token(ctx: mlir.LoweringRuleContext, args: Sequence[Any]
                ) -> tuple[mlir.LoweringRuleContext, tuple[Any, ...]]:
  """The context and operands of an ordered callback's custom call: one
  more operand and result each, a token (here a fresh one; _order.py
  chains it through the program)."""
  token = _jax.abstract_token
  return (ctx.replace(avals_in=(*ctx.avals_in, token),
                      avals_out=(*ctx.avals_out, token)),
          (*args, hlo.create_token()))


def _lower_shared(ctx: mlir.LoweringRuleContext, target: str,
                  args: Sequence[Any], *, ndevices: int,
                  has_side_effect: bool, device_index: int,
                  operand_output_aliases: dict[int, int] | None,
                  **attributes: Any) -> Sequence[Any]:
  """The callback of an automatically partitioned program, on one device
  (see the module's docstring): the custom call in a region where every
  device computes on its own, on the whole operands, with the ``runner``
  and ``participants`` that make it one call of the function shared by
  every device.  Ordered ones take and return the order token through the
  region (_order.py chains the region as one callback)."""
  # Dispatched paced: XLA's CPU client gets stuck when more multi-device
  # programs are dispatched without waiting than its threads run
  # (_pacing.py; plain JAX programs with collectives too).
  _pacing.mark(ctx.module_context)
  _with_runtime_tokens(ctx.module_context)
  devices = _device_assignment(ctx)
  # first_runs: the first device to reach the call may run it for the
  # runner where the platform allows (src/runtime/shared.c, "Who runs");
  # _order.py turns it off in a program that also holds JAX's Python
  # callback, which only the runner's thread issues.
  attributes = dict(
      attributes,
      runner=np.uint64(_devices.device_key(devices[device_index])),
      participants=np.int64(ndevices),
      **{_order.FIRST_RUNS: np.int64(1)})
  ordered = has_side_effect
  inner_ctx, operands = (_with_token(ctx, args) if ordered
                         else (ctx, tuple(args)))
  avals_in, avals_out = inner_ctx.avals_in, inner_ctx.avals_out
  build = _jax.build_ffi_lowering_function(
      target, has_side_effect=has_side_effect,
      operand_output_aliases=operand_output_aliases)
  if _jax.use_shardy_partitioner():
    region = sdy.ManualComputationOp(
        [_jax.ir_type(ctx.module_context, a) for a in avals_out],
        list(operands),
        _jax.build_sdy(_jax.SdyArrayList([_replicated_in_region(a, ndevices)
                                          for a in avals_in]),
                       ctx.module_context),
        _jax.build_sdy(_jax.SdyArrayList([_replicated_in_region(a, ndevices)
                                          for a in avals_out]),
                       ctx.module_context),
        sdy.ManualAxesAttr.get([ir.StringAttr.get(_REGION_AXIS)]))
    block = ir.Block.create_at_start(
        region.body,
        [_jax.ir_type(ctx.module_context, a) for a in avals_in])
    with ir.InsertionPoint(block):
      op = build(inner_ctx, *block.arguments, **attributes)
      sdy.return_(list(op.results))
    results = list(region.results)
    if ordered:
      _order.mark_region(region)
  else:  # GSPMD: into MANUAL and back, as JAX's shard_map lowers for it
    replicated, manual = _jax.OpSharding(), _jax.OpSharding()
    replicated.type = _jax.OpSharding.Type.REPLICATED
    manual.type = _jax.OpSharding.Type.MANUAL
    inner = [_jax.wrap_with_full_to_shard_op(
        ctx, _jax.wrap_with_sharding_op(ctx, x, aval, replicated), aval,
        manual) for x, aval in zip(args, ctx.avals_in)]
    op = build(inner_ctx, *inner, *operands[len(args):], **attributes)
    _jax.set_sharding(ctx.module_context, op, manual)
    results = [_jax.wrap_with_shard_to_full_op(
        ctx, _jax.wrap_with_sharding_op(ctx, r, aval, manual), aval,
        replicated) for r, aval in zip(op.results, ctx.avals_out)]
    if ordered:
      results.append(op.results[-1])
  if not ordered:
    return results
  _order.note(ctx)
  return results[:-1]


def _lower_through_python(ctx: mlir.LoweringRuleContext, target: str,
                          args: Sequence[Any], *, what: str,
                          has_side_effect: bool, device_index: int,
                          callback_id: Any, ntapped: Any = None,
                          partitioned: bool = False,
                          deliver: Any = 0) -> Sequence[Any]:
  ndevices = _sharded_devices(ctx)
  _pacing.mark(ctx.module_context)  # dispatched paced (_pacing.py)
  i32 = ShapedArray((), np.int32)
  ordinal = _jax.build_ffi_lowering_function("hcb_device_ordinal")(
      ctx.replace(avals_in=(), avals_out=(i32,))).results
  callback_id = int(callback_id)
  # A call with results spreads, with them, whether its function failed
  # (0: no; 1: parked; 2: not parked): the devices of the other processes
  # raise too (hcb_sharded_check), and each device of the runner's process
  # takes the failure parked for it.
  flagged = target != "hcb_tap" and bool(ctx.avals_out) and not partitioned
  devices = _device_assignment(ctx)
  here = jax.process_index()
  local = sum(d.process_index == here for d in devices) or ndevices
  # hcb_device_ordinal gives the device's ordinal on its platform (a CUDA
  # device's local hardware id); the runtime's device key also names the
  # platform (HCB_DEVICE in include/hcb/hcb.h).
  platform_bits = _PLATFORM_CODES[_platform(ctx)] << 32
  out_avals = ctx.avals_out
  # No custom call carries the id here: JAX keeps run_on_device with the
  # runtime executable, so holding the site's registration in it keeps the
  # id for exactly as long (_registry.py, the life of a site's id).
  registration = _registry.registration_of(callback_id)

  def run_on_device(device_ordinal: Any, *arrays: Any,
                    _holds: Any = registration) -> Sequence[Any]:
    key = platform_bits | int(device_ordinal)
    if target == "hcb_tap" and deliver:
      # Delivered here, in the computation, as the hcb_tap handler with
      # attribute deliver does: a failure fails the computation (as JAX's
      # own callback there does), or with deliver 2 is only kept.
      _hcb.submit_tap(callback_id, key, arrays[:int(ntapped)], int(deliver))
      return ()
    if target == "hcb_tap":
      try:
        _hcb.submit_tap(callback_id, key, arrays[:int(ntapped)])
      except Exception as exc:  # for barrier_wait, never for one device
        _errors.tap_not_queued(what, key, exc)
      return ()
    outs = tuple(np.zeros(a.shape, a.dtype) for a in out_avals)
    # A failure is parked and raised by every device (hcb_sharded_check
    # below): raising here, on one device, would leave the others waiting
    # in the collective that spreads the results.
    if not flagged:
      _hcb.run_call(callback_id, key, arrays, outs, 0)
      return outs
    try:
      parked = _hcb.run_call(callback_id, key, arrays, outs, local)
    except Exception as exc:  # not parked: kept for barrier_wait
      _errors.call_not_parked(what, key, exc)
      return (*outs, np.int32(2))
    return (*outs, np.int32(0 if parked is None else 1))

  ctx = ctx.replace(avals_in=(i32, *ctx.avals_in))
  # Ordered (see lower()): JAX's callback takes a token first and returns
  # one first; marked, so that _order.py chains it with the others.
  # A partitioned tap (jax.debug's partitioned=True) runs JAX's partitioned
  # callback as jax.debug does: every device taps its own shard, the
  # callback returns nothing (the tap's results are its operands), and it
  # takes no token (XLA's partitioner of that callback refuses one), so it
  # is not ordered against the program's other callbacks, as in JAX.
  ordered = has_side_effect and not partitioned
  if partitioned:  # no results: one annotation, for the op itself
    ctx = ctx.replace(avals_out=())
  elif flagged:  # one more result: whether the function failed
    ctx = ctx.replace(avals_out=(*out_avals, i32))
  results, token, _ = _jax.emit_python_callback(
      ctx, run_on_device, hlo.create_token() if ordered else None,
      [*ordinal, *args], ctx.avals_in,
      () if partitioned else ctx.avals_out,
      has_side_effect=has_side_effect, returns_token=ordered or partitioned,
      partitioned=partitioned, sharding=_maximal(ctx, device_index))
  if ordered:
    _order.mark_python_callback(token.owner)
    _order.note(ctx)
  if partitioned:
    return list(args)
  # Results left on one device come back wrong when they leave the program
  # from a device other than the first (JAX's own callbacks too, in JAX
  # 0.10): replicate them, so every device holds the whole result.
  results = [_jax.wrap_with_sharding_op(ctx, r, aval,
                                        _replicated(aval, ndevices))
             for r, aval in zip(results, ctx.avals_out)]
  if not flagged:
    return results
  runner = (f"device {devices[device_index].platform}:"
            f"{devices[device_index].id} (device_index={device_index}) in "
            f"process {devices[device_index].process_index}" if devices
            else f"device_index={device_index}")
  failed = (f"host_callback {what}: its function, run once for the "
            f"computation by {runner}, failed there")
  elsewhere = f"{failed}; the exception itself is raised in that process"
  unkept = (f"{failed}, and its exception could not be kept for the devices "
            "of that process: barrier_wait reports it there")
  return _jax.build_ffi_lowering_function(
      "hcb_sharded_check",
      operand_output_aliases={i: i for i in range(len(out_avals))})(
          ctx.replace(avals_in=ctx.avals_out, avals_out=out_avals),
          *results, callback_id=np.uint64(callback_id),
          elsewhere=elsewhere, unkept=unkept).results


def _replicated(aval: Any, ndevices: int) -> Any:
  """Replicated over the program's ``ndevices`` devices.  For Shardy, over
  a mesh of them rather than the empty mesh: in a program that has no mesh
  of its own (jit of one-device arguments inside ``jax.set_mesh``), JAX
  0.12's partitioner turns a side-effecting callback's maximal result
  constrained to the empty mesh into a replicated one, and refuses it."""
  if _jax.use_shardy_partitioner():
    return _jax.SdyArray(
        mesh_shape=(("hcb_devices", ndevices),), dim_shardings=tuple(
            _jax.SdyDim(axes=(), is_open=False)
            for _ in aval.shape))
  sharding = _jax.OpSharding()
  sharding.type = _jax.OpSharding.Type.REPLICATED
  return sharding


def _op_sharding(ctx: mlir.LoweringRuleContext) -> Any:
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _jax.SPMDAxisContext):
    return _jax.callback_op_sharding(axis_context, None, ctx.avals_out)
  return None


def lower(ctx: mlir.LoweringRuleContext, target: str, args: Sequence[Any], *,
          what: str, has_side_effect: bool, device_index: int,
          operand_output_aliases: dict[int, int] | None = None,
          partitioned: bool = False,
          **attributes: Any) -> Sequence[Any]:
  """Emits the custom call ``target`` with ``attributes`` (and the sharding
  annotation the context needs); returns its results.

  A side-effecting callback also takes and returns a token, which
  _order.py chains through the program so that callbacks run in program
  order; here it takes a token of its own."""
  ndevices = _sharded_devices(ctx)
  if ndevices > 1:
    if not 0 <= device_index < ndevices:
      raise ValueError(
          f"host_callback {what}: device_index={device_index} is out of "
          f"range for a computation on {ndevices} devices")
    if target == "hcb_buffer_call" and _platform(ctx) != "cpu":
      # The devices share a callback's results through host memory
      # (shared.c; JAX's Python callback too): a function that writes the
      # runner's GPU buffers would leave the others' unset.
      raise NotImplementedError(
          f"host_callback {what}: a function that works in place on GPU "
          f"buffers cannot run under jit over operands sharded across "
          f"{ndevices} devices (it would write one device's buffers and "
          "leave the others' results unset); call it inside jax.shard_map, "
          "where each device runs it on its own buffers")
    if partitioned or not _shared_here(ctx) or _region_refused(ctx):
      return _lower_through_python(
          ctx, target, args, what=what, has_side_effect=has_side_effect,
          device_index=device_index, partitioned=partitioned, **attributes)
    return _lower_shared(
        ctx, target, args, ndevices=ndevices,
        has_side_effect=has_side_effect, device_index=device_index,
        operand_output_aliases=operand_output_aliases, **attributes)
  ordered = has_side_effect
  sharding = _op_sharding(ctx)
  if ordered:
    if isinstance(sharding, _jax.SdyArrayList) and ctx.avals_out:
      # One more (replicated, rank 0) for the token result.
      token_sharding = _jax.SdyArray(mesh_shape=(), dim_shardings=(),
                                     logical_device_ids=())
      sharding = _jax.SdyArrayList(
          (*cast(Any, sharding).shardings, token_sharding))
    ctx, args = _with_token(ctx, args)
  op = _jax.build_ffi_lowering_function(
      target, has_side_effect=has_side_effect,
      operand_output_aliases=operand_output_aliases)(ctx, *args, **attributes)
  if sharding is not None:
    _jax.set_sharding(ctx.module_context, op, sharding)
  if not ordered:
    return op.results
  _order.note(ctx)
  return op.results[:-1]
