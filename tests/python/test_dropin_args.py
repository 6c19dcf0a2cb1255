"""What the drop-ins' functions receive, against JAX's own in the same
process (issue 27, items 5, 8, 11 and 13): eagerly (also under an eager
vmap) ``jax.Array``s on the CPU device, as JAX passes them; inside a trace
numpy arrays with the same values (the documented difference); typed PRNG
keys as JAX passes and prints them (eagerly the keys, traced their key
data), and as id_tap's and id_print's key data; ``host_callback.debug``'s
namespace, which is ``jax.debug``'s; and ``debug.log``'s records, formatted
in C, equal to JAX's."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback as jax_io_callback

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import flush, needs_debug_log

S = jax.ShapeDtypeStruct((3,), jnp.float32)


def kinds(tree) -> list[tuple[str, str, tuple[int, ...]]]:
  """What a function received, leaf by leaf: ``jax`` (a ``jax.Array`` on
  a CPU device), ``key`` (a typed PRNG key array) or ``numpy``, with the
  dtype and shape of its values."""
  out = []
  for x in jax.tree_util.tree_leaves(tree):
    if isinstance(x, jax.Array):
      kind = "key" if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) \
          else "jax"
      assert {d.platform for d in x.devices()} == {"cpu"}
    else:
      assert isinstance(x, (np.ndarray, np.generic)), type(x)
      kind = "numpy"
    out.append((kind, str(x.dtype), tuple(x.shape)))
  return out


def received(call, *args):
  """What ``call(fn, *args)`` passes to ``fn``, one entry per call."""
  seen = []

  def fn(*a, **k):
    seen.append(kinds((a, k)))
    return np.zeros(3, np.float32)

  call(fn, *args)
  flush()
  return seen


# ---- eager calls get jax.Arrays (item 8) ------------------------------------

APIS = {
    "pure_callback": ({"jax": jax.pure_callback, "hcb": hcb.pure_callback},
                      lambda api, f, *a: api(f, S, *a,
                                             vmap_method="sequential")),
    "io_callback": ({"jax": jax_io_callback, "hcb": hcb.io_callback},
                    lambda api, f, *a: api(f, S, *a)),
    "debug.callback": ({"jax": jax.debug.callback,
                        "hcb": hdebug.callback},
                       lambda api, f, *a: api(f, *a)),
}


@pytest.mark.parametrize("name", list(APIS))
def test_an_eager_call_gets_jax_arrays_on_the_cpu_like_jaxs(name):
  apis, call = APIS[name]
  x, y = jnp.arange(3.), np.int32(7)
  for how in ("eager", "eager vmap"):
    got = {}
    for side, api in apis.items():
      if how == "eager":
        got[side] = received(lambda f, *a: call(api, f, *a), x, y)
      else:
        got[side] = received(lambda f, *a: jax.vmap(
            lambda v: call(api, f, v, y))(*a), jnp.stack([x, x]))
    assert got["hcb"] == got["jax"], how
    assert got["jax"] and all(k[0] == "jax" for c in got["jax"] for k in c)
  # Inside a trace ours get numpy arrays of JAX's values, dtypes and shapes
  # (the documented difference: no copy onto JAX's CPU device per call).
  got = {side: received(lambda f, a: jax.jit(
      lambda v: call(api, f, v, 2 * v))(a), x) for side, api in apis.items()}
  assert [[k[1:] for k in c] for c in got["hcb"]] == \
      [[k[1:] for k in c] for c in got["jax"]]
  assert {k[0] for c in got["hcb"] for k in c} == {"numpy"}
  if name != "debug.callback":  # JAX's CPU device is the default there
    devices = {}
    for side, api in apis.items():
      def fn(v, side=side):
        devices[side] = jnp.zeros(()).devices()
        return v

      api(fn, S, x)
    assert devices["hcb"] == devices["jax"] == {jax.devices("cpu")[0]}


# ---- typed PRNG keys (item 5) ------------------------------------------------

KEY = jax.random.key(0)
KEYS = jax.random.split(KEY, 2)


def key_text(capsys, run) -> dict[str, str]:
  out = {}
  for side, mod in (("jax", jax.debug), ("hcb", hdebug)):
    run(mod)
    flush()
    out[side] = capsys.readouterr().out
  return out


def test_debug_print_of_typed_keys_is_jaxs(capsys):
  def scan(mod, k):
    def step(c, _):
      mod.print("c={}", c)
      return jax.random.split(c)[0], None
    return lax.scan(step, k, None, length=3)[0]

  runs = {
      "eager": lambda mod: mod.print("k={} {k2}", KEY, k2=KEYS),
      "jit": lambda mod: jax.jit(lambda k: mod.print("k={}", k))(KEY),
      "vmap": lambda mod: jax.jit(jax.vmap(
          lambda k: mod.print("k={k}", k=k)))(KEYS),
      "scan": lambda mod: jax.jit(lambda k: scan(mod, k))(KEY),
      "pytree": lambda mod: jax.jit(
          lambda k: mod.print("d={}", {"k": k, "n": 1}))(KEY),
  }
  for how, run in runs.items():
    got = key_text(capsys, run)
    if how == "vmap":  # JAX calls a batched print's elements in any order
      got = {k: sorted(v.splitlines()) for k, v in got.items()}
    assert got["hcb"] == got["jax"], how
    assert got["jax"]


HOWS = ["eager", "eager vmap", "jit", "jit vmap", "scan", "pytree"]


def test_debug_callback_gets_typed_keys_as_jax_passes_them():
  for how in HOWS:
    check_keys_passed(how)


def check_keys_passed(how):
  def run(api, f):
    if how == "eager":
      api(f, KEY)
    elif how == "eager vmap":
      jax.vmap(lambda k: api(f, k))(KEYS)
    elif how == "jit":
      jax.jit(lambda k: api(f, k))(KEY)
    elif how == "jit vmap":
      jax.jit(jax.vmap(lambda k: api(f, k)))(KEYS)
    elif how == "scan":
      jax.jit(lambda k: lax.scan(
          lambda c, _: (api(f, c), (jax.random.split(c)[0], None))[1], k,
          None, length=2))(KEY)
    else:
      jax.jit(lambda k: api(f, {"k": k, "x": 1.}))(KEY)

  got = {}
  for side, api in (("jax", jax.debug.callback), ("hcb", hdebug.callback)):
    seen = []

    def f(*a, seen=seen):
      seen.append((kinds(a), [np.asarray(jax.random.key_data(x))
                              if jax.dtypes.issubdtype(x.dtype,
                                                       jax.dtypes.prng_key)
                              else np.asarray(x)
                              for x in jax.tree_util.tree_leaves(a)]))

    run(api, f)
    flush()
    # JAX calls the elements of a batched callback in no fixed order.
    got[side] = sorted(seen, key=lambda c: [v.tobytes() for v in c[1]])
  assert len(got["hcb"]) == len(got["jax"]) > 0
  for (ours, our_values), (theirs, their_values) in zip(got["hcb"],
                                                        got["jax"]):
    # Traced, ours are numpy arrays where JAX's are jax.Arrays.
    assert [k if k[0] == "key" else k[1:] for k in ours] == \
        [k if k[0] == "key" else k[1:] for k in theirs]
    for a, b in zip(our_values, their_values):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("jit", [False, True])
def test_id_tap_and_id_print_send_typed_keys_as_their_key_data(capsys, jit):
  seen = []

  def tap(arg, transforms):
    seen.append((jax.tree_util.tree_map(
        lambda x: (type(x).__name__, str(x.dtype), x.tolist()), arg),
        transforms))

  def f(k, ks):
    hcb.id_tap(tap, {"k": k, "x": jnp.float32(1.)})
    hcb.id_print(k, what="key")
    jax.vmap(lambda kk: hcb.id_print(kk, what="vmap"))(ks)
    lax.scan(lambda c, _: (hcb.id_print(c, what="scan"), None), k, None,
             length=2)
    return hcb.id_tap(tap, k)

  out = (jax.jit(f) if jit else f)(KEY, KEYS)
  hcb.barrier_wait()
  # The keys themselves come back out of id_tap.
  assert jax.dtypes.issubdtype(out.dtype, jax.dtypes.prng_key)
  data = jax.random.key_data(KEY).tolist()
  assert seen == [
      ({"k": ("ndarray", "uint32", data), "x": ("ndarray", "float32", 1.0)},
       ()),
      (("ndarray", "uint32", data), ())]
  assert capsys.readouterr().out == (
      "what: key\n[0 0]\n"
      "transforms: [('batch', {'batch_dims': (0,)})] what: vmap\n"
      f"{np.asarray(jax.random.key_data(KEYS))}\n"
      "what: scan\n[0 0]\nwhat: scan\n[0 0]\n")


# ---- host_callback.debug's namespace (item 11) --------------------------------

def test_debug_namespace_is_jax_debugs():
  def public(module):
    return {n for n in dir(module) if not n.startswith("_")}

  assert public(hdebug) == public(jax.debug)
  assert sorted(hdebug.__all__) == sorted(jax.debug.__all__)
  # What ours adds nothing to is JAX's own (OrderedDebugEffect is public
  # from JAX 0.9).
  for name in {"breakpoint", "inspect_array_sharding",
               "visualize_array_sharding", "visualize_sharding",
               "DebugEffect", "OrderedDebugEffect"} & public(jax.debug):
    assert getattr(hdebug, name) is getattr(jax.debug, name)
  for name in ("np", "os", "sys", "jax", "logging", "string", "Any"):
    assert not hasattr(hdebug, name), name
  with pytest.raises(ImportError):
    exec("from host_callback.debug import np")  # pylint: disable=exec-used


def test_inspect_array_sharding_from_our_debug_module_works_under_jit():
  shardings = []
  jax.jit(lambda x: hdebug.inspect_array_sharding(
      x, callback=shardings.append))(jnp.ones(4))
  assert len(shardings) == 1 and shardings[0].num_devices == 1


# ---- debug.log: formatted in C, JAX's record (item 13) -------------------------

def log_records(caplog, mod, fn):
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="jax._src.debugging"):
    fn(mod)
    flush()
  return [r for r in caplog.records if r.name == "jax._src.debugging"]


@needs_debug_log
def test_log_of_plain_fields_is_formatted_in_c_with_jaxs_record(caplog):
  def run(mod):
    jax.jit(lambda x, i: mod.log("x={x} i={}", i, x=x))(
        jnp.arange(3.), jnp.int32(4))

  theirs = log_records(caplog, jax.debug, run)
  before = hdebug._print_paths.copy()
  ours = log_records(caplog, hdebug, run)
  assert hdebug._print_paths - before == {"c": 1}
  fields = ("name", "msg", "args", "levelno", "pathname", "lineno",
            "funcName", "module", "threadName", "processName", "exc_info")
  assert [[getattr(r, f) for f in fields] for r in ours] == \
      [[getattr(r, f) for f in fields] for r in theirs]
  assert [r.getMessage() for r in ours] == ["x=[0. 1. 2.] i=4"]
  assert ours[0].device == jax.devices()[0]
  assert ours[0].created >= theirs[0].created  # made when it printed
