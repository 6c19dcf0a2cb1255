"""Probes: how the runtime knows that the devices have finished what was
dispatched before.

A probe is a tiny computation (:func:`_touch`) compiled once for fixed
devices, apart from the user's JAX contexts.  Dispatched and waited for,
it returns once the computations dispatched before it on its devices have
finished, and with them issued all of their callbacks
(:func:`wait_for_devices` says why).  barrier_wait, the release of
retired ids, eager debug callbacks and the at-exit flush wait with them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from host_callback import _hcb
from host_callback import _jax
from host_callback._state import state


def _touch(x: jax.Array) -> jax.Array:
  return x + 1


class Probe(NamedTuple):
  """A probe computation (:func:`wait_for_devices`) compiled for fixed
  devices, and its operand, already on them."""

  compiled: Any  # jax.stages.Compiled
  operand: jax.Array


def _pinned_settings() -> contextlib.ExitStack:
  """JAX's settings as the runtime's own computations need them, whatever
  the user set, also globally (``jax.config.update``): transfers allowed,
  jit on, no mesh (a concrete, abstract or explicit-sharding one)."""
  stack = contextlib.ExitStack()
  stack.enter_context(jax.transfer_guard("allow"))
  stack.enter_context(jax.disable_jit(False))
  if _jax.trace_state_clean():  # jax.set_mesh refuses to run under a trace
    stack.enter_context(_jax.no_mesh())
  return stack


def _made_apart(make: Callable[[], Any]) -> Any:
  """``make()``, run where none of the calling thread's JAX contexts apply:
  the user's ``set_mesh``, ``default_device``, ``transfer_guard``,
  ``enable_x64``, ``disable_jit``, a trace in progress, and any context
  JAX adds later, are all thread-local; so it runs in a thread of its own,
  with the settings that can also be global pinned.  Where Python starts
  no more threads (late in interpreter shutdown), it runs in this thread
  with those settings pinned."""
  done: list[Any] = []
  finished = threading.Event()

  def run() -> None:
    try:
      with _pinned_settings():
        done.append((True, make()))
    except BaseException as e:  # pylint: disable=broad-except
      done.append((False, e))
    finally:
      finished.set()

  try:
    threading.Thread(target=run, name="hcb-probe-compile").start()
  except RuntimeError:  # "can't create new thread at interpreter shutdown"
    run()
  # Ctrl-C waits for the compilation, as it would in this thread (XLA's
  # compiler does not return to Python before it is done): a thread left
  # compiling while the interpreter exits aborts the process.  (An Event,
  # not Thread.join: a join that Ctrl-C interrupts may no longer tell
  # whether the thread is alive.)
  interrupted: KeyboardInterrupt | None = None
  while not finished.is_set():
    try:
      finished.wait()
    except KeyboardInterrupt as e:
      interrupted = e
  if interrupted is not None:
    raise interrupted
  ok, value = done[0]
  if not ok:
    raise value
  return value


def _probe(devices: tuple[jax.Device, ...]) -> Probe:
  """The probe on ``devices`` (one device, or all of them: an array sharded
  over them), compiled and placed once, apart from the user's contexts
  (:func:`_made_apart`)."""
  probe = state.probes.get(devices)
  if probe is None:
    def make() -> Probe:
      if len(devices) == 1:
        operand = jax.device_put(np.int32(0), devices[0])
      else:
        mesh = jax.sharding.Mesh(np.array(devices), ("d",))
        operand = jax.device_put(
            np.zeros(len(devices), np.int32),
            jax.sharding.NamedSharding(mesh,
                                       jax.sharding.PartitionSpec("d")))
      return Probe(jax.jit(_touch).lower(operand).compile(), operand)
    probe = state.probes.setdefault(devices, _made_apart(make))
  return probe


def _run_probes(probes: list[Probe]) -> list[jax.Array]:
  """Dispatches ``probes``.  A compiled program ignores the user's
  contexts when called, except ``disable_jit``, which it refuses."""
  with jax.disable_jit(False):
    return [p.compiled(p.operand) for p in probes]


def _probes_on(devices: list[jax.Device]) -> list[jax.Array]:
  """One probe computation on each of ``devices`` and, with several, one
  over all of them."""
  probes = [_probe((d,)) for d in devices]
  if len(devices) > 1:
    probes.append(_probe(tuple(devices)))
  return _run_probes(probes)


def dispatch_probes() -> list[jax.Array]:
  """The probes of :func:`wait_for_devices`, on the local CPU devices and
  the local CUDA devices (:func:`_probes_on`) -- except in a forked child:
  there a CPU computation over several devices never finishes (PJRT's CPU
  client runs it on threads the child does not have), so the child has
  none to wait for either, and the parent's CUDA context is unusable (a
  CUDA device has no computation of the child's)."""
  cpu = jax.local_devices(backend="cpu")
  if state.forked:
    return _run_probes([_probe((d,)) for d in cpu])
  return _probes_on(cpu) + (_probes_on(state.cuda_devices)
                            if state.cuda_devices else [])


def wait_for_cuda_devices() -> None:
  """Returns once the local CUDA devices have finished every computation
  dispatched before the call (none to wait for without CUDA devices, or in
  a forked child)."""
  if state.cuda_devices and not state.forked:
    for out in _probes_on(state.cuda_devices):
      out.block_until_ready()


def wait_for_device(device: jax.Device) -> None:
  """Returns once ``device`` has finished the one-device computations
  dispatched to it before the call (one probe on it: see
  :func:`wait_for_devices`); not the multi-device computations, which may
  still be running."""
  _run_probes([_probe((device,))])[0].block_until_ready()


def wait_for_devices() -> None:
  """Returns once every computation dispatched (by any thread) before the
  call has finished on every local device (CPU and CUDA), so that each has
  issued all of its callbacks: taps are then in the runtime's queues
  (which ``_hcb.barrier`` drains), calls have run, and the taps that go
  through JAX's Python callback (jit over sharded operands) have been
  submitted.

  It dispatches probe computations and waits for them.  What orders them
  after the computations dispatched earlier is how PJRT's CPU client
  schedules (JAX 0.6-0.12; tests/python/test_barrier.py checks it on the
  JAX installed):

  - a computation on one device waits for the previous one-device
    computation dispatched to that device (the device's last enqueue
    event), even when its own inputs are ready;
  - a computation on several devices (pmap, shard_map, jit over sharded
    operands) waits until the previous multi-device computation of the
    client has finished on all of its devices (the last collective launch
    event), whichever devices either runs on; one-device computations do
    not wait for these, nor these for them.

  So one probe per device covers the one-device computations, and one
  probe over all local devices covers every multi-device computation.  (A
  probe on each device alone is not enough: it can finish while a
  multi-device computation dispatched before it still waits for its
  inputs or its turn -- the early returns of issue 16.)  Under
  ``jax.distributed`` the same holds for this process's part of a global
  computation; every process waits for its own devices.

  On a CUDA device a computation runs on the device's compute stream
  after everything launched there before it, its part of a multi-device
  computation included; and a tap's record enters the runtime's queue
  once the device's lander has seen the event after its copies on that
  stream.  So when a CUDA device's probe completes, every earlier tap's
  copies are done, and the runtime's barrier, which waits for the lander
  to hand those over first, finds every record queued; its probes are made as the CPU's are (one per
  device, one over all), which also covers a multi-device computation
  that PJRT has not yet launched on every device.

  The probes are compiled once, apart from the user's JAX contexts
  (:func:`_probe`), and called as compiled programs, which ignore them:
  a barrier works inside ``jax.set_mesh``, ``jax.default_device``,
  ``jax.transfer_guard``, ``jax.disable_jit``, whatever the caller set.
  """
  for out in dispatch_probes():
    out.block_until_ready()  # interruptible: jaxlib checks for Ctrl-C
  # Computations that JAX runs with runtime tokens (with JAX effects, e.g.
  # io_callback) finish here too.  A token of a failed one holds an error
  # its caller has already seen: forget it rather than have JAX print it
  # at exit.
  try:
    _jax.wait_for_runtime_tokens()
  except jax.errors.JaxRuntimeError:
    _jax.forget_runtime_tokens()


def in_device_callback() -> bool:
  """Whether this thread runs a callback for a running computation: a
  call or buffer_callback function of ours, or JAX's own io_callback,
  pure_callback or debug.callback (XLA's threads, which Python knows only
  as ``threading._DummyThread``).  That computation cannot finish before
  the callback returns, and the probes of :func:`wait_for_devices` may
  wait for it (always under pmap, shard_map and jit over sharded operands,
  and on its own device): there the probes would never finish."""
  return _hcb.in_call() or isinstance(threading.current_thread(),
                                      threading._DummyThread)
