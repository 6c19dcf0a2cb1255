"""``vmap`` of callbacks that cannot batch themselves (``call``,
``buffer_callback``), by ``vmap_method`` as ``jax.pure_callback`` defines
it."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax import lax

VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims",
                "broadcast_all")


def check_vmap_method(vmap_method: str | None) -> None:
  """``ValueError`` unless ``vmap_method`` is ``None`` or a known method."""
  if vmap_method is not None and vmap_method not in VMAP_METHODS:
    raise ValueError(f"vmap_method must be None or one of {VMAP_METHODS}, "
                     f"got {vmap_method!r}")


def batch_by_method(args: Sequence[Any], dims: Sequence[Any], *,
                    vmap_method: str | None, what: str, nout: int,
                    bind_one: Callable[[list[Any]], Sequence[Any]],
                    bind_batched: Callable[[list[Any], int], Sequence[Any]],
                    always_broadcast: frozenset[int] = frozenset(),
                    legacy_message: str = ""
                    ) -> tuple[list[Any], list[int]]:
  """Batches one callback: ``bind_one(args)`` binds it on unbatched
  arguments, ``bind_batched(args, size)`` on arguments whose leading axis is
  the batch (its results get one too).  ``always_broadcast`` lists the
  arguments that ``expand_dims`` must broadcast instead (aliased ones).
  ``"legacy_vectorized"`` (``jax.pure_callback``'s, for its drop-in)
  passes the unbatched arguments as they are.  ``legacy_message`` starts
  the error without a ``vmap_method``: the words of the removed module,
  which its users search for."""
  if vmap_method is None:
    raise NotImplementedError(
        f"{legacy_message}{what} under vmap needs a vmap_method: pass "
        "vmap_method='sequential' or 'sequential_unrolled' (one call per "
        "batch element), 'expand_dims' or 'broadcast_all' (one call with "
        "batched arrays), as for jax.pure_callback.")
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  args = [x if d is None else jax.numpy.moveaxis(x, d, 0)
          for x, d in zip(args, dims)]

  if vmap_method in ("sequential", "sequential_unrolled"):
    mapped = [i for i, d in enumerate(dims) if d is not None]

    def one(batch: Sequence[Any]) -> list[Any]:
      full = list(args)
      for i, x in zip(mapped, batch):
        full[i] = x
      return list(bind_one(full))

    if vmap_method == "sequential":
      outs = lax.map(one, [args[i] for i in mapped])
    else:
      each = [one([args[i][k] for i in mapped]) for k in range(size)]
      outs = [jax.numpy.stack([e[j] for e in each]) for j in range(nout)]
    return list(outs), [0] * nout

  if vmap_method == "legacy_vectorized":  # jax.pure_callback's: as is
    return list(bind_batched(args, size)), [0] * nout
  expand = vmap_method == "expand_dims"
  args = [x if d is not None else
          lax.expand_dims(x, (0,)) if expand and i not in always_broadcast
          else lax.broadcast(x, (size,))
          for i, (x, d) in enumerate(zip(args, dims))]
  return list(bind_batched(args, size)), [0] * nout
