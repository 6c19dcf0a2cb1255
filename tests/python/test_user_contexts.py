"""The runtime's own computations ignore the user's JAX contexts.

host_callback waits for devices with small computations of its own (the
probes of barrier_wait, of jax.effects_barrier once host_callback has
started, of an eager debug callback, of the at-exit flush).  A user's
context -- a mesh (concrete, explicit-sharding), a default device, a
transfer guard, disable_jit, x64, JAX's checks -- must not make them fail:
importing host_callback never makes a JAX call fail that worked before.
Each context is tried with every operation, with JAX's callbacks and with
ours: wherever JAX's work, ours must work and give the same result; ours
without a JAX counterpart (barrier_wait, id_tap) must always work.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback as jax_io_callback

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import (SET_MESH, enable_x64_context, mesh_context,
                      no_concrete_mesh, run_python)


def _mesh(explicit: bool = False) -> jax.sharding.Mesh:
  devices = np.array(jax.devices()[:2])
  if explicit:
    return jax.sharding.Mesh(devices, ("x",),
                             axis_types=(jax.sharding.AxisType.Explicit,))
  return jax.sharding.Mesh(devices, ("x",))


def _legacy_mesh():
  warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:`
  return _mesh()


CONTEXTS = {
    "set_mesh": lambda: mesh_context(_mesh()),
    "set_mesh_explicit_axes": lambda: mesh_context(_mesh(explicit=True)),
    "with_mesh": _legacy_mesh,
    "default_device": lambda: jax.default_device(jax.devices()[1]),
    "transfer_guard_disallow": lambda: jax.transfer_guard("disallow"),
    "transfer_guard_disallow_explicit":
        lambda: jax.transfer_guard("disallow_explicit"),
    "disable_jit": jax.disable_jit,
    "enable_x64": enable_x64_context,
    "enable_checks": lambda: jax.enable_checks(True),
    "debug_nans": lambda: jax.debug_nans(True),
    "numpy_rank_promotion_raise": lambda: jax.numpy_rank_promotion("raise"),
    "numpy_dtype_promotion_strict":
        lambda: jax.numpy_dtype_promotion("strict"),
    "checking_leaks": jax.checking_leaks,
}

F32 = jax.ShapeDtypeStruct((), np.float32)


class _Apis:
  """One side's callbacks: JAX's or ours, and programs that use them
  (jitted before any context is entered, on arrays made before)."""

  def __init__(self, ours: bool):
    self.debug = hdebug if ours else jax.debug
    self.pure = hcb.pure_callback if ours else jax.pure_callback
    self.io = hcb.io_callback if ours else jax_io_callback
    self.seen: list[float] = []
    debug = self.debug
    self.jit_print = jax.jit(lambda x: (debug.print("jit {}", x), x + 1)[1])
    self.jit_callback = jax.jit(
        lambda x: (debug.callback(self.note, x), x + 1)[1])
    self.jit_pure = jax.jit(lambda x: self.pure(self.double, F32, x))
    self.jit_io = jax.jit(lambda x: self.io(self.double, F32, x))

  def note(self, x) -> None:
    self.seen.append(float(x))

  def double(self, x) -> np.float32:
    self.seen.append(float(x))
    return np.float32(2 * x)


def _ops(apis: _Apis, x: jax.Array) -> dict:
  """name -> operation; each returns an array or None (read outside the
  context: reading it is a transfer that transfer_guard may refuse)."""
  def flushed(value):
    jax.effects_barrier()
    return value

  return {
      "effects_barrier": lambda: flushed(None),
      "eager_print_numpy": lambda: apis.debug.print("e {}", np.float32(1)),
      "eager_print_array": lambda: apis.debug.print("e {}", x),
      "eager_callback": lambda: apis.debug.callback(apis.note, x),
      "eager_pure_callback": lambda: apis.pure(apis.double, F32, x),
      "eager_io_callback": lambda: apis.io(apis.double, F32, x),
      "jit_print": lambda: flushed(apis.jit_print(x)),
      "jit_callback": lambda: flushed(apis.jit_callback(x)),
      "jit_pure_callback": lambda: apis.jit_pure(x),
      "jit_io_callback": lambda: apis.jit_io(x),
  }


def _outcome(context, apis: _Apis, op):
  """(result, stdout, values the callbacks saw) of ``op()`` inside
  ``context``, or the exception's type."""
  out = io.StringIO()
  apis.seen.clear()
  try:
    with contextlib.redirect_stdout(out), context():
      result = op()
  except Exception as e:  # pylint: disable=broad-except
    return ("raised", type(e).__name__)
  value = None if result is None else float(np.asarray(result))
  return (value, out.getvalue(), list(apis.seen))


@pytest.mark.parametrize("name", list(CONTEXTS))
def test_dropins_work_in_every_context_where_jaxs_work(name):
  context = CONTEXTS[name]
  x = jnp.float32(3)
  sides = {"jax": _Apis(ours=False), "hcb": _Apis(ours=True)}
  for apis in sides.values():  # compiled and warm outside the context
    for op in _ops(apis, x).values():
      with contextlib.redirect_stdout(io.StringIO()):
        op()
  hcb.barrier_wait()
  theirs_ops, ours_ops = _ops(sides["jax"], x), _ops(sides["hcb"], x)
  worked = 0
  for op_name in theirs_ops:
    theirs = _outcome(context, sides["jax"], theirs_ops[op_name])
    ours = _outcome(context, sides["hcb"], ours_ops[op_name])
    if theirs[0] != "raised":
      assert ours == theirs, (name, op_name)
      worked += 1
  assert worked >= 3, f"JAX's callbacks fail in {name}: test nothing"


@pytest.mark.parametrize("name", list(CONTEXTS))
def test_barrier_wait_and_taps_work_in_every_context(name):
  seen = []
  tap = jax.jit(lambda v: hcb.id_tap(lambda a, _: seen.append(int(a)), v))
  x = jnp.int32(5)
  tap(x)
  hcb.barrier_wait()
  with CONTEXTS[name]():
    hcb.barrier_wait()  # nothing pending
    tap(x)
    hcb.barrier_wait()  # one pending
    jax.effects_barrier()
    hcb.id_print(x, output_stream=io.StringIO())  # eagerly
    hcb.barrier_wait()
  assert seen == [5, 5]


def test_eager_debug_callback_runs_in_jaxs_context_for_it():
  """JAX calls an eager debug callback with the first CPU device as the
  default device whatever the caller's, and from JAX 0.8 on with no mesh
  (0.6 and 0.7: in the caller's, where a new array spans it); ours too."""
  def where(mod):
    found = []

    def cb(_):
      found.append((jnp.zeros(()).devices(), no_concrete_mesh()))

    with mesh_context(_mesh()), jax.default_device(jax.devices()[1]):
      mod.callback(cb, jnp.float32(1))
    return found

  expected = ([({jax.devices()[0]}, True)]
              if jax.__version_info__ >= (0, 8)
              else [(set(jax.devices()[:2]), False)])
  assert where(hdebug) == where(jax.debug) == expected


GLOBAL_SETTINGS = {
    "transfer_guard": 'jax.config.update("jax_transfer_guard", '
                      '"disallow_explicit")',
    "disable_jit": 'jax.config.update("jax_disable_jit", True)',
    "enable_x64": 'jax.config.update("jax_enable_x64", True)',
    "default_device": 'jax.config.update("jax_default_device", '
                      'jax.devices()[1])',
    "set_mesh": f"{SET_MESH}(mesh)",
    "set_mesh_explicit": f"{SET_MESH}(explicit)",
}


@pytest.mark.parametrize("name", list(GLOBAL_SETTINGS))
def test_settings_made_for_the_whole_program_break_nothing(name):
  """Settings made for the rest of the program (jax.config.update, and
  jax.set_mesh outside a with): barriers, eager prints and the at-exit
  flush, which delivers the last tap."""
  result = run_python(f"""
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      from host_callback import debug
      devices = np.array(jax.devices()[:2])
      mesh = jax.sharding.Mesh(devices, ("x",))
      explicit = jax.sharding.Mesh(
          devices, ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
      f = jax.jit(lambda v: (debug.print("print {{}}", v),
                             hcb.id_tap(lambda a, _: print("tap", a), v))[1])
      x1, x2, x3, x4 = (jnp.int32(i) for i in range(1, 5))
      f(x1)
      hcb.barrier_wait()
      {GLOBAL_SETTINGS[name]}
      f(x2)
      hcb.barrier_wait()
      jax.effects_barrier()
      debug.print("eager {{}}", x3)
      print("end", flush=True)
      f(x4)  # delivered by the at-exit flush
      """, env={"JAX_NUM_CPU_DEVICES": "2"})
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines == ["print 1", "tap 1", "print 2", "tap 2", "eager 3", "end",
                   "print 4", "tap 4"]
  assert "at-exit barrier failed" not in result.stderr
