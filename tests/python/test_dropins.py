"""The drop-ins for JAX's debugging APIs against JAX's own, in the same
process: host_callback.debug.callback / print / log against jax.debug's
(calls, text character for character, log records), under jit, vmap, grad,
scan, cond, while_loop, shard_map, pmap and jit over sharded operands;
id_print / id_tap routed to a logging.Logger; and every drop-in's
signature against JAX's.  pure_callback and io_callback:
test_dropins_pure_io.py."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from functools import partial

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback as jax_io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import (DTYPES, HAS_SKIP_FORMAT_CHECK, devices_mesh, flush,
                      needs_debug_log)

DEBUGS = {"jax": jax.debug, "hcb": hdebug}


def texts(capsys, run) -> dict[str, str]:
  """What ``run(debug_module)`` prints with JAX's and with ours."""
  out = {}
  for name, mod in DEBUGS.items():
    run(mod)
    flush()
    out[name] = capsys.readouterr().out
  return out


def assert_same_text(capsys, run, sort: bool = False) -> str:
  got = texts(capsys, run)
  if sort:  # several devices print at once: lines may interleave
    got = {k: "".join(sorted(v.splitlines(keepends=True)))
           for k, v in got.items()}
  assert got["hcb"] == got["jax"]
  assert got["jax"]
  return got["jax"]


@pytest.mark.parametrize("ours, theirs", [
    pytest.param(hcb.pure_callback, jax.pure_callback, id="pure_callback"),
    pytest.param(hcb.io_callback, jax_io_callback, id="io_callback"),
    pytest.param(hdebug.callback, jax.debug.callback, id="callback"),
    pytest.param(hdebug.print, jax.debug.print, id="print"),
    # (jax.debug.log from JAX 0.8)
    *([pytest.param(hdebug.log, jax.debug.log, id="log")]
      if hasattr(jax.debug, "log") else []),
])
def test_signatures_are_jaxs(ours, theirs):
  def params(f):
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(f).parameters.values()
            if p.name != "_use_logging"]  # JAX's private switch of log
  assert params(ours) == params(theirs)


# ---- debug.print: the text --------------------------------------------------

def _values():
  values = {}
  for dtype in DTYPES:
    name = np.dtype(dtype).name
    values[f"{name}[2,3]"] = (np.arange(6) % 4).reshape(2, 3).astype(dtype)
    values[f"{name}[]"] = np.array(3, dtype)
  values["float32[0]"] = np.zeros((0,), np.float32)
  values["float32[2000]"] = np.linspace(0, 1, 2000, dtype=np.float32)
  values["float32 specials"] = np.array([np.nan, -np.inf, 1e-9, 1e9, -0.0],
                                        np.float32)
  values["int32[2,2,2]"] = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
  values["python int"] = 7
  values["python float"] = 0.1
  values["python bool"] = True
  return values


VALUES = _values()


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("key", list(VALUES))
def test_print_of_each_value_is_jaxs_text(capsys, key, jit):
  value = VALUES[key]

  def run(mod):
    def f(x):
      mod.print("x={x} {}", x, x=x)
      if HAS_SKIP_FORMAT_CHECK:
        mod.print("no placeholders", x, skip_format_check=True)
    (jax.jit(f) if jit else f)(value)

  assert_same_text(capsys, run)


@pytest.mark.parametrize("fmt", [
    "{x:.3f}", "{x:>12.4e}", "{x:+}", "{x!s}", "{x!r}", "{x!a}", "{x.shape}",
    "{x.dtype} {y[1]}", "{0} {1:.2f} {x}", "{x} {{literal}}", "",
])
def test_print_format_specs_are_jaxs(capsys, fmt):
  def run(mod):
    @jax.jit
    def f(x, y):
      if fmt == "{0} {1:.2f} {x}":
        mod.print(fmt, y, x, x=x)
      elif fmt == "{x.dtype} {y[1]}":
        mod.print(fmt, x=x, y=y)
      elif fmt == "":
        mod.print(fmt)
      else:
        mod.print(fmt, x=x)
    f(jnp.float32(2.5), jnp.arange(3, dtype=jnp.int32))

  assert_same_text(capsys, run)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_print_format_specs_of_scalars_of_each_dtype(capsys, dtype):
  x = np.array(2, dtype)
  kind = np.dtype(dtype).kind
  fmt = {"f": "{x:.3f} {x:>10} {x:e}", "V": "{x:.3f} {x:>10}",
         "c": "{x:.2f} {x:>20}", "b": "{x:>6} {x!s}"}.get(kind, "{x:04d} {x:x}")

  def run(mod):
    jax.jit(lambda v: mod.print(fmt, x=v))(x)

  assert_same_text(capsys, run)


@pytest.mark.parametrize("call", [
    "unused positional", "unused keyword", "skip_format_check"])
def test_print_checks_the_format_as_jax(capsys, call):
  """An argument the format leaves unused fails the trace with JAX's
  error; ``skip_format_check=True`` prints instead from JAX 0.7 on, and
  on JAX 0.6 (which has no such option) is one more unused argument."""
  def outcome(mod):
    args, kwargs = {"unused positional": (("x={x}", 1.0), {"x": 2.0}),
                    "unused keyword": (("{}", 1.0), {"y": 2.0}),
                    "skip_format_check": (("x", 1.0),
                                          {"skip_format_check": True})}[call]
    try:
      jax.jit(lambda: mod.print(*args, **kwargs))()
      jax.effects_barrier()
    except ValueError as e:
      return "raised " + str(e)
    return capsys.readouterr().out

  theirs, ours = outcome(jax.debug), outcome(hdebug)
  assert ours == theirs
  if call == "skip_format_check" and HAS_SKIP_FORMAT_CHECK:
    assert ours == "x 1.0\n"
  else:
    assert ours.startswith("raised Unused "), ours


def test_print_of_pytrees_is_jaxs(capsys):
  tree = {"b": (jnp.ones(2), [jnp.int32(3)]), "a": None}

  def run(mod):
    @jax.jit
    def f(t):
      t = {**t, "c": "text"}  # a static leaf
      mod.print("{t} | {a} | {}", t["b"], t=t, a=t["b"][0])
      if HAS_SKIP_FORMAT_CHECK:
        mod.print("tree", t, skip_format_check=True)
    f(tree)

  assert_same_text(capsys, run)


def test_print_uses_numpys_print_options_of_the_trace(capsys):
  x = jnp.linspace(0, 1, 7)

  def run(mod):
    f = jax.jit(lambda v: mod.print("{v}", v=v))
    with np.printoptions(precision=2, suppress=True, linewidth=20):
      f.lower(x)  # traced here: the options are taken now
      f(x)
    f(x)  # the same compiled program

  text = assert_same_text(capsys, run)
  assert "0.17" in text


def test_print_formats_a_format_that_starts_with_an_escaped_brace(capsys):
  # JAX looks for placeholders in the first field only, and fails here.
  jax.jit(lambda x: hdebug.print("{{literal}} {x}", x=x))(jnp.float32(1.))
  flush()
  assert capsys.readouterr().out == "{literal} 1.0\n"


def test_print_checks_its_arguments_as_jax_does():
  for mod in DEBUGS.values():
    with pytest.raises(ValueError) as jax_error:
      jax.debug.print("{x}", 1, x=2)
    with pytest.raises(ValueError) as our_error:
      mod.print("{x}", 1, x=2)
    assert str(our_error.value) == str(jax_error.value)
    with pytest.raises(ValueError, match="f-string"):
      mod.print("x", y=2)


# JAX 0.10 added the two-call form of jax.debug.callback and print.
_JAX_HAS_NO_TWO_CALL_FORM = (
    inspect.signature(jax.debug.callback).parameters["callback"].default is
    inspect.Parameter.empty)


def test_the_two_call_forms(capsys):
  if _JAX_HAS_NO_TWO_CALL_FORM:
    # JAX 0.9: the function and the format are required, as in ours there
    for mod in DEBUGS.values():
      with pytest.raises(TypeError, match="missing 1 required positional"):
        mod.print(ordered=True)
      with pytest.raises(TypeError, match="missing 1 required positional"):
        mod.callback(ordered=True)
    return

  def run(mod):
    mod.print(ordered=True)("a {x}", x=jnp.arange(2))
    mod.callback(ordered=True)(lambda v: print("cb", v), jnp.float32(1.))
    jax.jit(lambda v: mod.print(ordered=True, partitioned=False)("b {}", v))(
        jnp.float32(2.))

  assert_same_text(capsys, run)
  for mod in DEBUGS.values():
    with pytest.raises(TypeError, match="two-call form"):
      mod.print(None, 1)
    with pytest.raises(TypeError, match="two-call form"):
      mod.callback(None, 1)


# ---- debug.callback: the calls ----------------------------------------------

class Calls:
  def __init__(self):
    self.lock = threading.Lock()
    self.calls = []

  def __call__(self, *args, **kwargs):
    with self.lock:
      self.calls.append((
          jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), args),
          jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), kwargs)))


def calls_of(run):
  """The calls of the callback in ``run(debug_module, callback)``, with
  JAX's and with ours."""
  got = {}
  for name, mod in DEBUGS.items():
    calls = Calls()
    run(mod, calls)
    flush()
    got[name] = calls.calls
  return got


def assert_same_calls(run, sort=False):
  got = calls_of(run)
  if sort:
    got = {k: sorted(v, key=repr) for k, v in got.items()}
  assert got["hcb"] == got["jax"]
  assert got["jax"]
  return got["jax"]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_callback_args_kwargs_and_static_leaves(jit):
  def run(mod, cb):
    def f(x):
      mod.callback(cb, x, "static", None, {"k": (x * 2, 3)}, key=x + 1,
                   label="s")
    (jax.jit(f) if jit else f)(jnp.arange(3.))

  assert_same_calls(run)


@pytest.mark.parametrize("in_axes", [0, 1, (1, None)])
def test_callback_under_nested_vmap_is_called_per_element_in_jaxs_order(
    in_axes):
  x = jnp.arange(24.).reshape(2, 3, 4)
  y = jnp.float32(10.)

  def run(mod, cb):
    # Ordered: JAX's unordered callbacks in one program run in any order.
    g = lambda a, b: mod.callback(cb, a, b=b, ordered=True)
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes, None)
    jax.jit(jax.vmap(jax.vmap(g, in_axes=(0, None)), in_axes=axes))(x, y)

  assert len(assert_same_calls(run)) == 6


def test_callback_and_print_under_vmap_of_unbatched_and_batched(capsys):
  def run(mod):
    def f(a, b):
      mod.print("a={a} b={b}", a=a, b=b)
      mod.callback(lambda u: print("cb", u), b)
    jax.vmap(f, in_axes=(0, None))(jnp.arange(3), jnp.float32(5.))

  assert_same_text(capsys, run)


def test_print_under_grad_prints_primal_values_only(capsys):
  def run(mod):
    def f(x):
      mod.print("x={x}", x=x)
      y = jnp.sin(x) * x
      mod.print("y={y}", y=y)
      return y
    jax.grad(f)(1.5)
    jax.jit(jax.grad(f))(2.5)
    jax.jvp(f, (1.,), (1.,))
    jax.vmap(jax.grad(f))(jnp.arange(2.))

  assert_same_text(capsys, run)


def test_callback_inside_custom_jvp_rule_sees_tangents_not_cotangents():
  def run(mod, cb):
    @jax.custom_jvp
    def f(x):
      return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
      (x,), (t,) = primals, tangents
      mod.callback(cb, t, "tangent")
      return f(x), jnp.cos(x) * t

    jax.grad(f)(1.)
    jax.jvp(f, (1.,), (3.,))

  assert_same_calls(run)


def test_callback_under_grad_of_checkpoint_runs_again_in_the_remat():
  def run(mod, cb):
    def g(x):
      mod.callback(cb, x)
      return jnp.sin(x)
    jax.grad(jax.checkpoint(g))(1.)

  assert len(assert_same_calls(run)) == 2


@pytest.mark.parametrize("unsaved, times", [((), 1), (("y",), 1),
                                            (("y", "z"), 2)])
def test_callback_under_a_remat_policy_runs_again_as_jaxs(unsaved, times):
  """A policy that saves the callback: it runs again in the backward pass
  only when all its inputs are recomputed there anyway."""
  from jax.ad_checkpoint import checkpoint_name

  def policy(prim, *_, **params):
    return not (prim.name == "name" and params["name"] in unsaved)

  def run(mod, cb):
    def g(x):
      y = checkpoint_name(x + 1., "y")
      z = checkpoint_name(y * 2., "z")
      mod.callback(cb, y, z)
      return jnp.exp(z)
    jax.grad(jax.checkpoint(g, policy=policy))(2.)

  assert len(assert_same_calls(run)) == times


def test_print_in_scan_cond_and_while_loop(capsys):
  def run(mod):
    # Ordered: XLA may run JAX's unordered callbacks of one program in any
    # order (ours are in program order either way).
    mod = type("Ordered", (), {"print": staticmethod(
        partial(mod.print, ordered=True))})
    def body(c, x):
      mod.print("scan c={c} x={x}", c=c, x=x)
      return c + x, c

    def loop(i):
      return i < 3

    def step(i):
      lax.cond(i % 2 == 0, lambda: mod.print("even {}", i),
               lambda: mod.print("odd {}", i))
      return i + 1

    @jax.jit
    def f(xs):
      lax.scan(body, 0., xs)
      lax.while_loop(loop, step, 0)
      lax.fori_loop(0, 2, lambda i, c: (mod.print("fori {i}", i=i), c)[1], 0)

    f(jnp.arange(3.))

  assert_same_text(capsys, run)


def test_print_under_vmap_of_cond_and_while_with_batched_predicates(capsys):
  # JAX runs both branches of a batched cond (a select), and a batched
  # loop's body for every element until all are done: debug prints show it.
  def run(mod):
    # Ordered: under jit XLA may run JAX's unordered ones in any order.
    p = partial(mod.print, ordered=True)

    def f(i):
      lax.cond(i % 2 == 0, lambda: p("even {}", i), lambda: p("odd {}", i))
      lax.while_loop(lambda c: c < i,
                     lambda c: (p("body {} {}", i, c), c + 1)[1], 0)
    jax.vmap(f)(jnp.arange(3))
    jax.jit(jax.vmap(f))(jnp.arange(3))

  assert_same_text(capsys, run)
  with pytest.raises(NotImplementedError, match="batched predicate"):
    jax.vmap(lambda i: lax.cond(i > 0, lambda: hcb.id_print(i),
                                lambda: i))(jnp.arange(2))


def test_print_in_a_while_loop_predicate_with_a_known_trip_count(capsys):
  # XLA runs such a loop without its condition: the print must still run.
  def run(mod):
    def loop(i):
      mod.print("cond i={i}", i=i, ordered=True)
      return i < 2
    jax.jit(lambda: lax.while_loop(loop, lambda i: i + 1, 0))()

  assert_same_text(capsys, run)


# ---- several devices --------------------------------------------------------

def test_print_under_shard_map_prints_each_shard(capsys):
  n = len(jax.devices())
  assert n >= 2

  def run(mod):
    f = jax.jit(jax.shard_map(lambda v: (mod.print("shard {v}", v=v), v)[1],
                              mesh=devices_mesh(), in_specs=P("d"),
                              out_specs=P("d")))
    f(jnp.arange(2. * n))

  text = assert_same_text(capsys, run, sort=True)
  assert len(text.splitlines()) == n


def test_print_under_eager_shard_map_prints_each_shard(capsys):
  n = len(jax.devices())

  def run(mod):
    jax.shard_map(lambda v: (mod.print("shard {v}", v=v), v)[1],
                  mesh=devices_mesh(), in_specs=P("d"), out_specs=P("d"))(
                      jnp.arange(2. * n))

  assert len(assert_same_text(capsys, run, sort=True).splitlines()) == n


def test_callback_under_pmap_is_called_per_device():
  n = len(jax.devices())

  def run(mod, cb):
    jax.pmap(lambda v: mod.callback(cb, v * 2))(jnp.arange(float(n)))

  assert len(assert_same_calls(run, sort=True)) == n


def test_print_under_jit_over_sharded_operands_prints_the_whole_value(capsys):
  n = len(jax.devices())
  x = jax.device_put(jnp.arange(4. * n), NamedSharding(devices_mesh(), P("d")))

  def run(mod):
    jax.jit(lambda v: mod.print("all {v}", v=v * 2))(x)

  text = assert_same_text(capsys, run)
  assert len(text.splitlines()) == 1


def test_partitioned_print_under_jit_prints_each_devices_shard(capsys):
  n = len(jax.devices())
  x = jax.device_put(jnp.arange(4. * n), NamedSharding(devices_mesh(), P("d")))

  def run(mod):
    jax.jit(lambda v: mod.print("shard {v}", v=v * 2, partitioned=True))(x)

  text = assert_same_text(capsys, run, sort=True)
  assert len(text.splitlines()) == n  # one shard of 4 elements each
  assert "shard [0. 2. 4. 6.]" in text


def test_partitioned_callback_under_jit_gets_each_shard():
  n = len(jax.devices())
  x = jax.device_put(jnp.arange(2. * n), NamedSharding(devices_mesh(), P("d")))

  def run(mod, cb):
    jax.jit(lambda v: mod.callback(cb, v + 1, partitioned=True))(x)

  assert len(assert_same_calls(run, sort=True)) == n


# ---- in the computation, barriers, errors -----------------------------------

@pytest.mark.parametrize("mod", list(DEBUGS))
def test_a_debug_callback_has_run_when_its_call_returns(mod):
  # Inside the computation, as JAX's: no barrier needed; a barrier after
  # them waits for nothing more.
  done = []

  def slow(x):
    time.sleep(0.05)
    done.append(float(x))

  f = jax.jit(lambda x: (DEBUGS[mod].callback(slow, x), x + 1)[1])
  for i in range(3):
    f(jnp.float32(i)).block_until_ready()
    assert done[-1] == float(i)
  jax.effects_barrier()
  hcb.barrier_wait()
  assert done == [0., 1., 2.]


def test_callback_errors_raise_eagerly_and_fail_the_jitted_call_as_jaxs():
  def bad(x):
    if x > 0:
      raise ZeroDivisionError("bad value")

  for mod in DEBUGS.values():
    # eagerly both raise the exception itself
    with pytest.raises(ZeroDivisionError, match="bad value"):
      mod.callback(bad, 1.)
    # under jit both fail the call that ran it, naming the exception
    f = jax.jit(lambda x, mod=mod: mod.callback(bad, x))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="ZeroDivisionError: bad value"):
      f(1.)
    f(-1.)  # the next call works
  hcb.barrier_wait()  # raised by the call: not again
  with pytest.raises(TypeError, match="must be callable"):
    hdebug.callback(1, 2)


# ---- debug.log ---------------------------------------------------------------

def log_each(mod, x):
  jax.jit(jax.vmap(lambda v: mod.log("v={v:.1f}", v=v)))(x)


LOG_LINE = log_each.__code__.co_firstlineno + 1


@needs_debug_log
def test_log_emits_one_record_per_print_like_jaxs_with_the_device(caplog):
  records = {}
  for name, mod in DEBUGS.items():
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jax._src.debugging"):
      log_each(mod, jnp.arange(3.))
      flush()
    records[name] = [r for r in caplog.records
                     if r.name == "jax._src.debugging"]
  assert ([r.getMessage() for r in records["hcb"]] ==
          [r.getMessage() for r in records["jax"]] ==
          ["v=0.0", "v=1.0", "v=2.0"])
  for ours, theirs in zip(records["hcb"], records["jax"]):
    assert (ours.levelno, ours.pathname, ours.lineno) == (
        theirs.levelno, theirs.pathname, theirs.lineno)
    assert ours.pathname == __file__ and ours.lineno == LOG_LINE
    assert ours.device == jax.devices()[0]


@needs_debug_log
def test_log_eagerly_names_the_device_of_its_argument(caplog):
  x = jax.device_put(jnp.float32(1.), jax.devices()[1])
  with caplog.at_level(logging.INFO, logger="jax._src.debugging"):
    hdebug.log("x={}", x)
  (record,) = [r for r in caplog.records if r.name == "jax._src.debugging"]
  assert record.getMessage() == "x=1.0" and record.device == jax.devices()[1]


# ---- id_print and id_tap to a logger -----------------------------------------

def test_id_print_and_id_tap_log_one_record_per_tap(caplog):
  log = logging.getLogger("hcb_test_dropins")
  x = jnp.arange(3, dtype=jnp.int32)
  with caplog.at_level(logging.INFO, logger="hcb_test_dropins"):
    jax.jit(lambda v: hcb.id_print(v, output_stream=log, what="a",
                                   tap_with_device=True))(x)
    jax.jit(lambda v: hcb.id_tap(log, {"b": v}))(x)
    jax.jit(jax.vmap(lambda v: hcb.id_tap(log, v)))(x)
    hcb.barrier_wait()
  records = [r for r in caplog.records if r.name == "hcb_test_dropins"]
  assert [r.getMessage() for r in records] == [
      f"device: {jax.devices()[0]} what: a\n[0 1 2]", "{ b=[0 1 2] }",
      "transforms: [('batch', {'batch_dims': (0,)})]\n[0 1 2]"]
  assert [r.levelno for r in records] == [logging.INFO] * 3
  assert records[0].device == jax.devices()[0]
  assert records[1].device is None
