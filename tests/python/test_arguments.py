"""Every parameter of the public functions is checked where the callback is
bound, and the error names the function and the parameter: a misspelled
keyword names the parameter it was meant to be, a value of the wrong kind
says what was expected and what came.  Nothing waits for the callback to
run (on the host, later) to fail."""

from __future__ import annotations

import ctypes
import io
import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import _batching


def _tap(arg, transforms):
  del arg, transforms


# ---- misspelled keywords -----------------------------------------------------

def test_id_tap_names_a_misspelled_keyword_and_its_right_spelling():
  with pytest.raises(TypeError) as info:
    hcb.id_tap(_tap, 1.0, tap_with_devic=True)
  assert str(info.value) == (
      "id_tap() got an unexpected keyword argument 'tap_with_devic'; did you "
      "mean 'tap_with_device'?")


def test_id_tap_keeps_the_removed_modules_words_for_other_keywords():
  with pytest.raises(TypeError) as info:
    hcb.id_tap(_tap, 1.0, what="x")
  assert str(info.value).startswith(
      "id_tap() got an unexpected keyword argument 'what'. Support for "
      "**kwargs in ``id_tap`` has been removed.")


@pytest.mark.parametrize("wrong, right", [
    ("treshold", "threshold"), ("output_steam", "output_stream"),
    ("tap_with_devices", "tap_with_device"), ("device_idx", "device_index")])
def test_id_print_refuses_a_label_one_slip_from_a_parameter(wrong, right):
  stream = io.StringIO()
  with pytest.raises(TypeError, match=f"'{wrong}', which is close to its "
                                      f"parameter '{right}'"):
    hcb.id_print(1.0, output_stream=stream, **{wrong: 3})
  hcb.id_print(1.0, output_stream=stream, what=3, step=1)  # labels still print
  hcb.barrier_wait()
  assert stream.getvalue() == "step: 1 what: 3\n1.\n"


@pytest.mark.parametrize("function, call, wrong, right", [
    ("call", lambda: hcb.call(abs, 1.0, result_shap=1.0),
     "result_shap", "result_shape"),
    ("call", lambda: hcb.call(abs, 1.0, vmap_metod="sequential"),
     "vmap_metod", "vmap_method"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, jax.ShapeDtypeStruct((), np.float32),
                                 has_side_efect=True),
     "has_side_efect", "has_side_effect"),
    ("native_tap", lambda: hcb.native_tap(1, usr=0), "usr", "user"),
    ("native_call", lambda: hcb.native_call(1, nam="f"), "nam", "name"),
])
def test_a_misspelled_keyword_names_the_parameter(function, call, wrong,
                                                  right):
  with pytest.raises(TypeError) as info:
    call()
  assert str(info.value) == (
      f"{function}() got an unexpected keyword argument '{wrong}'; did you "
      f"mean '{right}'?")


def test_the_checks_keep_signatures_and_add_no_false_suggestion():
  import inspect
  with pytest.raises(TypeError, match="'result_shap'; did you mean"):
    hcb.call(abs, 1.0, result_shap=1.0)
  # A keyword far from every parameter: Python's own words, no suggestion.
  with pytest.raises(TypeError) as info:
    hcb.call(abs, 1.0, colour="red")
  assert str(info.value) == (
      "call() got an unexpected keyword argument 'colour'")
  assert list(inspect.signature(hcb.call).parameters) == [
      "callback_func", "arg", "result_shape", "call_with_device",
      "device_index", "callback_flavor", "vmap_method"]
  assert hcb.call.__doc__.startswith("Calls ``callback_func(arg)``")
  assert hcb.call(lambda x: x * 2, np.float32(2),
                  result_shape=np.float32(0)) == 4


# ---- values of the wrong kind, refused where the callback is bound ----------

def test_id_print_threshold_that_is_not_a_number_is_named():
  with pytest.raises(TypeError, match=r"id_print: threshold must be a number "
                                      r".* got 'many' \(str\)"):
    hcb.id_print(1.0, threshold="many")
  with pytest.raises(ValueError, match="id_print: threshold must not be NaN"):
    hcb.id_print(1.0, threshold=float("nan"))


def test_id_print_takes_every_threshold_numpy_takes():
  x = np.arange(10)
  for threshold in (np.inf, 5.5, 5, np.int64(5), -1):
    stream = io.StringIO()
    hcb.id_print(x, output_stream=stream, threshold=threshold)
    hcb.barrier_wait()
    assert stream.getvalue() == np.array2string(x, threshold=threshold) + "\n"


def test_id_print_output_stream_is_checked_before_any_tap_runs():
  with pytest.raises(TypeError, match=r"id_print: output_stream must be None "
                                      r"\(sys.stdout\), an object with a "
                                      r"write\(str\) method or a "
                                      r"logging.Logger, got 123 \(int\)"):
    jax.jit(lambda x: hcb.id_print(x, output_stream=123))(1.0)
  hcb.barrier_wait()  # nothing was queued, nothing failed on the host
  for stream in (None, sys.stderr, io.StringIO(),
                 logging.getLogger("hcb-test")):
    hcb.id_print(1.0, output_stream=stream)
  hcb.barrier_wait()


@pytest.mark.parametrize("function, call, message", [
    ("id_tap", lambda: hcb.id_tap(_tap, 1.0, tap_with_device="yes"),
     "id_tap: tap_with_device must be True or False, got 'yes' (str)"),
    ("id_print", lambda: hcb.id_print(1.0, tap_with_device=None),
     "id_print: tap_with_device must be True or False, got None (NoneType)"),
    ("id_print", lambda: hcb.id_print(1.0, callback_flavor="pure"),
     "id_print: callback_flavor must be a CallbackFlavor"),
    ("call", lambda: hcb.call(abs, 1.0, call_with_device="no"),
     "host_callback.call: call_with_device must be True or False, got 'no'"),
    ("call", lambda: hcb.call(3, 1.0),
     "host_callback.call: callback_func must be callable, got 3 (int)"),
    ("id_tap", lambda: hcb.id_tap(None, 1.0),
     "id_tap: tap_func must be callable, got None (NoneType)"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, (np.float32, 3)),
     "buffer_callback: result_shape_dtypes must be a pytree whose leaves "
     "have 'shape' and 'dtype'"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, jax.ShapeDtypeStruct((), np.float32),
                                 has_side_effect="always"),
     "buffer_callback: has_side_effect must be True or False"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, jax.ShapeDtypeStruct((), np.float32),
                                 command_buffer_compatible=2),
     "buffer_callback: command_buffer_compatible must be True or False"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, jax.ShapeDtypeStruct((), np.float32),
                                 input_output_aliases=[(0, 0)]),
     "buffer_callback: input_output_aliases must be None or a dict"),
    ("buffer_callback",
     lambda: hcb.buffer_callback(_tap, jax.ShapeDtypeStruct((), np.float32),
                                 input_output_aliases={"a": 0}),
     "buffer_callback: an input_output_aliases key must be an int"),
    ("native_tap", lambda: hcb.native_tap(1, user="params"),
     "native_tap: user must be an address"),
    ("native_call", lambda: hcb.native_call(1, user=-1),
     "native_call: user must be an address from 0 to 2**64-1 "
     "(0xffffffffffffffff), got -1"),
    ("native_call", lambda: hcb.native_call(1, name=7),
     "native_call: name must be a str or None, got 7 (int)"),
    ("native_tap", lambda: hcb.native_tap(-5),
     "native_tap: fn must be an address from 1 to 2**64-1 "
     "(0xffffffffffffffff), got -5"),
])
def test_a_bad_value_names_the_function_and_the_parameter(function, call,
                                                          message):
  del function
  with pytest.raises((TypeError, ValueError)) as info:
    call()
  assert message in str(info.value)


def test_a_native_user_pointer_may_be_an_address_a_void_p_or_none():
  params = ctypes.c_double(0.5)
  libc = ctypes.CDLL(None)
  with pytest.raises(TypeError, match="native_call: user must be an address"):
    hcb.native_call(libc.abs, user=[ctypes.addressof(params)])
  for user in (ctypes.addressof(params), np.uint64(ctypes.addressof(params)),
               ctypes.c_void_p(ctypes.addressof(params)), None, 0):
    assert hcb.native_call(libc.abs, user=user).user in (
        0, ctypes.addressof(params))


# ---- vmap_method: every method, everywhere ----------------------------------

def _message(call) -> str:
  with pytest.raises((ValueError, NotImplementedError)) as info:
    call()
  return str(info.value)


def test_every_vmap_method_message_lists_all_four():
  shape = jax.ShapeDtypeStruct((), np.float32)
  messages = [
      _message(lambda: hcb.call(abs, 1.0, vmap_method="parallel")),
      _message(lambda: hcb.buffer_callback(_tap, shape,
                                           vmap_method="parallel")),
      _message(lambda: jax.vmap(lambda x: hcb.call(
          np.sin, x, result_shape=x))(jnp.ones(3))),
      _message(lambda: jax.vmap(hcb.buffer_callback(_tap, shape))(
          jnp.ones(3))),
  ]
  for text in messages:
    for method in _batching.VMAP_METHODS:
      assert repr(method) in text, (method, text)


# ---- progress bars -------------------------------------------------------------

def test_progress_bars_check_tqdms_keywords_when_decorating():
  progress = pytest.importorskip("host_callback.progress")
  with pytest.raises(TypeError) as info:
    progress.scan_tqdm(10, descr="training")
  assert str(info.value).startswith(
      "scan_tqdm() got an unexpected keyword argument 'descr'; did you mean "
      "'desc'? (it passes its other keyword arguments to tqdm.")
  with pytest.raises(TypeError, match="loop_tqdm.*'print_rat'; did you mean "
                                      "'print_rate'"):
    progress.loop_tqdm(10, print_rat=2)
  with pytest.raises(TypeError, match="while_loop.*'mininterva'; did you "
                                      "mean 'mininterval'"):
    progress.while_loop(lambda v: v < 3, lambda v: v + 1, 0, mininterva=1)
  # tqdm's own keywords and jax-tqdm's alias pass.
  progress.scan_tqdm(10, desc="a", leave=False, mininterval=0.5, ncols=40,
                     message="b", position=1)


@pytest.mark.parametrize("call, message", [
    (lambda p: p.scan_tqdm("ten"), "scan_tqdm: n must be an int"),
    (lambda p: p.scan_tqdm(10, print_rate=2.5),
     "scan_tqdm: print_rate must be an int or None, got 2.5 (float)"),
    (lambda p: p.loop_tqdm(10, position="top"),
     "loop_tqdm: position must be an int"),
    (lambda p: p.while_loop(lambda v: v < 3, lambda v: v + 1, 0, total=-1),
     "while_loop: total must be >= 0, got -1"),
])
def test_progress_bar_parameters_are_named(call, message):
  progress = pytest.importorskip("host_callback.progress")
  with pytest.raises((TypeError, ValueError)) as info:
    call(progress)
  assert message in str(info.value)
