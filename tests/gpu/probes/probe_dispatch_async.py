"""Probe: a tap does not make its computation's dispatch wait for the
stream: the dispatch returns while the GPU still computes what comes
before the tap, and the tap runs later, once the GPU gets there.  And the
tap never waited for the stream on XLA's thread either (the pinned pool's
``syncs`` stay 0): were JAX to dispatch GPU work on a thread of its own,
an early return alone would prove nothing of the tap."""

from probe import DRY_RUN, device, done

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import host_callback as hcb  # noqa: E402

N, STEPS = (256, 4) if DRY_RUN else (4096, 100)  # about 1 s of an H100
seen = []


@jax.jit
def program(x):
  y = lax.fori_loop(0, STEPS, lambda i, c: (c @ x) / N, x)
  return hcb.id_tap(lambda v, t: seen.append(float(v[0, 0])), y)


x = jax.device_put(jnp.ones((N, N), jnp.float32), device())
program(x).block_until_ready()  # compiled, and warm
hcb.barrier_wait()
out = program(x)
ready, tapped = out.is_ready(), len(seen)
out.block_until_ready()
hcb.barrier_wait()
pool = hcb.stats()["devices"].get(str(device()), {}).get("pinned_pool")
message = (f"after the dispatch returned: result ready {ready}, tap run "
           f"{tapped - 1} time(s); then {len(seen) - 1} time(s); pinned "
           f"pool {pool}")
if DRY_RUN:
  done(len(seen) == 2 and pool is None,
       message + " (not timed on a CPU, which has no pinned pool)")
done(not ready and tapped == 1 and len(seen) == 2 and pool is not None
     and pool["syncs"] == 0, message)
