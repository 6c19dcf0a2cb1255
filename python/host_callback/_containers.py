"""Callbacks inside JAX's container primitives (scan, while, cond, jit, ...).

Two concerns, one detection (does a sub-jaxpr hold a callback?):

1. Keeping callbacks whose results are unused.

JAX removes an equation whose outputs are unused unless it has an effect,
and our primitives deliberately have none (an effect would cost jitted
functions JAX's C++ fast dispatch path).  So each callback primitive gets a
DCE rule that keeps it unless its flavor is ``PURE``, and the DCE rules of
the primitives that hold sub-jaxprs (scan, while, cond, jit, remat, custom
derivatives, shard_map) are wrapped to keep a container whose body holds
such a callback.  The compiled custom calls carry ``has_side_effect``, so
XLA keeps them too.

JAX looks DCE rules up in one process-wide table and has no hook scoped to
a program, so the wrappers are process-wide; they are installed only once a
program holding one of our primitives is traced (not at import), and for
any equation without our callbacks inside they call JAX's rule unchanged.
What they cost a program without callbacks is measured in
bench/dce_wrappers.py.

2. ``vmap`` of ``cond`` with a batched predicate becomes a ``select`` of
both branches: every branch would run, and its callbacks with it.  That is
refused with an error naming the combination (JAX refuses it for its own
IO callbacks too).

3. ``vmap`` of ``while_loop`` whose predicate holds a callback.  With a
batched predicate JAX's lowering evaluates the predicate twice per
iteration (in the loop's condition, and in its body for the mask that
keeps finished elements), so its taps would run twice.  The batching rule
of ``while`` is wrapped to batch, instead, the loop the removed module made
of it: the predicate evaluated once before the loop and once at the end of
each body, its value carried (the loop's condition only reads it).  The
predicate's callbacks then run once per iteration, after the body's, in
program order, with the batch of predicates: as many times as without vmap
(iterations + 1).  Elements already finished get their predicate evaluated
on the body's discarded result, as under the removed module.

4. Partial evaluation (``grad``, ``linearize``) of a ``cond`` whose branches
hold taps of values without tangents (a loop's index: a progress bar).
JAX stages such a cond whole when its index is unknown, and partial
evaluation keeps a staged equation only if an output needs it or it has an
effect: the cond has no output anyone needs, and the taps have no effect
(no JVP rule ran for them).  The partial-evaluation rule of ``cond`` is
wrapped to mark the callbacks directly in its branches the way their
primitive says (taps: with the effect of a differentiated tap) first.

5. Lowering of a ``while_loop`` whose predicate holds a callback.  XLA
runs a loop whose trip count it can tell (``i < 3``) without evaluating
its condition, so the predicate's callbacks would never run: such a loop
is lowered with the predicate computed in the body and carried (the loop
of 3.), so that they run once per iteration, in order.

6. ``vmap`` of a ``while_loop`` whose predicate it batches runs the body
for every element, finished or not (their results are discarded): an io
call there (``io_callback``, ``host_callback.call`` of the default flavor,
one call per element) would run for elements the program has finished
with.  JAX refuses its io_callback there; so does this, with JAX's words.
Taps (of the batch, once per iteration), debug callbacks and pure calls run
there, as JAX's debug and pure callbacks do.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import jax
from jax import lax
from jax.extend.core import Jaxpr
from jax.extend.core import JaxprEqn
from jax.extend.core import Primitive
from jax.extend.core import jaxpr_as_fun
from jax.extend.core import primitives as jax_primitives
from jax.interpreters import mlir

from host_callback import _jax
from host_callback._types import CallbackFlavor

_kept: set[Primitive] = set()
# Callbacks that vmap of a while with a batched predicate refuses (6.).
_refused_in_batched_while: set[Primitive] = set()
# prim -> how partial evaluation marks an equation of it to be kept (4.).
_marks: dict[Primitive, Callable[[JaxprEqn], JaxprEqn]] = {}


def _keeps(eqn: JaxprEqn) -> bool:
  return (eqn.primitive in _kept and
          eqn.params["flavor"] is not CallbackFlavor.PURE)


# id(jaxpr) -> (weak reference to it, whether it holds a callback).  Weak:
# a jaxpr's parameters hold our sites, hence the user's functions, which
# must go when JAX's caches let the jaxpr go.
_holds_cache: dict[int, tuple[weakref.ref[Jaxpr], bool]] = {}


def _jaxpr_holds_callback(jaxpr: Jaxpr) -> bool:
  cached = _holds_cache.get(id(jaxpr))
  if cached is not None and cached[0]() is jaxpr:
    return cached[1]
  found = any(_keeps(eqn) or _eqn_holds_callback(eqn) for eqn in jaxpr.eqns)
  if len(_holds_cache) > 4096:
    _holds_cache.clear()
  _holds_cache[id(jaxpr)] = (weakref.ref(jaxpr), found)
  return found


def _eqn_holds_callback(eqn: JaxprEqn) -> bool:
  for sub in _jax.jaxprs_in_params(eqn.params):
    if _jaxpr_holds_callback(sub):
      return True
  return False


# A DCE rule is called as rule(used_outputs, eqn) up to JAX 0.11 and
# rule(used_outputs, live_ins, eqn) from 0.12: the equation is the last
# argument (_jax.dce_rules).

def _callback_dce_rule(used_outputs: list[bool], *rest: Any
                       ) -> tuple[list[bool], JaxprEqn | None]:
  eqn = rest[-1]
  if _keeps(eqn) or any(used_outputs):
    return [True] * len(eqn.invars), eqn
  return [False] * len(eqn.invars), None


def _keeping_callbacks(rule: Callable[..., Any]) -> Callable[..., Any]:
  def rule_keeping_callbacks(used_outputs: list[bool], *rest: Any) -> Any:
    eqn = rest[-1]
    if not any(used_outputs) and _eqn_holds_callback(eqn):
      # Nothing downstream needs the container, but its callbacks must run:
      # keep it whole (XLA still removes dead code that is no callback).
      return [True] * len(eqn.invars), eqn
    return rule(used_outputs, *rest)

  setattr(rule_keeping_callbacks, "__wrapped__", rule)  # JAX's rule
  return rule_keeping_callbacks


def _wrap_container_rules() -> None:
  rules = _jax.dce_rules
  if jax_primitives.while_p not in rules:
    rules[jax_primitives.while_p] = _jax.default_dce_rule
  for prim, rule in list(rules.items()):
    if prim not in _kept and not hasattr(rule, "__wrapped__"):
      rules[prim] = _keeping_callbacks(rule)


def keep_when_unused(prim: Primitive) -> None:
  """Keeps equations of ``prim`` (which must have a ``flavor`` parameter)
  unless the flavor is ``PURE``; see :func:`keep_containers`."""
  _kept.add(prim)
  _jax.dce_rules[prim] = _callback_dce_rule


def mark_for_partial_eval(prim: Primitive,
                          mark: Callable[[JaxprEqn], JaxprEqn]) -> None:
  """``mark(eqn)`` is ``eqn`` with an effect that partial evaluation keeps
  (see 4. above); it is applied to the equations of ``prim`` in the
  branches of a ``cond`` that partial evaluation stages."""
  _marks[prim] = mark


def _marked(closed: Any) -> Any:
  """``closed`` (a ClosedJaxpr) with its callbacks marked, or itself when
  it has none to mark."""
  eqns, effects, changed = [], set(closed.jaxpr.effects), False
  for eqn in closed.jaxpr.eqns:
    mark = _marks.get(eqn.primitive)
    if mark is not None and _keeps(eqn):
      new = mark(eqn)
      changed = changed or new is not eqn
      effects |= set(new.effects)
      eqn = new
    eqns.append(eqn)
  if not changed:
    return closed
  return closed.replace(jaxpr=closed.jaxpr.replace(eqns=eqns,
                                                   effects=effects))


def _keeping_cond_partial_eval(rule: Callable[..., Any]) -> Callable[..., Any]:
  def cond_partial_eval(trace: Any, *tracers: Any, branches: Any,
                        **params: Any) -> Any:
    if any(_jaxpr_holds_callback(b.jaxpr) for b in branches):
      branches = tuple(_marked(b) for b in branches)
    return rule(trace, *tracers, branches=branches, **params)

  setattr(cond_partial_eval, "__wrapped__", rule)  # JAX's rule
  return cond_partial_eval


def _holds_effectful_callback(jaxpr: Jaxpr) -> bool:
  """Whether ``jaxpr`` (or one nested in it) holds a callback that must not
  run where the program does not: neither ``PURE`` nor ``DEBUG`` (debug
  callbacks, as JAX's ``jax.debug``, may run where a transformation makes
  the program run, e.g. both branches of a batched cond)."""
  for eqn in jaxpr.eqns:
    if (eqn.primitive in _kept and eqn.params["flavor"] not in
        (CallbackFlavor.PURE, CallbackFlavor.DEBUG)):
      return True
    if any(_holds_effectful_callback(sub)
           for sub in _jax.jaxprs_in_params(eqn.params)):
      return True
  return False


def _holds_io_callback(jaxpr: Jaxpr) -> bool:
  """Whether ``jaxpr`` (or one nested in it) holds the drop-in
  ``io_callback``."""
  return any(
      (eqn.primitive in _kept and eqn.params.get("api") == "io_callback") or
      any(_holds_io_callback(sub) for sub in _jax.jaxprs_in_params(eqn.params))
      for eqn in jaxpr.eqns)


def _refusing_batched_cond(rule: Callable[..., Any]) -> Callable[..., Any]:
  def cond_batching_rule(axis_data: Any, args: Any, dims: Any, *,
                         branches: Any, **params: Any) -> Any:
    if dims[0] is not None and any(
        _jaxpr_holds_callback(b.jaxpr) and
        _holds_effectful_callback(b.jaxpr) for b in branches):
      # JAX's words first where JAX refuses it too (its io_callback).
      jax_words = ("IO effect not supported in vmap-of-cond. "
                   if any(_holds_io_callback(b.jaxpr) for b in branches)
                   else "")
      raise NotImplementedError(
          f"{jax_words}vmap of lax.cond with a batched predicate, where a "
          "branch holds host_callback taps or calls: vmap would run every "
          "branch (as a select), and with them callbacks of branches not "
          "taken. Use CallbackFlavor.PURE or DEBUG callbacks there, or "
          "move the callback out of the cond.")
    return rule(axis_data, args, dims, branches=branches, **params)

  setattr(cond_batching_rule, "__wrapped__", rule)  # JAX's rule
  return cond_batching_rule


def _while_with_carried_predicate(cond_nconsts: int, cond_jaxpr: Any,
                                  body_nconsts: int, body_jaxpr: Any
                                  ) -> Callable[..., list[Any]]:
  """The loop ``while cond(c): c = body(c)`` as a function of the while
  equation's operands, written so that ``cond`` runs once per iteration:
  ``p = cond(c); while p: c = body(c); p = cond(c)``."""
  cond_fun = jaxpr_as_fun(cond_jaxpr)
  body_fun = jaxpr_as_fun(body_jaxpr)

  def loop(*args: Any) -> list[Any]:
    cconsts, bconsts, init = (args[:cond_nconsts],
                              args[cond_nconsts:cond_nconsts + body_nconsts],
                              args[cond_nconsts + body_nconsts:])

    def body(carry: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
      new = list(body_fun(*bconsts, *carry[1]))
      (pred,) = cond_fun(*cconsts, *new)
      return pred, new

    (pred,) = cond_fun(*cconsts, *init)
    _, out = lax.while_loop(lambda carry: carry[0], body, (pred, list(init)))
    return out

  return loop


def refuse_in_batched_while(prim: Primitive) -> None:
  """Makes ``vmap`` of a ``while_loop`` whose predicate it batches refuse
  equations of ``prim`` (which must have a ``flavor`` parameter) in the
  loop's body or condition, unless their flavor is ``PURE`` or ``DEBUG``
  (6. of the module's docstring)."""
  _refused_in_batched_while.add(prim)


def _holds_refused(jaxpr: Jaxpr) -> bool:
  """Whether ``jaxpr`` (or one nested in it) holds an equation that a
  while with a batched predicate refuses."""
  for eqn in jaxpr.eqns:
    if (eqn.primitive in _refused_in_batched_while and
        eqn.params["flavor"] not in (CallbackFlavor.PURE,
                                     CallbackFlavor.DEBUG)):
      return True
    if any(_holds_refused(sub) for sub in _jax.jaxprs_in_params(eqn.params)):
      return True
  return False


def _predicate_batched(axis_data: Any, dims: Any, cond_nconsts: int,
                       cond_jaxpr: Any, body_nconsts: int,
                       body_jaxpr: Any) -> bool:
  """Whether ``vmap`` batches the predicate of the loop, found as JAX's
  batching rule of ``while`` finds it: the carry is batched where its
  initial value is, or where the body makes it so (to a fixpoint); the
  predicate is batched when the condition makes it so from that carry."""
  batched = [d is not None for d in dims]
  cconsts = batched[:cond_nconsts]
  bconsts = batched[cond_nconsts:cond_nconsts + body_nconsts]
  carry = batched[cond_nconsts + body_nconsts:]
  for _ in range(1 + len(carry)):
    _, out = _jax.batch_jaxpr(body_jaxpr, axis_data, bconsts + carry, carry)
    grown = [a or bool(b) for a, b in zip(carry, out)]
    if grown == carry:
      break
    carry = grown
  _, (pred,) = _jax.batch_jaxpr(cond_jaxpr, axis_data, cconsts + carry,
                                False)
  return bool(pred)


def _predicate_once_batched_while(rule: Callable[..., Any]
                                  ) -> Callable[..., Any]:
  def while_batching_rule(axis_data: Any, args: Any, dims: Any, *,
                          cond_nconsts: int, cond_jaxpr: Any,
                          body_nconsts: int, body_jaxpr: Any) -> Any:
    name, size, spmd_name, mesh_axis = _jax.vmap_axis(axis_data)
    if (any(d is not None for d in dims) and
        (_jaxpr_holds_callback(body_jaxpr.jaxpr) and
         _holds_refused(body_jaxpr.jaxpr) or
         _jaxpr_holds_callback(cond_jaxpr.jaxpr) and
         _holds_refused(cond_jaxpr.jaxpr)) and
        _predicate_batched(axis_data, dims, cond_nconsts, cond_jaxpr,
                           body_nconsts, body_jaxpr)):
      raise NotImplementedError(
          "Unordered IO effects not supported in while_loop with batched "
          "predicate: vmap runs the loop while any element's predicate "
          "holds, so an io_callback (or host_callback.call) in its body or "
          "condition would run for elements whose loop has already "
          "finished. Move the callback out of the loop, or use "
          "pure_callback, debug.callback or id_tap there.")
    if (mesh_axis is not None or all(d is None for d in dims) or
        not _jaxpr_holds_callback(cond_jaxpr.jaxpr)):
      return rule(axis_data, args, dims, cond_nconsts=cond_nconsts,
                  cond_jaxpr=cond_jaxpr, body_nconsts=body_nconsts,
                  body_jaxpr=body_jaxpr)
    # The rewritten loop's condition holds no callback: batching it comes
    # back here and goes on to JAX's rule.
    loop = _while_with_carried_predicate(cond_nconsts, cond_jaxpr,
                                         body_nconsts, body_jaxpr)
    outs = jax.vmap(loop, in_axes=tuple(dims), out_axes=0, axis_size=size,
                    axis_name=name, spmd_axis_name=spmd_name)(*args)
    return list(outs), [0] * len(outs)

  setattr(while_batching_rule, "__wrapped__", rule)  # JAX's rule
  return while_batching_rule


def _predicate_in_body_while(rule: Callable[..., Any]) -> Callable[..., Any]:
  def while_lowering(ctx: Any, *args: Any, cond_nconsts: int,
                     cond_jaxpr: Any, body_nconsts: int,
                     body_jaxpr: Any) -> Any:
    if (cond_jaxpr.out_avals[0].shape == () and
        _jaxpr_holds_callback(cond_jaxpr.jaxpr)):
      # XLA runs a loop whose trip count it can tell (``i < 3``) without
      # evaluating its condition: the callbacks there would never run.
      # Evaluated in the body, carried to a condition that only reads it,
      # they run once per iteration, in the same order.  (The rewritten
      # loop's condition holds no callback: it comes back to JAX's rule.)
      loop = _while_with_carried_predicate(cond_nconsts, cond_jaxpr,
                                           body_nconsts, body_jaxpr)
      return mlir.lower_fun(loop, multiple_results=True)(ctx, *args)
    return rule(ctx, *args, cond_nconsts=cond_nconsts,
                cond_jaxpr=cond_jaxpr, body_nconsts=body_nconsts,
                body_jaxpr=body_jaxpr)

  setattr(while_lowering, "__wrapped__", rule)  # JAX's rule
  return while_lowering


def _wrap_once(rules: dict[Any, Any], prim: Primitive,
               wrap: Callable[[Any], Any]) -> None:
  """Puts ``wrap(rule)`` in place of JAX's ``rules[prim]``, once: a wrapped
  rule keeps JAX's as its ``__wrapped__``."""
  rule = rules[prim]
  if not hasattr(rule, "__wrapped__"):
    rules[prim] = wrap(rule)


def _wrap_while_lowering() -> None:
  rule = _jax.generic_lowering(jax_primitives.while_p)
  if not hasattr(rule, "__wrapped__"):
    mlir.register_lowering(jax_primitives.while_p,
                           _predicate_in_body_while(rule))


_wrapped_count = -1  # how many DCE rules JAX had when they were last wrapped


def keep_containers() -> None:
  """Makes JAX keep containers (scan, while, cond, jit, ...) whose body
  holds one of our callbacks, refuse vmap of a cond whose branches hold
  one (unless it is PURE or DEBUG: those may run in every branch), keep
  the taps of a cond under partial evaluation, lower a while whose
  predicate holds one with the predicate in the body (XLA skips the
  condition of a loop whose trip count it knows), and batch a while whose
  predicate holds one with the predicate evaluated once per iteration.
  Our primitives' abstract evaluation calls it, so it happens when the
  first program with a callback is traced; after that it is one comparison.
  Rules that JAX registers later (a module imported afterwards) are wrapped
  at the next call."""
  global _wrapped_count
  if len(_jax.dce_rules) == _wrapped_count:
    return
  _wrap_container_rules()
  _wrap_once(_jax.fancy_primitive_batchers, jax_primitives.cond_p,
             _refusing_batched_cond)
  _wrap_once(_jax.fancy_primitive_batchers, jax_primitives.while_p,
             _predicate_once_batched_while)
  _wrap_once(_jax.custom_partial_eval_rules, jax_primitives.cond_p,
             _keeping_cond_partial_eval)
  _wrap_while_lowering()
  _wrapped_count = len(_jax.dce_rules)
