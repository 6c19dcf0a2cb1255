"""debug.print and debug.callback under jit over sharded operands, inside
and outside a mesh context, with Shardy (JAX's default partitioner) and
with GSPMD: under vmap with different in_axes, partitioned or not, and
partitioned callbacks that compute on their shard.  Each case runs with
JAX's jax.debug and with ours, in a fresh interpreter with 4 CPU devices
(the partitioner is chosen before anything is compiled); the lines printed
must be the same (as sets: devices print concurrently)."""

from __future__ import annotations

import json

import pytest

from conftest import MESH_CONTEXT, run_python

SCRIPT = """
import contextlib, functools, io, json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_use_shardy_partitioner", {shardy})
import host_callback as hcb

results = {{}}

def lines(name, run, mesh):
  for side, debug in (("jax", jax.debug), ("hcb", hcb.debug)):
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out):
        with ({mesh_context}(mesh) if mesh is not None
              else contextlib.nullcontext()):
          run(debug)
          jax.effects_barrier()
      got = sorted(out.getvalue().splitlines())
    except Exception as e:
      got = "raised " + type(e).__name__
    results[name + " " + side] = got

two = Mesh(np.array(jax.devices()[:2]), ("x",))
four = Mesh(np.array(jax.devices()), ("x",))
for partitioned in (True, False):
  for mesh_name, mesh in (("in_mesh", True), ("no_mesh", False)):
    # JAX's own case: 2 devices, both operands sharded on their first axis,
    # mapped over different axes.
    s = NamedSharding(two, P("x"))
    x = jax.device_put(np.arange(4).reshape(2, 2), s)
    y = jax.device_put(np.arange(4).reshape(2, 2) + 6, s)
    def diff_axes(debug, p=partitioned):
      @jax.jit
      @functools.partial(jax.vmap, in_axes=(0, 1))
      def f(a, b):
        debug.print("hello: {{}} {{}}", a, b, partitioned=p)
      f(x, y)
    lines(f"diff_axes {{partitioned}} {{mesh_name}}", diff_axes,
          two if mesh else None)
    # Each mapped axis sharded over 4 devices.
    a4 = jax.device_put(np.arange(16).reshape(4, 4), NamedSharding(four, P("x")))
    b4 = jax.device_put(np.arange(16).reshape(4, 4) + 100,
                        NamedSharding(four, P(None, "x")))
    def diff_axes4(debug, p=partitioned):
      @jax.jit
      @functools.partial(jax.vmap, in_axes=(0, 1))
      def f(a, b):
        debug.print("h {{}} {{}}", a, b, partitioned=p)
      f(a4, b4)
    lines(f"diff_axes4 {{partitioned}} {{mesh_name}}", diff_axes4,
          four if mesh else None)
    # Computing on the shard.
    v = jax.device_put(np.arange(8), NamedSharding(four, P("x")))
    def compute(debug, p=partitioned):
      @jax.jit
      def f(a):
        debug.print("sum: {{}}", a.sum(), partitioned=p)
        debug.callback(lambda s: print("callback", s.shape, int(s.sum())),
                       a * 2, partitioned=p)
        return a + 1
      f(v).block_until_ready()
    lines(f"compute {{partitioned}} {{mesh_name}}", compute,
          four if mesh else None)
print(json.dumps(results))
"""


@pytest.fixture(scope="module", params=["shardy", "gspmd"])
def results(request):
  done = run_python(SCRIPT.format(shardy=request.param == "shardy",
                                  mesh_context=MESH_CONTEXT),
                    env={"JAX_NUM_CPU_DEVICES": "4"}, timeout=400)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


def _cases(results, prefix, count=4):
  """(JAX's lines, ours, case) of each case whose name starts with
  ``prefix``: partitioned or not, in a mesh context or not."""
  names = sorted({k.rsplit(" ", 1)[0] for k in results
                  if k.startswith(prefix)})
  assert len(names) == count
  return [(results[n + " jax"], results[n + " hcb"], n) for n in names]


@pytest.mark.parametrize("case", ["diff_axes ", "diff_axes4 ", "compute "])
def test_prints_like_jax(results, case):
  for theirs, ours, name in _cases(results, case):
    assert isinstance(theirs, list) and theirs, name  # JAX's works
    assert ours == theirs, name


def test_partitioned_print_under_vmap_prints_each_devices_slice(results):
  for _, ours, name in _cases(results, "diff_axes True", 2):
    assert ours == ["hello: [0 1] [6]", "hello: [0 1] [8]",
                    "hello: [2 3] [7]", "hello: [2 3] [9]"], name


def test_partitioned_callback_computes_on_its_shard(results):
  for _, ours, name in _cases(results, "compute True", 2):
    assert [line for line in ours if line.startswith("callback")] == [
        "callback (2,) 10", "callback (2,) 18", "callback (2,) 2",
        "callback (2,) 26"], name
