"""``buffer_callback``: host callbacks that work in place on XLA's buffers.

Lowers to the ``hcb_buffer_call`` custom call (src/ffi/handlers.h): a call
whose target works in place on the device's buffers (on CPU the same
handler as ``call``'s ``hcb_call``; on CUDA it gets device pointers and
XLA's stream), with the result buffers aliased to operands where
``input_output_aliases`` says so.  The C target (python/_hcb/buffer.c)
hands the callback :class:`Buffer` objects that point at XLA's memory -- no
copy in either direction -- and invalidates them when the callback
returns.  A :class:`NativeCallback` is a C function instead: it runs with
no Python at all.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad
from jax.interpreters import batching
from jax.interpreters import mlir

from host_callback import _args
from host_callback import _batching
from host_callback import _containers
from host_callback import _hcb
from host_callback import _lowering
from host_callback import _native
from host_callback import _runtime
from host_callback import _sites
from host_callback._native import NativeCallback
from host_callback._types import CallbackFlavor

Buffer = _hcb.Buffer


class ExecutionStage(enum.Enum):
  """The stage of XLA's FFI at which a callback runs.  As JAX's: its
  values are XLA's numbers, and a member is no int (``EXECUTE == 3`` is
  false) and reads ``ExecutionStage.EXECUTE`` in ``str`` and ``repr``."""

  INSTANTIATE = _hcb.STAGE_INSTANTIATE
  PREPARE = _hcb.STAGE_PREPARE
  INITIALIZE = _hcb.STAGE_INITIALIZE
  EXECUTE = _hcb.STAGE_EXECUTE

  def __str__(self) -> str:
    return f"ExecutionStage.{self.name}"

  __repr__ = __str__


class ExecutionContext:
  """What a buffer callback knows about the call: the ``device`` running it,
  the ``stage`` (always ``EXECUTE`` here) and, on a GPU, XLA's ``stream``."""

  __slots__ = ("device", "stage")

  def __init__(self, device: jax.Device,
               stage: ExecutionStage = ExecutionStage.EXECUTE):
    self.device = device
    self.stage = stage

  @property
  def stream(self) -> int:
    """XLA's CUDA stream (a ``cudaStream_t`` as an int) on which the
    computation runs, as JAX's ``ExecutionContext.stream`` gives it: enqueue
    the callback's GPU work on it (``cupy.cuda.ExternalStream(ctx.stream)``)
    so that it reads the inputs after XLA wrote them and XLA reads the
    results after it wrote them.  Valid only while the callback runs.  CPU
    computations have none: raises ``jax.errors.JaxRuntimeError``
    ("UNIMPLEMENTED: XLA FFI GPU context is not available"), as JAX's
    does."""
    if self.device.platform == "gpu":
      stream = _hcb.call_stream()
      if stream:
        return stream
      raise jax.errors.JaxRuntimeError(
          "FAILED_PRECONDITION: ExecutionContext.stream is XLA's stream "
          f"during the buffer callback on {self.device} only; read it inside "
          "the callback, on the thread that runs it")
    raise jax.errors.JaxRuntimeError(
        "UNIMPLEMENTED: XLA FFI GPU context is not available "
        f"(ExecutionContext.stream: {self.device} is a CPU device, which has "
        "no stream; streams exist only for GPU buffer callbacks)")

  def __repr__(self) -> str:
    return f"ExecutionContext(device={self.device}, stage={self.stage.name})"


class BufferSite(NamedTuple):
  """What a compiled Python buffer callback refers to by id.  The C target
  reads the fields by name when it is registered (python/_hcb/buffer.c)."""

  callback: Callable[..., Any]
  in_treedef: Any
  out_treedef: Any
  context_type: type[ExecutionContext]
  # Shortcuts of the call (the common shapes): the number of operands when
  # (args, kwargs) is a tuple of them and no keyword, else -1; whether the
  # results are one array, not a container.
  positional_operands: int
  one_result: bool

  @property
  def jax_error_log(self) -> _sites.JaxErrorLog:
    """A failure is JAX's buffer_callback's: the computation fails with it,
    nothing is logged or kept for barrier_wait."""
    return _sites.JaxErrorLog(None, "", keep=False)

  def register(self) -> int:
    return _hcb.register_buffer_callback(
        site=self, name=_sites.callable_name(self.callback))


buffer_callback_p = Primitive("hcb_buffer_callback")
buffer_callback_p.multiple_results = True


def _impl(*args: Any, **params: Any) -> Any:
  return _runtime.apply_eagerly(buffer_callback_p, *args, **params)


def _abstract_eval(*avals: Any, result_avals: tuple[Any, ...],
                   **params: Any) -> tuple[Any, ...]:
  del avals, params
  _containers.keep_containers()
  return result_avals


def _lowering_rule(ctx: mlir.LoweringRuleContext, *args: Any,
                   site: BufferSite | NativeCallback, flavor: CallbackFlavor,
                   input_output_aliases: tuple[tuple[int, int], ...],
                   **params: Any) -> Any:
  # command_buffer_compatible: a trait of the registered handler, not of
  # one call; hcb_buffer_call's is the same for every buffer callback.
  del params
  return _lowering.lower(
      ctx, "hcb_buffer_call", args, what="buffer_callback",
      has_side_effect=flavor is not CallbackFlavor.PURE, device_index=0,
      operand_output_aliases=dict(input_output_aliases),
      callback_id=np.uint64(_runtime.lowered_site_id(ctx, site)))


def _jvp(*args: Any, **params: Any) -> Any:
  del args, params
  raise ValueError(
      "Buffer callbacks do not support JVP. Please use `jax.custom_jvp` to "
      "use callbacks while taking gradients.")


def _transpose(*args: Any, **params: Any) -> Any:
  del args, params
  raise ValueError(
      "Buffer callbacks do not support transpose. Please use "
      "`jax.custom_vjp` to use callbacks while taking gradients.")


def _batching_rule(args: Sequence[Any], dims: Sequence[Any], *,
                   result_avals: tuple[Any, ...], **params: Any
                   ) -> tuple[list[Any], list[int]]:
  def bind_batched(batched_args: list[Any], size: int) -> Sequence[Any]:
    batched = tuple(a.update(shape=(size, *a.shape)) for a in result_avals)
    return buffer_callback_p.bind(*batched_args, result_avals=batched,
                                  **params)

  aliased = frozenset(i for i, _ in params["input_output_aliases"])
  site = params["site"]
  name = _sites.callable_name(
      site if isinstance(site, NativeCallback) else site.callback)
  return _batching.batch_by_method(
      args, dims, vmap_method=params["vmap_method"],
      what=f"buffer_callback of {name!r}", nout=len(result_avals),
      # JAX's words first: its users search for them.
      legacy_message="vmap is only supported for the buffer_callback "
      "primitive when vmap_method is one of 'sequential', "
      "'sequential_unrolled', 'expand_dims', 'broadcast_all', or "
      "'legacy_vectorized'. Got vmap_method=None. ",
      bind_one=lambda full: buffer_callback_p.bind(
          *full, result_avals=result_avals, **params),
      bind_batched=bind_batched, always_broadcast=aliased)


buffer_callback_p.def_impl(_impl)
buffer_callback_p.def_abstract_eval(_abstract_eval)
# Not given the devices, as JAX's buffer_callback is not: a program that
# mixes NamedShardings of several meshes keeps working (JAX refuses such a
# program where a primitive needs the devices).  Under jit over sharded
# operands it then runs on JAX's Python callback (_lowering.lower).
_lowering.register_lowering(buffer_callback_p, _lowering_rule,
                            needs_devices=False)
ad.primitive_jvps[buffer_callback_p] = _jvp
ad.primitive_transposes[buffer_callback_p] = _transpose
batching.primitive_batchers[buffer_callback_p] = _batching_rule
_containers.keep_when_unused(buffer_callback_p)


def _static_aliases(input_output_aliases: Mapping[int, int] | None,
                    args: tuple[Any, ...], in_avals: list[Any],
                    result_avals: tuple[Any, ...]
                    ) -> tuple[tuple[int, int], ...]:
  aliases: list[tuple[int, int]] = []
  for i, o in sorted((input_output_aliases or {}).items()):
    i, o = int(i), int(o)
    mapping = f"input_output_aliases contains the mapping '{i}:{o}'"
    if i >= len(args):
      raise ValueError(f"{mapping} with input index {i} outside the range "
                       f"[0, {len(args)}).")
    if o >= len(result_avals):
      raise ValueError(f"{mapping} with output index {o} outside the range "
                       f"[0, {len(result_avals)}).")
    in_aval, out_aval = in_avals[i], result_avals[o]
    if (in_aval.shape, in_aval.dtype) != (out_aval.shape, out_aval.dtype):
      raise ValueError(f"{mapping} referring to an input with abstract value "
                       f"{in_aval} and an output with a different abstract "
                       f"value {out_aval}.")
    aliases.append((i, o))
  return tuple(aliases)


def _result_aval(leaf: Any, result_shape_dtypes: Any) -> ShapedArray:
  """One leaf of ``result_shape_dtypes`` as an aval, or a clear error."""
  try:
    return ShapedArray(leaf.shape, leaf.dtype)
  except Exception:
    raise TypeError(
        "buffer_callback: result_shape_dtypes must be a pytree whose leaves "
        "have 'shape' and 'dtype' (e.g. jax.ShapeDtypeStruct), got the leaf "
        f"{leaf!r} ({type(leaf).__name__}) in {result_shape_dtypes!r}"
    ) from None


def _check_aliases(aliases: Any) -> None:
  """``input_output_aliases``: None or a mapping of input index to output
  index (the ranges are checked per call, as JAX does)."""
  if aliases is None:
    return
  if not isinstance(aliases, Mapping):
    raise TypeError(
        "buffer_callback: input_output_aliases must be None or a dict of "
        "input index to output index, got "
        f"{aliases!r} ({type(aliases).__name__})")
  for i, o in aliases.items():
    _args.check_index("buffer_callback", "an input_output_aliases key", i)
    _args.check_index("buffer_callback", "an input_output_aliases value", o)


@_args.keywords("buffer_callback")
def buffer_callback(callback: Callable[..., None] | NativeCallback,
                    result_shape_dtypes: Any, *,
                    has_side_effect: bool = False,
                    vmap_method: str | None = None,
                    input_output_aliases: Mapping[int, int] | None = None,
                    command_buffer_compatible: bool = False
                    ) -> Callable[..., Any]:
  """A callback that writes its results in place into XLA's buffers.

  ``callback(ctx, out, *args, **kwargs)`` runs on the host while the
  computation waits.  ``ctx`` is an :class:`ExecutionContext`; ``out`` has
  the structure of ``result_shape_dtypes`` with a writable :class:`Buffer`
  per leaf; ``args``/``kwargs`` are those of the call with a read-only
  :class:`Buffer` per array.  A Buffer points at XLA's memory:
  ``numpy.asarray(buf)`` is a view, not a copy, and a Buffer kept after the
  callback returns raises on use.  The callback must return ``None``.

  On a GPU the Buffers are device memory: ``cupy.asarray(buf)``
  (``__cuda_array_interface__``) or ``cupy.from_dlpack(buf)`` view them,
  and host access (``numpy.asarray``, ``memoryview``) raises.  The
  callback runs while XLA enqueues the computation, not after the device
  reached it: do the work on ``ctx.stream`` (``with
  cupy.cuda.ExternalStream(ctx.stream):``), or on the default stream a
  DLPack consumer passes to ``__dlpack__`` (ordered after XLA's, and XLA's
  after it when the callback returns).  Results written on a stream the
  callback made itself must be finished there (``stream.synchronize()``)
  before it returns: that stream may be gone when XLA reads them.
  Sub-byte types (``int4``, ...) are refused on GPU.

  Args:
    callback: the Python function, or a C function from
      :func:`native_call`.
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``
      (e.g. ``jax.ShapeDtypeStruct``): the results.
    has_side_effect: keep the call even when its results are unused.
    vmap_method: as for ``jax.pure_callback`` (``None``: vmap raises).
    input_output_aliases: ``{input index: output index}`` of flattened
      arguments and results that share a buffer.
    command_buffer_compatible: accepted for compatibility; it changes
      nothing here (the callback runs at every execution).

  Returns:
    A function of arrays (pytrees) that returns the results as JAX arrays.
  """
  if not _native.is_native(callback, NativeCallback, "buffer_callback"):
    _args.check_callable("buffer_callback", "callback", callback)
  _batching.check_vmap_method(vmap_method)
  has_side_effect = _args.check_bool("buffer_callback", "has_side_effect",
                                     has_side_effect)
  command_buffer_compatible = _args.check_bool(
      "buffer_callback", "command_buffer_compatible",
      command_buffer_compatible)
  _check_aliases(input_output_aliases)
  out_treedef: Any  # jax.tree_util.PyTreeDef: jaxlib has no stub for it
  flat_shapes, out_treedef = jax.tree_util.tree_flatten(result_shape_dtypes)
  result_avals = tuple(_result_aval(x, result_shape_dtypes)
                       for x in flat_shapes)
  one_result = out_treedef == jax.tree_util.tree_structure(0)
  flavor = (CallbackFlavor.IO_CALLBACK if has_side_effect
            else CallbackFlavor.PURE)
  func = (callback if isinstance(callback, NativeCallback)
          else _sites.hashable_callable(callback))

  def wrapped(*args: Any, **kwargs: Any) -> Any:
    flat_args, in_treedef = jax.tree_util.tree_flatten((args, kwargs))
    in_avals = [jax.typeof(x) for x in flat_args]
    aliases = _static_aliases(input_output_aliases, args, in_avals,
                              result_avals)
    positional: Any = jax.tree_util.tree_structure(
        (tuple(range(len(flat_args))), {}))
    site = (func if isinstance(func, NativeCallback)
            else BufferSite(func, in_treedef, out_treedef, ExecutionContext,
                            len(flat_args) if positional == in_treedef
                            else -1, one_result))
    outs = buffer_callback_p.bind(
        *flat_args, site=site, result_avals=result_avals, flavor=flavor,
        input_output_aliases=aliases, vmap_method=vmap_method,
        command_buffer_compatible=bool(command_buffer_compatible))
    return out_treedef.unflatten(outs)

  return wrapped
