"""The drop-ins of JAX's callbacks run inside the computation, in the thread
that runs it, before it goes on, as JAX runs its own: a callback may run
JAX computations with callbacks of their own (in its thread, or in a thread
it waits for, on its device or another, of any size), and an exception in
a callback fails the call that ran it, under every transformation, while
the next call works.  Each test runs one program with JAX's APIs and with
ours and compares what the user sees.

(Ctrl-C: test_delivery.py.  The same in C, over hand-built call frames:
tests/c/test_ffi_tap.c, and over a stand-in CUDA runtime,
tests/c/test_ffi_cuda.c.)
"""

from __future__ import annotations

import textwrap
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback as jax_io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import run_python

# One program, run with JAX's APIs ("jax") or ours ("hcb"): `debug`,
# `io_callback` and `pure_callback` name the one or the other.
_APIS = """
    import sys, threading
    import jax, jax.numpy as jnp, numpy as np
    if sys.argv[1] == "hcb":
      import host_callback as hcb
      from host_callback import debug
      io_callback, pure_callback = hcb.io_callback, hcb.pure_callback
    else:
      debug = jax.debug
      from jax.experimental import io_callback
      pure_callback = jax.pure_callback
"""


def _both(program: str, devices: int = 1) -> dict[str, str]:
  """The output of ``program`` (after _APIS) with JAX's APIs and with
  ours, each in a fresh interpreter of ``devices`` CPU devices; a program
  that hangs fails the test when its timeout ends."""
  out = {}
  for api in ("jax", "hcb"):
    proc = run_python(
        "import sys; sys.argv[1:] = [%r]\n" % api +
        textwrap.dedent(_APIS) + textwrap.dedent(program),
        env={"JAX_NUM_CPU_DEVICES": str(devices)}, timeout=120)
    assert proc.returncode == 0, (api, proc.stderr)
    out[api] = proc.stdout
  return out


# ---- callbacks that run JAX --------------------------------------------------

_INNER = """
    big = jnp.ones((512, 512), jnp.float32)

    @jax.jit
    def inner(m):  # large enough for XLA's worker threads
      r = m @ m
      debug.print("inner {}", r[0, 0])
      return r[0, 0]
"""


def test_a_callback_running_a_large_computation_with_prints_finishes():
  out = _both(_INNER + """
    def cb(v):
      print("cb", v, flush=True)
      print("cb got", float(inner(big)), flush=True)

    @jax.jit
    def outer(x):
      debug.callback(cb, x)
      debug.print("outer {}", x)
      return x + 1

    for i in range(3):
      print("result", float(outer(jnp.float32(i))), flush=True)
  """)
  assert out["hcb"] == out["jax"]
  assert out["hcb"].splitlines()[:5] == [
      "cb 0.0", "inner 512.0", "cb got 512.0", "outer 0.0", "result 1.0"]


def test_a_callback_waiting_for_a_thread_that_runs_a_computation_finishes():
  out = _both(_INNER + """
    def cb(v):
      got = []
      t = threading.Thread(target=lambda: got.append(float(inner(big))))
      t.start()
      t.join()
      print("thread got", got, flush=True)

    small = jax.jit(lambda x: (debug.print("small {}", x), x * 2)[1])

    def cb_small(v):
      got = []
      t = threading.Thread(target=lambda: got.append(float(small(v))))
      t.start()
      t.join()
      print("small got", got, flush=True)

    @jax.jit
    def outer(x):
      debug.callback(cb, x)
      debug.callback(cb_small, x)
      return x + 1

    print("result", float(outer(jnp.float32(3))), flush=True)
  """)
  assert out["hcb"] == out["jax"]
  assert out["hcb"].splitlines() == [
      "inner 512.0", "thread got [512.0]", "small 3.0", "small got [6.0]",
      "result 4.0"]


def test_a_callback_running_a_computation_on_another_device_finishes():
  out = _both(_INNER + """
    d1 = jax.devices()[1]

    def cb(v):
      m = jax.device_put(big, d1)
      print("on", d1.id, float(inner(m)), flush=True)

    @jax.jit
    def outer(x):
      debug.callback(cb, x)
      return x + 1

    print("result", float(outer(jnp.float32(3))), flush=True)
  """, devices=2)
  assert out["hcb"] == out["jax"]
  assert out["hcb"].splitlines() == ["inner 512.0", "on 1 512.0",
                                     "result 4.0"]


def test_io_and_pure_callbacks_running_computations_with_prints_finish():
  out = _both(_INNER + """
    def f(v):
      return np.float32(inner(big)) + v

    spec = jax.ShapeDtypeStruct((), jnp.float32)
    g = jax.jit(lambda x: io_callback(f, spec, x) + pure_callback(f, spec, x))
    print("result", float(g(jnp.float32(1))), flush=True)
  """)
  assert out["hcb"] == out["jax"]
  assert out["hcb"].splitlines() == ["inner 512.0", "inner 512.0",
                                     "result 1026.0"]


# ---- errors fail the call ----------------------------------------------------

def _nan_check(x: Any) -> None:
  if np.isnan(np.asarray(x)).any():
    raise ValueError("found a nan")


def _nan_check_result(x: Any) -> Any:
  _nan_check(x)
  return np.asarray(x)


def _debug_callback(mod: Any, x: Any) -> Any:
  mod.callback(_nan_check, x)
  return x * 2


def _debug_print(mod: Any, x: Any) -> Any:
  # a NaN prints; a format spec that a float refuses fails instead
  mod.print("{x:d}", x=x)
  return x * 2


def _io_callback(mod: Any, x: Any) -> Any:
  f = hcb.io_callback if mod is hdebug else jax_io_callback
  return f(_nan_check_result, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2


def _pure_callback(mod: Any, x: Any) -> Any:
  f = hcb.pure_callback if mod is hdebug else jax.pure_callback
  return f(_nan_check_result, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
           vmap_method="sequential") * 2


KINDS = {"debug.callback": _debug_callback, "debug.print": _debug_print,
         "io_callback": _io_callback, "pure_callback": _pure_callback}


def _transformed(how: str, kind: Any, mod: Any) -> tuple[Any, Any, Any]:
  """A jitted program that runs ``kind`` (with JAX's or our ``mod``) under
  ``how``, an input on which its callback raises, and one on which it does
  not (for debug.print: a float input always fails its format)."""
  bad = jnp.array([1.0, np.nan, 3.0, 4.0], jnp.float32)
  good = jnp.arange(4.0, dtype=jnp.float32)
  one = lambda x: kind(mod, x)  # noqa: E731
  if how == "jit":
    f = jax.jit(one)
  elif how == "scan":
    f = jax.jit(lambda xs: jax.lax.scan(
        lambda c, x: (c + one(x), None), 0.0, xs)[0])
  elif how == "vmap":
    f = jax.jit(jax.vmap(one))
  elif how == "pmap":
    f = jax.pmap(one)
  else:  # jit over operands sharded across the 4 devices
    mesh = jax.make_mesh((4,), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    bad, good = (jax.device_put(a, sharding) for a in (bad, good))
    f = jax.jit(one)
  return f, bad, good


# debug.print's format fails alike on every element: jit stands for scan
# and vmap there.
CASES = [(name, how) for name in KINDS
         for how in ("jit", "scan", "vmap", "pmap", "sharded_jit")
         if not (name == "debug.print" and how in ("scan", "vmap"))]


@pytest.mark.parametrize("name,how", CASES)
def test_an_exception_in_a_callback_fails_that_call_as_jaxs(name, how):
  apis = [("jax", jax.debug), ("hcb", hdebug)]
  if how == "sharded_jit" and name in ("io_callback", "pure_callback"):
    # JAX's own fails on one device alone, and the others wait for it in
    # the collective that spreads its result until XLA aborts the process
    # (20 s); ours fails on every device (hcb_sharded_check).
    apis = apis[1:]
  errors = {}
  for api, mod in apis:
    f, bad, good = _transformed(how, KINDS[name], mod)
    with pytest.raises(Exception) as info:
      jax.block_until_ready(f(bad))
    errors[api] = info.value
    if name != "debug.print":  # the next call works
      jax.block_until_ready(f(good))
  # JAX's error and ours: of one type, ending with the exception's line
  # (the callback's traceback before it)
  last = {api: str(e).rstrip().splitlines()[-1] for api, e in errors.items()}
  assert isinstance(errors["hcb"], jax.errors.JaxRuntimeError)
  assert type(errors["hcb"]) is type(errors.get("jax", errors["hcb"]))
  assert last["hcb"] == last.get("jax", last["hcb"])
  if name == "debug.print":  # a float refuses 'd'
    assert last["hcb"].startswith(("TypeError: unsupported format string",
                                   "ValueError: Unknown format code 'd'"))
  else:
    assert last["hcb"] == "ValueError: found a nan"
  hcb.barrier_wait()  # the call raised it: barrier_wait does not again


def test_a_progress_bar_that_fails_fails_its_loop_and_the_next_works():
  import io
  from host_callback.progress import scan_tqdm

  class Broken(io.StringIO):
    """A stream that cannot be written (a closed terminal)."""

    def write(self, s: str) -> int:
      raise OSError("no terminal")

  def loop(**tqdm_kwargs: Any) -> Any:
    @scan_tqdm(10, **tqdm_kwargs)
    def step(c, i):
      return c + i, None
    return jax.jit(lambda xs: jax.lax.scan(step, 0, xs)[0])

  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="OSError: no terminal"):
    loop(file=Broken())(jnp.arange(10)).block_until_ready()
  assert int(loop(file=io.StringIO())(jnp.arange(10))) == 45
  hcb.barrier_wait()


def test_after_a_bar_whose_stream_failed_other_threads_bars_work():
  # tqdm holds its process-wide lock while it draws and never releases it
  # when the stream raises: every later bar of another thread would wait
  # for it forever (pmap's devices draw from their own threads).  The
  # failure is raised once tqdm has returned, and the lock is free.
  done = run_python("""
      import io, jax, jax.numpy as jnp
      from host_callback.progress import scan_tqdm

      class Broken(io.StringIO):
        def write(self, s):
          raise OSError("no terminal")

      def loop(**kw):
        @scan_tqdm(10, **kw)
        def step(c, i):
          return c + i, None
        return lambda xs: jax.lax.scan(step, 0, xs)[0]

      try:
        jax.jit(loop(file=Broken()))(jnp.arange(10)).block_until_ready()
      except jax.errors.JaxRuntimeError as e:
        print("failed:", "OSError: no terminal" in str(e))
      out = io.StringIO()
      xs = jnp.tile(jnp.arange(10), (4, 1))
      print(jax.pmap(loop(file=out))(xs).tolist(), out.getvalue().count("10/10"))
  """, env={"JAX_NUM_CPU_DEVICES": "4"}, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines() == ["failed: True", "[45, 45, 45, 45] 4"]


def test_the_computations_thread_runs_the_callback():
  """No other thread runs a drop-in's function: the one that runs the
  computation does (the caller's, for a small computation on CPU), as
  JAX's, so no thread is woken for a callback."""
  threads: dict[str, set[int]] = {"jax": set(), "hcb": set()}

  for api, mod in (("jax", jax.debug), ("hcb", hdebug)):
    f = jax.jit(lambda x, mod=mod, api=api: (mod.callback(
        lambda v: threads[api].add(threading.get_ident()), x), x + 1)[1])
    for _ in range(20):
      f(jnp.float32(1)).block_until_ready()
  assert threads["hcb"] == threads["jax"] == {threading.get_ident()}
