"""JAX internals: used through one module, each touchpoint checked, and none
of JAX's own rules replaced by importing the package."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

from conftest import run_python
from host_callback import _jax

PACKAGE = pathlib.Path(_jax.__file__).parent


@pytest.mark.parametrize("name,check", _jax.TOUCHPOINTS,
                         ids=[name for name, _ in _jax.TOUCHPOINTS])
def test_touchpoint_is_as_the_package_uses_it(name, check):
  problem = check()
  assert problem is None, f"jax._src {name} changed in this JAX: {problem}"


def test_check_touchpoints_names_what_changed(monkeypatch):
  # A JAX that renamed a parameter of one touchpoint: the report names it.
  def emit_python_callback(ctx, callback, token, operands, operand_avals,
                           result_avals, *, has_side_effect, sharded):
    del ctx, callback, token, operands, operand_avals, result_avals
    del has_side_effect, sharded

  monkeypatch.setattr(_jax._callback, "emit_python_callback",
                      emit_python_callback)
  touchpoints = [(n, c) for n, c in _jax.TOUCHPOINTS
                 if n == "callback.emit_python_callback"]
  monkeypatch.setattr(_jax, "TOUCHPOINTS", touchpoints)
  (problem,) = _jax.check_touchpoints()
  assert "callback.emit_python_callback" in problem
  assert "'partitioned', 'sharding'" in problem, problem


def test_only_the_internals_module_imports_jax_src():
  pattern = re.compile(r"^\s*(from|import)\s+jax\._src\b", re.M)
  offenders = [p.name for p in PACKAGE.glob("*.py")
               if p.name != "_jax.py" and pattern.search(p.read_text())]
  assert offenders == []


def test_importing_the_package_replaces_none_of_jax_rules():
  script = textwrap.dedent("""
      import jax, jax.numpy as jnp
      from jax._src.interpreters import partial_eval as pe
      from jax.interpreters import batching
      from jax.extend.core import primitives as P

      from jax._src import dispatch
      before = dict(pe.dce_rules)
      cond_rule = batching.fancy_primitive_batchers[P.cond_p]
      effects_barrier = dispatch.RuntimeTokenSet.block_until_ready
      import host_callback as hcb
      own = {p for p in pe.dce_rules if p.name.startswith("hcb_")}
      changed = [p.name for p, r in pe.dce_rules.items()
                 if p not in own and before.get(p) is not r]
      assert changed == [], changed
      assert batching.fancy_primitive_batchers[P.cond_p] is cond_rule

      # A program without callbacks: traced and run as before.
      f = jax.jit(lambda x: jax.lax.scan(lambda c, y: (c + y, y), x, x)[0])
      assert float(f(jnp.ones(3))[0]) == 4.0
      assert all(before.get(p) is r for p, r in pe.dce_rules.items()
                 if p not in own)
      assert dispatch.RuntimeTokenSet.block_until_ready is effects_barrier

      # Tracing a program with a tap keeps the containers that hold taps.
      seen = []
      def g(x):
        jax.lax.scan(lambda c, y: (hcb.id_tap(lambda a, t: seen.append(a), c),
                                   None), x, None, length=2)
        return x
      jax.jit(g)(1.0)
      hcb.barrier_wait()
      assert len(seen) == 2, seen
      print("ok")
  """)
  done = run_python(script, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip() == "ok"


def test_only_programs_with_python_routed_callbacks_leave_the_fast_path():
  # pxla.UnloadedMeshExecutable.build_unsafe_call is wrapped (_pacing.py):
  # JAX's C++ fast path takes a program only while its callable is JAX's
  # own ExecuteReplicated.  A program without callbacks, or with taps as
  # our own custom calls, keeps it; jit over sharded operands with a tap
  # (JAX's Python callback carries it) is paced.
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import host_callback as hcb

  def unsafe_call(f, *args):
    return jax.jit(f).lower(*args).compile()._executable.unsafe_call

  mesh = Mesh(np.array(jax.devices()), ("d",))
  xs = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
  tap = lambda x: hcb.id_tap(lambda a, t: None, x)  # noqa: E731
  replicated = _jax._pxla.ExecuteReplicated
  assert isinstance(unsafe_call(lambda x: x + 1, xs), replicated)
  assert isinstance(unsafe_call(tap, jnp.arange(8.0)), replicated)
  paced = unsafe_call(tap, xs)
  assert type(paced).__name__ == "_PacedCall"
  assert isinstance(paced.call, replicated)
