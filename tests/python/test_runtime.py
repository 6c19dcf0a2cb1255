"""The runtime seen from Python: ordering at scale, exceptions and
barrier_wait, threads, exit flush, back-pressure, settings, inline mode,
stop/restart, fast dispatch."""

from __future__ import annotations

import logging
import re
import threading

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import host_callback as hcb

from conftest import run_python


def test_100k_taps_from_one_scan_arrive_in_order(collect):
  n = 100_000
  f = jax.jit(lambda xs: lax.scan(
      lambda c, x: (c, hcb.id_tap(collect, x)), 0, xs)[1])
  before = hcb.stats()
  f(jnp.arange(n, dtype=jnp.int32)).block_until_ready()
  hcb.barrier_wait()
  got = np.array([int(a) for a in collect.args])
  np.testing.assert_array_equal(got, np.arange(n))
  after = hcb.stats()
  assert after["records_in"] - before["records_in"] == n
  assert after["records_out"] - before["records_out"] == n
  assert after["queued_records"] == 0
  print("stats after 100,000 taps:", after)


def test_one_failing_tap_of_1000(collect, caplog):
  def tap(x, transforms):
    if int(x) == 500:
      raise ValueError("tap refused 500")
    collect(x, transforms)

  f = jax.jit(lambda xs: lax.scan(lambda c, x: (c, hcb.id_tap(tap, x)), 0,
                                  xs)[1])
  with caplog.at_level(logging.ERROR, logger="host_callback"):
    f(jnp.arange(1000))
    with pytest.raises(hcb.CallbackException) as info:
      hcb.barrier_wait()
  assert len(collect.args) == 999  # every other tap delivered
  assert 500 not in [int(a) for a in collect.args]
  msg = str(info.value)
  assert msg.startswith("There were exceptions during callback processing. "
                        "Last one was: Traceback")
  assert "ValueError: tap refused 500" in msg
  assert isinstance(info.value.__cause__, ValueError)
  assert any("tap refused 500" in r.getMessage() and "Traceback" in
             r.getMessage() for r in caplog.records)
  hcb.barrier_wait()  # raised once, then cleared
  assert hcb.TapFunctionException is hcb.CallbackException


def test_runtime_goes_on_after_an_exception(collect):
  jax.jit(lambda x: hcb.id_tap(lambda a, t: 1 / 0, x))(1.0)
  with pytest.raises(hcb.CallbackException, match="ZeroDivisionError"):
    hcb.barrier_wait()
  jax.jit(lambda x: hcb.id_tap(collect, x))(2.0)
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [2.0]


def test_four_python_threads_tap_at_once():
  per_thread: dict[int, list[int]] = {k: [] for k in range(4)}
  lock = threading.Lock()

  def make_tap(k):
    def tap(x, transforms):
      with lock:
        per_thread[k].append(int(x))
    return tap

  def work(k):
    f = jax.jit(lambda xs: lax.scan(
        lambda c, x: (c, hcb.id_tap(make_tap(k), x)), 0, xs)[1])
    for r in range(5):
      f(jnp.arange(200) + 1000 * r)

  threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  hcb.barrier_wait()
  for k in range(4):
    # Each thread's calls were dispatched in order on the one device.
    assert per_thread[k] == [1000 * r + i for r in range(5) for i in range(200)]


def test_exit_flushes_pending_taps():
  proc = run_python("""
      import sys, time, jax, jax.numpy as jnp
      from jax import lax
      import host_callback as hcb
      # One write per line: print writes the text and its end apart, and the
      # main thread's line could split a tap's ("main donetap 0").
      def slow(x, transforms):
        time.sleep(0.002)
        sys.stdout.write(f"tap {int(x)}\\n")
        sys.stdout.flush()
      f = jax.jit(lambda xs: lax.scan(lambda c, x: (c, hcb.id_tap(slow, x)),
                                      0, xs)[1])
      f(jnp.arange(300))
      sys.stdout.write("main done\\n")
      sys.stdout.flush()
      # no barrier_wait: the at-exit flush must deliver everything
  """)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.split("\n")
  taps = [int(l.split()[1]) for l in lines if l.startswith("tap ")]
  assert taps == list(range(300))


def test_backpressure_16MB_bound_1GB_slow_consumer_loses_nothing():
  proc = run_python("""
      import time, jax, jax.numpy as jnp, numpy as np
      from jax import lax
      import host_callback as hcb
      seen = []
      def slow(x, transforms):
        time.sleep(0.003)
        seen.append((int(x[0]), int(x[-1]), x.nbytes))
      n, size = 256, 1 << 20  # 256 taps of 4 MiB (int32[1M]) = 1 GiB
      def step(c, i):
        hcb.id_tap(slow, jnp.full((size,), i, jnp.int32))
        return c, None
      jax.jit(lambda: lax.scan(step, 0, jnp.arange(n))[0])()
      hcb.barrier_wait()
      s = hcb.stats()
      assert seen == [(i, i, 4 * size) for i in range(n)], seen[:5]
      assert s["records_out"] == n and s["bytes_in"] >= n * 4 * size
      assert s["producer_waits"] > 0, s
      assert s["high_water_bytes"] <= 16_000_000, s
      print("ok", s["producer_waits"], s["producer_wait_ns"],
            s["high_water_bytes"])
  """, env={"HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16e6"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("ok ")


@pytest.mark.parametrize("name", ["HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE",
                                  "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"])
def test_queue_bound_setting(name):
  proc = run_python("import host_callback as hcb; "
                    "print(hcb.stats()['max_queue_bytes'])",
                    env={name: "32e6"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "32000000"
  proc = run_python("import host_callback", env={name: "1000"})
  assert proc.returncode != 0
  assert (f"ValueError: {name} must be a number of bytes from 16000000 to "
          "9223372036854775807, such as 256e6; got '1000'") in proc.stderr


@pytest.mark.parametrize("name", ["HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE",
                                  "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE"])
@pytest.mark.parametrize("value", ["1e100", "-5", "nan", "inf", "-inf", "lots",
                                   "1e7", "0x10", "9223372036854775808"])
def test_queue_bound_out_of_range_is_a_value_error_naming_the_variable(
    name, value, monkeypatch):
  from host_callback import _config
  monkeypatch.delenv("HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE", raising=False)
  monkeypatch.setenv(name, value)
  with pytest.raises(ValueError) as info:
    _config.max_queue_bytes()
  assert str(info.value) == (
      f"{name} must be a number of bytes from 16000000 to "
      f"9223372036854775807, such as 256e6; got {value!r}")


@pytest.mark.parametrize("value,size", [("16e6", 16_000_000),
                                        (" 256e6 ", 256_000_000),
                                        ("9223372036854775807", 2**63 - 1),
                                        ("1e18", 10**18)])
def test_queue_bound_in_range(value, size, monkeypatch):
  from host_callback import _config
  monkeypatch.setenv("HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE", value)
  assert _config.max_queue_bytes() == size


def test_a_malformed_pinned_pool_size_is_refused_where_the_pool_is_set_up():
  # The variable sizes the pinned pool of GPU callbacks: a machine without
  # CUDA never reads it (a typo there used to break `import host_callback`
  # everywhere), and a machine with CUDA refuses it, naming it, where the
  # CUDA handlers are registered.
  done = run_python("""
      import jax
      import host_callback as hcb
      from host_callback import _handlers
      seen = []
      jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x))(3)
      hcb.barrier_wait()
      print("taps", seen, flush=True)
      try:
        _handlers.register_cuda_handlers()
      except ValueError as e:
        print("error:", e, flush=True)
      """, env={"HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE": "lots"})
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines() == [
      "taps [3]",
      "error: HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE must be a number of bytes "
      "from 4194304 to 9223372036854775807, such as 512e6; got 'lots'"]


def test_cuda_pinned_pool_setting(monkeypatch):
  from host_callback import _config
  monkeypatch.delenv("HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE", raising=False)
  assert _config.cuda_pinned_bytes() == 256 << 20
  monkeypatch.setenv("HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE", "512e6")
  assert _config.cuda_pinned_bytes() == 512_000_000
  monkeypatch.setenv("HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE", "1e6")
  with pytest.raises(ValueError) as info:
    _config.cuda_pinned_bytes()
  assert str(info.value) == (
      "HOST_CALLBACK_CUDA_PINNED_BYTE_SIZE must be a number of bytes from "
      "4194304 to 9223372036854775807, such as 512e6; got '1e6'")
  # what Python validated, C takes: under 4 MiB is refused there too
  from host_callback import _hcb
  with pytest.raises(ValueError, match="at least 4194304 bytes, got 1000"):
    _hcb.cuda_set_pinned_bytes(1000)


def test_inline_mode_calls_in_the_calling_thread():
  proc = run_python("""
      import threading, jax, jax.numpy as jnp
      import host_callback as hcb
      where = []
      tap = lambda x, t: where.append((float(x), threading.get_ident()))
      hcb.id_tap(tap, jnp.float32(1.0))           # eager: inline, at once
      assert where == [(1.0, threading.get_ident())], where
      jax.jit(lambda x: hcb.id_tap(tap, x))(2.0)  # staged: asynchronous
      hcb.barrier_wait()
      assert where[1][0] == 2.0 and where[1][1] != threading.get_ident()
      try:
        hcb.id_tap(lambda x, t: 1 / 0, jnp.float32(1.0))
      except ZeroDivisionError:
        print("raised in caller")
  """, env={"HOST_CALLBACK_INLINE": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "raised in caller"


def test_stop_and_restart(collect):
  f = jax.jit(lambda x: hcb.id_tap(collect, x))
  f(1.0)
  hcb.stop_outfeed_receiver()
  assert [float(a) for a in collect.args] == [1.0]  # drained by the stop
  f(2.0)  # the next tap starts the threads again
  hcb.barrier_wait()
  assert [float(a) for a in collect.args] == [1.0, 2.0]


def test_barrier_inside_a_tap_is_refused():
  jax.jit(lambda x: hcb.id_tap(lambda a, t: hcb.barrier_wait(), x))(1.0)
  with pytest.raises(hcb.CallbackException,
                     match="barrier_wait was called from inside a tap"):
    hcb.barrier_wait()


def test_fast_dispatch_path_and_one_compilation(collect):
  from jax._src import test_util as jtu
  f = jax.jit(lambda x: hcb.id_tap(collect, x) * 2)
  x = jnp.ones(3)
  f(x)  # compile
  with jtu.count_pjit_cpp_cache_miss() as misses:
    for _ in range(20):
      f(x)
  assert misses() == 0  # every call took JAX's C++ fast path
  assert f._cache_size() == 1
  hcb.barrier_wait()
  assert len(collect.args) == 21


def test_same_function_reuses_its_compilation(collect):
  from jax._src import test_util as jtu
  def g(x):
    return hcb.id_tap(collect, x) + 1
  with jtu.count_jit_compilation_cache_miss() as compiles:
    jax.jit(g)(1.0)
    jax.jit(g)(2.0)  # a new jit object, same function and tap site
  assert compiles() == 1
  hcb.barrier_wait()


def test_stats_per_device(collect):
  jax.jit(lambda x: hcb.id_tap(collect, x))(jnp.ones(10))
  hcb.barrier_wait()
  s = hcb.stats()
  dev = s["devices"][str(jax.devices()[0])]
  for key in ("records_in", "bytes_in", "records_out", "bytes_out",
              "queued_records", "queued_bytes", "reserved_records",
              "reserved_bytes", "high_water_bytes", "producer_waits",
              "producer_wait_ns", "errors"):
    assert key in s and key in dev
  assert dev["records_out"] >= 1 and dev["bytes_out"] >= 40
  # after the barrier nothing is queued or on its way, in records or bytes
  # alike, and every byte in came out
  for counts in (s, dev):
    assert counts["queued_records"] == counts["queued_bytes"] == 0, counts
    assert counts["reserved_records"] == counts["reserved_bytes"] == 0
    assert counts["bytes_in"] == counts["bytes_out"]


def test_dtype_codes_and_execution_stages_are_xla_s():
  # The runtime defines both (include/hcb/hcb.h, XLA's FFI header) and the
  # Python side takes them from _hcb; here they are checked against JAX's
  # own view of XLA, so that a wrong code fails here and not as a tap of
  # one dtype arriving as another.
  from jax._src.lib import xla_client
  from jax.experimental import buffer_callback

  from host_callback import _runtime

  def xla_name(name: str) -> str:  # numpy's name -> XLA's PrimitiveType
    special = {"bool": "PRED", "bfloat16": "BF16"}
    if name in special:
      return special[name]
    kind, bits, rest = re.fullmatch(r"(u?int|float|complex)(\d+)_?(\w*)",
                                    name).groups()
    return {"int": "S", "uint": "U", "float": "F", "complex": "C"}[kind] + \
        bits + rest.upper()

  named = {code: dtype for code, dtype in enumerate(_runtime._dtype_table())
           if dtype is not None}
  assert {np.dtype(np.int8), np.dtype(np.complex128), np.dtype(ml_dtypes.int4),
          np.dtype(ml_dtypes.bfloat16)} <= set(named.values())
  checked = 0
  for code, dtype in named.items():
    try:
      xla = xla_client.PrimitiveType(code).name
    except ValueError:  # a type newer than this jaxlib's enum (int2 in 0.10)
      continue
    assert xla == xla_name(dtype.name), (code, dtype)
    checked += 1
  assert checked >= 20, checked
  assert {s.name: s.value for s in hcb.ExecutionStage} == {
      s.name: int(s.value) for s in buffer_callback.ExecutionStage}


def test_runtime_errors_raise_one_python_type_per_code():
  # The extension maps the runtime's error codes to Python in one place
  # (hcb_py_raise): a value it does not handle is a TypeError, a bad
  # argument a ValueError, each with the runtime's message.
  from host_callback import _hcb
  from host_callback._print import PrintNode, PrintOptions

  node = [PrintNode(kind=_hcb.PRINT_ARRAY, children=0, key=None, text=None)]
  options = PrintOptions(threshold=1000, edgeitems=3, linewidth=75,
                         precision=8, floatmode=_hcb.FLOATMODE_MAXPREC,
                         sign="-", suppress=False, nanstr="nan", infstr="inf")
  with pytest.raises(TypeError, match=r"cannot print dtype float8_e4m3fn"):
    _hcb.format_value(node, [np.zeros(2, ml_dtypes.float8_e4m3fn)], options)
  too_precise = options._replace(precision=_hcb.PRINT_MAX_PRECISION + 1)
  with pytest.raises(ValueError, match=r"print option precision is 401, "
                                       r"expected 0\.\.400"):
    _hcb.format_value(node, [np.zeros(2, np.float32)], too_precise)
  assert _hcb.format_value(node, [np.zeros(2, np.float32)], options) == \
      "[0. 0.]"
  # The C side reads the print nodes and options by name: a plain tuple of
  # the right values, or a field that drifted, is refused, naming it.
  with pytest.raises(TypeError, match=r"expected a PrintNode, got a tuple "
                                      r"without field 'kind'"):
    _hcb.format_value([tuple(node[0])], [np.zeros(2, np.float32)], options)
  with pytest.raises(TypeError, match=r"expected a PrintOptions, got a tuple "
                                      r"without field 'threshold'"):
    _hcb.format_value(node, [np.zeros(2, np.float32)], tuple(options))
