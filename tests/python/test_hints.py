"""Mistakes a newcomer makes get a message that names the fix: a shape
given as ``result_shape``, a call that returns a value it never declared,
a tap function that does not take ``(arg, transforms)``; and a program
that ends with tap errors nobody raised says so, in one line, at exit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from conftest import run_python


def test_a_shape_given_as_result_shape_names_shapedtypestruct():
  f = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=(3,)))
  with pytest.raises(Exception) as raised:
    f(jnp.arange(3.0)).block_until_ready()
  assert ("(result_shape=(3,) declares 1 Python int scalar, not a shape: "
          "for an array of shape (3,) declare jax.ShapeDtypeStruct((3,), "
          "dtype), or pass an array of that shape and dtype)"
          in str(raised.value)), str(raised.value)
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()
  # the declaration it meant works
  out = jax.jit(lambda x: hcb.call(
      lambda v: v * 2, x,
      result_shape=jax.ShapeDtypeStruct((3,), jnp.float32)))(jnp.arange(3.0))
  np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])


def test_a_tuple_of_ints_that_is_meant_is_no_mistake():
  out = jax.jit(lambda x: hcb.call(lambda v: (np.int32(1), np.int32(2)), x,
                                   result_shape=(0, 0)))(jnp.arange(3.0))
  assert [int(o) for o in out] == [1, 2]


def test_a_result_never_declared_names_result_shape():
  f = jax.jit(lambda x: hcb.call(lambda v: v * 2, x))
  with pytest.raises(Exception) as raised:
    f(jnp.arange(3.0)).block_until_ready()
  assert ("but result_shape declares no result; to return it, declare it: "
          "result_shape=jax.ShapeDtypeStruct(shape, dtype), or an array of "
          "its shape and dtype (a pytree of them for several)"
          in str(raised.value)), str(raised.value)
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()


@pytest.mark.parametrize("func, with_device, missing", [
    (lambda x: None, False, "def f(arg, transforms): ..."),
    (lambda x, transforms: None, True,
     "def f(arg, transforms, *, device): ..."),
])
def test_a_tap_function_of_the_wrong_signature_is_named_where_bound(
    func, with_device, missing):
  call = ("tap_func(arg, transforms, device=device)" if with_device
          else "tap_func(arg, transforms)")
  with pytest.raises(TypeError) as raised:
    hcb.id_tap(func, jnp.float32(1), tap_with_device=with_device)
  text = str(raised.value)
  assert text.startswith(f"id_tap: the tap function is called as {call}, "
                         "but "), text
  assert text.endswith(f"({missing})"), text


def test_tap_functions_of_every_accepted_signature_are_bound():
  got = []

  def keywords(arg, transforms, **kwargs):
    got.append(sorted(kwargs))

  def varargs(*args, device=None):
    got.append(len(args))

  class Tap:
    def __call__(self, arg, transforms):
      got.append("method")

  jax.jit(lambda x: hcb.id_tap(keywords, x, tap_with_device=True))(1.0)
  jax.jit(lambda x: hcb.id_tap(varargs, x, tap_with_device=True))(1.0)
  jax.jit(lambda x: hcb.id_tap(Tap(), x))(1.0)
  jax.jit(lambda x: hcb.id_tap(print, x))(1.0)  # no signature to read
  hcb.barrier_wait()
  assert got == [["device"], 2, "method"]


def test_tap_errors_nobody_raised_are_named_in_one_line_at_exit():
  done = run_python("""
      import jax, jax.numpy as jnp
      import host_callback as hcb
      def bad(x, transforms):
        raise ValueError("tap failed")
      jax.jit(lambda x: hcb.id_tap(bad, x))(jnp.arange(3.0))
      print("done")
  """)
  assert done.returncode == 0  # the program's status: it ended well
  assert done.stdout == "done\n"
  last = done.stderr.splitlines()[-1]
  assert last == (
      "host_callback: at exit, a tap function's error was never raised by "
      "barrier_wait (the last: ValueError: tap failed); call "
      "hcb.barrier_wait() to raise it where the program can handle it")
  # the traceback was logged once, when it failed
  assert done.stderr.count("Traceback") == 1, done.stderr
