"""Measurement 8: real libraries' callback-heavy workloads, unchanged, with
JAX's callbacks and patched to host_callback's (``HOST_CALLBACK_PATCH=jax``).

The libraries live in their own environment (.venv-clients,
requirements/clients.txt), so each workload runs in two child processes of
that environment's Python, one unpatched and one patched, started once and
kept: after a warm-up run (compilation), the parent asks each in turn for
one timed run, so that the repetitions of both are interleaved and a ratio
is taken per round, as everywhere in this harness.  A run is timed until
its result has been read and every callback has run
(``jax.effects_barrier()``, which waits for host_callback's too).

The child is ``run.py --clients-worker NAME``; the workloads are
:data:`WORKLOADS`.  What each measures and why: bench/README.md.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import time
from typing import Any, Callable

from hcb_bench.harness import Config
from hcb_bench.harness import Sample
from hcb_bench.harness import num

BENCH_RUN = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "run.py")


@dataclasses.dataclass(frozen=True)
class ClientRow:
  """One workload: seconds per run with JAX's callbacks and patched, or
  why it could not be measured."""

  key: str
  label: str
  what: str
  theirs: Sample | None = None
  ours: Sample | None = None
  error: str | None = None

  @property
  def speedup(self) -> float | None:
    """JAX's time over host_callback's (median of the paired ratios)."""
    if self.theirs is None or self.ours is None:
      return None
    return self.theirs.ratio(self.ours)


@dataclasses.dataclass(frozen=True)
class ClientsResult:
  rows: list[ClientRow]
  python: str
  versions: str


# ---- the workloads (in the child) -------------------------------------------

def _jax_tqdm(smoke: bool) -> Callable[[], Any]:
  """jax-tqdm 0.4.0: a scan of ``carry + 1`` with a bar updated every
  step (``print_rate=1``)."""
  import jax
  import jax.numpy as jnp
  from jax_tqdm import scan_tqdm
  n = 500 if smoke else 20_000

  @scan_tqdm(n, print_rate=1, file=io.StringIO())
  def step(carry, _):
    return carry + 1, None

  f = jax.jit(lambda x: jax.lax.scan(step, x, jnp.arange(n))[0])
  return lambda: f(jnp.int32(0))


def _diffrax(smoke: bool) -> Callable[[], Any]:
  """diffrax 0.7.2: an ODE solve of fixed steps with ``TqdmProgressMeter``
  (an update every step: a ``jax.pure_callback``)."""
  import diffrax
  import jax.numpy as jnp
  n = 200 if smoke else 5_000
  term = diffrax.ODETerm(lambda t, y, args: -y)

  def solve():
    return diffrax.diffeqsolve(
        term, diffrax.Euler(), t0=0.0, t1=1.0, dt0=1.0 / n,
        y0=jnp.ones(4), saveat=diffrax.SaveAt(t1=True),
        progress_meter=diffrax.TqdmProgressMeter(refresh_steps=1),
        max_steps=n + 1).ys

  return solve


def _numpyro(smoke: bool) -> Callable[[], Any]:
  """numpyro 0.21: NUTS, 4 chains in parallel, with progress bars."""
  import jax
  import numpy as np
  import numpyro
  import numpyro.distributions as dist
  from numpyro.infer import MCMC, NUTS
  y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
  sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

  def model(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", 8):
      theta = numpyro.sample("theta", dist.Normal(mu, tau))
      numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

  n = 20 if smoke else 300
  mcmc = MCMC(NUTS(model), num_warmup=n, num_samples=n, num_chains=4,
              chain_method="parallel", progress_bar=True)

  def run():
    mcmc.run(jax.random.PRNGKey(0), sigma, y=y)
    return mcmc.get_samples()["mu"]

  return run


# key: (label, what it runs, the function that builds the workload)
WORKLOADS: dict[str, tuple[str, str, Callable[[bool], Callable[[], Any]]]] = {
    "jax_tqdm": ("jax-tqdm 0.4.0 `scan_tqdm`, `print_rate=1`",
                 "a scan of 20,000 steps, a bar update every step",
                 _jax_tqdm),
    "diffrax": ("diffrax 0.7.2 `TqdmProgressMeter`",
                "`diffeqsolve`, 5,000 Euler steps, the meter updated every "
                "step", _diffrax),
    "numpyro": ("numpyro 0.21 MCMC with progress bars",
                "NUTS, eight schools, 4 parallel chains, 300 warm-up and "
                "300 samples each", _numpyro),
}


def worker_main(key: str) -> int:
  """The child: builds workload ``key``, warms it up, then answers each
  ``run`` line on stdin with the seconds of one run (``error ...`` if it
  failed) on stdout; the libraries' own output goes to stderr."""
  proto = sys.stdout
  sys.stdout = sys.stderr
  import jax
  if key == "numpyro":  # 4 devices for 4 parallel chains (hcb_bench sets 1)
    jax.config.update("jax_num_cpu_devices", 4)
  smoke = os.environ.get("HCB_BENCH_SMOKE") == "1"

  def once(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    jax.effects_barrier()
    return time.perf_counter() - start

  try:
    fn = WORKLOADS[key][2](smoke)
    once(fn)  # compile and warm up
    proto.write("ready\n")
  except Exception as e:  # noqa: BLE001 -- reported to the parent
    proto.write(f"error {type(e).__name__}: {str(e).splitlines()[0]}\n")
    proto.flush()
    return 0
  proto.flush()
  for line in sys.stdin:
    if line.strip() != "run":
      break
    try:
      proto.write(f"{once(fn)!r}\n")
    except Exception as e:  # noqa: BLE001
      proto.write(f"error {type(e).__name__}: {str(e).splitlines()[0]}\n")
    proto.flush()
  return 0


# ---- the parent --------------------------------------------------------------

class _Child:
  """A worker process and its line protocol."""

  def __init__(self, python: str, key: str, patched: bool, smoke: bool):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HOST_CALLBACK_PATCH", "JAX_NUM_CPU_DEVICES",
                        "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "cpu"
    env["HCB_BENCH_SMOKE"] = "1" if smoke else "0"
    if patched:
      env["HOST_CALLBACK_PATCH"] = "jax"
    self.proc = subprocess.Popen(
        [python, BENCH_RUN, "--clients-worker", key], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)

  def answer(self) -> str:
    assert self.proc.stdout is not None
    line = self.proc.stdout.readline().strip()
    return line or "error the worker exited"

  def run(self) -> str:
    assert self.proc.stdin is not None
    self.proc.stdin.write("run\n")
    self.proc.stdin.flush()
    return self.answer()

  def close(self) -> None:
    try:
      assert self.proc.stdin is not None
      self.proc.stdin.close()
      self.proc.wait(timeout=120)
    except (OSError, subprocess.TimeoutExpired):
      self.proc.kill()
      self.proc.wait()


def _measure(python: str, key: str, reps: int, smoke: bool) -> ClientRow:
  label, what, _ = WORKLOADS[key]
  children = {name: _Child(python, key, name == "ours", smoke)
              for name in ("theirs", "ours")}
  try:
    for name, child in children.items():
      ready = child.answer()
      if ready != "ready":
        who = "JAX's" if name == "theirs" else "patched"
        return ClientRow(key, label, what, error=f"{who} run: {ready[6:]}")
    times: dict[str, list[float]] = {"theirs": [], "ours": []}
    for _ in range(reps):
      for name, child in children.items():
        answer = child.run()
        if answer.startswith("error"):
          who = "JAX's" if name == "theirs" else "patched"
          return ClientRow(key, label, what, error=f"{who} run: {answer[6:]}")
        times[name].append(float(answer))
    return ClientRow(key, label, what, Sample(tuple(times["theirs"])),
                     Sample(tuple(times["ours"])))
  finally:
    for child in children.values():
      child.close()


def measure_clients(cfg: Config, python: str | None) -> ClientsResult | None:
  """Item 8: every workload, JAX's callbacks against patched.  None
  without the clients environment's Python."""
  if not python or not os.access(python, os.X_OK):
    return None
  versions = subprocess.run(
      [python, "-c", "import importlib.metadata as m; print(', '.join("
       "f'{p} {m.version(p)}' for p in ('jax', 'jax-tqdm', 'diffrax', "
       "'equinox', 'numpyro')))"], capture_output=True, text=True).stdout
  reps = max(1, min(cfg.reps, 3))  # minutes per numpyro round
  rows = [_measure(python, key, reps, cfg.smoke) for key in WORKLOADS]
  return ClientsResult(rows, python, versions.strip())


def clients_section(r: ClientsResult | None) -> list[str]:
  """RESULTS.md's section 9."""
  if r is None:
    return ["Not measured: no clients environment (`make install-clients` "
            "makes .venv-clients; `make bench` passes "
            "`--clients-python .venv-clients/bin/python`)."]
  n = len(r.rows[0].theirs.values) if r.rows and r.rows[0].theirs else 0
  lines = [
      f"Each library's own code, unchanged, in {r.python} ({r.versions}): "
      "with JAX's callbacks, and patched to host_callback's at start-up "
      "(`HOST_CALLBACK_PATCH=jax`), each in a process of its own kept "
      "for the whole measurement, their runs interleaved. Seconds per run "
      "(after a warm-up run), until the result has been read and every "
      "callback has run; the speed-up is the median of the per-round "
      f"ratios (JAX's time / patched time){f', {n} rounds' if n else ''}.",
      "",
      "| workload | what runs | JAX's callbacks, s | patched, s | speed-up |",
      "|---|---|---:|---:|---:|"]
  for row in r.rows:
    if row.error is not None or row.theirs is None or row.ours is None:
      lines.append(f"| {row.label} | {row.what} | – | – | not measured: "
                   f"{row.error} |")
      continue
    speedup = row.speedup
    lines.append(f"| {row.label} | {row.what} | {row.theirs.text()} | "
                 f"{row.ours.text()} | "
                 f"{'–' if speedup is None else num(speedup) + '×'} |")
  return lines
