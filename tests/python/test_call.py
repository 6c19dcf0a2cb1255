"""call against real JAX: results and their checks, pytrees, dtypes, control
flow, errors, devices, flavors, transformations, inline mode, re-entrancy."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb

from conftest import DTYPES, run_python, run_python_until

F32_3 = jax.ShapeDtypeStruct((3,), np.float32)


# ---- results --------------------------------------------------------------

def test_eigvals_example_of_the_old_docs_inside_jit():
  def host_eig(m):
    # numpy 2.5 returns complex eigenvalues even when they are real; the
    # declared result is real, as in the old module's example.
    return np.real_if_close(np.linalg.eigvals(m))

  def device_fun(m):
    return hcb.call(host_eig, m,
                    result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype))

  m = np.array([[[2., 1.], [1., 2.]], [[5., 0.], [0., 7.]]], np.float32)
  got = np.sort(np.asarray(jax.jit(device_fun)(m)), axis=-1)
  np.testing.assert_allclose(got, [[1., 3.], [5., 7.]], rtol=1e-6)


def test_eager_and_jit_give_the_callback_numpy_and_return_jax_arrays():
  seen = []

  def host(x):
    seen.append(type(x))
    return x * 2

  x = np.arange(3, dtype=np.float32)
  eager = hcb.call(host, x, result_shape=x)
  jitted = jax.jit(lambda a: hcb.call(host, a, result_shape=a))(x)
  for out in (eager, jitted):
    assert isinstance(out, jax.Array) and out.dtype == np.float32
    np.testing.assert_array_equal(out, [0., 2., 4.])
  assert seen == [np.ndarray, np.ndarray]


def test_pytrees_in_and_out():
  def host(arg):
    a, (b, c) = arg["a"], arg["bc"]
    return [a + 1, {"s": np.int32(b.sum()), "c": c}]

  arg = {"a": jnp.ones(2), "bc": (jnp.arange(3, dtype=jnp.int32),
                                  jnp.zeros((2, 2), jnp.bfloat16))}
  shape = [jax.ShapeDtypeStruct((2,), np.float32),
           {"s": jax.ShapeDtypeStruct((), np.int32),
            "c": jax.ShapeDtypeStruct((2, 2), jnp.bfloat16)}]
  out = jax.jit(lambda x: hcb.call(host, x, result_shape=shape))(arg)
  np.testing.assert_array_equal(out[0], [2., 2.])
  assert int(out[1]["s"]) == 3
  assert out[1]["c"].dtype == jnp.bfloat16 and out[1]["c"].shape == (2, 2)


@pytest.mark.parametrize("shape, returned, expected", [
    (3., np.float32(1.5), 1.5),                    # numeric scalar: float32[]
    (np.int32(0), 7, 7),                           # numpy scalar, Python int
    (np.zeros((2,), np.float32), [9., 8.], None),  # an array declares its aval
    (jnp.zeros((2,), jnp.int32), np.array([1, 2], np.int32), [1, 2]),
])
def test_result_shape_forms(shape, returned, expected):
  if expected is None:  # a list is a pytree, not an array: refused
    with pytest.raises(jax.errors.JaxRuntimeError, match="pytree structure"):
      jax.jit(lambda x: hcb.call(lambda _: returned, x,
                                 result_shape=shape))(1.).block_until_ready()
    with pytest.raises(hcb.CallbackException):
      hcb.barrier_wait()
    return
  out = jax.jit(lambda x: hcb.call(lambda _: returned, x,
                                   result_shape=shape))(1.)
  np.testing.assert_array_equal(out, expected)
  assert out.dtype == jax.dtypes.canonicalize_dtype(np.asarray(shape).dtype)


@pytest.mark.parametrize("shape", [None, ()])
def test_no_result(shape):
  seen = []
  out = jax.jit(lambda x: hcb.call(seen.append, x, result_shape=shape))(2.)
  assert out == shape
  assert [float(s) for s in seen] == [2.]


@pytest.mark.parametrize("bad", ["float32", object(), [1., "x"],
                                 {"a": lambda: 0}])
def test_bad_result_shape_is_a_trace_time_value_error(bad):
  with pytest.raises(ValueError) as info:
    jax.jit(lambda x: hcb.call(lambda v: v, x, result_shape=bad))(1.)
  # The removed module's words first (users search for them), then ours.
  assert str(info.value).startswith(
      "result_shape should be a pytree of values with structure matching the "
      "expected result of the callback function. The values must be either "
      "numeric scalars, or must have 'shape' and 'dtype' attributes. Got "
      f"{bad}. host_callback.call: ")
  if isinstance(bad, str):
    assert str(info.value).endswith(
        "host_callback.call: the leaf 'float32' (a str) is neither a numeric "
        "scalar nor has 'shape' and 'dtype'")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips(dtype):
  x = (np.arange(6) % 3).reshape(2, 3).astype(dtype)
  got = []

  def host(a):
    got.append(a)
    return a[::-1]  # not contiguous: copied through numpy

  out = jax.jit(lambda a: hcb.call(host, a, result_shape=a))(x)
  assert got[0].dtype == np.dtype(dtype)
  np.testing.assert_array_equal(got[0], x)
  assert out.dtype == np.dtype(dtype)
  np.testing.assert_array_equal(np.asarray(out), x[::-1])


def test_64_bit_dtypes_with_x64():
  proc = run_python("""
      import jax
      jax.config.update("jax_enable_x64", True)
      import numpy as np, host_callback as hcb
      for dt in (np.int64, np.uint64, np.float64, np.complex128):
        x = np.array([1, 2**40], dtype=dt)
        out = jax.jit(lambda a: hcb.call(lambda v: v + 1, a,
                                         result_shape=a))(x)
        print(out.dtype, out.tolist())
      try:  # with x64, a float64 declaration wants float64
        jax.jit(lambda a: hcb.call(lambda v: v.astype(np.float32), a,
                                   result_shape=a))(np.ones(2))
      except Exception as e:
        print(isinstance(e, jax.errors.JaxRuntimeError),
              "float32[2]; result_shape declares float64[2]" in str(e))
  """)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split("\n")[:5] == [
      "int64 [2, 1099511627777]", "uint64 [2, 1099511627777]",
      "float64 [2.0, 1099511627777.0]", "complex128 [(2+0j), (1099511627777+0j)]",
      "True True"]


def test_64_bit_results_fill_32_bit_declarations_without_x64():
  def host(_):
    return (np.float64(0.5), np.array([1, 2], np.int64),
            np.array([3], np.uint64), np.complex128(1j), 2.5, 4)

  shape = (np.float32(0), np.zeros(2, np.int32), np.zeros(1, np.uint32),
           np.complex64(0), np.float32(0), np.int32(0))
  out = jax.jit(lambda x: hcb.call(host, x, result_shape=shape))(1.)
  assert [o.dtype for o in out] == [np.float32, np.int32, np.uint32,
                                    np.complex64, np.float32, np.int32]
  assert [np.asarray(o).tolist() for o in out] == [0.5, [1, 2], [3], 1j,
                                                  2.5, 4]


def test_empty_arrays_and_empty_pytrees():
  seen = []

  def host(arg):
    seen.append(arg)
    return {"e": np.zeros((0, 3), np.float32), "t": ()}

  shape = {"e": jax.ShapeDtypeStruct((0, 3), np.float32), "t": ()}
  out = jax.jit(lambda x: hcb.call(host, x, result_shape=shape))(
      ((), {}, jnp.zeros((2, 0), jnp.int32)))
  assert out["e"].shape == (0, 3) and out["t"] == ()
  empty_t, empty_d, z = seen[0]
  assert empty_t == () and empty_d == {} and z.shape == (2, 0)


def test_callback_may_keep_its_arrays():
  kept = []

  def host(x):
    kept.append(x)
    return x

  f = jax.jit(lambda a: hcb.call(host, a, result_shape=a) + 1)
  for i in range(5):
    f(jnp.full((4,), i, jnp.float32))
  assert [k.tolist() for k in kept] == [[float(i)] * 4 for i in range(5)]


# ---- control flow ---------------------------------------------------------

def test_inside_cond_only_the_taken_branch_calls():
  calls = []

  def host(x):
    calls.append(float(x))
    return x * 10

  f = jax.jit(lambda p, x: lax.cond(
      p, lambda v: hcb.call(host, v, result_shape=v), lambda v: -v, x))
  assert float(f(True, 2.)) == 20. and float(f(False, 3.)) == -3.
  assert calls == [2.]


def test_inside_while_loop_body_and_predicate():
  calls = []

  def pred_host(i):
    calls.append(("pred", int(i)))
    return np.bool_(i < 3)

  def body_host(i):
    calls.append(("body", int(i)))
    return i + 1

  def cond(i):
    return hcb.call(pred_host, i, result_shape=jax.ShapeDtypeStruct((), bool))

  def body(i):
    return hcb.call(body_host, i, result_shape=i)

  out = jax.jit(lambda i: lax.while_loop(cond, body, i))(jnp.int32(0))
  assert int(out) == 3
  assert calls == [("pred", 0), ("body", 0), ("pred", 1), ("body", 1),
                   ("pred", 2), ("body", 2), ("pred", 3)]


def test_hundreds_of_calls_in_one_scan():
  def host(c):
    return c * 2 + 1

  def step(c, _):
    c = hcb.call(host, c, result_shape=c)
    return c % 1000, c

  last, ys = jax.jit(lambda c: lax.scan(step, c, None, length=500))(
      jnp.int32(0))
  expected, c = [], 0
  for _ in range(500):
    c = c * 2 + 1
    expected.append(c)
    c %= 1000
  assert np.asarray(ys).tolist() == expected and int(last) == c


def test_accumulator_example_of_the_old_docs():
  accumulator = []

  def host_log(arg):
    accumulator.append(float(arg))
    return 0.

  def device_fun(x):
    y = hcb.call(host_log, x, result_shape=jax.ShapeDtypeStruct((), np.float32))
    z = hcb.call(host_log, 2. * x,
                 result_shape=jax.ShapeDtypeStruct((), np.float32))
    return y + z

  res1 = jax.jit(device_fun)(1.)
  res2 = jax.jit(device_fun)(1.)
  assert float(res1) == 0. and float(res2) == 0.
  # No barrier_wait: the results depend on every call.
  assert accumulator == [1., 2., 1., 2.]


def test_call_runs_after_the_taps_its_device_issued_before_it():
  order = []

  def slow_tap(x, _):
    threading.Event().wait(0.05)
    order.append(("tap", float(x)))

  def host(x):
    order.append(("call", float(x)))
    return x

  f = jax.jit(lambda x: hcb.call(host, hcb.id_tap(slow_tap, x),
                                 result_shape=x))
  f(1.)
  f(2.)
  assert order == [("tap", 1.), ("call", 1.), ("tap", 2.), ("call", 2.)]


# ---- errors ---------------------------------------------------------------

def _raises(x):
  raise ValueError("host says no")


ERRORS = {
    "exception": (_raises, "callback '_raises' raised ValueError: host says "
                           "no\nTraceback (most recent call last):"),
    "pytree": (lambda x: (x, x), "returned a result with pytree structure "
                                 "PyTreeDef((*, *)); result_shape declares "
                                 "PyTreeDef(*)"),
    "shape": (lambda x: np.zeros((2, 2), np.float32),
              "returned float32[2,2]; result_shape declares float32[3]"),
    "dtype": (lambda x: x.astype(np.int32),
              "returned int32[3]; result_shape declares float32[3]"),
    "none": (lambda x: None,
             "returned None; result_shape declares float32[3]"),
}


def _run(where, func):
  if where == "eager":
    return hcb.call(func, jnp.ones(3), result_shape=F32_3)
  if where == "jit":
    return jax.jit(lambda x: hcb.call(func, x, result_shape=F32_3))(
        jnp.ones(3))
  step = lambda c, _: (hcb.call(func, c, result_shape=F32_3), None)
  return jax.jit(lambda x: lax.scan(step, x, None, length=3)[0])(jnp.ones(3))


@pytest.mark.parametrize("where", ["eager", "jit", "scan"])
@pytest.mark.parametrize("kind", list(ERRORS))
def test_errors_fail_the_computation_are_recorded_and_the_next_call_works(
    kind, where, caplog):
  func, message = ERRORS[kind]
  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.block_until_ready(_run(where, func))
  assert message in str(info.value)
  if kind != "exception":
    assert "host_callback.call: callback '<lambda>'" in str(info.value)
  with pytest.raises(hcb.CallbackException) as recorded:
    hcb.barrier_wait()
  assert message.split("\n")[0].split(": ", 1)[-1] in str(recorded.value)
  # A result that does not match is a TypeError, as in inline mode.
  if kind != "exception":
    assert isinstance(recorded.value.__cause__, TypeError)
  assert any("error in call function" in r.getMessage()
             for r in caplog.records)
  np.testing.assert_array_equal(_run(where, lambda x: x + 1), 2. if
                                where != "scan" else 4.)


def test_a_long_traceback_keeps_its_end():
  def ping(n):  # ping and pong alternate: Python cannot fold the frames
    if n == 0:
      raise RuntimeError("at the bottom")
    return pong(n - 1)

  def pong(n):
    return ping(n - 1)

  with pytest.raises(jax.errors.JaxRuntimeError) as info:
    jax.jit(lambda x: hcb.call(lambda v: ping(60), x, result_shape=x))(
        1.).block_until_ready()
  msg = str(info.value)
  assert len(msg) < 2100
  assert "' raised RuntimeError: at the bottom\n...\n" in msg
  assert msg.endswith("in ping\n    raise RuntimeError(\"at the bottom\")\n"
                      "RuntimeError: at the bottom")
  with pytest.raises(hcb.CallbackException, match="at the bottom"):
    hcb.barrier_wait()


def test_jax_arrays_and_numpy_scalars_are_results_too():
  shape = (F32_3, np.float32(0))
  out = jax.jit(lambda x: hcb.call(
      lambda v: (jnp.asarray(v) * 2, np.float32(7)), x,
      result_shape=shape))(jnp.ones(3))
  np.testing.assert_array_equal(out[0], [2., 2., 2.])
  assert float(out[1]) == 7.


def test_python_scalar_that_does_not_fit_is_an_error():
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="returned a Python int that does not fit int8"):
    jax.jit(lambda x: hcb.call(lambda _: 300, x,
                               result_shape=np.int8(0)))(1.).block_until_ready()
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="returned a Python float; result_shape declares "
                           "int32"):
    jax.jit(lambda x: hcb.call(lambda _: 1.5, x,
                               result_shape=np.int32(0)))(1.).block_until_ready()
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()


def test_bad_arguments_get_clear_errors():
  with pytest.raises(TypeError, match="callback_func must be callable"):
    hcb.call(3, 1.)
  with pytest.raises(TypeError, match="callback_flavor must be a"):
    hcb.call(abs, 1., callback_flavor="pure")
  with pytest.raises(ValueError, match="vmap_method must be None or one of"):
    hcb.call(abs, 1., vmap_method="parallel")


# ---- devices --------------------------------------------------------------

def test_call_with_device_passes_the_calling_device():
  seen = []

  def host(x, *, device):
    seen.append(device)
    return x

  f = jax.jit(lambda x: hcb.call(host, x, result_shape=x,
                                 call_with_device=True))
  for dev in jax.devices()[:3]:
    f(jax.device_put(jnp.float32(1), dev))
  assert seen == jax.devices()[:3]


def test_computations_on_several_devices_call_concurrently():
  barrier = threading.Barrier(4, timeout=30)

  def host(x):
    barrier.wait()  # only returns once all four devices are inside a call
    return x + 1

  f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
  outs = [None] * 4

  def run(i):
    outs[i] = float(f(jax.device_put(jnp.float32(i), jax.devices()[i])))

  threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert outs == [1., 2., 3., 4.]


# ---- flavors --------------------------------------------------------------

def test_io_callback_runs_with_an_unused_result_and_pure_may_not():
  calls = []

  def host(x):
    calls.append(float(x))
    return x

  def f(x, flavor):
    hcb.call(host, x, result_shape=x, callback_flavor=flavor)
    return x + 1

  jax.jit(f, static_argnums=1)(1., hcb.CallbackFlavor.IO_CALLBACK)
  assert calls == [1.]
  jax.jit(f, static_argnums=1)(2., hcb.CallbackFlavor.PURE)
  assert calls == [1.]  # removed as dead code
  out = jax.jit(lambda x: hcb.call(host, x, result_shape=x,
                                   callback_flavor=hcb.CallbackFlavor.PURE))(3.)
  assert float(out) == 3. and calls == [1., 3.]


def test_debug_flavor():
  with pytest.raises(NotImplementedError,
                     match="DEBUG flavor can be used only when result_shape "
                           "is None"):
    hcb.call(abs, 1., result_shape=1.,
             callback_flavor=hcb.CallbackFlavor.DEBUG)
  seen = []
  jax.jit(lambda x: hcb.call(seen.append, x,
                             callback_flavor=hcb.CallbackFlavor.DEBUG))(5.)
  assert [float(s) for s in seen] == [5.]


# ---- transformations --------------------------------------------------------

def test_jvp_and_grad_raise_not_implemented():
  f = lambda x: hcb.call(np.sin, x, result_shape=x)
  for transform in (jax.grad, lambda g: lambda x: jax.jvp(g, (x,), (1.,))):
    with pytest.raises(NotImplementedError,
                       match="JVP rule is implemented only for id_tap, not "
                             "for call"):
      transform(f)(1.)


def test_custom_jvp_makes_a_call_differentiable():
  @jax.custom_jvp
  def host_sin(x):
    return hcb.call(np.sin, x, result_shape=x)

  @host_sin.defjvp
  def host_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return host_sin(x), hcb.call(np.cos, x, result_shape=x) * t

  g = jax.jit(jax.grad(lambda x: host_sin(x) * 2))(0.5)
  np.testing.assert_allclose(g, 2 * np.cos(0.5), rtol=1e-6)


def test_custom_vjp_makes_a_call_differentiable():
  @jax.custom_vjp
  def host_exp(x):
    return hcb.call(np.exp, x, result_shape=x)

  host_exp.defvjp(lambda x: (host_exp(x), x),
                  lambda x, ct: (ct * hcb.call(np.exp, x, result_shape=x),))
  np.testing.assert_allclose(jax.grad(host_exp)(1.), np.e, rtol=1e-6)


def test_vmap_without_vmap_method_names_the_fix():
  with pytest.raises(NotImplementedError) as info:
    jax.vmap(lambda x: hcb.call(np.sin, x, result_shape=x))(jnp.ones(3))
  # The removed module's words first (users search for them), then ours.
  assert str(info.value).startswith(
      "batching rules are implemented only for id_tap, not for call. "
      "host_callback.call of 'sin' under vmap needs a vmap_method: pass "
      "vmap_method='sequential'")


@pytest.mark.parametrize("method", ["sequential", "sequential_unrolled",
                                    "expand_dims", "broadcast_all"])
def test_vmap_methods(method):
  shapes = []

  def host(arg):
    x, y = arg
    shapes.append((x.shape, y.shape))
    return x * 10 + y

  xs = jnp.arange(3, dtype=jnp.float32)  # batched
  y = jnp.float32(0.5)                   # not batched
  out = jax.jit(jax.vmap(
      lambda x: hcb.call(host, (x, y), result_shape=x, vmap_method=method)))(xs)
  np.testing.assert_allclose(out, [0.5, 10.5, 20.5])
  expected = {"sequential": [((), ())] * 3,
              "sequential_unrolled": [((), ())] * 3,
              "expand_dims": [((3,), (1,))],
              "broadcast_all": [((3,), (3,))]}[method]
  assert shapes == expected


def test_nested_vmap_with_expand_dims():
  out = jax.vmap(jax.vmap(lambda x: hcb.call(
      lambda v: v + 1, x, result_shape=x, vmap_method="expand_dims")))(
          jnp.zeros((2, 3)))
  np.testing.assert_array_equal(out, np.ones((2, 3)))


# ---- dispatch ---------------------------------------------------------------

def test_fast_dispatch_path_and_one_compilation():
  from jax._src import test_util as jtu
  f = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=x) + 1)
  x = jnp.ones(3)
  f(x)
  with jtu.count_pjit_cpp_cache_miss() as misses:
    for _ in range(20):
      np.testing.assert_array_equal(f(x), 3.)
  assert misses() == 0 and f._cache_size() == 1


# ---- inline mode and re-entrancy ------------------------------------------

def test_inline_mode_calls_in_the_calling_thread():
  proc = run_python("""
      import threading, jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      where = []
      def host(x, device):
        where.append((threading.get_ident(), device))
        return x * 2
      out = hcb.call(host, jnp.float32(2.), result_shape=np.float32(0),
                     call_with_device=True, device_index=1)
      assert float(out) == 4. and out.dtype == np.float32, out
      assert where == [(threading.get_ident(), jax.devices()[1])], where
      try:
        hcb.call(lambda x: 1 / 0, 1.)
      except ZeroDivisionError:
        print("raised in caller")
      try:
        hcb.call(lambda x: np.zeros(2), 1., result_shape=np.float32(0))
      except TypeError as e:
        print(e)
      # The rules of compiled calls for Python scalars, too.
      try:
        hcb.call(lambda x: 2.5, 1., result_shape=np.int32(0))
      except TypeError as e:
        print(e)
      try:
        hcb.call(lambda x: 300, 1., result_shape=np.int8(0))
      except ValueError as e:
        print(e)
  """, env={"HOST_CALLBACK_INLINE": "1", "JAX_NUM_CPU_DEVICES": "2"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split("\n")[:2] == [
      "raised in caller",
      "host_callback.call: callback '<lambda>' returned float64[2]; "
      "result_shape declares float32[]"]
  scalars = proc.stdout.split("\n")[2:4]
  assert scalars[0] == ("host_callback.call: callback '<lambda>' returned a "
                        "Python float; result_shape declares int32[]"), scalars
  assert scalars[1].startswith(
      "host_callback.call: callback '<lambda>' returned a Python int that "
      "does not fit int8[]"), scalars


@pytest.mark.parametrize("same_device", [False, True])
def test_callback_may_run_jax_on_a_device(same_device):
  inner = jax.jit(lambda m, v: (m @ m @ m)[0, :3] * 0 + v * 3)
  m = jnp.ones((800, 800))

  def host(x):
    dev = jax.devices()[0 if same_device else 1]
    return np.asarray(inner(jax.device_put(m, dev), jax.device_put(x, dev)))

  f = jax.jit(lambda x: hcb.call(host, x, result_shape=x) + 1)
  out = f(jax.device_put(jnp.arange(3, dtype=jnp.float32), jax.devices()[0]))
  np.testing.assert_array_equal(out, [1., 4., 7.])


def test_call_from_a_tap_function_on_the_same_device_is_diagnosed():
  # The tap function runs (from another thread, so that XLA cannot run it
  # inline on the consumer thread) a computation whose call must wait for
  # the device's earlier taps, among them the running tap function: they
  # wait for each other, and the runtime says so in the log instead of
  # hanging silently.
  _, stderr, status = run_python_until("""
        import threading, jax, numpy as np
        import host_callback as hcb
        inner = jax.jit(lambda v: hcb.call(lambda a: a, v, result_shape=v))
        def tap(v, transforms):
          t = threading.Thread(target=lambda: inner(v).block_until_ready())
          t.start()
          t.join()
        jax.jit(lambda x: hcb.id_tap(tap, x))(1.)
        hcb.barrier_wait()
    """, "they wait for each other", "stderr", timeout=60)
  assert status is None, f"it ended ({status}) instead of hanging: {stderr}"
  assert "'<lambda>.<locals>.<lambda>' on cpu:0 has waited 2 s for the taps " \
         "its device issued before it" in stderr
  assert "they wait for each other" in stderr


def test_an_eager_call_compiles_once_per_signature():
  compiles = []

  def listen(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)

  def double(x):
    return x * 2

  x = np.arange(35, dtype=np.float32).reshape(5, 7)  # a shape of its own
  for _ in range(3):
    out = hcb.call(double, x, result_shape=x)
    np.testing.assert_array_equal(out, x * 2)
  hcb.id_tap(lambda v, t: None, x)  # an eager tap of the same argument
  assert len(compiles) == 2, compiles  # the call's program and the tap's


def _fails_the_second_time(call):
  state = {"fail": False}

  def host(x):
    if state["fail"]:
      raise ValueError("host says no")
    return x

  call(host)
  state["fail"] = True
  return lambda: call(host)


def test_a_failing_eager_call_raises_jax_runtime_error_every_time():
  # From the second time on JAX runs the cached program through its C++
  # dispatch, which reports any failed computation as ValueError.
  x = jnp.ones(3)
  again = _fails_the_second_time(
      lambda f: hcb.call(f, x, result_shape=x))
  for _ in range(2):
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="UNKNOWN: host_callback.call: callback '.*host' "
                             "raised ValueError: host says no"):
      again()
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()

  def fill(f):
    def cb(ctx, out, v):
      np.asarray(out)[...] = f(np.asarray(v))
    return hcb.buffer_callback(cb, F32_3)(x)

  again = _fails_the_second_time(fill)
  for _ in range(2):
    with pytest.raises(jax.errors.JaxRuntimeError, match="host says no"):
      again()
  hcb.barrier_wait()  # JAX's buffer_callback: raised by the computation only


def test_a_jitted_call_that_fails_on_jax_fast_path_names_the_callback():
  # JAX's C++ dispatch of a jitted function that has run before raises a
  # computation that failed synchronously as ValueError (jaxlib's
  # PjitFunction turns every error status into one; JAX's own pure_callback
  # too): the message is the same as on JAX's Python path.
  state = {"fail": False}

  def host(x):
    if state["fail"]:
      raise ValueError("host says no")
    return x

  f = jax.jit(lambda v: hcb.call(host, v, result_shape=v))
  x = jnp.ones(3)
  f(x)
  state["fail"] = True
  for _ in range(2):
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError),
                       match="UNKNOWN: host_callback.call: callback '.*host' "
                             "raised ValueError: host says no"):
      jax.block_until_ready(f(x))
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()
