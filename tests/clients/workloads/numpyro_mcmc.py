"""numpyro 0.21: NUTS on the eight-schools model, 4 chains in parallel on 4
CPU devices, with progress bars (``io_callback`` in numpyro): the same
samples, bit for bit, and complete bars."""

import numpyro

numpyro.set_host_device_count(4)  # before JAX starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

import _case  # noqa: E402
from _case import case  # noqa: E402

J = 8
Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(sigma, y=None):
  mu = numpyro.sample("mu", dist.Normal(0, 5))
  tau = numpyro.sample("tau", dist.HalfCauchy(5))
  with numpyro.plate("J", J):
    theta = numpyro.sample("theta", dist.Normal(mu, tau))
    numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def _sample(chain_method, progress_bar):
  mcmc = MCMC(NUTS(eight_schools), num_warmup=150, num_samples=150,
              num_chains=4, chain_method=chain_method,
              progress_bar=progress_bar)
  mcmc.run(jax.random.PRNGKey(0), SIGMA, y=Y)
  samples = mcmc.get_samples(group_by_chain=True)
  return {k: samples[k] for k in sorted(samples)}


@case
def parallel_chains_with_bars():
  return _sample("parallel", True)


@case
def parallel_chains_bars_against_none():
  """The bars change no number: the same samples as without them."""
  with_bars = _sample("parallel", True)
  without = _sample("parallel", False)
  return {k: bool(jnp.array_equal(with_bars[k], without[k]))
          for k in with_bars}


def whose():
  import numpyro.util
  return {"numpyro.util.io_callback": _case.module_of(numpyro.util.io_callback),
          "devices": str(len(jax.devices()))}


if __name__ == "__main__":
  _case.main(whose)
