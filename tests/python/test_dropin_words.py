"""Errors and log records of the drop-ins in JAX's words, on JAX's loggers
(issue 27, item 9), against JAX's own in the same process: a failing
pure_callback or io_callback logs JAX's one record and nothing else, its
error names the API the user called, a wrong result is reported in JAX's
words first, refusals start with JAX's phrase, debug callbacks log JAX's
record; host_callback's own call keeps its own words and logger."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback as jax_io_callback
from jax.experimental.buffer_callback import buffer_callback as \
    jax_buffer_callback

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import run_python

S = jax.ShapeDtypeStruct((), jnp.float32)
PURES = {"jax": jax.pure_callback, "hcb": hcb.pure_callback}
IOS = {"jax": jax_io_callback, "hcb": hcb.io_callback}


class Records(logging.Handler):
  """Every record of every logger at WARNING and above, as a tuple that
  compares across the two libraries: (logger, level, message, exception
  type)."""

  def __init__(self) -> None:
    super().__init__(logging.WARNING)
    self.records: list[logging.LogRecord] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.records.append(record)

  def take(self) -> list[tuple[str, str, str, str | None]]:
    out = [(r.name, r.levelname, r.getMessage(),
            r.exc_info[0].__name__ if r.exc_info else None)
           for r in self.records]
    self.records.clear()
    return out


@pytest.fixture
def records():
  handler = Records()
  root = logging.getLogger()
  root.addHandler(handler)
  try:
    yield handler
  finally:
    root.removeHandler(handler)


def raises(x):
  raise ArithmeticError("no answer")


def outcome(f) -> tuple[type[BaseException] | None, str]:
  """The exception type and text of running ``f`` to completion."""
  try:
    jax.block_until_ready(f())
    jax.effects_barrier()
  except Exception as e:  # pylint: disable=broad-except
    return type(e), str(e)
  return None, ""


# ---- a failing pure_callback / io_callback -------------------------------------

@pytest.mark.parametrize("api", ["pure_callback", "io_callback"])
@pytest.mark.parametrize("jit", [False, True])
def test_a_raising_callback_logs_jaxs_one_record_and_nothing_else(
    records, api, jit):
  apis = PURES if api == "pure_callback" else IOS
  got = {}
  for side, call in apis.items():
    f = lambda x, call=call: call(raises, S, x)
    kind, text = outcome(lambda f=f: (jax.jit(f) if jit else f)(1.))
    assert kind is jax.errors.JaxRuntimeError and "no answer" in text
    got[side] = records.take()
    if side == "hcb":
      # The error names the API the user called, and is not raised again.
      assert text.startswith(f"UNKNOWN: {api}: callback 'raises' raised "
                             "ArithmeticError: no answer")
      hcb.barrier_wait()
  assert got["hcb"] == got["jax"] == [
      ("jax._src.callback", "ERROR", f"jax.{api} failed", "ArithmeticError")]


class LibraryError(RuntimeError):
  """An exception class of a library (this module, not builtins)."""


def raises_library_error(x):
  raise LibraryError("the library's words")


@pytest.mark.parametrize("api", ["pure_callback", "io_callback"])
def test_the_exception_line_of_the_error_is_jaxs(records, api):
  # JAX's error names the exception's type as CPython does, without its
  # module: a program that reads the error's text (equinox's error_if
  # under jax.jit) finds the same line with either.
  apis = PURES if api == "pure_callback" else IOS
  lines = {}
  for side, call in apis.items():
    kind, text = outcome(lambda call=call: jax.jit(
        lambda x: call(raises_library_error, S, x))(1.))
    assert kind is jax.errors.JaxRuntimeError
    lines[side] = [line for line in text.splitlines()
                   if line.endswith("the library's words")][-1]
  records.take()
  assert lines["hcb"] == lines["jax"] == (
      "LibraryError: the library's words")


def test_a_filter_on_jaxs_callback_logger_silences_a_failure(records):
  # What equinox's error_if does around its jitted calls.
  class HideJaxFailure(logging.Filter):
    def filter(self, record):
      return record.getMessage() != "jax.pure_callback failed"

  hide = HideJaxFailure()
  logging.getLogger("jax._src.callback").addFilter(hide)
  try:
    for pc in PURES.values():
      kind, _ = outcome(lambda pc=pc: jax.jit(
          lambda x: pc(raises, S, x))(1.))
      assert kind is jax.errors.JaxRuntimeError
    assert records.take() == []
    # host_callback's own call keeps the removed module's ways: its logger.
    kind, _ = outcome(lambda: jax.jit(
        lambda x: hcb.call(raises, x, result_shape=x))(1.))
    assert kind is jax.errors.JaxRuntimeError
  finally:
    logging.getLogger("jax._src.callback").removeFilter(hide)
  assert [r[0] for r in records.take()] == ["host_callback"]
  with pytest.raises(hcb.CallbackException, match="no answer"):
    hcb.barrier_wait()


@pytest.mark.parametrize("case, jax_words", [
    (lambda x: np.zeros(2, np.float32),
     "Incorrect output shape for return value #0: Expected: (), "
     "Actual: (2,)"),
    (lambda x: np.int32(1),
     "Incorrect output dtype for return value #0: Expected: float32, "
     "Actual: int32"),
    (lambda x: (x, x),
     "Mismatched number of outputs from callback. Expected: 1, Actual: 2"),
    (lambda x: None,
     "Mismatched number of outputs from callback. Expected: 1, Actual: 0"),
], ids=["shape", "dtype", "two", "none"])
def test_a_wrong_result_is_reported_in_jaxs_words_and_not_logged(
    records, case, jax_words):
  for api, apis in (("pure_callback", PURES), ("io_callback", IOS)):
    for side, call in apis.items():
      kind, text = outcome(lambda call=call: jax.jit(
          lambda x: call(case, S, x))(1.))
      assert kind is jax.errors.JaxRuntimeError
      assert jax_words in text
      if side == "hcb":
        assert text.startswith(f"INVALID_ARGUMENT: {jax_words} ({api}: "
                               "callback '")
        assert "host_callback" not in text
        assert "result_shape_dtypes declares" in text
    assert records.take() == []  # JAX logs no wrong result either
  hcb.barrier_wait()


def test_a_wrong_result_among_several_names_its_position_like_jax():
  two = (S, jax.ShapeDtypeStruct((2,), jnp.int32))
  for side, pc in PURES.items():
    kind, text = outcome(lambda pc=pc: jax.jit(lambda x: pc(
        lambda a: (a, np.zeros(3, np.int32)), two, x))(1.))
    assert kind is jax.errors.JaxRuntimeError
    assert ("Incorrect output shape for return value #1: Expected: (2,), "
            "Actual: (3,)") in text, side


# ---- refusals -------------------------------------------------------------

def test_a_result_in_the_other_byte_order_is_refused_as_jax_refuses_it():
  # A drop-in refuses it with JAX's words (JAX takes no byte-swapped
  # array); host_callback's own call converts it, as it converts any array
  # of the declared dtype.
  # (JAX 0.9 reports its dtype as any other that is not the one declared.)
  swapped = lambda v: np.asarray(v, ">f4")  # noqa: E731
  spec = jax.ShapeDtypeStruct((3,), jnp.float32)
  words = ("Dtype >f4 is not a valid JAX array type. Only arrays of numeric "
           "types are supported by JAX" if jax.__version_info__ >= (0, 10)
           else "Incorrect output dtype for return value #0: Expected: "
                "float32, Actual: >f4")
  for pure_callback in (jax.pure_callback, hcb.pure_callback):
    with pytest.raises(jax.errors.JaxRuntimeError, match=words):
      jax.jit(lambda x: pure_callback(swapped, spec, x))(jnp.arange(3.))
  out = jax.jit(lambda x: hcb.call(swapped, x, result_shape=spec))(
      jnp.arange(3.))
  np.testing.assert_array_equal(out, [0., 1., 2.])


def test_vmap_of_cond_over_io_callback_starts_with_jaxs_phrase():
  for side, io in IOS.items():
    def f(p, io=io):
      return jax.lax.cond(p, lambda: io(lambda: None, None),
                          lambda: io(lambda: None, None))

    with pytest.raises(NotImplementedError) as e:
      jax.vmap(f)(jnp.array([True, False]))
    assert str(e.value).startswith("IO effect not supported in vmap-of-cond."), side


def test_buffer_callback_refusals_start_with_jaxs_phrase(records):
  def returns(ctx, out, x):
    return 1

  for bc in (jax_buffer_callback, hcb.buffer_callback):
    with pytest.raises(NotImplementedError) as e:
      jax.vmap(bc(lambda ctx, out, x: None, S))(jnp.ones(2))
    assert str(e.value).startswith(
        "vmap is only supported for the buffer_callback primitive when "
        "vmap_method is one of 'sequential', 'sequential_unrolled', "
        "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. Got "
        "vmap_method=None.")
    kind, text = outcome(lambda bc=bc: jax.jit(bc(returns, S))(1.))
    assert kind is jax.errors.JaxRuntimeError
    assert text.startswith("INVALID_ARGUMENT: buffer_callback callback must "
                           "not return any values.") or \
        "ValueError: buffer_callback callback must not return" in text
    # A raising buffer callback: JAX logs nothing; neither do we.
    kind, text = outcome(lambda bc=bc: jax.jit(bc(
        lambda ctx, out, x: raises(x), S))(1.))
    assert kind is jax.errors.JaxRuntimeError and "no answer" in text
  assert records.take() == []
  hcb.barrier_wait()  # the computations raised them: not again


# ---- debug callbacks ----------------------------------------------------------

def test_a_raising_debug_callback_logs_jaxs_record(records):
  # Eagerly both log, then raise the exception itself.
  for mod in (jax.debug, hdebug):
    with pytest.raises(ArithmeticError, match="no answer"):
      mod.callback(raises, 1.)
  assert records.take() == [("jax._src.debugging", "ERROR",
                             "jax.debug.callback failed",
                             "ArithmeticError")] * 2
  # Under jit both fail the call, with JAX's one record each; the error
  # names the exception, and barrier_wait does not raise it again.
  for mod in (jax.debug, hdebug):
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="ArithmeticError: no answer"):
      jax.jit(lambda x, mod=mod: mod.callback(raises, x))(1.)
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="Unknown format code"):  # a float: no 'd'
      jax.jit(lambda x, mod=mod: mod.print("{x:d}", x=x))(1.)
  hcb.barrier_wait()
  assert records.take() == [
      ("jax._src.debugging", "ERROR", "jax.debug.callback failed",
       "ArithmeticError"),
      ("jax._src.debugging", "ERROR", "jax.debug.callback failed",
       "ValueError")] * 2


def test_the_exit_of_a_program_adds_no_record_of_a_drop_in_failure():
  r = run_python("""
      import jax, jax.numpy as jnp
      import host_callback as hcb
      from host_callback import debug

      def bad(x):
        raise ArithmeticError("no answer")

      try:
        jax.jit(lambda x: hcb.pure_callback(
            bad, jax.ShapeDtypeStruct((), jnp.float32), x))(1.)
      except jax.errors.JaxRuntimeError:
        print("caught")
      try:
        jax.jit(lambda x: debug.callback(bad, x))(1.)
      except jax.errors.JaxRuntimeError:
        print("caught")
      jax.effects_barrier()
      print("done")
  """)
  assert r.returncode == 0, r.stderr
  assert r.stdout == "caught\ncaught\ndone\n"
  assert r.stderr.count("jax.pure_callback failed") == 1
  assert r.stderr.count("jax.debug.callback failed") == 1
  assert "host_callback" not in r.stderr.replace(
      "site-packages/host_callback", "")
