"""Taps and calls under transformations (vmap, jvp/grad, remat, custom
rules) and on several devices (pmap, shard_map), on the session's 4 CPU
devices."""

from __future__ import annotations

import subprocess
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import host_callback as hcb

from conftest import run_python


class Recorder:
  """A tap function that records (value as lists, transforms, device)."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.seen: list[tuple] = []

  def __call__(self, arg, transforms, *, device=None):
    value = jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), arg)
    with self.lock:
      self.seen.append((value, transforms, device))

  def taken(self) -> list[tuple]:
    hcb.barrier_wait()
    with self.lock:
      seen, self.seen = self.seen, []
    return seen


@pytest.fixture
def rec() -> Recorder:
  return Recorder()


def batch(*dims):
  return ("batch", {"batch_dims": dims})


def power3(tap, x):
  y = x * x
  hcb.id_tap(tap, (x, y))  # result unused: still runs
  return y * x


# ---- vmap -------------------------------------------------------------------

def test_vmap_taps_once_with_batched_values_and_batch_dims(rec):
  out = jax.vmap(lambda x: power3(rec, x))(np.array([2., 3.]))
  np.testing.assert_array_equal(out, [8., 27.])
  assert rec.taken() == [(([2., 3.], [4., 9.]), (batch(0, 0),), None)]


def test_vmap_unbatched_arguments_are_none(rec):
  jax.vmap(lambda x: hcb.id_tap(rec, (x, 5.)), in_axes=1)(np.ones((2, 3)))
  (value, transforms, _), = rec.taken()
  assert value == ([[1.] * 3] * 2, 5.)
  assert transforms == (batch(1, None),)


def test_nested_vmaps_add_one_entry_each_innermost_first(rec):
  f = jax.vmap(jax.vmap(lambda x, y: hcb.id_tap(rec, (x, y)),
                        in_axes=(0, None)), in_axes=(None, 0))
  f(np.arange(3.), np.arange(2.))
  (value, transforms, _), = rec.taken()
  assert transforms == (batch(0, None), batch(None, 0))
  assert value == ([0., 1., 2.], [0., 1.])


def test_vmap_inside_jit_and_scan(rec):
  def step(c, x):
    return c + hcb.id_tap(rec, x), None

  jax.jit(jax.vmap(lambda xs: lax.scan(step, 0., xs)[0]))(
      np.arange(6.).reshape(2, 3))
  assert rec.taken() == [([0., 3.], (batch(0),), None),
                         ([1., 4.], (batch(0),), None),
                         ([2., 5.], (batch(0),), None)]


def test_vmap_of_while_loop_taps_every_iteration(rec):
  out = jax.vmap(lambda x: lax.while_loop(
      lambda c: c < 3, lambda c: hcb.id_tap(rec, c) + 1, x))(np.array([1, 2]))
  np.testing.assert_array_equal(out, [3, 3])
  # A batched predicate runs the body for the whole batch until every
  # element is done: the tap sees the whole batch each time.
  assert [v for v, _, _ in rec.taken()] == [[1, 2], [2, 3]]


def test_vmap_of_cond_with_batched_predicate_is_refused(rec):
  f = lambda p, x: lax.cond(p, lambda v: hcb.id_tap(rec, v), lambda v: v, x)
  with pytest.raises(NotImplementedError,
                     match="vmap of lax.cond with a batched predicate"):
    jax.vmap(f)(np.array([True, False]), np.ones(2))
  jax.vmap(f, in_axes=(None, 0))(True, np.ones(2))  # unbatched: fine
  assert rec.taken() == [([1., 1.], (batch(0),), None)]


# ---- autodiff ---------------------------------------------------------------

@pytest.mark.parametrize("transform", ["jvp", "grad", "grad_of_grad",
                                       "value_and_grad"])
def test_autodiff_taps_primal_values_once(rec, transform):
  f = lambda x: power3(rec, x)
  if transform == "jvp":
    out = jax.jvp(f, (3.,), (0.1,))
    np.testing.assert_allclose(out, (27., 2.7), rtol=1e-6)
  elif transform == "grad":
    assert float(jax.grad(f)(3.)) == 27.
  elif transform == "grad_of_grad":
    assert float(jax.grad(jax.grad(f))(3.)) == 18.
  else:
    v, g = jax.value_and_grad(f)(3.)
    assert (float(v), float(g)) == (27., 27.)
  assert rec.taken() == [((3., 9.), (), None)]


def test_integer_arguments_have_float0_tangents(rec):
  f = lambda i, x: hcb.id_tap(rec, (i, x))[1] * 2
  out, tangent = jax.jvp(f, (3, 1.), (np.zeros((), jax.dtypes.float0), 1.))
  assert (float(out), float(tangent)) == (2., 2.)
  assert rec.taken() == [((3, 1.), (), None)]


def test_grad_under_jit_and_scan(rec):
  def loss(x):
    c, _ = lax.scan(lambda c, _: (power3(rec, c), None), x, None, length=2)
    return c

  g = jax.jit(jax.grad(loss))(1.5)
  np.testing.assert_allclose(g, 9 * 1.5 ** 8, rtol=1e-5)
  assert rec.taken() == [((1.5, 2.25), (), None),
                         ((3.375, 11.390625), (), None)]


def test_grad_keeps_a_tap_of_values_without_tangents_in_a_scan(rec):
  """A tap of the loop's index (no tangent, so no JVP rule runs) in a
  differentiated scan runs once per step, eagerly and under jit."""
  def loss(x):
    def step(c, i):
      hcb.id_tap(rec, i)
      return c * 1.5, None
    return lax.scan(step, x, jnp.arange(3))[0]

  for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
    np.testing.assert_allclose(grad(1.0), 1.5 ** 3, rtol=1e-6)
    assert rec.taken() == [(0, (), None), (1, (), None), (2, (), None)]


def test_grad_keeps_a_tap_in_a_cond_in_a_scan(rec):
  """The same inside a cond whose outputs are unused (a progress bar's
  every-k-steps update), eagerly and under jit."""
  def loss(x):
    def step(c, i):
      lax.cond(i % 2 == 0, lambda: (hcb.id_tap(rec, i), None)[1],
               lambda: None)
      return c * 1.5, None
    return lax.scan(step, x, jnp.arange(5))[0]

  for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
    np.testing.assert_allclose(grad(1.0), 1.5 ** 5, rtol=1e-6)
    assert rec.taken() == [(0, (), None), (2, (), None), (4, (), None)]


def test_custom_jvp_rule_taps_tangents_and_its_transpose_cotangents(rec):
  @jax.custom_jvp
  def watch(a):
    return a

  @watch.defjvp
  def watch_jvp(primals, tangents):
    return primals[0], hcb.id_tap(rec, tangents[0])

  f = lambda x: watch(x * 2) * 3
  jax.jvp(f, (3.,), (0.1,))
  assert rec.taken() == [(pytest.approx(0.2), (), None)]
  jax.grad(f)(3.)
  assert rec.taken() == [(3., (("transpose", {}),), None)]


def test_custom_vjp_backward_rule_taps_cotangents(rec):
  @jax.custom_vjp
  def watch(a):
    return a

  watch.defvjp(lambda a: (a, None), lambda _, ct: (hcb.id_tap(rec, ct),))

  def loss(x):
    c, _ = lax.scan(lambda c, _: (watch(c) * 2, None), x, None, length=2)
    return c

  assert float(jax.grad(loss)(1.)) == 4.
  assert rec.taken() == [(2., (), None), (4., (), None)]


# ---- rematerialisation ------------------------------------------------------

def test_checkpoint_reruns_taps_in_the_old_order(rec):
  f = lambda x: power3(rec, jax.checkpoint(lambda y: power3(rec, y))(x))
  jax.grad(f)(3.)
  assert [v for v, _, _ in rec.taken()] == [(3., 9.), (27., 729.), (3., 9.)]


def test_named_call_and_odeint(rec):
  from jax.experimental.ode import odeint
  f = jax.named_call(lambda x: hcb.id_tap(rec, x) * 2, name="doubler")
  assert float(jax.jit(f)(2.)) == 4.
  assert rec.taken() == [(2., (), None)]

  def rhs(y, t):
    return -hcb.id_tap(rec, y)

  ys = odeint(rhs, 1., jnp.array([0., 0.1]))
  np.testing.assert_allclose(ys[-1], np.exp(-0.1), rtol=1e-4)
  seen = rec.taken()
  assert len(seen) > 2 and seen[0][0] == 1.


# ---- devices ----------------------------------------------------------------

XS = np.arange(8, dtype=np.float32).reshape(4, 2)


def by_device(seen):
  return sorted(seen, key=lambda s: s[2].id)


def test_pmap_each_device_taps_its_shard(rec):
  out = jax.pmap(lambda x: hcb.id_tap(rec, x, tap_with_device=True) * 2)(XS)
  np.testing.assert_array_equal(out, XS * 2)
  assert by_device(rec.taken()) == [
      (XS[i].tolist(), (), jax.devices()[i]) for i in range(4)]


def test_pmap_call_returns_each_devices_slice():
  def host(x, *, device):
    return x + 100 * device.id

  out = jax.pmap(lambda x: hcb.call(host, x, result_shape=x,
                                    call_with_device=True))(XS)
  np.testing.assert_array_equal(out, XS + 100 * np.arange(4)[:, None])


def test_pmap_of_vmap_and_vmap_of_pmap(rec):
  xs = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
  jax.pmap(jax.vmap(lambda x: hcb.id_tap(rec, x, tap_with_device=True)))(xs)
  seen = by_device(rec.taken())
  assert [(v, t, d.id) for v, t, d in seen] == [
      (xs[0].tolist(), (batch(0),), 0), (xs[1].tolist(), (batch(0),), 1)]
  jax.vmap(jax.pmap(lambda x: hcb.id_tap(rec, x, tap_with_device=True)))(xs)
  seen = by_device(rec.taken())
  assert [d.id for _, _, d in seen] == [0, 1]
  assert [v for v, _, _ in seen] == [xs[:, 0].tolist(), xs[:, 1].tolist()]


def test_pmap_keeps_each_devices_order(rec):
  def step(c, _):
    return hcb.id_tap(rec, c, tap_with_device=True) + 1, None

  jax.pmap(lambda x: lax.scan(step, x, None, length=20)[0])(
      np.arange(4.)).block_until_ready()  # see test_pmap_of_vmap_...
  seen = rec.taken()
  for dev in jax.devices():
    mine = [v for v, _, d in seen if d == dev]
    assert mine == [dev.id + k for k in range(20)]


def test_shard_map_each_device_taps_and_calls_with_its_shard(rec):
  mesh = Mesh(np.array(jax.devices()), ("d",))

  def body(x):
    x = hcb.id_tap(rec, x, tap_with_device=True)
    return hcb.call(lambda v, device: v * 10 + device.id, x, result_shape=x,
                    call_with_device=True)

  out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))(XS)
  np.testing.assert_array_equal(out, XS * 10 + np.arange(4)[:, None])
  assert by_device(rec.taken()) == [
      ([XS[i].tolist()], (), jax.devices()[i]) for i in range(4)]


@pytest.mark.parametrize("method", ["sequential", "expand_dims",
                                    "broadcast_all"])
def test_vmap_of_call_inside_shard_map(method):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  calls = []

  def host(x):
    calls.append(x.shape)
    return x + 1

  body = jax.vmap(lambda x: hcb.call(host, x, result_shape=x,
                                     vmap_method=method))
  xs = np.arange(16, dtype=np.float32).reshape(8, 2)
  out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))(xs)
  np.testing.assert_array_equal(out, xs + 1)
  per_device = {"sequential": [(2,)] * 2, "expand_dims": [(2, 2)],
                "broadcast_all": [(2, 2)]}[method]
  assert sorted(calls) == sorted(per_device * 4)


@pytest.mark.parametrize("device_index", [0, 1])
def test_sharded_jit_calls_once_on_device_index_with_the_whole_operand(
    rec, device_index):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(XS, NamedSharding(mesh, P("d")))
  tapped = jax.jit(lambda v: hcb.id_tap(rec, v * 1, tap_with_device=True,
                                        device_index=device_index) + 1)(x)
  np.testing.assert_array_equal(tapped, XS + 1)
  assert rec.taken() == [(XS.tolist(), (), jax.devices()[device_index])]

  calls = []

  def host(v, *, device):
    calls.append((device, v.shape))
    return v * 10

  out = jax.jit(lambda v: hcb.call(host, v, result_shape=v,
                                   call_with_device=True,
                                   device_index=device_index))(x)
  np.testing.assert_array_equal(out, XS * 10)  # the whole result
  assert calls == [(jax.devices()[device_index], (4, 2))]

  def fill(ctx, out, v):
    np.asarray(out)[...] = np.asarray(v) + 0.5

  out = jax.jit(hcb.buffer_callback(fill, jax.ShapeDtypeStruct((4, 2),
                                                               np.float32)))(x)
  np.testing.assert_array_equal(out, XS + 0.5)


def test_sharded_jit_device_index_out_of_range(rec):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(XS, NamedSharding(mesh, P("d")))
  with pytest.raises(ValueError, match="device_index=4 is out of range: JAX "
                                       "has 4 devices"):
    jax.jit(lambda v: hcb.id_tap(rec, v, device_index=4))(x)


def _run_on_sharded_x(body: str) -> subprocess.CompletedProcess[str]:
  """Runs ``body`` in a fresh process after a start that shards
  x = [0, 1, 2, 3] over every device (names jax, np, hcb, mesh, x)."""
  start = """
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      import host_callback as hcb
      mesh = Mesh(np.array(jax.devices()), ("d",))
      x = jax.device_put(np.arange(4, dtype=np.float32),
                         NamedSharding(mesh, P("d")))
  """
  return run_python(textwrap.dedent(start) + textwrap.dedent(body),
                    timeout=120)


def test_sharded_jit_taps_and_calls_take_hundreds_of_arrays():
  # JAX's Python callback hands the runtime one array per leaf.  It took at
  # most 256; the device whose tap failed then left the others waiting for
  # it in the program's collectives (a hang).  The FFI path has no limit.
  done = _run_on_sharded_x("""
      got = []
      def f(x):
        leaves = [x.sum() + i for i in range(300)]  # 6, 7, ..., 305
        hcb.id_tap(lambda v, t: got.append(float(sum(v))), leaves,
                   device_index=1)
        doubled = hcb.call(lambda v: [a * 2 for a in v], leaves,
                           result_shape=leaves)
        return x + sum(doubled)
      out = jax.jit(f)(x)
      hcb.barrier_wait()
      print(got, np.asarray(out).tolist())
  """)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split("\n")[0] == \
      "[46650.0] [93300.0, 93301.0, 93302.0, 93303.0]"


def test_sharded_jit_call_errors_surface(rec):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(XS, NamedSharding(mesh, P("d")))
  with pytest.raises(Exception, match="returned float32\\[2\\]; "
                                      "result_shape declares float32\\[4,2\\]"):
    jax.jit(lambda v: hcb.call(lambda a: a[0], v, result_shape=v))(
        x).block_until_ready()
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()


def test_barrier_wait_while_every_device_is_busy(rec):
  gate = threading.Event()

  def slow(x, transforms, *, device):
    gate.wait(5)
    rec(x, transforms, device=device)

  f = jax.pmap(lambda x: hcb.id_tap(slow, x, tap_with_device=True))
  f(XS).block_until_ready()  # the taps are queued; their functions wait
  threading.Timer(0.2, gate.set).start()
  hcb.barrier_wait()  # returns once every device's tap ran
  assert len(rec.taken()) == 4


# ---- several processes ------------------------------------------------------

def test_two_processes_each_receive_their_own_devices_callbacks():
  import json
  import os
  import socket
  import subprocess
  import sys

  with socket.socket() as s:  # a free loopback port for the coordinator
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
  worker = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")
  env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
  procs = [subprocess.Popen([sys.executable, worker, str(i), port], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  for i, g in enumerate(got):
    devices = g["local"]
    assert len(devices) == 2
    shards = {d: [2 * i + k] for k, d in enumerate(devices)}
    expected = sorted([d, [[2. * r, 2. * r + 1]]]
                      for d, (r,) in shards.items())
    assert g["taps"] == expected  # exactly this process's devices
    assert g["inline"] == [devices[1], (
        "host_callback.call: device_index=3 is out of range for an inline "
        "callback, which runs in this process: it has 2 local devices, so "
        "device_index must be from 0 to 1")]
    assert g["calls"] == expected
    assert g["out"] == sorted([d, [[v + 100 for v in row] for row in rows]]
                              for d, rows in expected)
  assert set(got[0]["local"]).isdisjoint(got[1]["local"])
  # under jit over sharded operands the runner's process alone runs the
  # functions, once, on the whole operands; every device gets the results
  runner = got[0]["runner"]
  xs = [[0., 1.], [2., 3.], [4., 5.], [6., 7.]]
  for g in got:
    mine = runner in g["local"]
    assert g["sharded"]["taps"] == ([[runner, xs]] if mine else [])
    assert g["sharded"]["calls"] == ([runner] if mine else [])
    assert g["sharded"]["out"] == sorted(  # replicated: whole everywhere
        [d, [[2 * v + 1 for v in row] for row in xs]] for d in g["local"])
  # a call that fails there fails in both processes, the runner's with
  # the exception, the other saying where it was raised; the next works
  failing = got[0]["failing"]["runner"]
  for g in got:
    mine = failing in g["local"]
    ran, raised = g["failing"]["ran"], g["failing"]["raised"]
    assert ran == ([failing, failing] if mine else [])
    if mine:
      assert "raised ValueError: the first call fails" in raised[0]
    else:
      assert (f"its function, run once for the computation by device "
              f"cpu:{failing} (device_index=3) in process 1, failed there; "
              "the exception itself is raised in that process") in raised[0]
    assert raised[1] == sorted(
        [d, [[v - 1 for v in row] for row in xs]] for d in g["local"])
    # the runner's process also reports it at the barrier, as on one device
    assert len(raised) == (3 if mine else 2)
    if mine:
      assert "the first call fails" in raised[2]
