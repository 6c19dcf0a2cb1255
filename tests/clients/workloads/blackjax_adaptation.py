"""blackjax 1.2.5: window adaptation of NUTS with ``progress_bar=True``
(``io_callback`` in blackjax), then sampling with a bar: the same
adapted parameters and samples, bit for bit; and bars of chains under
``vmap``."""

import blackjax
import jax
import jax.numpy as jnp

import _case
from _case import case

LOC = jnp.array([1.0, -2.0, 0.5])
SCALE = jnp.array([1.0, 0.5, 2.0])


def logdensity(x):
  return -0.5 * jnp.sum(((x - LOC) / SCALE) ** 2)


@case
def window_adaptation_with_bar():
  warmup = blackjax.window_adaptation(blackjax.nuts, logdensity,
                                      progress_bar=True)
  (state, parameters), _ = warmup.run(jax.random.PRNGKey(1), jnp.zeros(3),
                                      num_steps=300)
  return state.position, parameters["step_size"], parameters[
      "inverse_mass_matrix"]


@case
def sampling_with_bar():
  warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
  (state, parameters), _ = warmup.run(jax.random.PRNGKey(2), jnp.zeros(3),
                                      num_steps=100)
  kernel = blackjax.nuts(logdensity, **parameters)
  _, (states, _) = blackjax.util.run_inference_algorithm(
      jax.random.PRNGKey(3), kernel, 300, initial_state=state,
      progress_bar=True)
  return states.position


@case
def chains_under_vmap_with_bars():
  kernel = blackjax.nuts(logdensity, step_size=0.5,
                         inverse_mass_matrix=jnp.ones(3))

  def chain(key):
    _, (states, _) = blackjax.util.run_inference_algorithm(
        key, kernel, 200, initial_position=jnp.zeros(3), progress_bar=True)
    return states.position

  return jax.vmap(chain)(jax.random.split(jax.random.PRNGKey(4), 2))


def whose():
  import blackjax.progress_bar
  return {"blackjax.progress_bar.io_callback":
          _case.module_of(blackjax.progress_bar.io_callback)}


if __name__ == "__main__":
  _case.main(whose)
