"""Every use of JAX's internals (``jax._src``), in one place.

JAX's public API has no way to give a primitive all the rules it needs
(partial evaluation for ``remat``, dead-code elimination, effects allowed in
control flow) nor to pin a Python callback to one device of an SPMD
program, so the package uses a few internals.  No other module imports
``jax._src``.  Each touchpoint below says what it is, why it is needed, and
which JAX versions have it: every one is present, as used here, in JAX
0.6.2, 0.7.2, 0.8.3, 0.9.2, 0.10.2, 0.11.2 and 0.12.0.1 (the versions
``make test`` runs).  Where an older JAX differs from 0.10 on, the
touchpoint is a function (or a value) that picks the form this JAX has,
found from JAX's own signatures or names; the few differences of
behaviour that neither shows are chosen by JAX's version number, each
said where it is set.

:func:`check_touchpoints` checks each one's shape (that the names exist and
take the arguments we pass); tests/python/test_jax_internals.py runs it, so
a JAX release that changes one fails there with a message that names it,
rather than somewhere deep in a traced program.

Everything public that the package uses (``jax.extend.core.Primitive``,
``jax.interpreters.ad``/``batching``/``mlir``, ``jax.ffi``,
``jax.core.Tracer``/``ShapedArray``) is imported where it is used.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any, Callable, Sequence, cast

import jax
import jax.extend.core
from jax._src import callback as _callback
from jax._src import dispatch as _dispatch
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src import effects as _effects
from jax._src import ffi as _ffi
from jax._src import monitoring as _monitoring
from jax._src import pjit as _pjit
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import batching as _jax_batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import xla_client as _xc
from jax.interpreters import batching as _batching

# ---- names JAX made public in 0.10 -------------------------------------------

# core.jaxprs_in_params(params): the jaxprs of an equation's parameters;
# core.no_effects: the empty effect set.  jax.extend.core from 0.10,
# jax._src.core only in 0.9.
jaxprs_in_params: Callable[[Any], Any] = getattr(
    jax.extend.core, "jaxprs_in_params", _core.jaxprs_in_params)
no_effects: Any = getattr(jax.extend.core, "no_effects", _core.no_effects)

# JAX 0.9's forms of the callbacks the drop-ins copy (read from JAX's own
# functions, which a patch_jax() does not replace): pure_callback's
# parameter ``vectorized`` (refused, gone in 0.10), and jax.debug.callback
# and print without their two-call form (added in 0.10).
pure_callback_vectorized: inspect.Parameter | None = inspect.signature(
    _callback.pure_callback).parameters.get("vectorized")
debug_two_call_form: bool = inspect.signature(
    _debugging.debug_callback).parameters["callback"].default is not (
        inspect.Parameter.empty)
# jax.debug.print's ``skip_format_check``: from JAX 0.7 (0.6 checks every
# format, and a keyword of that name is one more argument of the format).
debug_print_skip_format_check: bool = "skip_format_check" in (
    inspect.signature(_debugging.debug_print).parameters)

# jax.ffi.build_ffi_lowering_function: an FFI custom call's MLIR op; public
# from JAX 0.7, in jax._src.ffi in 0.6.
build_ffi_lowering_function: Callable[..., Any] = getattr(
    jax.ffi, "build_ffi_lowering_function", None) or (
        _ffi.build_ffi_lowering_function)

# jax.debug's effects: public from JAX 0.9 (the ordered one), in
# jax._src.debugging in all.
DebugEffect: type = _debugging.DebugEffect
OrderedDebugEffect: type = _debugging.OrderedDebugEffect

# jax.ffi.register_ffi_type (JAX 0.8 on) registers a state's type with its
# deleter (a dict of two capsules, "type_id" and "type_info"); before 0.8,
# under FFI 0.1, jax.ffi.register_ffi_type_id registers the id alone, and
# XLA takes the deleter with each state (include/hcb/ffi_version.h).
def register_ffi_state_type(name: str, capsules: dict[str, Any],
                            platform: str) -> None:
  register = getattr(jax.ffi, "register_ffi_type", None)
  if register is not None:
    register(name, capsules, platform=platform)
  else:
    jax.ffi.register_ffi_type_id(name, capsules["type_id"], platform=platform)


# JAX refuses a callback's result in the other byte order from 0.10 on
# ("Dtype >f4 is not a valid JAX array type"); 0.9 reports its dtype as any
# other that is not the one declared.  No signature shows it: the one
# difference chosen by JAX's version (with the one below).
refuses_byte_swapped_results: bool = jax.__version_info__ >= (0, 10)

# JAX calls an eager debug callback without the caller's mesh from 0.8 on;
# 0.6 and 0.7 call it inside the caller's ``jax.set_mesh`` (both with the
# first CPU device as the default device).  A behaviour, not a signature:
# chosen by JAX's version.
eager_debug_callback_clears_mesh: bool = jax.__version_info__ >= (0, 8)

# Where a touchpoint's form changed in JAX 0.10, which one this JAX has.
# (JAX 0.6 has no jax.set_mesh at all.)
_SET_MESH_TAKES_NONE = hasattr(jax, "set_mesh") and "None" in str(
    inspect.signature(jax.set_mesh).parameters["mesh"].annotation)
_LOWERING_TAKES_MODULE_CONTEXT = len(inspect.signature(
    _mlir.set_sharding).parameters) == 3  # (ctx, op, sharding)


def no_mesh() -> Any:
  """A context without a mesh: ``jax.set_mesh(None)``, which JAX refuses
  before 0.10 (0.6 has no ``jax.set_mesh``); there, the two thread-local
  values that ``set_mesh`` swaps (config.abstract_mesh_context_manager and
  device_context), set to the empty meshes.  Outside a trace only
  (``set_mesh`` refuses to run inside one)."""
  if _SET_MESH_TAKES_NONE:
    return jax.set_mesh(None)
  return _NoMesh()


class _NoMesh:
  """``jax.set_mesh(None)`` for JAX 0.6 to 0.9 (see :func:`no_mesh`)."""

  __slots__ = ("abstract", "concrete")

  def __enter__(self) -> None:
    from jax._src import config as _config  # pylint: disable=g-import-not-at-top
    from jax._src import mesh as _mesh  # pylint: disable=g-import-not-at-top
    self.abstract = _config.abstract_mesh_context_manager.swap_local(
        _mesh.empty_abstract_mesh)
    # (JAX 0.6 has no empty concrete mesh: None stands for none.)
    self.concrete = _config.device_context.swap_local(
        getattr(_mesh, "empty_concrete_mesh", None))

  def __exit__(self, *exc: Any) -> None:
    from jax._src import config as _config  # pylint: disable=g-import-not-at-top
    _config.abstract_mesh_context_manager.set_local(self.abstract)
    _config.device_context.set_local(self.concrete)


# ---- the generic lowering rule of a primitive --------------------------------

def generic_lowering(prim: Any) -> Callable[..., Any]:
  """The lowering rule JAX registered for ``prim`` on every platform
  (``mlir._lowerings[prim].rule``), for a rule of ours that wraps it (the
  public ``mlir.register_lowering`` replaces a rule, it gives no access to
  the one replaced).  JAX 0.7 on keeps a record with the rule in
  ``.rule``; 0.6 the rule itself."""
  entry: Any = _mlir._lowerings[prim]
  rule: Callable[..., Any] = getattr(entry, "rule", entry)
  return rule


# ---- evaluating a primitive eagerly -------------------------------------------

# dispatch.apply_primitive(prim, *args, **params): runs one primitive
# outside jit by compiling it alone; what JAX's own primitives use as their
# impl rule.  JAX 0.6-0.12.
apply_primitive: Callable[..., Any] = _dispatch.apply_primitive


def forget_runtime_tokens() -> None:
  """Drops the completion tokens JAX keeps of effectful computations.

  dispatch.runtime_tokens (a RuntimeTokenSet with ``clear()``): a token of a
  failed computation holds an error that ``jax.effects_barrier`` raises
  again, and at exit.  barrier_wait has recorded that error already.
  JAX 0.6-0.12.
  """
  _dispatch.runtime_tokens.clear()


def output_runtime_tokens() -> list[Any]:
  """The runtime tokens of the computations with host callbacks (or
  effects) that this thread dispatched last, one per device.

  dispatch.runtime_tokens (a RuntimeTokenSet, thread-local) and its
  ``output_runtime_tokens`` dict {device: token with block_until_ready()}:
  ``jax.effects_barrier`` waits for them, but only in the thread that
  dispatched.  A callback's id is released by another thread, which waits
  for the computations its last program had started (_registry.py).
  JAX 0.6-0.12.
  """
  return list(_dispatch.runtime_tokens.output_runtime_tokens.values())


# ---- is a trace in progress? ------------------------------------------------

# core.trace_state_clean(): whether this thread is at JAX's top level: no
# trace in progress (jit, vmap, grad, ...), primitives are evaluated now.
# jax.set_mesh refuses to run otherwise.  JAX 0.6-0.12.
trace_state_clean: Callable[[], bool] = _core.trace_state_clean
# ---- dispatch of a compiled program (_pacing.py) ------------------------------

# pxla.UnloadedMeshExecutable.build_unsafe_call(self): builds, once per
# executable, the callable that runs a compiled jit program from Python
# (MeshExecutable.unsafe_call, an ExecuteReplicated); ``self.keepalive`` is
# the list of what its lowering kept alive (mlir.ModuleContext.add_keepalive).
# JAX dispatches a program through its C++ fast path only when that callable
# is an ExecuteReplicated (pjit._get_fastpath_data,
# MeshExecutable.create_cpp_call); any other callable is called on every
# dispatch, by JAX's Python path.  ExecuteReplicated.__call__ of a program
# with host callbacks sets dispatch.runtime_tokens.output_runtime_tokens
# (see output_runtime_tokens).  JAX 0.6-0.12.
_Unloaded: Any = _pxla.UnloadedMeshExecutable
_jax_build_unsafe_call: Callable[[Any], Any] = _Unloaded.build_unsafe_call


def wrap_program_calls(
    wrap: Callable[[Sequence[Any], Callable[..., Any]], Callable[..., Any]]
) -> None:
  """Has every compiled jit program built from now on run through
  ``wrap(keepalive, call)``, where ``call`` is JAX's own callable and
  ``keepalive`` what the program's lowering kept alive.  A program whose
  ``wrap`` returns ``call`` itself keeps JAX's C++ fast dispatch; one that
  gets another callable is dispatched by JAX's Python path, through it.
  Installing it again replaces ``wrap``."""

  def build_unsafe_call(self: Any) -> Any:
    return wrap(self.keepalive, _jax_build_unsafe_call(self))

  build_unsafe_call.__wrapped__ = _jax_build_unsafe_call  # type: ignore[attr-defined]
  _Unloaded.build_unsafe_call = build_unsafe_call


def _check_program_calls() -> str | None:
  if "keepalive" not in getattr(_Unloaded, "__dataclass_fields__", {}):
    return "UnloadedMeshExecutable has no keepalive field"
  problem = _has_params(_jax_build_unsafe_call, "self")
  if problem is not None or len(_params(_jax_build_unsafe_call)) != 1:
    return "UnloadedMeshExecutable.build_unsafe_call is not (self)"
  if ("isinstance(executable.unsafe_call, pxla.ExecuteReplicated)"
      not in inspect.getsource(_pjit._get_fastpath_data)):
    return ("pjit._get_fastpath_data no longer keeps the C++ fast path to "
            "an ExecuteReplicated")
  return None


# ---- program order (_order.py) ------------------------------------------------

# dispatch.JAXPR_TO_MLIR_MODULE_EVENT: the jax.monitoring event that
# pxla._cached_lowering_to_hlo reports around lowering a program to MLIR:
# record_scalar at its start, record_event_duration_secs at its end (before
# the module is compiled).  _order.py rewrites the module then.
# JAX 0.6-0.12.
LOWERING_EVENT: str = _dispatch.JAXPR_TO_MLIR_MODULE_EVENT


def has_monitoring_listeners(on_start: Callable[..., Any],
                             on_end: Callable[..., Any]) -> bool:
  """Whether both listeners are registered with jax.monitoring
  (monitoring._scalar_listeners and get_event_duration_listeners(); a user
  may clear them with jax.monitoring.clear_event_listeners).
  JAX 0.6-0.12."""
  return (on_start in _monitoring._scalar_listeners and
          on_end in _monitoring.get_event_duration_listeners())


# core.abstract_token: the abstract value of a token, for the token operand
# and result of ordered callbacks.  Public as jax.ffi.abstract_token from
# JAX 0.11 (jax.core.abstract_token, deprecated, in 0.10).  JAX 0.6-0.12.
abstract_token: Any = _core.abstract_token


# ---- jax.effects_barrier ------------------------------------------------------

# dispatch.RuntimeTokenSet.block_until_ready(self): what jax.effects_barrier()
# runs (api.effects_barrier calls it on dispatch.runtime_tokens, the one
# instance), as do JAX's own atexit hook (dispatch.wait_for_tokens) and
# jax.clear_backends.  It waits for the computations that JAX gave runtime
# tokens, i.e. those with JAX effects; ours have none (they keep JAX's C++
# fast dispatch), so host_callback adds its own wait.  The instance is a
# threading.local, whose attributes are per thread: the method is replaced
# on the class, so every thread's effects_barrier goes through it, whichever
# way the caller imported effects_barrier.  JAX 0.6-0.12.
_TokenSet: Any = _dispatch.RuntimeTokenSet
_jax_block_until_ready: Callable[[Any], None] = _TokenSet.block_until_ready


def wait_for_runtime_tokens() -> None:
  """JAX's own ``jax.effects_barrier()``, without host_callback's wait."""
  _jax_block_until_ready(_dispatch.runtime_tokens)


def extend_effects_barrier(also_wait: Callable[[], None]) -> None:
  """Makes ``jax.effects_barrier()`` call ``also_wait()`` after JAX's own
  wait (also when that raises).  Installing it again replaces
  ``also_wait``."""

  def block_until_ready(self: Any) -> None:
    try:
      _jax_block_until_ready(self)
    finally:
      also_wait()

  block_until_ready.__doc__ = _jax_block_until_ready.__doc__
  block_until_ready.__wrapped__ = _jax_block_until_ready  # type: ignore[attr-defined]
  _TokenSet.block_until_ready = block_until_ready


def _check_effects_barrier() -> str | None:
  import jax._src.api as api  # effects_barrier's own module
  if not callable(getattr(_TokenSet, "block_until_ready", None)):
    return "RuntimeTokenSet has no block_until_ready()"
  if not isinstance(_dispatch.runtime_tokens, _TokenSet):
    return "dispatch.runtime_tokens is not a RuntimeTokenSet"
  if "runtime_tokens.block_until_ready" not in inspect.getsource(
      api.effects_barrier):
    return ("api.effects_barrier no longer calls "
            "dispatch.runtime_tokens.block_until_ready()")
  return None


# ---- effects ------------------------------------------------------------------

# effects.Effect and the sets of effect types allowed in lowering, in
# control flow (cond, while, scan), in remat, in custom_jvp/custom_vjp, and
# kept by partial evaluation.  A tap bound by differentiation rules carries
# an effect so that differentiation keeps it (_tap.py).  JAX 0.6-0.12.
Effect = _effects.Effect


def allow_effect_everywhere(effect_type: type) -> None:
  """Lets ``effect_type`` be lowered and appear in control flow, remat and
  custom derivatives, and be kept by partial evaluation."""
  for effect_set in (_effects.lowerable_effects,
                     _effects.control_flow_allowed_effects,
                     _effects.remat_allowed_effects,
                     _effects.custom_derivatives_allowed_effects,
                     _effects.partial_eval_kept_effects):
    effect_set.add_type(effect_type)


# ---- partial evaluation (remat) -----------------------------------------------

# partial_eval_jaxpr_custom_rules[prim] = rule(saveable, unks_in, inst_in,
# eqn): how remat splits a primitive between the forward and the backward
# pass; ensure_enum(policy result) and SaveableType interpret the remat
# policy's answer.  JAX 0.6-0.12.
partial_eval_jaxpr_custom_rules: dict[Any, Any] = (
    _pe.partial_eval_jaxpr_custom_rules)
ensure_enum: Callable[[Any], Any] = _pe.ensure_enum
SaveableType: type = _pe.SaveableType

# custom_partial_eval_rules[prim] = rule(trace, *tracers, **params): how
# JaxprTrace (linearize and grad, and the partial evaluation of control flow
# under them) stages a primitive; trace.default_process_primitive(prim,
# tracers, params) is what it does without a rule.  JaxprTrace keeps only the
# staged equations that its outputs reach, or that carry an effect of
# partial_eval_kept_effects.  JAX 0.6-0.12.
custom_partial_eval_rules: dict[Any, Any] = _pe.custom_partial_eval_rules

# ---- dead-code elimination ----------------------------------------------------

# dce_rules[prim] = rule(used_outputs, [live_ins,] eqn) -> (used_inputs,
# new eqn or None).  JAX 0.12 added the middle argument (which inputs are
# live); rules here take *args and find the equation last.  A primitive
# without a rule uses _default_dce_rule, which removes an equation whose
# outputs are unused unless it has an effect.  JAX 0.6-0.12.
dce_rules: dict[Any, Callable[..., Any]] = _pe.dce_rules
default_dce_rule: Callable[..., Any] = _pe._default_dce_rule

# ---- batching of cond ---------------------------------------------------------

# batching.fancy_primitive_batchers[cond_p] = rule(axis_data, args, dims, *,
# branches, **params): vmap of lax.cond; with a batched predicate it runs
# both branches and selects.  jax.interpreters.batching re-exports the
# registry.  JAX 0.6-0.12.
fancy_primitive_batchers: dict[Any, Callable[..., Any]] = (
    _batching.fancy_primitive_batchers)

# ---- batching of while --------------------------------------------------------

# batching.fancy_primitive_batchers[while_p] = rule(axis_data, args, dims, *,
# cond_nconsts, cond_jaxpr, body_nconsts, body_jaxpr): vmap of
# lax.while_loop.  With a batched predicate the loop runs while any element's
# predicate holds, and XLA's lowering of it evaluates the predicate twice per
# iteration: in the loop's condition and again in its body, for the mask
# that keeps finished elements (_containers.py).  The rule receives an
# interpreters.batching.AxisData (name, size, spmd_name,
# explicit_mesh_axis), read by vmap_axis.  JAX 0.6-0.12.


# batching.batch_jaxpr(closed_jaxpr, axis_data, in_batched, instantiate) ->
# (batched ClosedJaxpr, out_batched): which outputs of a jaxpr are batched
# when the given inputs are; what JAX's while batching rule uses to find
# whether the predicate is batched.  JAX 0.6-0.12.
batch_jaxpr: Callable[..., Any] = _jax_batching.batch_jaxpr


def vmap_axis(axis_data: Any) -> tuple[Any, int, Any, Any]:
  """(name, size, spmd_name, explicit_mesh_axis) of the vmap a batching
  rule runs under: what ``jax.vmap`` takes to batch the same way (the name
  is JAX's placeholder object for a vmap without ``axis_name``)."""
  return (axis_data.name, axis_data.size, axis_data.spmd_name,
          getattr(axis_data, "explicit_mesh_axis", None))


# JAX 0.6 and 0.7 trace the function of a ``pmap`` in
# pxla.stage_parallel_callable(pci, fun) (a pmap called eagerly) or in
# partial_eval.DynamicJaxprTrace.process_map(primitive, f, tracers, params)
# (a pmap inside jit or inside another pmap), with the map's axis in the
# axis env beside vmap's and nothing to tell them apart; from 0.8 on
# ``pmap`` traces through ``shard_map``, whose axes are the abstract mesh's
# manual axes.  So there the staging frames on the stack say that pmaps
# are tracing, and their global axis sizes how many devices they span.
_PMAP_STAGING: dict[Any, Callable[[Any], int]] = {} if (
    jax.__version_info__ >= (0, 8)) else {
        getattr(_pxla, "stage_parallel_callable").__code__:
            lambda f_locals: f_locals["pci"].global_axis_size,
        getattr(_pe.DynamicJaxprTrace, "process_map").__code__:
            lambda f_locals: f_locals["params"]["global_axis_size"]}


def pmap_devices_tracing() -> int:
  """How many devices the ``pmap``s of JAX 0.6 or 0.7 that are tracing the
  running code span together (1 where none is, and always from 0.8 on:
  see :func:`jax.sharding.get_abstract_mesh`'s manual axes instead)."""
  devices = 1
  if not _PMAP_STAGING:
    return devices
  frame: types.FrameType | None = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    size_of = _PMAP_STAGING.get(frame.f_code)
    if size_of is not None:
      devices *= size_of(frame.f_locals)
    frame = frame.f_back
  return devices


def _check_pmap_staging() -> str | None:
  if not _PMAP_STAGING:
    return None
  return (_has_params(getattr(_pxla, "stage_parallel_callable"), "pci") or
          _has_params(getattr(_pe.DynamicJaxprTrace, "process_map"),
                      "params"))


# ---- lowering under SPMD partitioning -----------------------------------------

# The lowering context's axis_context is a sharding_impls.ShardingContext
# (jit over sharded operands: num_devices) or SPMDAxisContext (shard_map,
# manual axes).  JAX 0.6-0.12.
ShardingContext = _sharding_impls.ShardingContext
SPMDAxisContext = _sharding_impls.SPMDAxisContext

# Shardy's sharding annotations: SdyArrayList(shardings), SdyArray(mesh_shape,
# dim_shardings, logical_device_ids=...), SdyDim(axes, is_open).  The GSPMD
# partitioner's annotation is xla_client.OpSharding.  JAX 0.6-0.12.
SdyArrayList: type = _sharding_impls.SdyArrayList
SdyArray: type = _sharding_impls.SdyArray
SdyDim: type = _sharding_impls.SdyDim
OpSharding: Any = _xc.OpSharding


def ir_type(module_context: Any, aval: Any) -> Any:
  """mlir.aval_to_ir_type: (module_context, aval) from JAX 0.10, (aval) in
  0.9."""
  if _LOWERING_TAKES_MODULE_CONTEXT:
    return _mlir.aval_to_ir_type(module_context, aval)
  return cast(Any, _mlir.aval_to_ir_type)(aval)


def build_sdy(shardings: Any, module_context: Any) -> Any:
  """The MLIR attribute of an SdyArrayList: ``build(cache)`` with the
  module's ``sharding_attr_cache`` from JAX 0.10, ``build()`` in 0.9."""
  if _LOWERING_TAKES_MODULE_CONTEXT:
    return shardings.build(module_context.sharding_attr_cache)
  return shardings.build()

# mlir.wrap_with_sharding_op(ctx, value, aval, sharding) and
# mlir.set_sharding(module_context, op, sharding): annotate an MLIR value or
# op with a sharding.  Not re-exported by jax.interpreters.mlir in 0.6-0.12.
wrap_with_sharding_op: Callable[..., Any] = _mlir.wrap_with_sharding_op


def set_sharding(module_context: Any, op: Any, sharding: Any) -> None:
  """mlir.set_sharding: (module_context, op, sharding) from JAX 0.10, (op,
  sharding) in 0.9."""
  if _LOWERING_TAKES_MODULE_CONTEXT:
    _mlir.set_sharding(module_context, op, sharding)
  else:
    cast(Any, _mlir.set_sharding)(op, sharding)

# mlir.wrap_with_full_to_shard_op / wrap_with_shard_to_full_op(ctx, value,
# aval, sharding): the GSPMD partitioner's way into and out of a region
# where every device computes on its own (MANUAL), as JAX's shard_map
# lowers without Shardy.  JAX 0.6-0.12.
wrap_with_full_to_shard_op: Callable[..., Any] = (
    _mlir.wrap_with_full_to_shard_op)
wrap_with_shard_to_full_op: Callable[..., Any] = (
    _mlir.wrap_with_shard_to_full_op)

# dispatch.prim_requires_devices_during_lowering: primitives whose lowering
# is given the computation's devices (ShardingContext.device_assignment),
# as JAX's pure_callback and io_callback are: a callback under jit over
# sharded operands names the device that runs it.  JAX 0.6-0.12.
prim_requires_devices_during_lowering: set[Any] = (
    _dispatch.prim_requires_devices_during_lowering)

# ModuleContext.add_host_callback(callback) and .host_callbacks: the Python
# callables a program registers with jaxlib as its host callbacks.  JAX
# runs a program that has any with runtime tokens, one per device, that
# tell when each run has finished (pxla.ExecuteReplicated,
# has_host_callbacks), which the pacing under jit over sharded operands
# waits on (_lowering._with_runtime_tokens).  JAX 0.6-0.12.
def add_host_callback(module_context: Any, callback: Any) -> None:
  module_context.add_host_callback(callback)


def host_callbacks(module_context: Any) -> Sequence[Any]:
  return module_context.host_callbacks


# callback.emit_python_callback(ctx, callback, token, operands,
# operand_avals, result_avals, *, has_side_effect, returns_token,
# sharding): JAX's own lowering of a Python callback -- the only custom call
# whose single-device (maximal) sharding XLA's Shardy partitioner keeps, so
# the one way to run a callback once, on one chosen device, under jit over
# sharded operands (_lowering.py).  JAX 0.6-0.12; before 0.10 it annotates the
# token (under Shardy, with results) replicated, which XLA refuses for a
# side-effecting op, where 0.10 puts it on the results' device: done here
# for every version.  ``returns_token`` (from JAX 0.8; only TPU's lowering
# reads it) is left out for a JAX without it.
_EMIT_TAKES_RETURNS_TOKEN = "returns_token" in inspect.signature(
    _callback.emit_python_callback).parameters


def emit_python_callback(ctx: Any, callback: Any, token: Any,
                         operands: Any, operand_avals: Any,
                         result_avals: Any, **kwargs: Any) -> Any:
  if not _EMIT_TAKES_RETURNS_TOKEN:
    kwargs.pop("returns_token", None)
  results, token_out, keep = _callback.emit_python_callback(
      ctx, callback, token, operands, operand_avals, result_avals, **kwargs)
  sharding = kwargs.get("sharding")
  if (token is not None and token_out is not None and result_avals and
      isinstance(sharding, SdyArrayList)):
    shardings = tuple(cast(Any, sharding).shardings)
    set_sharding(ctx.module_context, token_out.owner, SdyArrayList(
        (SdyArray(mesh_shape=(), dim_shardings=(),
                  logical_device_ids=shardings[0].logical_device_ids),
         *shardings)))
  return results, token_out, keep

# callback._callback_op_sharding(axis_context, sharding, avals_out): the
# sharding JAX gives its own callbacks inside shard_map (MANUAL).
# JAX 0.6-0.12.
callback_op_sharding: Callable[..., Any] = _callback._callback_op_sharding


# JAX 0.6's XLA (Shardy opt-in there) refuses a manual computation whose
# only result is a token ("expected the first use of
# @xla.sdy.manual_computation_body to be by a xla.sdy.LocalToGlobalShape");
# 0.7's takes it.  Found by version: no signature shows it.
shardy_region_needs_a_value: bool = jax.__version_info__ < (0, 7)


def use_shardy_partitioner() -> bool:
  """Whether JAX lowers with the Shardy partitioner (the default since JAX
  0.7); the ``jax_use_shardy_partitioner`` option."""
  # Config options are attributes that jax.config defines at run time:
  # getattr, as the type checker knows of none of them.
  return bool(getattr(jax.config, "jax_use_shardy_partitioner"))


# ---- the checks ---------------------------------------------------------------

def _params(fn: Callable[..., Any]) -> list[str]:
  return list(inspect.signature(fn).parameters)


def _has_params(fn: Callable[..., Any], *names: str) -> str | None:
  missing = [n for n in names if n not in _params(fn)]
  return f"has no parameter(s) {missing}" if missing else None


def _check_trace_state_clean() -> str | None:
  if trace_state_clean() is not True:
    return "is not True outside any trace"
  inside: list[bool] = []
  jax.make_jaxpr(lambda: inside.append(trace_state_clean()))()
  return None if inside == [False] else f"is {inside} inside make_jaxpr"


def _check_dce_rule() -> str | None:
  n = len(_params(default_dce_rule))
  if n not in (2, 3):
    return (f"_default_dce_rule takes {n} arguments, expected (used_outputs, "
            "eqn) or (used_outputs, live_ins, eqn)")
  return None


def _check_custom_partial_eval() -> str | None:
  if not isinstance(custom_partial_eval_rules, dict):
    return "custom_partial_eval_rules is not a dict"
  return _has_params(_pe.JaxprTrace.default_process_primitive, "primitive",
                     "tracers", "params")


def _check_effect_sets() -> str | None:
  for name in ("lowerable_effects", "control_flow_allowed_effects",
               "remat_allowed_effects", "custom_derivatives_allowed_effects",
               "partial_eval_kept_effects"):
    if not hasattr(getattr(_effects, name, None), "add_type"):
      return f"effects.{name} is gone or has no add_type"
  return None


def _check_cond_batcher() -> str | None:
  from jax.extend.core import primitives
  rule = fancy_primitive_batchers.get(primitives.cond_p)
  if rule is None:
    return "has no rule for cond_p"
  return _has_params(getattr(rule, "__wrapped__", rule), "axis_data", "args",
                     "dims", "branches")


def _check_while_batcher() -> str | None:
  from jax.extend.core import primitives
  rule = fancy_primitive_batchers.get(primitives.while_p)
  if rule is None:
    return "has no rule for while_p"
  return _has_params(getattr(rule, "__wrapped__", rule), "axis_data", "args",
                     "dims", "cond_nconsts", "cond_jaxpr", "body_nconsts",
                     "body_jaxpr")


def _check_while_lowering() -> str | None:
  from jax.extend.core import primitives
  rule = generic_lowering(primitives.while_p)
  return _has_params(getattr(rule, "__wrapped__", rule), "ctx",
                     "cond_jaxpr", "body_jaxpr", "cond_nconsts",
                     "body_nconsts")


def _check_batch_jaxpr() -> str | None:
  closed = jax.make_jaxpr(lambda c, x: (c * 2, x + 1))(1.0, 2.0)
  axis_data = _jax_batching.AxisData("i", 3, None, None)
  _, out_batched = batch_jaxpr(closed, axis_data, (True, False), False)
  if list(out_batched) != [True, False]:
    return f"finds outputs batched as {out_batched}, expected [True, False]"
  return None


def _check_axis_data() -> str | None:
  from jax._src.interpreters import batching
  axis_data = batching.AxisData("i", 3, None, None)
  if vmap_axis(axis_data) != ("i", 3, None, None):
    return f"AxisData('i', 3, None, None) reads as {vmap_axis(axis_data)}"
  return None


# (name, check): each check returns None when the touchpoint is as used here,
# or what changed.
TOUCHPOINTS: Sequence[tuple[str, Callable[[], str | None]]] = (
    ("dispatch.apply_primitive",
     lambda: _has_params(apply_primitive, "prim")),
    ("core.trace_state_clean", _check_trace_state_clean),
    ("dispatch.JAXPR_TO_MLIR_MODULE_EVENT",
     lambda: None if LOWERING_EVENT == (
         "/jax/core/compile/jaxpr_to_mlir_module_duration")
     else f"is {LOWERING_EVENT!r}"),
    ("monitoring listener lists",
     lambda: None if isinstance(_monitoring._scalar_listeners, list) and
     isinstance(_monitoring.get_event_duration_listeners(), list)
     else "are not lists"),
    ("core.abstract_token",
     lambda: None if type(abstract_token).__name__ == "AbstractToken"
     else f"is a {type(abstract_token).__name__}"),
    ("dispatch.runtime_tokens.clear",
     lambda: None if callable(getattr(_dispatch.runtime_tokens, "clear", None))
     else "runtime_tokens has no clear()"),
    ("dispatch.runtime_tokens.output_runtime_tokens",
     lambda: None if isinstance(getattr(_dispatch.runtime_tokens,
                                        "output_runtime_tokens", None), dict)
     else "runtime_tokens has no output_runtime_tokens dict"),
    ("dispatch.RuntimeTokenSet.block_until_ready (jax.effects_barrier)",
     _check_effects_barrier),
    ("pxla.UnloadedMeshExecutable.build_unsafe_call and keepalive "
     "(the C++ fast path)", _check_program_calls),
    ("effects.Effect and the allowed-effect sets", _check_effect_sets),
    ("partial_eval.partial_eval_jaxpr_custom_rules",
     lambda: None if isinstance(partial_eval_jaxpr_custom_rules, dict)
     else "is not a dict"),
    ("partial_eval.custom_partial_eval_rules and "
     "JaxprTrace.default_process_primitive", _check_custom_partial_eval),
    ("partial_eval.ensure_enum and SaveableType",
     lambda: None if ensure_enum(SaveableType()) is not None
     else "ensure_enum returned None"),
    ("partial_eval.dce_rules and _default_dce_rule", _check_dce_rule),
    ("batching.fancy_primitive_batchers[cond_p]", _check_cond_batcher),
    ("batching.fancy_primitive_batchers[while_p]", _check_while_batcher),
    ("mlir._lowerings[while_p].rule", _check_while_lowering),
    ("batching.batch_jaxpr", _check_batch_jaxpr),
    ("batching.AxisData (name, size, spmd_name, explicit_mesh_axis)",
     _check_axis_data),
    ("pxla.stage_parallel_callable and DynamicJaxprTrace.process_map "
     "(pmap's tracing, JAX 0.6 and 0.7)",
     _check_pmap_staging),
    ("sharding_impls.ShardingContext",
     lambda: _has_params(ShardingContext, "num_devices")),
    ("sharding_impls.SdyArray",
     lambda: _has_params(SdyArray, "mesh_shape", "dim_shardings",
                         "logical_device_ids")),
    ("sharding_impls.SdyDim", lambda: _has_params(SdyDim, "axes", "is_open")),
    ("sharding_impls.SdyArrayList",
     lambda: None if callable(SdyArrayList) else "is not a class"),
    ("xla_client.OpSharding",
     lambda: None if hasattr(OpSharding, "Type") and hasattr(
         OpSharding.Type, "MAXIMAL") else "has no Type.MAXIMAL"),
    ("mlir.wrap_with_sharding_op",
     lambda: _has_params(wrap_with_sharding_op, "ctx", "x", "aval_out",
                         "sharding")),
    ("mlir.set_sharding",
     lambda: _has_params(_mlir.set_sharding, "op", "sharding")),
    ("debugging.debug_callback and callback.pure_callback",
     lambda: _has_params(_debugging.debug_callback, "callback") or
     _has_params(_callback.pure_callback, "vmap_method")),
    ("core.jaxprs_in_params and no_effects",
     lambda: None if callable(jaxprs_in_params) and not no_effects
     else "are not a function and an empty set"),
    ("mlir.wrap_with_full_to_shard_op and wrap_with_shard_to_full_op",
     lambda: _has_params(wrap_with_full_to_shard_op, "ctx", "x", "aval_out",
                         "sharding") or _has_params(
                             wrap_with_shard_to_full_op, "ctx", "x",
                             "aval_out", "sharding")),
    ("mlir.ModuleContext.add_host_callback and host_callbacks",
     lambda: None if callable(getattr(_mlir.ModuleContext,
                                      "add_host_callback", None)) and
     "host_callbacks" in _mlir.ModuleContext.__annotations__
     else "are not there"),
    ("dispatch.prim_requires_devices_during_lowering",
     lambda: None if isinstance(prim_requires_devices_during_lowering, set)
     else "is not a set"),
    ("sharding_impls.ShardingContext.device_assignment",
     lambda: _has_params(ShardingContext, "device_assignment")),
    ("callback.emit_python_callback",
     lambda: _has_params(_callback.emit_python_callback, "ctx", "callback",
                         "token", "operands", "operand_avals", "result_avals",
                         "has_side_effect", "partitioned", "sharding")),
    ("callback._callback_op_sharding",
     lambda: _has_params(callback_op_sharding, "axis_context", "sharding",
                         "avals_out")),
    ("config jax_use_shardy_partitioner",
     lambda: None if isinstance(use_shardy_partitioner(), bool)
     else "is not a bool"),
)


def check_touchpoints() -> list[str]:
  """What changed in the JAX installed, one line per touchpoint that is not
  as this module uses it (empty when all are)."""
  problems = []
  for name, check in TOUCHPOINTS:
    try:
      problem = check()
    except Exception as e:  # a missing name, a signature that cannot be read
      problem = f"{type(e).__name__}: {e}"
    if problem is not None:
      problems.append(f"jax._src {name} (JAX {jax.__version__}): {problem}")
  return problems
