"""Program order: callbacks run in the order the program issues them.

XLA keeps only the order that data imposes: two side-effecting custom calls
with no data between them may run in either order, or at once.  So every
ordered callback (a tap, a print, a ``call`` or a ``buffer_callback``, not
``PURE`` ones) is lowered with a token operand and a token result
(``_lowering.lower``), and once JAX has lowered the whole program to MLIR,
this module chains those tokens through it in program order: each
callback's token operand is the previous callback's token result.

The chain goes everywhere a callback can be:

- straight-line code: from one custom call to the next;
- ``cond`` (``stablehlo.case``): each branch starts from the token before
  the ``case`` and returns its last token as an extra result;
- ``while_loop``/``fori_loop``/``scan`` (``stablehlo.while``): the token is
  one more loop-carried value; the predicate region starts each iteration
  from it (its callbacks run before the body's, as XLA evaluates the
  predicate first);
- nested ``jit`` (``func.call`` of a private function): the function takes
  the token as one more argument and returns it as one more result;
- any other op with regions (``shard_map``'s manual computation): its
  regions are chained inside, and the op is ordered as a whole by
  ``stablehlo.optimization_barrier``s, only where that orders callbacks
  and never over a constant when there is a choice (_Chainer._opaque): a
  barrier hides its operands from the compiler, and a program must compute
  the same numbers with callbacks as without.

The main function's signature is unchanged (it starts from a new token), so
the program is called exactly as before: no JAX effect, and JAX's C++ fast
dispatch is kept.

When: JAX reports the end of each program's lowering to MLIR as a
monitoring event (``jax.monitoring``, ``_jax.LOWERING_EVENT``); the
lowering rules note each module that has an ordered callback, and the
listener rewrites those modules then, before XLA compiles them.  A module
lowered some other way keeps a fresh token per callback: it runs, only
without the order guarantee.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

import jax.monitoring
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import mlir

from host_callback import _jax

ORDERED_TARGETS = frozenset({"hcb_tap", "hcb_call", "hcb_buffer_call"})


class _Pending(threading.local):
  """Per thread: a stack of lowerings in progress (JAX reports the start and
  the end of each), each with the modules that hold ordered callbacks."""

  def __init__(self) -> None:
    self.frames: list[list[Any]] = []


_pending = _Pending()
_lock = threading.Lock()


def _on_start(event: str, value: float, **kwargs: str | int) -> None:
  del value, kwargs
  if event == _jax.LOWERING_EVENT:
    _pending.frames.append([])


def _on_end(event: str, duration_secs: float, **kwargs: str | int) -> None:
  del duration_secs, kwargs
  if event == _jax.LOWERING_EVENT and _pending.frames:
    for module in _pending.frames.pop():
      try:
        chain_module(module)
      except Exception:  # a failed lowering's module, or a bug here
        # JAX reports the end of a lowering that raised too: never hide
        # its error, nor stop a program for want of order.
        logging.getLogger("host_callback").warning(
            "host_callback: could not order the callbacks of a program; "
            "they run, but possibly not in program order", exc_info=True)


def ensure_listening() -> None:
  """Registers the listeners (again, if the user cleared JAX's listeners)."""
  if _jax.has_monitoring_listeners(_on_start, _on_end):
    return
  with _lock:
    if not _jax.has_monitoring_listeners(_on_start, _on_end):
      jax.monitoring.register_scalar_listener(_on_start)
      jax.monitoring.register_event_duration_secs_listener(_on_end)


def note(ctx: mlir.LoweringRuleContext) -> None:
  """Called by the lowering of an ordered callback: its module is chained
  when its lowering ends."""
  ensure_listening()
  if _pending.frames:
    frame = _pending.frames[-1]
    module = ctx.module_context.module
    if not any(m is module for m in frame):
      frame.append(module)


# ---- the rewrite ------------------------------------------------------------

def _token_type() -> Any:
  return hlo.TokenType.get()


_MARK = "hcb_order"  # a frontend attribute: "first" (JAX's callback)
_FRONTEND = "mhlo.frontend_attributes"


def _frontend_attributes(op: Any) -> dict[str, Any]:
  op = getattr(op, "operation", op)
  if _FRONTEND not in op.attributes:
    return {}
  old = ir.DictAttr(op.attributes[_FRONTEND])
  return {old[i].name: old[i].attr for i in range(len(old))}


def _set_frontend_attribute(op: Any, name: str, value: str) -> None:
  op = getattr(op, "operation", op)
  attrs = _frontend_attributes(op)
  attrs[name] = ir.StringAttr.get(value)
  op.attributes[_FRONTEND] = ir.DictAttr.get(attrs)


def mark_python_callback(op: Any) -> None:
  """Marks JAX's Python-callback custom call ``op`` (the sharded path of
  _lowering.py) as ordered; its token is its first operand and result."""
  _set_frontend_attribute(op, _MARK, "first")


def mark_region(op: Any) -> None:
  """Marks ``op``, a region that holds one ordered callback of ours
  (_lowering._lower_shared: Shardy's manual computation), as that
  callback: its token is its last operand and result, chained inside
  already."""
  _set_frontend_attribute(op, _MARK, "last")


def _token_slots(op: Any) -> tuple[int, int] | None:
  """Where an ordered callback takes and returns its token: ``(operand
  index, result index)``, None for any other op.  Our custom calls have it
  last among their operands and last among their results (a call with no
  operand or no result besides has it first there: the indices differ);
  JAX's Python callback has it first in both; a region of ours
  (:func:`mark_region`) last in both."""
  if not len(op.operands) or not len(op.results):
    return None
  mark = _frontend_attributes(op).get(_MARK)
  if op.name != "stablehlo.custom_call":  # a region of _lowering
    if mark is None or ir.StringAttr(mark).value != "last":
      return None
    slots = (len(op.operands) - 1, len(op.results) - 1)
  elif ir.StringAttr(op.attributes["call_target_name"]).value in (
      ORDERED_TARGETS):
    slots = (len(op.operands) - 1, len(op.results) - 1)
  elif mark is not None:
    slots = (0, 0)
  else:
    return None
  if not (hlo.TokenType.isinstance(op.operands[slots[0]].type) and
          hlo.TokenType.isinstance(op.results[slots[1]].type)):
    return None
  return slots


def _ops(block: Any) -> Iterator[Any]:
  return iter(list(block.operations))


class _Chainer:
  """Rewrites one module; remembers which functions hold callbacks."""

  def __init__(self, module: Any):
    self.funcs = {ir.StringAttr(op.attributes["sym_name"]).value: op
                  for op in module.body.operations
                  if op.operation.name == "func.func"}
    self.memo: dict[str, bool] = {}
    self.token = _token_type()
    # The ops with a chain of their own (_opaque): the barrier that ties
    # the token to their results, and their blocks that hold callbacks,
    # with the last token of each block's chain.
    self.opaque: list[tuple[Any, list[tuple[Any, Any]]]] = []

  # -- which ops hold callbacks --

  def _callee(self, op: Any) -> str | None:
    if op.name != "func.call":
      return None
    return ir.FlatSymbolRefAttr(op.attributes["callee"]).value

  def func_has(self, name: str) -> bool:
    if name not in self.memo:
      self.memo[name] = False  # recursion guard
      func = self.funcs.get(name)
      self.memo[name] = func is not None and self.has(func.operation)
    return self.memo[name]

  def has(self, op: Any) -> bool:
    """Whether ``op`` is, or holds, an ordered callback."""
    if _token_slots(op) is not None:
      return True
    callee = self._callee(op)
    if callee is not None:
      return self.func_has(callee)
    return any(self.has(inner.operation)
               for region in op.regions for block in region.blocks
               for inner in block.operations)

  # -- rewriting --

  def module(self) -> None:
    for name, func in list(self.funcs.items()):
      if not self.func_has(name):
        continue
      private = ("sym_visibility" in func.attributes and ir.StringAttr(
          func.attributes["sym_visibility"]).value == "private")
      if private:
        self._private_func(func)
      else:  # main: a signature the caller relies on
        entry = func.regions[0].blocks[0]
        with ir.InsertionPoint.at_block_begin(entry):
          start = hlo.create_token()
        self.block(entry, start)
    self._settle_opaque()

  def _private_func(self, func: Any) -> None:
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [*ftype.inputs, self.token], [*ftype.results, self.token]))
    for key in ("arg_attrs", "res_attrs"):
      if key in func.attributes:
        attrs = list(ir.ArrayAttr(func.attributes[key]))
        func.attributes[key] = ir.ArrayAttr.get(
            [*attrs, ir.DictAttr.get({})])
    entry = func.regions[0].blocks[0]
    last = self.block(entry, entry.add_argument(self.token, func.location))
    self._extend_terminator(entry, last)

  def _extend_terminator(self, block: Any, token: Any) -> None:
    ops = block.operations
    term = ops[len(ops) - 1]
    ir.Operation.create(term.operation.name,
                        operands=[*term.operands, token],
                        attributes=_attributes(term), loc=term.location,
                        ip=ir.InsertionPoint(term))
    term.operation.erase()

  def _replace(self, old: Any, results: list[Any], operands: list[Any],
               nregions: int = 0) -> Any:
    new = ir.Operation.create(
        old.name, results=results, operands=operands,
        attributes=_attributes(old), regions=nregions, loc=old.location,
        ip=ir.InsertionPoint(old))
    for i, result in enumerate(old.results):
      result.replace_all_uses_with(new.results[i])
    return new

  def block(self, block: Any, token: Any) -> Any:
    """Chains the callbacks of ``block`` from ``token``; returns the token
    after its last one."""
    for op in _ops(block):
      op = op.operation
      slots = _token_slots(op)
      if slots is not None:
        fresh = op.operands[slots[0]]
        _replace_operand(op, fresh, token)
        made = getattr(fresh.owner, "operation", fresh.owner)
        if (isinstance(made, ir.Operation) and
            made.name == "stablehlo.create_token" and
            not list(made.results[0].uses)):
          made.erase()
        token = op.results[slots[1]]
      elif not self.has(op):
        continue
      elif self._callee(op) is not None:
        types = [r.type for r in op.results]
        new = self._replace(op, [*types, self.token], [*op.operands, token])
        op.erase()
        token = new.results[len(types)]
      elif op.name in ("stablehlo.case", "stablehlo.if"):
        types = [r.type for r in op.results]
        new = self._replace(op, [*types, self.token], list(op.operands),
                            len(op.regions))
        for i, region in enumerate(op.regions):
          branch = region.blocks[0]
          branch.append_to(new.regions[i])
          self._extend_terminator(branch, self.block(branch, token))
        op.erase()
        token = new.results[len(types)]
      elif op.name == "stablehlo.while":
        types = [r.type for r in op.results]
        new = self._replace(op, [*types, self.token], [*op.operands, token],
                            2)
        cond, body = (region.blocks[0] for region in op.regions)
        for i, inner in enumerate((cond, body)):
          inner.append_to(new.regions[i])
          start = inner.add_argument(self.token, op.location)
          last = self.block(inner, start)
          if inner is body:
            self._extend_terminator(inner, last)
        op.erase()
        token = new.results[len(types)]
      else:
        token = self._opaque(op, token)
    return token

  def _opaque(self, op: Any, token: Any) -> Any:
    """An op with regions this module does not know (``shard_map``'s
    manual computation, isolated from the values around it): each block
    gets a chain of its own, and the op is ordered as a
    whole by ``stablehlo.optimization_barrier``s.

    Before it, only when a callback comes before it in this chain: one
    barrier ties the token to an operand, and inside, another ties that
    operand's block argument to the start of the block's chain.  The
    operand is preferably an argument of the function, never a constant
    when there is a choice: a barrier hides its operand from the optimizer
    (a constant would no longer be folded into the computation, and its
    numbers could change).  After it: a barrier ties the token to its
    results; it stays only if a later callback needs that token
    (:meth:`_settle_opaque`)."""
    entries = [region.blocks[0] for region in op.regions
               if len(region.blocks)]
    ordered_before = not _is_chain_start(token) and len(op.operands) > 0
    chosen = _barrier_operand(op) if ordered_before else None
    lasts = []
    for region in op.regions:
      for inner in region.blocks:
        with ir.InsertionPoint.at_block_begin(inner):
          start = hlo.create_token()
          if (chosen is not None and inner in entries and
              len(inner.arguments) == len(op.operands)):
            start = hlo.OptimizationBarrierOp(
                [start, inner.arguments[chosen]]).results[0]
        last = self.block(inner, start)
        if last != start:  # the block has callbacks
          lasts.append((inner, last))
    if chosen is not None:
      value = op.operands[chosen]
      before = hlo.OptimizationBarrierOp(
          [token, value], ip=ir.InsertionPoint(op))
      _replace_operand(op.operation, value, before.results[1])
    if not len(op.results):
      return token
    after = hlo.OptimizationBarrierOp(
        [token, *op.results], ip=ir.InsertionPoint(op))
    after.operation.move_after(op)
    self.opaque.append((after, lasts))
    return after.results[0]

  def _settle_opaque(self) -> None:
    """Keeps the barrier after an op with a chain of its own only where a
    later callback needs its token, and then makes that op's results
    depend on the callbacks inside (each block's last token joins what the
    block returns); elsewhere removes it, so that the op's results reach
    the computation after it as they would without callbacks."""
    for after, lasts in reversed(self.opaque):
      op = after.operation
      if list(op.results[0].uses):
        for inner, last in lasts:
          ops = inner.operations
          term = ops[len(ops) - 1]
          if not len(term.operands):
            continue
          tie = hlo.OptimizationBarrierOp(
              [last, *term.operands], ip=ir.InsertionPoint(term))
          for i in range(len(term.operands)):
            term.operands[i] = tie.results[i + 1]
        continue
      for i in range(1, len(op.results)):
        op.results[i].replace_all_uses_with(op.operands[i])
      op.erase()


def _attributes(op: Any) -> dict[str, Any]:
  # By index: iterating an operation's attributes gives their names from
  # JAX 0.8's MLIR bindings on, NamedAttributes before.
  named = [op.attributes[i] for i in range(len(op.attributes))]
  return {n.name: n.attr for n in named}


def _replace_operand(op: Any, old: Any, new: Any) -> None:
  """Makes ``op`` use ``new`` where it used ``old`` (as MLIR's
  replace_uses_of_with, which JAX's MLIR bindings have from 0.8 on)."""
  for i, operand in enumerate(op.operands):
    if operand == old:
      op.operands[i] = new


def chain_module(module: Any) -> None:
  """Chains the ordered callbacks of ``module`` in program order."""
  with module.context, ir.Location.unknown():
    _Chainer(module).module()
    _runners_run_after_python_callbacks(module)


def _nested(op: Any) -> Iterator[Any]:
  """Every op inside ``op``, at any depth."""
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        inner = getattr(inner, "operation", inner)
        yield inner
        yield from _nested(inner)


# The attribute of a call that the devices share under jit over sharded
# operands (_lowering._lower_shared) that lets the first device to reach
# it run it for its runner (src/runtime/shared.c, "Who runs").
FIRST_RUNS = "first_runs"
_BACKEND_CONFIG = "mhlo.backend_config"


def _runners_run_after_python_callbacks(module: Any) -> None:
  """In a module that also holds JAX's Python callback (the sharded path of
  _lowering.py: it runs on the runner's own thread, and only there), has
  the runner run every shared call itself: another device that came first
  would run it before the runner's thread had issued the callbacks that
  come before it."""
  ops = list(_nested(module.operation))
  if not any(ir.StringAttr(mark).value == "first"
             for op in ops
             if (mark := _frontend_attributes(op).get(_MARK)) is not None):
    return
  for op in ops:
    if (op.name != "stablehlo.custom_call" or
        _BACKEND_CONFIG not in op.attributes):
      continue
    config = ir.DictAttr(op.attributes[_BACKEND_CONFIG])
    if FIRST_RUNS not in config:
      continue
    entries = {config[i].name: config[i].attr for i in range(len(config))}
    entries[FIRST_RUNS] = ir.IntegerAttr.get(
        ir.IntegerType.get_signless(64), 0)
    op.attributes[_BACKEND_CONFIG] = ir.DictAttr.get(entries)


def _is_chain_start(token: Any) -> bool:
  """Whether ``token`` starts a chain (no callback before it)."""
  owner = getattr(token.owner, "operation", token.owner)
  return (isinstance(owner, ir.Operation) and
          owner.name == "stablehlo.create_token")


def _barrier_operand(op: Any) -> int:
  """The operand of ``op`` a barrier hides best: an argument of the
  function, else one that is no constant, else the first."""
  kinds = []
  for value in op.operands:
    owner = getattr(value.owner, "operation", value.owner)
    if not isinstance(owner, ir.Operation):
      kinds.append(0)  # a block argument
    elif owner.name == "stablehlo.constant":
      kinds.append(2)
    else:
      kinds.append(1)
  return min(range(len(kinds)), key=lambda i: kinds[i])


# Listening from import on: a lowering that has started before the first
# callback is lowered must be seen starting.
ensure_listening()
