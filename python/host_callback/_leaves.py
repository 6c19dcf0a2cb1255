"""How the leaves of a pytree argument travel through a custom call.

Operands are arrays: Python scalars and numpy values become JAX arrays,
typed PRNG keys travel as their key data (and are wrapped again where the
caller gets them back).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import jax
import numpy as np

from host_callback import _jax


def as_array(x: Any) -> Any:
  """``x`` as a JAX array or tracer.  ``jax.device_put`` rather than
  ``jax.numpy.asarray``: the latter compiles a program of its own (JAX's
  ``stage``) for each new shape and dtype, so an eager call compiled twice;
  both canonicalise the dtype and keep Python scalars weakly typed."""
  if isinstance(x, (jax.Array, jax.core.Tracer)):
    return x
  return jax.device_put(x)


def tree_flatten(tree: Any, what: str) -> tuple[list[Any], Any]:
  """``jax.tree_util.tree_flatten(tree)``, with one clear error for a tree
  nested deeper than JAX flattens.  JAX's flattening recurses once per
  level, in C++, and stops with a SystemError whose cause is a
  RecursionError; ``what`` (the API) names the argument in the
  RecursionError raised instead.  Where it stops depends on the Python:
  3.11 stops at ``sys.getrecursionlimit()``; 3.12 and later cap recursion
  in C code on their own (about 1,500 levels on 3.12, 10,000 on 3.13),
  whatever that limit says.  id_tap, id_print and call flatten through
  here, so that they take the same trees and refuse the same."""
  try:
    return jax.tree_util.tree_flatten(tree)
  except (RecursionError, SystemError) as e:
    if not isinstance(e, RecursionError) and not isinstance(
        e.__cause__, RecursionError):
      raise
    if sys.version_info < (3, 12):
      limit = ("Python's recursion limit (sys.getrecursionlimit() is "
               f"{sys.getrecursionlimit()}); flatten the value, or raise the "
               "limit with sys.setrecursionlimit")
    else:
      limit = ("Python's limit on recursion in C code, which "
               "sys.setrecursionlimit does not raise; flatten the value")
    raise RecursionError(
        f"{what}: the argument nests deeper than JAX can flatten a pytree: "
        f"JAX goes one level deeper per nesting and stops at {limit}") from e


def flatten(tree: Any, what: str) -> tuple[list[Any], Any]:
  """The leaves of ``tree`` as arrays, and its treedef (``what``: the API,
  for the error of a tree nested too deep; see :func:`tree_flatten`)."""
  leaves, treedef = tree_flatten(tree, what)
  return [as_array(x) for x in leaves], treedef


def is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype,
                                                     jax.dtypes.prng_key)


def key_data_of_keys(leaves: Sequence[Any]) -> list[Any]:
  """The leaves as the custom call carries them: typed keys as key data."""
  return [jax.random.key_data(x) if is_key(x) else x for x in leaves]


def rewrap_keys(originals: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
  """``outs`` with the key data of typed keys among ``originals`` wrapped
  again as keys of the same implementation."""
  return [jax.random.wrap_key_data(o, impl=jax.random.key_impl(x))
          if is_key(x) else o for x, o in zip(originals, outs)]


def any_tracer(leaves: Sequence[Any]) -> bool:
  """Whether we are staging (some leaf is a tracer)."""
  return any(isinstance(x, jax.core.Tracer) for x in leaves)


def staging(leaves: Sequence[Any]) -> bool:
  """Whether a callback on ``leaves`` is being staged into a program (run
  by each execution of it) rather than called now: some leaf is a tracer,
  or a trace in progress stages even constants (``jit``, ``scan``: a
  ``jax.Array`` closed over is no tracer there, yet the callback must run
  per execution, not once at trace time).  Eager ``vmap``/``grad`` of
  constants evaluate them now, as JAX's callbacks do."""
  if any_tracer(leaves):
    return True
  if _jax.trace_state_clean():  # the common eager case, cheaply
    return False
  # A value made now is a tracer exactly when the current trace stages.
  return isinstance(jax.lax.full((), 0, np.int8), jax.core.Tracer)
