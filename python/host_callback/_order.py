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
  ``stablehlo.optimization_barrier``s: one ties an operand to the token
  before it, one ties the token after it to its results.

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


_MARK = "hcb_order"  # a frontend attribute: "first" or "last"


def mark_python_callback(op: Any) -> None:
  """Marks JAX's Python-callback custom call ``op`` (the sharded path of
  _lowering.py) as ordered; its token is its first operand and result."""
  op = getattr(op, "operation", op)
  key = "mhlo.frontend_attributes"
  attrs: dict[str, Any] = {}
  if key in op.attributes:
    old = ir.DictAttr(op.attributes[key])
    for i in range(len(old)):
      attrs[old[i].name] = old[i].attr
  attrs[_MARK] = ir.StringAttr.get("first")
  op.attributes[key] = ir.DictAttr.get(attrs)


def _token_slots(op: Any) -> tuple[int, int] | None:
  """Where an ordered callback takes and returns its token: ``(operand
  index, result index)``, None for any other op.  Our custom calls have it
  last among their operands and last among their results (a call with no
  operand or no result besides has it first there: the indices differ);
  JAX's Python callback has it first in both."""
  if (op.name != "stablehlo.custom_call" or not len(op.operands) or
      not len(op.results)):
    return None
  target = ir.StringAttr(op.attributes["call_target_name"]).value
  if target in ORDERED_TARGETS:
    slots = (len(op.operands) - 1, len(op.results) - 1)
  elif "mhlo.frontend_attributes" in op.attributes and _MARK in ir.DictAttr(
      op.attributes["mhlo.frontend_attributes"]):
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
        op.replace_uses_of_with(fresh, token)
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
    """An op with regions this module does not know (e.g. isolated from the
    values around it): chain inside, order it as a whole by barriers."""
    for region in op.regions:
      for inner in region.blocks:
        with ir.InsertionPoint.at_block_begin(inner):
          start = hlo.create_token()
        self.block(inner, start)
    if len(op.operands):
      first = op.operands[0]
      before = hlo.OptimizationBarrierOp(
          [token, first], ip=ir.InsertionPoint(op))
      op.replace_uses_of_with(first, before.results[1])
    if not len(op.results):
      return token
    after = hlo.OptimizationBarrierOp(
        [token, *op.results], ip=ir.InsertionPoint(op))
    after.operation.move_after(op)
    return after.results[0]


def _attributes(op: Any) -> dict[str, Any]:
  return {name: op.attributes[name] for name in op.attributes}


def chain_module(module: Any) -> None:
  """Chains the ordered callbacks of ``module`` in program order."""
  with module.context, ir.Location.unknown():
    _Chainer(module).module()


# Listening from import on: a lowering that has started before the first
# callback is lowered must be seen starting.
ensure_listening()
