"""jax-tqdm 0.1.2, written for the removed ``jax.experimental.host_callback``
(``id_tap`` in ``lax.cond``): its README's examples of that release.  On
current JAX it imports only through host_callback's legacy module
(``HOST_CALLBACK_PATCH=legacy``), and it spells ``jax.lax`` as
``jax.jax.lax``, which JAX no longer has: that alias, unrelated to
callbacks, is provided here.  As the removed module's users did, a case
waits for the taps with ``barrier_wait`` before it reads the bars: the
old module's taps are asynchronous, and host_callback's keep that
contract."""

import jax

jax.jax = jax  # jax-tqdm 0.1.2 calls jax.jax.lax.cond

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import _case  # noqa: E402
from _case import case  # noqa: E402


def _barrier_wait():
  from jax.experimental import host_callback
  host_callback.barrier_wait()


@case
def scan():
  from jax_tqdm import scan_tqdm
  n = 10_000

  @scan_tqdm(n)
  def step(carry, x):
    return carry + 1, carry + 1

  last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
  _barrier_wait()
  return last_number, all_numbers.sum()


@case
def fori_loop():
  from jax_tqdm import loop_tqdm
  n = 10_000

  @loop_tqdm(n)
  def step(i, val):
    return val + 1

  last_number = lax.fori_loop(0, n, step, 0)
  _barrier_wait()
  return last_number


@case
def scan_print_rate_3_jit():
  from jax_tqdm import scan_tqdm
  n = 1_000

  @scan_tqdm(n, print_rate=3, desc="three at a time")
  def step(carry, x):
    return carry + x, None

  total = jax.jit(lambda: lax.scan(step, 0, jnp.arange(n))[0])()
  _barrier_wait()
  return total


def whose():
  try:
    import jax_tqdm.pbar
    return {"jax_tqdm.pbar.host_callback": jax_tqdm.pbar.host_callback.__name__,
            "id_tap": _case.module_of(jax_tqdm.pbar.host_callback.id_tap)}
  except ImportError as e:  # unpatched: the library does not import
    return {"import": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
  _case.main(whose)
