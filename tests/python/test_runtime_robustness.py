"""The runtime under what users do around taps (issue 16, items 5-8): fork,
Ctrl-C during barrier_wait, a tap function that runs JAX on its own device
while that device waits on a full queue, and back-pressure per record.
Each case runs in a subprocess, bounded in time."""

from __future__ import annotations

import re
import signal
import time

import pytest

from conftest import run_python, run_python_until, start_python

# A 16e6-byte queue (the least allowed) and 1 MB taps: about 15 fit.
SMALL_QUEUE = {"HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16e6"}


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
def test_fork_child_has_a_runtime_of_its_own(how):
  # The parent has run taps and has ten more pending (0.5 s of work) when it
  # forks; the child runs taps of its own (a compiled function: XLA cannot
  # compile in a forked child) and barrier_wait.
  proc = run_python(f"""
      import multiprocessing as mp, os, time, warnings
      warnings.filterwarnings("ignore")  # JAX's warning about os.fork
      import jax
      import host_callback as hcb
      seen = []
      def tap(x, transforms):
        time.sleep(0.05)
        seen.append((os.getpid(), int(x)))
      f = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
      for i in range(3):
        f(i)
      hcb.barrier_wait()
      for i in range(100, 110):
        f(i)
      def child():
        for i in range(1000, 1003):
          f(i)
        hcb.barrier_wait()
        mine = sorted(v for p, v in seen if p == os.getpid())
        print("child", mine, flush=True)
      if {how!r} == "os.fork":
        pid = os.fork()
        if pid == 0:
          child()
          os._exit(0)
        for _ in range(200):
          done, status = os.waitpid(pid, os.WNOHANG)
          if done:
            print("child status", status, flush=True)
            break
          time.sleep(0.05)
        else:
          print("child hung", flush=True)
          os.kill(pid, 9)
      else:
        p = mp.get_context("fork").Process(target=child)
        p.start()
        p.join(10)
        print("child hung" if p.is_alive() else f"child status {{p.exitcode}}",
              flush=True)
        if p.is_alive():
          p.kill()
      hcb.barrier_wait()
      print("parent", sorted(v for p, v in seen if p == os.getpid()),
            flush=True)
  """, timeout=60)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "child [1000, 1001, 1002]\n" in proc.stdout, proc.stdout
  assert "child status 0\n" in proc.stdout, proc.stdout
  # the parent's pending taps: delivered once, by the parent
  assert f"parent {[0, 1, 2] + list(range(100, 110))}\n" in proc.stdout


def test_fork_child_exits_with_pending_taps_flushed():
  # The child leaves with taps of its own pending: the at-exit flush
  # delivers them and the child exits (it used to hang).  The parent never
  # called barrier_wait: the child cannot compile barrier_wait's probe, so
  # it is compiled before the fork.  A forked child of JAX that runs the
  # interpreter's finalisation may die in JAX's garbage collection
  # (SIGSEGV, without host_callback too), after the flush: the status is
  # not checked, the taps are.
  proc = run_python("""
      import os, sys, time, warnings
      warnings.filterwarnings("ignore")
      import jax
      import host_callback as hcb
      def tap(x, transforms):
        time.sleep(0.02)
        print(os.getpid(), "tap", int(x), flush=True)
      f = jax.jit(lambda x: hcb.id_tap(tap, x))
      f(0)
      print("parent", os.getpid(), flush=True)
      pid = os.fork()
      if pid == 0:
        for i in range(1, 4):
          f(i)
        sys.exit(0)  # the at-exit flush: barrier_wait, then stop
      for _ in range(200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
          print("child status", status, flush=True)
          break
        time.sleep(0.05)
      else:
        print("child hung", flush=True)
        os.kill(pid, 9)
  """, timeout=60)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "child status" in proc.stdout, proc.stdout  # it did not hang
  parent = re.search(r"^parent (\d+)$", proc.stdout, re.M).group(1)
  taps = re.findall(r"^(\d+) tap (\d+)$", proc.stdout, re.M)
  assert sorted(int(v) for p, v in taps if p != parent) == [1, 2, 3], \
      proc.stdout
  assert [int(v) for p, v in taps if p == parent] == [0], proc.stdout


def test_ctrl_c_interrupts_barrier_wait_while_a_tap_runs():
  # A tap sleeps 3 s; SIGINT comes 0.3 s into barrier_wait, which must end
  # then, while that tap function still runs (it has not returned yet).
  proc = run_python("""
      import os, signal, threading, time
      import jax
      import host_callback as hcb
      out = []
      def tap(x, transforms):
        if int(x) == 0:
          time.sleep(3)
        out.append(int(x))
      f = jax.jit(lambda x: hcb.id_tap(tap, x))
      f(1)
      hcb.barrier_wait()
      f(0)
      sent = []
      def interrupt():
        time.sleep(0.3)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
      threading.Thread(target=interrupt).start()
      try:
        hcb.barrier_wait()
        print("no KeyboardInterrupt", flush=True)
      except KeyboardInterrupt:
        print("interrupted with the tap still running:", 0 not in out,
              flush=True)
      # the runtime goes on: later taps and barriers work
      f(2)
      hcb.barrier_wait()
      print("delivered", out, flush=True)
  """, timeout=60)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "interrupted with the tap still running: True" in proc.stdout, \
      proc.stdout
  assert "delivered [1, 0, 2]" in proc.stdout, proc.stdout


def test_ctrl_c_interrupts_barrier_wait_while_devices_wait_on_a_full_queue():
  # Under pmap, device 0's tap function never returns and its queue fills:
  # device 0's computations wait, and so does barrier_wait's probe of the
  # devices (before it reaches the queues).  Ctrl-C must still end it.
  proc = run_python("""
      import os, signal, threading, time
      import jax, numpy as np
      import host_callback as hcb
      never = threading.Event()
      def tap(x, transforms, device):
        if device.id == 0:
          never.wait()
      f = jax.pmap(lambda x: hcb.id_tap(tap, x, tap_with_device=True))
      x = np.zeros((jax.local_device_count(), 1 << 20), np.float32)
      for _ in range(8):  # 4 MB per device each: more than the bound
        f(x)
      sent = []
      def interrupt():
        time.sleep(1)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
      threading.Thread(target=interrupt).start()
      try:
        hcb.barrier_wait()
        print("no KeyboardInterrupt", flush=True)
      except KeyboardInterrupt:
        print("interrupted", flush=True)
      os._exit(0)  # device 0 never finishes
  """, env=SMALL_QUEUE, timeout=60)
  # Device 0 never finishes: without the interrupt the barrier waits
  # forever (the subprocess times out).
  assert "interrupted" in proc.stdout, (proc.stdout, proc.stderr[-3000:])


def test_ctrl_c_while_a_call_waits_for_the_taps_before_it():
  # A call waits for its device's earlier tap, whose function never
  # returns, on the main thread (XLA runs the small program inline there):
  # Ctrl-C fails that computation, naming the call and Ctrl-C (or jaxlib
  # raises KeyboardInterrupt first), Python raises KeyboardInterrupt, the
  # call's function never runs for it, and the next computation works once
  # the tap function returns.
  proc = run_python("""
      import os, signal, threading, time
      import jax, jax.numpy as jnp
      import host_callback as hcb
      release = threading.Event()
      ran = []
      def fn(v):
        ran.append(float(v))
        return v + 1
      def tap(x, transforms):
        if x == 1:
          release.wait()
      f = jax.jit(lambda x: hcb.call(fn, hcb.id_tap(tap, x), result_shape=x))
      f(jnp.float32(0))  # compiled, and run once: the SIGINT finds it waiting
      ran.clear()
      threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
      error = None
      try:
        try:
          float(f(jnp.float32(1)))
        except Exception as e:  # the computation that waited
          error = e
          for _ in range(100):  # then Python's handler of Ctrl-C
            time.sleep(0.01)
        print("error:", error, flush=True)
      except KeyboardInterrupt:
        print("KeyboardInterrupt; error:", error, flush=True)
      release.set()
      hcb.barrier_wait()
      print("ran", ran, flush=True)
      print("result", float(f(jnp.float32(2))), ran, flush=True)
  """, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("KeyboardInterrupt; error: "), proc.stdout
  if not lines[0].endswith("error: None"):  # the computation failed first
    assert ("call 'fn' on cpu:0 interrupted while waiting for the 1 taps "
            "its device issued before it: Ctrl-C (SIGINT)") in lines[0], \
        proc.stdout
  assert lines[1:] == ["ran []", "result 3.0 [2.0]"], proc.stdout


def test_ctrl_c_ends_the_exit_flush_of_a_tap_that_never_returns():
  # The script ends while its tap function never returns: the at-exit flush
  # waits for it.  Ctrl-C then ends the process at once, saying what is
  # left (it used to wait forever to join the consumer thread).
  proc = start_python("""
      import threading
      import jax
      import host_callback as hcb
      never = threading.Event()
      jax.jit(lambda x: hcb.id_tap(lambda x, t: never.wait(), x))(1)
      print("script end", flush=True)
      """)
  try:
    assert proc.stdout.readline() == "script end\n"
    time.sleep(0.5)  # into the at-exit flush
    proc.send_signal(signal.SIGINT)
    # The tap function never returns: without the interrupt the flush
    # waits forever and this times out.
    _, err = proc.communicate(timeout=30)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  assert "exit interrupted: 1 queued taps are left undelivered" in err, err


@pytest.mark.parametrize("inner", ["jit", "jit with call"])
def test_tap_running_jax_on_its_own_device_is_diagnosed(inner):
  # The tap function runs JAX on the CPU device that issued the tap, while
  # the main program keeps dispatching 4 MB taps into a 16e6-byte queue:
  # the device waits for the tap function, which waits for the device.  (With
  # a call inside, the first tap already waits: the call waits for the
  # device's earlier taps, the running one included.)
  # Within 5 s the runtime must say so (logger host_callback); the
  # deadlocked process is killed as soon as it has said so (at most 12 s).
  code = f"""
      import logging, os, sys, threading, time
      import jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      t0 = [time.monotonic()]
      class Show(logging.Handler):
        def emit(self, r):
          print(f"[{{time.monotonic() - t0[0]:.1f}}] {{r.getMessage()}}",
                flush=True)
      logging.getLogger("host_callback").addHandler(Show())
      inner_call = jax.jit(lambda x: hcb.call(
          lambda v: v * 2, jnp.mean(x),
          result_shape=jax.ShapeDtypeStruct((), np.float32)))
      def tap(x, transforms):
        if {inner!r} == "jit":
          float(jnp.mean(x))
        else:
          float(inner_call(x))
      big = jnp.ones((1 << 20,), np.float32)
      step = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
      x = big
      for i in range(40):
        x = step(x)
      x.block_until_ready()
      hcb.barrier_wait()
      print("completed", flush=True)
  """
  out, _, _ = run_python_until(code, r"^completed$|has waited.*$", "stdout",
                               env=SMALL_QUEUE, timeout=12)
  if "completed" in out:
    return
  warning = re.search(r"^\[(\S+)\] (.*(has waited).*)$", out, re.M)
  assert warning is not None, repr(out)
  assert float(warning.group(1)) < 5.0, out
  message = warning.group(2)
  # Whichever wait is noticed first: the device's, for room in its queue,
  # or (with a call) the call's, for the taps before it.
  if "room in its tap queue" in message or inner == "jit":
    assert "device cpu:0 has waited" in message
    assert "room in its tap queue" in message
    assert "tap function 'tap' is running" in message
    assert "HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE" in message
    assert "move that work out of the tap function" in message
  else:
    assert "has waited 2 s for the taps its device issued before it" in message
    assert "the tap function now running: 'tap'" in message
    assert "outside the tap function" in message


def test_backpressure_releases_the_device_per_tap():
  # 1 MB taps of 0.1 s each into a 16e6-byte queue (about 15 fit); each step
  # is waited for, and a step finishes only once its tap is queued.  With
  # the queue full, a step must finish per tap delivered, not once per
  # batch of taps the consumer took at once.
  proc = run_python("""
      import time, jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      delivered = [0]
      def tap(x, transforms):
        time.sleep(0.1)
        delivered[0] += 1
      step = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)
      x = jnp.zeros((1 << 18,), np.float32)
      step(x).block_until_ready()
      hcb.barrier_wait()
      delivered[0] = 0
      seen = []
      for i in range(45):
        x = step(x)
        x.block_until_ready()
        seen.append(delivered[0])
      hcb.barrier_wait()
      print("most taps delivered between two steps",
            max(seen[i + 1] - seen[i] for i in range(20, 44)), flush=True)
  """, env=SMALL_QUEUE, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  most = int(re.search(r"between two steps (\d+)", proc.stdout).group(1))
  # Once the queue is full, each step waits for room for its own tap: one
  # tap delivered lets it go (a few more if this thread is slow to
  # dispatch the next step).  A queue released only per batch the consumer
  # took let about 15 through between two steps.
  assert most <= 5, proc.stdout


def test_multiprocessing_child_flushes_its_taps_when_it_ends():
  # A multiprocessing child ends without atexit: the taps it issued and did
  # not wait for are still delivered, by the child, before it ends.
  proc = run_python("""
      import multiprocessing as mp, os, time, warnings
      warnings.filterwarnings("ignore")
      import jax
      import host_callback as hcb
      def tap(x, transforms):
        time.sleep(0.05)
        print(os.getpid(), "tap", int(x), flush=True)
      f = jax.jit(lambda x: hcb.id_tap(tap, x))
      f(0)
      hcb.barrier_wait()
      print("parent", os.getpid(), flush=True)
      def child():
        for i in range(1, 4):
          f(i)  # no barrier_wait
      p = mp.get_context("fork").Process(target=child)
      p.start()
      p.join(10)
      print("child hung" if p.is_alive() else f"child status {p.exitcode}",
            flush=True)
      if p.is_alive():
        p.kill()
  """, timeout=60)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "child status 0\n" in proc.stdout, proc.stdout
  parent = re.search(r"^parent (\d+)$", proc.stdout, re.M).group(1)
  taps = re.findall(r"^(\d+) tap (\d+)$", proc.stdout, re.M)
  assert [int(v) for p, v in taps if p != parent] == [1, 2, 3], proc.stdout


def test_300_unsynced_sharded_jit_calls_finish_as_with_jax_ordered_io_callback():
  # A loop that dispatches jit over operands sharded across 4 devices 300
  # times without waiting, each program with one callback (JAX's Python
  # callback carries it, pinned to one device).  JAX's own
  # io_callback(ordered=True) finishes 3,000 such calls; plain JAX
  # (x + sum(x)) about 100 to 300 on 2 cores; our taps used to abort the
  # process at about 50 (XLA's rendezvous: "only 3 of them arrived on
  # time").  Every API of ours finishes 300 (the thresholds: docs/runtime.md).
  proc = run_python("""
      import contextlib, io
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      import host_callback as hcb
      from host_callback import debug
      mesh = Mesh(np.array(jax.devices()), ("d",))
      xs = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))
      spec = jax.ShapeDtypeStruct(xs.shape, xs.dtype)
      sink = io.StringIO()
      programs = {
          "id_tap": lambda x: hcb.id_tap(lambda a, t: None, x + 1,
                                         device_index=2),
          "id_print": lambda x: hcb.id_print(x + 1, output_stream=sink),
          "call": lambda x: hcb.call(lambda a: a, x + 1, result_shape=x),
          "debug.print": lambda x: (debug.print("{}", x), x + 1)[1],
          "io_callback": lambda x: hcb.io_callback(lambda a: a, spec, x + 1,
                                                   ordered=True),
          "pure_callback": lambda x: hcb.pure_callback(lambda a: a, spec,
                                                       x + 1),
      }
      for name, fn in programs.items():
        f = jax.jit(fn)
        with contextlib.redirect_stdout(sink):
          for _ in range(300):
            out = f(xs)
          out.block_until_ready()
          hcb.barrier_wait()
        print(name, "finished", out.sum() == 16 * 15 / 2 + 16, flush=True)
      hcb.barrier_wait()
  """, timeout=300)
  assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
  assert proc.stdout.split("\n")[:-1] == [
      f"{name} finished True" for name in
      ("id_tap", "id_print", "call", "debug.print", "io_callback",
       "pure_callback")], proc.stdout


def test_ctrl_c_ends_a_device_waiting_for_room_in_a_full_queue():
  # A tap function that never returns, and a loop of 4 MB taps made on the
  # device (a program with no input, which XLA runs within the calling
  # thread's dispatch: on that thread, or on one of its own while the
  # caller waits for it inside jaxlib).  The fourth call waits for room in
  # the 16e6-byte queue.  The test sends SIGINT once the runtime says the
  # device waits: that computation fails, naming Ctrl-C, and Python raises
  # KeyboardInterrupt (unless jaxlib, which checks for Ctrl-C too, replaced
  # it with the computation's error); the taps queued before are delivered
  # once the tap function returns, and the runtime goes on.
  proc = start_python("""
      import threading, time
      import jax, jax.numpy as jnp
      import host_callback as hcb
      release = threading.Event()
      seen = []
      def tap(x, transforms):
        release.wait()
        seen.append(x.shape)
      f = jax.jit(lambda: hcb.id_tap(tap, jnp.zeros(1 << 20)))
      returned, error = 0, None
      try:
        try:
          for _ in range(100):
            f().block_until_ready()
            returned += 1
        except Exception as e:  # the computation that waited
          error = e
          for _ in range(100):  # then, mostly, Python's handler of Ctrl-C
            time.sleep(0.01)
        print("error:", type(error).__name__, error, flush=True)
      except KeyboardInterrupt:
        print("KeyboardInterrupt; error:", type(error).__name__, error,
              flush=True)
      release.set()
      hcb.barrier_wait()
      print("returned", returned, "delivered", len(seen), flush=True)
      f()
      hcb.barrier_wait()
      print("then delivered", len(seen), flush=True)
      """, SMALL_QUEUE)
  try:
    for line in proc.stderr:  # the runtime's stall warning: it waits now
      if "has waited" in line and "for room in its tap queue" in line:
        break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  lines = out.splitlines()
  assert lines[0].startswith(("KeyboardInterrupt; error: ", "error: ")), out
  if not lines[0].endswith("NoneType None"):  # the call failed first
    assert "interrupted while waiting for room in its queue" in lines[0], out
    assert "Ctrl-C (SIGINT)" in lines[0], out
  returned = int(re.match(r"returned (\d+) delivered", lines[1])[1])
  # The waiting tap was not queued: every tap of a call that returned was
  # delivered, and no other.
  assert lines[1] == f"returned {returned} delivered {returned}", out
  assert returned >= 3, out
  assert lines[2] == f"then delivered {returned + 1}", out
