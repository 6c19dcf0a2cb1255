"""Results imply delivery: a computation's ``debug.*`` callbacks and
progress-bar updates have run before its outputs are ready, as JAX's own
debug callbacks have (no ``barrier_wait`` needed): they run inside the
computation, in its thread (docs/runtime.md, "In the computation").
``id_tap`` and ``id_print`` keep the removed module's asynchronous
contract, unless ``HOST_CALLBACK_TAPS_BEFORE_RESULTS=1``.  And Ctrl-C, as
in JAX, is the main thread's.
"""

from __future__ import annotations

import contextlib
import functools
import io
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import debug

from conftest import run_python


def _scan_of_prints(n: int):
  def body(c, x):
    debug.print("step {}", x)
    return c + x, None
  return jax.jit(lambda x: jax.lax.scan(body, 0.0, x)[0]), jnp.arange(
      float(n))


def test_a_result_read_after_its_prints_comes_after_them_on_a_pipe() -> None:
  """stdout to a pipe (block buffered): the line printed with the result
  comes after the 200 lines of the computation, every time."""
  proc = run_python("""
      import jax, jax.numpy as jnp
      from host_callback import debug
      def body(c, x):
        debug.print("step {}", x)
        return c + x, None
      f = jax.jit(lambda x: jax.lax.scan(body, 0.0, x)[0])
      for i in range(5):
        print("result", float(f(jnp.arange(200.0) + i)))
      """)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) == 5 * 201
  for i in range(5):
    block = lines[i * 201:(i + 1) * 201]
    assert block[:200] == [f"step {float(k + i)}" for k in range(200)]
    assert block[200] == f"result {sum(range(200)) + 200.0 * i}"


def test_redirect_stdout_around_a_computation_captures_all_its_prints(
) -> None:
  f, x = _scan_of_prints(2000)
  for i in range(3):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      float(f(x + i))
    lines = buf.getvalue().splitlines()
    assert lines == [f"step {float(k + i)}" for k in range(2000)]


def test_debug_callback_has_run_when_the_result_is_read() -> None:
  seen: list[float] = []
  f = jax.jit(lambda x: (debug.callback(lambda v: seen.append(float(v)), x),
                         x * 2)[1])
  for i in range(20):
    assert float(f(jnp.float32(i))) == 2 * i
    assert seen == [float(k) for k in range(i + 1)]


def test_shard_map_and_pmap_each_device_delivers_before_the_result() -> None:
  mesh = Mesh(np.array(jax.devices()[:4]), ("i",))

  def prints(x):
    jax.lax.scan(lambda c, _: (debug.print("dev {}", x), (c, None))[1], 0,
                 None, length=25)
    return x * 2

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"),
                     out_specs=P("i"))
  def f(x):
    return jax.jit(prints)(x) + 1

  g = jax.pmap(prints, devices=jax.devices()[:4])
  # Each device prints its own [d.].
  for h, x in ((f, jnp.arange(4.0)), (g, jnp.arange(4.0).reshape(4, 1))):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      np.asarray(h(x))
    assert sorted(buf.getvalue().splitlines()) == sorted(
        f"dev [{d}.]" for d in range(4) for _ in range(25))


def test_jit_over_sharded_operands_delivers_before_the_result() -> None:
  mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  seen: list[str] = []

  def slow(what, v):
    time.sleep(0.05)  # the consumer is still at it when the device is done
    seen.append(f"{what} {v}")

  # The callbacks go through JAX's Python callback there, pinned to one
  # device (the whole value) or on every device (partitioned: each shard).
  f = jax.jit(lambda v: (
      debug.callback(functools.partial(slow, "all"), v.sum()),
      debug.callback(functools.partial(slow, "part"), v, partitioned=True),
      v + 1)[2])
  for i in range(3):
    seen.clear()
    np.asarray(f(x + i))
    assert sorted(seen) == sorted(
        [f"all {28.0 + 8 * i}"] +
        [f"part [{2 * d + i}. {2 * d + 1 + i}.]" for d in range(4)])


def test_progress_bar_is_complete_and_closed_when_the_result_is_read(
) -> None:
  from host_callback import progress
  for i in range(3):
    out = io.StringIO()

    @progress.scan_tqdm(300, file=out, mininterval=0)
    def step(carry, i):
      return carry + i, None

    r = jax.jit(lambda: jax.lax.scan(step, 0, jnp.arange(300))[0])()
    assert int(r) == sum(range(300))
    assert "300/300" in out.getvalue()
    assert not progress._registry.bars


def test_a_debug_callback_that_runs_a_computation_with_prints_finishes(
) -> None:
  """The inner computation, run by the callback on its device's consumer
  thread, does not wait for that thread (it would wait for itself); its
  print comes before the outer computation's result, as it ran within the
  outer callback."""
  inner = jax.jit(lambda v: (debug.print("inner {}", v), v * 2)[1])
  got: list[float] = []
  outer = jax.jit(lambda x: (debug.callback(
      lambda v: got.append(float(inner(jnp.float32(v) + 100))), x),
                             x + 1)[1])
  for _ in range(5):
    got.clear()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      assert float(outer(jnp.float32(1))) == 2.0
    assert got == [202.0]
    assert buf.getvalue() == "inner 101.0\n"


def test_id_tap_stays_asynchronous_by_default() -> None:
  """The result of a computation is ready while its tap function still
  runs (the removed module's contract: barrier_wait waits for it)."""
  released = threading.Event()
  saw: list[bool] = []

  def tap(arg, transforms):
    saw.append(released.wait(20))

  f = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
  assert float(f(1.0)) == 2.0
  released.set()
  hcb.barrier_wait()
  assert saw == [True]


def test_opt_in_delivers_id_tap_and_id_print_before_the_result() -> None:
  proc = run_python("""
      import io, time, jax, jax.numpy as jnp
      import host_callback as hcb
      seen = []
      def tap(arg, transforms):
        time.sleep(0.05)
        seen.append(float(arg))
      out = io.StringIO()
      def body(c, x):
        hcb.id_tap(tap, x)
        hcb.id_print(x, output_stream=out)
        return c + x, None
      f = jax.jit(lambda x: jax.lax.scan(body, 0.0, x)[0])
      for i in range(3):
        r = float(f(jnp.arange(10.0) + i))
        assert seen == [float(k + j) for j in range(i + 1)
                        for k in range(10)], seen
        assert out.getvalue().count("\\n") == 10 * (i + 1)
      print("ok")
      """, env={"HOST_CALLBACK_TAPS_BEFORE_RESULTS": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "ok"


def test_opt_in_taps_run_in_the_computation_and_keep_their_errors() -> None:
  """With the opt-in an id_tap runs in the computation's thread, and its
  exception is still the old module's: the computation goes on, and
  barrier_wait raises it."""
  proc = run_python("""
      import threading
      import jax, jax.numpy as jnp
      import host_callback as hcb
      threads = []
      def tap(arg, transforms):
        threads.append(threading.current_thread().name)
        if arg > 1:
          raise ValueError("tap refused")
      f = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
      print(float(f(1.0)), float(f(2.0)), threads)
      try:
        hcb.barrier_wait()
      except hcb.CallbackException as e:
        print("barrier:", str(e).splitlines()[-1])
      """, env={"HOST_CALLBACK_TAPS_BEFORE_RESULTS": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      "2.0 3.0 ['MainThread', 'MainThread']",
      "barrier: ValueError: tap refused"], proc.stdout


def test_ctrl_c_in_a_callback_of_the_main_thread_fails_its_call_as_jaxs(
) -> None:
  """The computation runs in the main thread, and so does its callback,
  which waits: Ctrl-C raises KeyboardInterrupt in the callback, and the
  call fails naming it, as JAX's does; the runtime goes on working."""
  proc = run_python("""
      import os, signal, threading, time
      import jax, jax.numpy as jnp
      from host_callback import debug
      release = threading.Event()
      f = jax.jit(lambda x: (debug.callback(lambda v: release.wait(60), x),
                             x + 1)[1])
      threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
      try:
        float(f(jnp.float32(1)))
        print("no interrupt")
      except jax.errors.JaxRuntimeError as e:
        print("failed:", str(e).splitlines()[0])
      release.set()
      g = jax.jit(lambda x: (debug.print("after {}", x), x + 2)[1])
      print("result", float(g(jnp.float32(1))))
      """, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      "failed: UNKNOWN: debug.callback: callback "
      "'<lambda>.<locals>.<lambda>' raised KeyboardInterrupt: ",
      "after 1.0", "result 3.0"], proc.stdout


def test_ctrl_c_leaves_a_computation_of_another_thread_running() -> None:
  """A thread other than the main one runs a computation whose callback
  waits: Ctrl-C is the main thread's (KeyboardInterrupt there), and the
  other thread's computation goes on and ends with its result, as in
  JAX."""
  proc = run_python("""
      import os, signal, threading
      import jax, jax.numpy as jnp
      from host_callback import debug
      started, release = threading.Event(), threading.Event()
      def cb(v):
        started.set()
        release.wait()
      f = jax.jit(lambda x: (debug.callback(cb, x), x + 1)[1])
      out = []
      def worker():
        try:
          out.append(float(f(jnp.float32(1))))
        except Exception as e:
          out.append(f"{type(e).__name__}: {e}")
      t = threading.Thread(target=worker)
      t.start()
      started.wait()
      interrupts = 0
      for _ in range(3):  # Ctrl-C, three times
        try:
          os.kill(os.getpid(), signal.SIGINT)
          t.join(1)
        except KeyboardInterrupt:
          interrupts += 1
      print("main: interrupted", interrupts)
      print("worker running:", t.is_alive())
      release.set()
      t.join()
      print("worker:", *out)
      g = jax.jit(lambda x: (debug.print("after {}", x), x + 2)[1])
      print("result", float(g(jnp.float32(1))))
      """, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      "main: interrupted 3", "worker running: True", "worker: 2.0",
      "after 1.0", "result 3.0"], proc.stdout
