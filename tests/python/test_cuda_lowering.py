"""Lowering for CUDA, checked on machines without a GPU: every API
cross-lowers for platform "cuda" (``lower(lowering_platforms=("cuda",))``)
to its typed-FFI custom call with its attributes, chained in program order,
under the same transformations and control flow as on CPU -- the CUDA
module is the very module that CPU runs; and on CPU the calls that work in
place on the device's buffers (buffer_callback, native calls) lower to
``hcb_buffer_call`` and still run."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import _devices
from conftest import run_python

SOURCE = r"""
#include <stdatomic.h>
#include "hcb/hcb.h"

static atomic_long taps;

int count_tap(void *user, hcb_record *rec, hcb_error *err) {
  (void)user; (void)rec; (void)err;
  atomic_fetch_add(&taps, 1);
  return HCB_OK;
}

/* results[0] = args[0] * 2, float32. */
int double_call(void *user, hcb_device device, const hcb_array *args,
                size_t nargs, const hcb_array *results, size_t nresults,
                hcb_error *err) {
  size_t i;
  (void)user; (void)device;
  if (nargs != 1 || nresults != 1 || args[0].dtype != HCB_F32 ||
      results[0].nbytes != args[0].nbytes)
    return hcb_error_set(err, HCB_EINVAL, "double_call: bad arguments");
  for (i = 0; i < args[0].nbytes / 4; i++)
    ((float *)results[0].data)[i] = ((const float *)args[0].data)[i] * 2;
  return HCB_OK;
}

long counted_taps(void) { return atomic_load(&taps); }
"""


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Any:
  d = tmp_path_factory.mktemp("cuda_lowering")
  (d / "native.c").write_text(SOURCE)
  flags = subprocess.run([sys.executable, "-m", "host_callback", "--cflags",
                          "--libs"], capture_output=True, text=True,
                         check=True).stdout.split()
  path = str(d / "libnative.so")
  subprocess.run(["cc", "-std=c11", "-shared", "-fPIC", "-O2", "-Wall",
                  "-Werror", str(d / "native.c"), *flags, "-o", path],
                 check=True)
  lib = ctypes.CDLL(path)
  lib.counted_taps.restype = ctypes.c_long
  return lib


def _ignore(arg: Any, transforms: Any) -> None:
  del arg, transforms


def _add_one(ctx: Any, out: Any, x: Any) -> None:
  del ctx
  np.asarray(out)[...] = np.asarray(x) + 1


# ---- reading the lowered programs --------------------------------------------

class HloCall(NamedTuple):
  """One custom call of an HLO module's text."""

  target: str
  operands: list[str]
  attributes: str  # everything after the target


_HLO_CALL = re.compile(
    r"= .*? custom-call\((?P<operands>[^)]*)\), "
    r'custom_call_target="(?P<target>\w+)"(?P<attributes>.*)$', re.M)


def _lowered(f: Callable[..., Any], platform: str, *args: Any) -> Any:
  return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))


_MLIR_BACKEND_CONFIG = re.compile(
    r"stablehlo\.custom_call @(?P<target>\w+)\(.*?"
    r"mhlo\.backend_config = (?P<config>\{[^}]*\})")


def hlo_calls(lowered: Any) -> list[HloCall]:
  """The custom calls of ``lowered`` as XLA compiles it (HLO text).

  Before JAX 0.8 the HLO text of a lowering leaves out a typed FFI call's
  attributes (XLA still gets them: a compiled module's text has them), so
  there each call's ``backend_config`` is read from the StableHLO text,
  the n-th call of a target getting the n-th dictionary of that target.
  """
  calls = [HloCall(m["target"], [o.strip() for o in m["operands"].split(",")],
                   m["attributes"])
           for m in _HLO_CALL.finditer(lowered.as_text(dialect="hlo"))]
  if jax.__version_info__ >= (0, 8):
    return calls
  configs: dict[str, list[str]] = {}
  for m in _MLIR_BACKEND_CONFIG.finditer(lowered.as_text()):
    configs.setdefault(m["target"], []).append(m["config"])
  return [c._replace(attributes=c.attributes + ", backend_config="
                     + configs[c.target].pop(0))
          if configs.get(c.target) else c for c in calls]


class MlirCall(NamedTuple):
  """One custom call of a StableHLO module's text, with its SSA names."""

  target: str
  operands: list[str]
  token_result: str  # the SSA name of its last result


_MLIR_CALL = re.compile(
    r"(?P<name>%\w+)(?::(?P<n>\d+))? = stablehlo\.custom_call "
    r"@(?P<target>\w+)\((?P<operands>[^)]*)\)")


def mlir_calls(text: str) -> list[MlirCall]:
  calls = []
  for m in _MLIR_CALL.finditer(text):
    n = int(m["n"] or 1)
    last = m["name"] if n == 1 else f"{m['name']}#{n - 1}"
    calls.append(MlirCall(m["target"], [o.strip() for o in
                                         m["operands"].split(",")], last))
  return calls


def _attribute(call: HloCall, name: str) -> str | None:
  found = re.search(rf"\b{name} = ([^,}}]+)", call.attributes)
  return None if found is None else found[1].strip()


def assert_typed_ffi(call: HloCall, *, side_effect: bool = True) -> None:
  """The custom call is XLA's typed FFI (API version 4) with a callback id
  among its attributes, and has a side effect (or not)."""
  assert "api_version=API_VERSION_TYPED_FFI" in call.attributes, call
  assert re.fullmatch(r"\d+ : ui64", _attribute(call, "callback_id") or ""), (
      call)
  assert ("custom_call_has_side_effect=true" in call.attributes) == (
      side_effect), call


# ---- every API, lowered for CUDA ---------------------------------------------

X = jnp.arange(4, dtype=jnp.float32)


def test_id_tap_lowers_to_hcb_tap_for_cuda():
  lowered = _lowered(lambda x: hcb.id_tap(_ignore, (x, x * 2), result=x + 1),
                     "cuda", X)
  call, = hlo_calls(lowered)
  assert call.target == "hcb_tap"
  assert_typed_ffi(call)
  # The two tapped arrays and a token in, the token alone out: the program
  # goes on with its own arrays (``result`` is no operand).
  assert len(call.operands) == 3
  assert _attribute(call, "ntapped") == "2 : i64"
  assert "output_to_operand_aliasing" not in call.attributes


def test_id_print_lowers_to_hcb_tap_for_cuda():
  lowered = _lowered(lambda x: hcb.id_print(x, what="x") * 2, "cuda", X)
  call, = hlo_calls(lowered)
  assert call.target == "hcb_tap"
  assert_typed_ffi(call)
  assert _attribute(call, "ntapped") == "1 : i64"
  assert "output_to_operand_aliasing" not in call.attributes


def test_native_tap_lowers_to_hcb_tap_for_cuda(native):
  tap = hcb.native_tap(native.count_tap)
  call, = hlo_calls(_lowered(lambda x: hcb.id_tap(tap, x), "cuda", X))
  assert call.target == "hcb_tap"
  assert_typed_ffi(call)


def test_python_call_lowers_to_hcb_call_for_cuda():
  lowered = _lowered(lambda x: hcb.call(np.sin, x, result_shape=x), "cuda", X)
  call, = hlo_calls(lowered)
  assert call.target == "hcb_call"  # staged through host memory on CUDA
  assert_typed_ffi(call)
  assert "output_to_operand_aliasing" not in call.attributes
  assert _attribute(call, "ntapped") is None


def test_native_call_lowers_to_hcb_buffer_call_for_cuda(native):
  double = hcb.native_call(native.double_call)
  lowered = _lowered(lambda x: hcb.call(double, x, result_shape=x), "cuda", X)
  call, = hlo_calls(lowered)
  assert call.target == "hcb_buffer_call"  # in place on the device
  assert_typed_ffi(call)


@pytest.mark.parametrize("has_side_effect", [False, True])
def test_buffer_callback_lowers_to_hcb_buffer_call_for_cuda(has_side_effect):
  f = hcb.buffer_callback(_add_one, jax.ShapeDtypeStruct(X.shape, X.dtype),
                          has_side_effect=has_side_effect,
                          input_output_aliases={0: 0})
  call, = hlo_calls(_lowered(f, "cuda", X))
  assert call.target == "hcb_buffer_call"
  assert_typed_ffi(call, side_effect=has_side_effect)
  # A side-effecting call is ordered: a token operand and result (last).
  assert len(call.operands) == (2 if has_side_effect else 1)
  # Result 0 (the only one without a token: "{}") is operand 0.
  assert re.search(r"output_to_operand_aliasing=\{\{0?\}: \(0, \{\}\)\}",
                   call.attributes), call


def test_native_buffer_callback_lowers_to_hcb_buffer_call_for_cuda(native):
  f = hcb.buffer_callback(hcb.native_call(native.double_call),
                          jax.ShapeDtypeStruct(X.shape, X.dtype),
                          has_side_effect=True)
  call, = hlo_calls(_lowered(f, "cuda", X))
  assert call.target == "hcb_buffer_call"
  assert_typed_ffi(call)


def test_callbacks_under_jit_over_sharded_operands_lower_to_shared_calls():
  """On CUDA as on CPU: our custom calls, each with the device that runs
  the function (its device key) and the devices that share it; no
  Python callback."""
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("d",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  x = jax.device_put(X, sharded)
  lowered = _lowered(
      lambda v: hcb.call(np.sin, hcb.id_tap(_ignore, v, device_index=1),
                         result_shape=v), "cuda", x)
  calls = hlo_calls(lowered)
  ours = [c for c in calls if c.target.startswith("hcb_")]
  assert [c.target for c in ours] == ["hcb_tap", "hcb_call"], calls
  assert not any("callback" in c.target for c in calls), calls
  tap, call = ours
  assert "participants = 2 : i64" in tap.attributes, tap
  assert f"runner = {_devices.device_key(jax.devices('cpu')[1])} : ui64" in \
      tap.attributes, tap
  assert f"runner = {_devices.device_key(jax.devices('cpu')[0])} : ui64" in \
      call.attributes, call


def test_in_place_calls_under_jit_over_sharded_gpu_operands_are_refused(
    native):
  """Under jit over sharded operands one device runs a callback and the
  others take its results through host memory: a function meant for the
  GPU's own buffers would leave theirs unset, so it is refused at
  lowering, saying what to use instead."""
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:2]), ("d",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  x = jax.device_put(X, sharded)
  result = jax.ShapeDtypeStruct(X.shape, X.dtype)
  for f in (hcb.buffer_callback(_add_one, result),
            lambda x: hcb.call(hcb.native_call(native.double_call), x,
                               result_shape=result)):
    with pytest.raises(NotImplementedError,
                       match="cannot run under jit over operands sharded "
                             "across 2 devices .* inside jax.shard_map"):
      _lowered(f, "cuda", x)
    jax.jit(f)(x).block_until_ready()  # on CPU: host buffers, it runs


def test_pure_callbacks_lower_without_side_effect_or_token_for_cuda():
  pure = hcb.CallbackFlavor.PURE
  lowered = _lowered(
      lambda x: hcb.call(np.sin, hcb.id_tap(_ignore, x, callback_flavor=pure),
                         result_shape=x, callback_flavor=pure), "cuda", X)
  calls = hlo_calls(lowered)
  assert [c.target for c in calls] == ["hcb_tap", "hcb_call"]
  for call in calls:
    assert_typed_ffi(call, side_effect=False)
    assert len(call.operands) == 1, call  # x alone: no token


# ---- program order -----------------------------------------------------------

def test_callbacks_are_chained_in_program_order_for_cuda(native):
  double = hcb.native_call(native.double_call)
  add_one = hcb.buffer_callback(
      _add_one, jax.ShapeDtypeStruct(X.shape, X.dtype), has_side_effect=True)

  def f(x):
    hcb.id_tap(_ignore, x)  # unused results: still ordered
    y = hcb.id_print(x * 2, where="second")
    hcb.call(np.cos, x, result_shape=x)
    z = hcb.call(double, y, result_shape=y)
    return add_one(z)

  calls = mlir_calls(_lowered(f, "cuda", X).as_text())
  assert [c.target for c in calls] == [
      "hcb_tap", "hcb_tap", "hcb_call", "hcb_buffer_call", "hcb_buffer_call"]
  # Each custom call's token operand (its last) is the previous one's token
  # result; the first starts from a fresh token.
  assert not calls[0].operands[-1].startswith("%arg")
  for before, after in zip(calls, calls[1:]):
    assert after.operands[-1] == before.token_result, (before, after)


# ---- the same program as on CPU ----------------------------------------------

def _grad_of_taps(x):
  return jax.grad(lambda x: jnp.sum(hcb.id_tap(_ignore, x) ** 2))(x)


def _scan_of_taps_and_prints(x):
  def step(c, y):
    return hcb.id_tap(_ignore, c + y), hcb.id_print(y, step=True)
  return jax.lax.scan(step, x[0], x)


def _cond_of_calls(x):
  return jax.lax.cond(x[0] > 0,
                      lambda x: hcb.call(np.cos, x, result_shape=x),
                      lambda x: hcb.id_tap(_ignore, x), x)


def _while_with_taps_in_predicate_and_body(x):
  return jax.lax.while_loop(
      lambda c: hcb.id_tap(_ignore, c)[0] < 10,
      lambda c: hcb.id_print(c + 1, where="body"), x)


def _vmap_of_taps_and_calls(x):
  return jax.vmap(lambda v: hcb.call(
      np.sin, hcb.id_tap(_ignore, v), result_shape=v,
      vmap_method="sequential"))(jnp.stack([x, x]))


def _nested_jit_and_buffer_callback(x):
  add_one = hcb.buffer_callback(
      _add_one, jax.ShapeDtypeStruct(X.shape, X.dtype), has_side_effect=True)
  return jax.jit(lambda x: add_one(hcb.id_tap(_ignore, x)))(x)


def _fori_of_prints_under_vmap(x):
  return jax.vmap(lambda v: jax.lax.fori_loop(
      0, 3, lambda i, c: hcb.id_print(c * 2, i=i), v))(jnp.stack([x, x]))


# (program, its callback's custom call, the op that carries the callbacks'
# token across control flow: a line of the StableHLO text)
_WHILE = r"stablehlo\.while\(.*!stablehlo\.token$"
PROGRAMS = {
    "grad": (_grad_of_taps, "stablehlo.custom_call @hcb_tap", None),
    "scan": (_scan_of_taps_and_prints, "stablehlo.custom_call @hcb_tap",
             _WHILE),
    "cond": (_cond_of_calls, "stablehlo.custom_call @hcb_call",
             r"^ *\}\) : \(tensor<i32>\) -> \(.*!stablehlo\.token\)$"),
    "while_loop": (_while_with_taps_in_predicate_and_body,
                   "stablehlo.custom_call @hcb_tap", _WHILE),
    "vmap": (_vmap_of_taps_and_calls, "stablehlo.custom_call @hcb_call",
             _WHILE),  # vmap_method="sequential": a loop
    "nested_jit": (_nested_jit_and_buffer_callback,
                   "stablehlo.custom_call @hcb_buffer_call",
                   r"= call @.*\(.*!stablehlo\.token\)$"),
    "fori_vmap": (_fori_of_prints_under_vmap,
                  "stablehlo.custom_call @hcb_tap", _WHILE),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cuda_lowering_is_the_cpu_lowering(name):
  """The CUDA module is the one CPU compiles and runs (the CPU tests check
  what it does): the same custom calls, attributes, transforms, control
  flow and token chain."""
  f, call, control = PROGRAMS[name]
  cpu = _lowered(f, "cpu", X)
  cuda = _lowered(f, "cuda", X)  # cpu kept alive: the same callback ids
  text = cuda.as_text()
  assert call in text
  if control is not None:
    # The control flow carries the token of the callbacks inside it.
    assert re.search(control, text, re.M), text
  assert text == cpu.as_text()
  assert cuda.as_text(dialect="hlo") == cpu.as_text(dialect="hlo")
  for c in hlo_calls(cuda):
    assert c.target in ("hcb_tap", "hcb_call", "hcb_buffer_call")
    assert_typed_ffi(c)
  f(X)  # and it runs on CPU
  hcb.barrier_wait()


def test_transforms_reach_the_cuda_sites():
  """vmap, grad (jvp and transpose) make sites of their own, as on CPU:
  distinct callback ids, each a registered tap."""
  seen: list[Any] = []

  @jax.custom_jvp
  def g(x):
    return x

  @g.defjvp
  def g_jvp(primals, tangents):
    return primals[0], hcb.id_tap(lambda t, tr: seen.append(tr), tangents[0])

  def f(x):
    x = jax.vmap(lambda v: hcb.id_tap(lambda a, tr: seen.append(tr), v))(x)
    return jnp.sum(g(x) * 3)

  program = lambda x: jax.grad(f)(jnp.stack([x, x]))  # noqa: E731
  ids = [_attribute(c, "callback_id")
         for c in hlo_calls(_lowered(program, "cuda", X))]
  assert len(ids) == 2 and len(set(ids)) == 2
  program(X)
  hcb.barrier_wait()
  assert sorted(str(tr) for tr in seen) == sorted([
      "(('batch', {'batch_dims': (0,)}),)", "(('transpose', {}),)"])


def test_multi_platform_lowering_keeps_each_platforms_callback():
  """Lowered for CPU and CUDA at once, each platform's branch has the
  custom call (and so the device key of its own platform where one is
  needed)."""
  both = jax.jit(lambda x: hcb.id_tap(_ignore, x) * 2).trace(X).lower(
      lowering_platforms=("cpu", "cuda"))
  text = both.as_text()
  assert text.count("stablehlo.custom_call @hcb_tap") == 2
  assert "stablehlo.case" in text


# ---- CPU: calls in place lower to hcb_buffer_call ----------------------------

def test_buffer_callback_lowers_to_hcb_buffer_call_on_cpu_and_runs():
  f = hcb.buffer_callback(_add_one, jax.ShapeDtypeStruct(X.shape, X.dtype),
                          has_side_effect=True)
  call, = hlo_calls(_lowered(f, "cpu", X))
  assert call.target == "hcb_buffer_call"
  assert_typed_ffi(call)
  np.testing.assert_array_equal(jax.jit(f)(X), [1, 2, 3, 4])


def test_native_call_lowers_to_hcb_buffer_call_on_cpu_and_runs(native):
  double = hcb.native_call(native.double_call)
  f = lambda x: hcb.call(double, x, result_shape=x) + 1  # noqa: E731
  call, = hlo_calls(_lowered(f, "cpu", X))
  assert call.target == "hcb_buffer_call"
  np.testing.assert_array_equal(jax.jit(f)(X), [1, 3, 5, 7])
  # In scan, under vmap: the same custom call, still in place.
  out, _ = jax.jit(lambda c: jax.lax.scan(
      lambda c, _: (hcb.call(double, c, result_shape=c), None), c, None,
      length=3))(jnp.ones(2, jnp.float32))
  np.testing.assert_array_equal(out, [8.0, 8.0])


def test_python_call_still_lowers_to_hcb_call_on_cpu():
  call, = hlo_calls(_lowered(
      lambda x: hcb.call(np.sin, x, result_shape=x), "cpu", X))
  assert call.target == "hcb_call"


def test_native_tap_on_cpu_still_runs(native):
  before = native.counted_taps()
  jax.jit(lambda x: hcb.id_tap(hcb.native_tap(native.count_tap), x))(X)
  hcb.barrier_wait()
  assert native.counted_taps() == before + 1


# ---- devices -----------------------------------------------------------------

def test_device_keys_name_the_platform():
  from host_callback import _devices
  for dev in jax.devices("cpu"):
    key = _devices.device_key(dev)
    assert key >> 32 == 0 and _devices.device_for_key(key) is dev
  cuda = _devices.local_cuda_devices()
  if not cuda:
    # A CUDA key finds no device on a machine without one.
    with pytest.raises(LookupError, match="platform 1 ordinal 0"):
      _devices.device_for_key((1 << 32) | 0)
  for dev in cuda:
    key = _devices.device_key(dev)
    assert key == (1 << 32) | dev.local_hardware_id
    assert _devices.device_for_key(key) is dev


def test_cuda_registration_survives_a_missing_cuda_runtime():
  """Without a CUDA backend nothing is registered for CUDA; registering
  anyway where libcudart cannot be loaded warns and still registers (the
  handlers retry when first run)."""
  done = run_python("""
      import logging, jax, jax.numpy as jnp
      import host_callback as hcb
      from host_callback import _handlers
      from host_callback._state import state
      jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x))(jnp.ones(2))
      hcb.barrier_wait()
      assert state.cuda_devices == [], state.cuda_devices
      path = _handlers.cudart_path()
      assert path is None or path.endswith(("libcudart.so.13",
                                            "libcudart.so.12")), path
      records = []
      class Keep(logging.Handler):
        def emit(self, record):
          records.append(record.getMessage())
      logging.getLogger("host_callback").addHandler(Keep())
      _handlers.register_cuda_handlers()
      print("warned" if any("CUDA runtime could not be loaded" in r
                            for r in records) else "loaded")
      """, env={"LD_LIBRARY_PATH": "", "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() in ("warned", "loaded")
  if _runtime_has_no_cudart():
    assert done.stdout.strip() == "warned"


def _runtime_has_no_cudart() -> bool:
  for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
    try:
      ctypes.CDLL(name)
      return False
    except OSError:
      pass
  from host_callback import _handlers
  return _handlers.cudart_path() is None
