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

2. ``vmap`` of ``cond`` with a batched predicate becomes a ``select`` of
both branches: every branch would run, and its callbacks with it.  That is
refused with an error naming the combination (JAX refuses it for its own
IO callbacks too).
"""

from __future__ import annotations

from typing import Any, Callable

from jax._src import core as jax_core
from jax._src.interpreters import batching
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import Primitive

from host_callback._types import CallbackFlavor

_kept: set[Primitive] = set()


def _keeps(eqn: jax_core.JaxprEqn) -> bool:
  return (eqn.primitive in _kept and
          eqn.params["flavor"] is not CallbackFlavor.PURE)


_holds_cache: dict[int, tuple[Any, bool]] = {}


def _jaxpr_holds_callback(jaxpr: jax_core.Jaxpr) -> bool:
  cached = _holds_cache.get(id(jaxpr))
  if cached is not None and cached[0] is jaxpr:
    return cached[1]
  found = any(_keeps(eqn) or _eqn_holds_callback(eqn) for eqn in jaxpr.eqns)
  if len(_holds_cache) > 4096:
    _holds_cache.clear()
  _holds_cache[id(jaxpr)] = (jaxpr, found)
  return found


def _eqn_holds_callback(eqn: jax_core.JaxprEqn) -> bool:
  for sub in jax_core.jaxprs_in_params(eqn.params):
    if _jaxpr_holds_callback(sub):
      return True
  return False


def _callback_dce_rule(used_outputs: list[bool], eqn: jax_core.JaxprEqn
                       ) -> tuple[list[bool], jax_core.JaxprEqn | None]:
  if _keeps(eqn) or any(used_outputs):
    return [True] * len(eqn.invars), eqn
  return [False] * len(eqn.invars), None


def _keeping_callbacks(rule: Callable[..., Any]) -> Callable[..., Any]:
  def rule_keeping_callbacks(used_outputs: list[bool],
                             eqn: jax_core.JaxprEqn):
    if not any(used_outputs) and _eqn_holds_callback(eqn):
      # Nothing downstream needs the container, but its callbacks must run:
      # keep it whole (XLA still removes dead code that is no callback).
      return [True] * len(eqn.invars), eqn
    return rule(used_outputs, eqn)

  rule_keeping_callbacks.__wrapped__ = rule  # type: ignore[attr-defined]
  return rule_keeping_callbacks


def _wrap_container_rules() -> None:
  from jax._src.lax.control_flow import loops

  if loops.while_p not in pe.dce_rules:
    pe.dce_rules[loops.while_p] = pe._default_dce_rule
  for prim, rule in list(pe.dce_rules.items()):
    if prim not in _kept and not hasattr(rule, "__wrapped__"):
      pe.dce_rules[prim] = _keeping_callbacks(rule)


def keep_when_unused(prim: Primitive) -> None:
  """Keeps equations of ``prim`` (which must have a ``flavor`` parameter)
  and the containers that hold them, unless the flavor is ``PURE``."""
  _kept.add(prim)
  pe.dce_rules[prim] = _callback_dce_rule
  _wrap_container_rules()


def _refusing_batched_cond(rule: Callable[..., Any]) -> Callable[..., Any]:
  def cond_batching_rule(axis_data: Any, args: Any, dims: Any, *,
                         branches: Any, **params: Any) -> Any:
    if dims[0] is not None and any(
        _jaxpr_holds_callback(b.jaxpr) for b in branches):
      raise NotImplementedError(
          "vmap of lax.cond with a batched predicate, where a branch holds "
          "host_callback taps or calls: vmap would run every branch (as a "
          "select), and with them callbacks of branches not taken. Use "
          "CallbackFlavor.PURE callbacks there, or move the callback out of "
          "the cond.")
    return rule(axis_data, args, dims, branches=branches, **params)

  cond_batching_rule.__wrapped__ = rule  # type: ignore[attr-defined]
  return cond_batching_rule


def _wrap_cond_batching() -> None:
  from jax._src.lax.control_flow import conditionals

  rule = batching.fancy_primitive_batchers[conditionals.cond_p]
  if not hasattr(rule, "__wrapped__"):
    batching.fancy_primitive_batchers[conditionals.cond_p] = (
        _refusing_batched_cond(rule))


_wrap_cond_batching()
