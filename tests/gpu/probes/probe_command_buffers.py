"""Probe: with XLA's command buffers (CUDA graphs) enabled for fusions,
custom calls, while loops and conditionals, every callback still runs at
every execution, in program order, with the right values: host_callback's
handlers carry no command-buffer trait, so XLA must leave them out of its
graphs, and a graph replayed without them would skip or reorder them."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") +
    " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL"
).strip()

from probe import device, done  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import host_callback as hcb  # noqa: E402

STEPS = 20
log: list[tuple[str, int]] = []


def step(c, _):
  c = hcb.id_tap(lambda x, t: log.append(("tap", int(x))), c)
  c = hcb.call(lambda x: np.int32(x + 1), c,
               result_shape=jax.ShapeDtypeStruct((), np.int32))
  c = lax.cond(c % 2 == 0,
               lambda v: hcb.id_tap(lambda x, t: log.append(("even", int(x))),
                                    v),
               lambda v: v, c)
  return c, None


def body(c):
  return hcb.buffer_callback(lambda ctx, out, x: None,
                             jax.ShapeDtypeStruct((), np.int32),
                             input_output_aliases={0: 0},
                             has_side_effect=True)(c) + 1


@jax.jit
def program(c):
  c = lax.scan(step, c, None, length=STEPS)[0]
  return lax.while_loop(lambda v: v < 2 * STEPS, body, c)


want = []
for i in range(STEPS):
  want.append(("tap", i))
  if (i + 1) % 2 == 0:
    want.append(("even", i + 1))
results, logs = [], []
for run in range(3):  # graphs are captured at a first run, replayed later
  log.clear()
  results.append(int(program(jax.device_put(jnp.int32(0), device()))))
  hcb.barrier_wait()
  logs.append(list(log))
ok = results == [2 * STEPS] * 3 and all(got == want for got in logs)
done(ok, f"3 runs: results {results} (want {2 * STEPS}), callbacks in "
     f"order every run: {all(got == want for got in logs)} "
     f"({[len(got) for got in logs]} of {len(want)})")
