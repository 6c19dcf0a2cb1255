"""jax-tqdm 0.4.0: the examples of its README, as written there (the
results returned so that they can be compared, and ``n`` where the README
has it)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax_tqdm import PBar, loop_tqdm, scan_tqdm

import _case
from _case import case


@case
def scan():
  n = 10_000

  @scan_tqdm(n)
  def step(carry, x):
    return carry + 1, carry + 1

  last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
  return last_number, all_numbers


@case
def scan_with_data():
  n = 10
  scan_data = jnp.zeros((n, 200, 100))

  @scan_tqdm(n)
  def step(carry, x):
    _, d = x
    return carry + 1, d

  last_number, output_data = lax.scan(step, 0, (jnp.arange(n), scan_data))
  return last_number, output_data.sum()


@case
def fori_loop():
  n = 10_000

  @loop_tqdm(n)
  def step(i, val):
    return val + 1

  last_number = lax.fori_loop(0, n, step, 0)
  return last_number


@case
def vmap_of_scans():
  n = 10_000

  @scan_tqdm(n)
  def step(carry, _):
    return carry + 1, carry + 1

  def map_func(i):
    init = PBar(id=i, carry=0)
    final_value, _all_numbers = jax.lax.scan(step, init, jax.numpy.arange(n))
    return final_value.carry, _all_numbers

  last_numbers, all_numbers = jax.vmap(map_func)(jax.numpy.arange(10))
  return last_numbers, all_numbers


@case
def print_rate_2():
  n = 10_000

  @scan_tqdm(n, print_rate=2)
  def step(carry, x):
    return carry + 1, carry + 1

  last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
  return last_number, all_numbers


@case
def print_rate_1_std():
  n = 10_000

  @scan_tqdm(n, print_rate=1, tqdm_type="std")
  def step(carry, x):
    return carry + 1, carry + 1

  last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
  return last_number, all_numbers


def whose():
  import jax_tqdm.base
  return {"jax_tqdm.base.callback": _case.module_of(jax_tqdm.base.callback)}


if __name__ == "__main__":
  _case.main(whose)
