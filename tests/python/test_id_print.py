"""id_print: the text, character for character, against numpy and JAX.

The reference for every comparison is what id_print of the removed
jax.experimental.host_callback module (the old module, below) would write
with the installed numpy and JAX: ``numpy.array2string`` for arrays
and JAX's pretty printer for the containers around them (``expected_value``
below).  The C printer is reached through ``Printer.format`` (the Python
path of id_print) for the differential tests, and through ``id_print`` in
compiled code everywhere else.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src import pretty_printer as pp

import host_callback as hcb
from host_callback import _print

from conftest import repeats


# ---- the reference ----------------------------------------------------------

def expected_doc(value: Any, threshold: int | None) -> pp.Doc:
  def group(open_: str, close: str, children: list[pp.Doc]) -> pp.Doc:
    return pp.group(pp.concat([pp.text(open_),
                               pp.nest(2, pp.join(pp.brk(), children)),
                               pp.text(close)]))
  if isinstance(value, tuple):
    return group("( ", " )", [expected_doc(v, threshold) for v in value])
  if isinstance(value, list):
    return group("[ ", " ]", [expected_doc(v, threshold) for v in value])
  if isinstance(value, dict):
    return group("{ ", " }", [pp.text(f"{k}=") + expected_doc(v, threshold)
                              for k, v in sorted(value.items())])
  if isinstance(value, np.ndarray):
    return pp.text(np.array2string(value, threshold=threshold))
  return pp.text(str(value))


def expected_value(value: Any, threshold: int | None = None) -> str:
  """The old module's text of one value (without the newline)."""
  return str(expected_doc(value, threshold))


def expected_tap(value: Any, threshold: int | None = None, **kv: Any) -> str:
  """The old module's output of one tap: the sorted ``k: v`` line, the
  value."""
  line = " ".join(f"{k}: {v}" for k, v in sorted(kv.items()))
  return (line + "\n" if line else "") + expected_value(value, threshold) + "\n"


def c_array2string(a: np.ndarray, threshold: int | None = None,
                   **numpy_options: Any) -> str:
  """The C printer on one array, with numpy's options as id_print takes
  them."""
  with np.printoptions(**numpy_options):
    printer = _print.Printer({}, None, threshold)
  assert printer.options is not None
  return printer.format(a)


# ---- golden cases, one per rule --------------------------------------------

BF16 = ml_dtypes.bfloat16
GOLDEN = [
    # positional floats: shortest digits, aligned on the point
    (np.array([1.0, 2.5]), {}, "[1.  2.5]"),
    (np.array([0.1, 0.2, 0.3], np.float32), {}, "[0.1 0.2 0.3]"),
    (np.array([-0.0, 1.0]), {}, "[-0.  1.]"),
    (np.array(3.0), {}, "3."),
    (np.array([123.456, 1.5]), {}, "[123.456   1.5  ]"),
    # precision cut-off, ties to even
    (np.array([0.001953125, 1.0]), {}, "[0.00195312 1.        ]"),
    (np.array([1 / 3]), {}, "[0.33333333]"),
    # scientific notation: large, small, wide ratio, 3-digit exponents
    (np.array([1e8, 1.5e8]), {}, "[1.0e+08 1.5e+08]"),
    (np.array([1e-5, 1.0]), {}, "[1.e-05 1.e+00]"),
    (np.array([1.0, 1001.0]), {}, "[1.000e+00 1.001e+03]"),
    (np.array([1e100, 1e8]), {}, "[1.e+100 1.e+008]"),
    (np.array([1e6, 1.0], np.float32), {}, "[1.e+06 1.e+00]"),
    (np.array([60000, 1], np.float16), {}, "[6.e+04 1.e+00]"),
    # nan and inf take the width of the numbers
    (np.array([np.nan, 1.5, -np.inf]), {}, "[ nan  1.5 -inf]"),
    (np.array([np.nan, np.inf]), {}, "[nan inf]"),
    # integers, bools
    (np.array([-5, 100, 3], np.int8), {}, "[ -5 100   3]"),
    (np.array([np.iinfo(np.int64).min, 0]), {},
     "[-9223372036854775808                    0]"),
    (np.array([2**64 - 1, 0], np.uint64), {}, "[18446744073709551615                    0]"),
    (np.array([True, False]), {}, "[ True False]"),
    (np.array(True), {}, "True"),
    # complex, bfloat16 (ml_dtypes prints %g, unpadded)
    (np.array([1 + 2j, np.nan + 1j], np.complex64), {}, "[ 1.+2.j nan+1.j]"),
    (np.array([1, 2.5, 3.1415926, 1e10, -0.0], BF16), {},
     "[1 2.5 3.14062 9.99922e+09 -0]"),
    # empty and 0-d
    (np.zeros((2, 0)), {}, "[]"),
    (np.array(7, np.int32), {}, "7"),
    # summarisation, line wrapping, nesting
    (np.arange(2000), {}, "[   0    1    2 ... 1997 1998 1999]"),
    (np.arange(10), {"threshold": 5}, "[0 1 2 ... 7 8 9]"),
    (np.arange(30.0), {},
     "[ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11. 12. 13. 14. 15. 16. 17.\n"
     " 18. 19. 20. 21. 22. 23. 24. 25. 26. 27. 28. 29.]"),
    (np.arange(8).reshape(2, 2, 2), {}, "[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]]"),
    (np.arange(8).reshape(8, 1), {"threshold": 2},
     "[[0]\n [1]\n [2]\n ...\n [5]\n [6]\n [7]]"),
]


@pytest.mark.parametrize("array,kwargs,text", GOLDEN,
                         ids=[f"{a.dtype}{a.shape}" for a, _, _ in GOLDEN])
def test_golden_text_matches_numpy_and_c(array, kwargs, text):
  assert np.array2string(array, **kwargs) == text  # the rule, in numpy
  assert c_array2string(array, **kwargs) == text


@pytest.mark.parametrize("options", [
    {"precision": 3}, {"floatmode": "fixed"}, {"floatmode": "unique"},
    {"floatmode": "maxprec_equal"}, {"sign": "+"}, {"sign": " "},
    {"suppress": True}, {"linewidth": 20}, {"edgeitems": 1, "threshold": 4},
    {"nanstr": "NaN", "infstr": "Inf"}])
def test_numpy_print_options(options):
  a = np.array([[1.5, -2.25, np.nan], [1e-7, np.inf, 3.0]])
  threshold = options.pop("threshold", None)
  with np.printoptions(**options):
    want = np.array2string(a, threshold=threshold)
  assert c_array2string(a, threshold, **options) == want


# ---- differential tests -----------------------------------------------------

SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-5, 1e-4, 0.1, 1.0, 999.0,
           1000.5, 1e6, 1e8, 1e16, 1e-300, 5e-324, 65504.0, 3.0e38]
FLOATS = [np.float16, np.float32, np.float64, np.complex64, np.complex128]
INTS = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
        np.uint32, np.uint64]


@st.composite
def any_array(draw: Any) -> np.ndarray:
  dtype = np.dtype(draw(st.sampled_from(FLOATS + INTS + [BF16])))
  ndim = draw(st.integers(0, 4))
  shape = draw(hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0,
                                max_side=40 if ndim == 1 else 5))
  how = draw(st.sampled_from(["bits", "values", "scaled"]))
  size = int(np.prod(shape))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  if dtype == BF16 or (how == "bits" and dtype.kind in "fc"):
    # every bit pattern: subnormals, NaN payloads, all magnitudes
    raw = rng.integers(0, 256, size * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)
  if dtype.kind in "biu":
    return draw(hnp.arrays(dtype, shape))
  values = rng.standard_normal(size)
  if how == "scaled":
    values *= 10.0 ** rng.integers(-12, 13, size)
  special = rng.random(size) < 0.2
  values[special] = rng.choice(SPECIAL, int(special.sum()))
  with np.errstate(all="ignore"):
    if dtype.kind == "c":
      imag = rng.standard_normal(size) * 10.0 ** rng.integers(-4, 5, size)
      return (values + 1j * imag).astype(dtype).reshape(shape)
    return values.astype(dtype).reshape(shape)


PRINT_OPTIONS = st.fixed_dictionaries({}, optional={
    "precision": st.integers(0, 17),
    "floatmode": st.sampled_from(sorted(_print._FLOATMODES)),
    "sign": st.sampled_from(["-", "+", " "]),
    "suppress": st.booleans(),
    "linewidth": st.integers(10, 130),
    "edgeitems": st.integers(0, 4),
})

def test_differential_against_numpy_array2string():
  """At least 20,000 random arrays (scaled by HOST_CALLBACK_TEST_REPEAT),
  zero mismatches."""
  checked = [0]
  draws = repeats(2100)

  @hypothesis.settings(max_examples=draws, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(st.lists(any_array(), min_size=10, max_size=10),
                    st.one_of(st.none(), st.integers(0, 60)), PRINT_OPTIONS)
  def check(arrays, threshold, options):
    for a in arrays:
      with np.printoptions(**options), np.errstate(all="ignore"):
        want = np.array2string(a, threshold=threshold)
      assert c_array2string(a, threshold, **options) == want, (a.dtype,
                                                               a.shape)
    checked[0] += len(arrays)

  check()
  assert checked[0] >= 10 * repeats(2000)


def small_array() -> st.SearchStrategy[np.ndarray]:
  return st.one_of(
      hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=12),
                 elements=st.floats(-1e4, 1e4, width=32)),
      hnp.arrays(np.int32, hnp.array_shapes(min_dims=0, max_dims=1,
                                            max_side=30)))


VALUES = st.recursive(
    small_array(),
    lambda children: st.one_of(
        st.tuples(children, children), st.lists(children, max_size=4),
        st.dictionaries(st.text("abcxyz", min_size=1, max_size=12), children,
                        max_size=4),
        st.lists(children, max_size=3).map(tuple)),
    max_leaves=8)


@hypothesis.settings(max_examples=400, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(VALUES)
def test_container_layout_matches_jax_pretty_printer(value):
  assert _print.Printer({}, None, None).format(value) == expected_value(value)


# ---- id_print in compiled code ----------------------------------------------

def power3(x, stream):
  y = x * x
  hcb.id_print((x, y), what="x,x^2", output_stream=stream)
  return y * x


def test_old_docs_example_under_jit_jvp_and_grad():
  s = io.StringIO()
  jax.jit(lambda x: power3(x, s))(3.0)
  jax.jvp(lambda x: power3(x, s), (3.0,), (0.1,))
  jax.grad(lambda x: power3(x, s))(3.0)
  hcb.barrier_wait()
  assert s.getvalue() == "what: x,x^2\n( 3. 9. )\n" * 3


def test_old_docs_example_tangents_with_custom_jvp():
  s = io.StringIO()

  @jax.custom_jvp
  def print_tangents(arg):
    return None

  @print_tangents.defjvp
  def print_tangents_jvp(primals, tangents):
    arg_dot, = tangents
    hcb.id_print(arg_dot, what="tangents", output_stream=s)
    return primals, tangents

  def power3_with_tangents(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=s)
    print_tangents((x, y))
    return y * x

  jax.jvp(power3_with_tangents, (3.0,), (0.1,))
  hcb.barrier_wait()
  assert s.getvalue() == ("what: x,x^2\n( 3. 9. )\n"
                          "what: tangents\n( 0.1 0.6 )\n")


def test_old_docs_example_cotangents_with_custom_vjp():
  s = io.StringIO()

  @jax.custom_vjp
  def print_cotangents(arg):
    return arg

  def fwd(arg):
    return print_cotangents(arg), None

  def bwd(residual, ct_b):
    hcb.id_print(ct_b, what="cotangents", output_stream=s)
    return ct_b,

  print_cotangents.defvjp(fwd, bwd)

  def power3_with_cotangents(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=s)
    x1, y1 = print_cotangents((x, y))
    return y1 * x1

  jax.grad(power3_with_cotangents)(3.0)
  hcb.barrier_wait()
  assert s.getvalue() == ("what: x,x^2\n( 3. 9. )\n"
                          "what: cotangents\n( 9. 3. )\n")


def test_old_docs_example_checkpoint_prints_in_the_old_order():
  s = io.StringIO()
  f = lambda x: power3(x, s)
  jax.grad(lambda x: f(jax.checkpoint(f)(x)))(3.0)
  hcb.barrier_wait()
  assert s.getvalue() == ("what: x,x^2\n( 3. 9. )\n"
                          "what: x,x^2\n( 27. 729. )\n"
                          "what: x,x^2\n( 3. 9. )\n")


def test_jit_with_kwargs_and_result():
  s = io.StringIO()
  f = jax.jit(lambda x: hcb.id_print(x * 2, result=x + 1, output_stream=s,
                                     b=2, a="first"))
  out = f(jnp.arange(3.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
  assert s.getvalue() == "a: first b: 2\n[0. 2. 4.]\n"


def test_scan_prints_every_step_in_order():
  s = io.StringIO()

  def step(c, x):
    hcb.id_print({"c": c, "x": x}, output_stream=s, step="s")
    return c + x, None

  jax.jit(lambda xs: jax.lax.scan(step, 0, xs))(jnp.arange(1, 4))
  hcb.barrier_wait()
  assert s.getvalue() == "".join(
      expected_tap({"c": np.array(c), "x": np.array(x)}, step="s")
      for c, x in [(0, 1), (1, 2), (3, 3)])


def test_cond_prints_only_the_branch_taken():
  s = io.StringIO()
  f = jax.jit(lambda p, x: jax.lax.cond(
      p, lambda x: hcb.id_print(x, output_stream=s, branch="yes"),
      lambda x: hcb.id_print(-x, output_stream=s, branch="no"), x))
  f(True, jnp.float32(1.5))
  f(False, jnp.float32(1.5))
  hcb.barrier_wait()
  assert s.getvalue() == "branch: yes\n1.5\nbranch: no\n-1.5\n"


def test_vmap_prints_the_batch_with_transforms():
  s = io.StringIO()
  jax.vmap(lambda x: hcb.id_print(x, output_stream=s, what="v"))(
      jnp.arange(6).reshape(2, 3))
  hcb.barrier_wait()
  assert s.getvalue() == ("transforms: [('batch', {'batch_dims': (0,)})] "
                          "what: v\n[[0 1 2]\n [3 4 5]]\n")


def test_large_arrays_are_summarised_and_threshold_applies():
  s = io.StringIO()
  x = jnp.arange(3000.0).reshape(30, 100)
  jax.jit(lambda x: hcb.id_print(x, output_stream=s))(x)
  jax.jit(lambda x: hcb.id_print(x[0, :20], output_stream=s, threshold=5))(x)
  hcb.barrier_wait()
  assert s.getvalue() == (np.array2string(np.asarray(x)) + "\n" +
                          np.array2string(np.arange(20.0), threshold=5) + "\n")


def test_long_containers_break_like_the_old_module():
  s = io.StringIO()
  value = {"weights": jnp.linspace(0, 1, 12), "bias": (jnp.ones(3), [1, 2])}
  jax.jit(lambda v: hcb.id_print(v, output_stream=s))(value)
  hcb.barrier_wait()
  host = jax.tree_util.tree_map(np.asarray, value)
  assert s.getvalue() == expected_tap(host)
  assert "\n  bias=" not in s.getvalue() and "\n  weights=" in s.getvalue()


def test_every_dtype_prints_like_numpy():
  s = io.StringIO()
  values = [np.array([1, -2, 3], np.int8), np.array([7, 8], np.uint16),
            np.array([True, False]), np.array([0.5, np.nan], np.float16),
            np.array([1.5, -np.inf], BF16), np.array([0.1, 1e-7], np.float32),
            np.array([1 + 1j, -2.5j], np.complex64)]
  jax.jit(lambda *v: hcb.id_print(v, output_stream=s))(*values)
  hcb.barrier_wait()
  assert s.getvalue() == expected_tap(tuple(values))


def test_prints_to_sys_stdout_by_default(capsys):
  jax.jit(lambda x: hcb.id_print(x, what="out"))(jnp.arange(3))
  hcb.barrier_wait()
  assert capsys.readouterr().out == "what: out\n[0 1 2]\n"


def test_tap_with_device_names_each_device_once_per_record():
  s = io.StringIO()
  devices = jax.devices()
  f = jax.pmap(lambda x: hcb.id_print(x * 2, output_stream=s, what="p",
                                      tap_with_device=True))
  f(jnp.arange(len(devices) * 2.0).reshape(len(devices), 2))
  hcb.barrier_wait()
  lines = s.getvalue().splitlines()
  records = sorted(zip(lines[0::2], lines[1::2]))
  assert records == sorted(
      (f"device: {d} what: p", np.array2string(np.array([4.0 * i, 4.0 * i + 2])))
      for i, d in enumerate(devices))


class SlowStream:
  """A stream whose write yields the GIL, to invite interleaving."""

  def __init__(self) -> None:
    self.chunks: list[str] = []
    self.lock = threading.Lock()

  def write(self, text: str) -> None:
    time.sleep(0.0005)
    with self.lock:
      self.chunks.append(text)


def test_records_of_several_devices_never_interleave():
  s = SlowStream()
  n = len(jax.devices())
  f = jax.pmap(lambda x: jax.lax.fori_loop(
      0, 20, lambda i, c: hcb.id_print(c + i, output_stream=s,
                                       tap_with_device=True), x))
  f(jnp.zeros((n, 3))).block_until_ready()  # see the test above
  hcb.barrier_wait()
  assert len(s.chunks) == 2 * 20 * n
  for kv, value in zip(s.chunks[0::2], s.chunks[1::2]):
    assert kv.startswith("device: ") and value.startswith("["), (kv, value)


def test_failing_stream_is_reported_and_printing_goes_on():
  class Broken:
    def write(self, text: str) -> None:
      raise OSError("disk full")

  jax.jit(lambda x: hcb.id_print(x, output_stream=Broken()))(jnp.ones(2))
  with pytest.raises(hcb.CallbackException, match="disk full"):
    hcb.barrier_wait()
  s = io.StringIO()
  jax.jit(lambda x: hcb.id_print(x, output_stream=s))(jnp.ones(2))
  hcb.barrier_wait()
  assert s.getvalue() == "[1. 1.]\n"


def test_long_kwargs_lines_are_written_whole():
  s = io.StringIO()
  long = "y" * 5000
  jax.jit(lambda x: hcb.id_print(x, output_stream=s, tap_with_device=True,
                                 a=long, z=long))(jnp.int32(3))
  hcb.barrier_wait()
  dev = jax.devices()[0]
  assert s.getvalue() == f"a: {long} device: {dev} z: {long}\n3\n"


@pytest.mark.parametrize("path", ["c", "python"])
def test_any_text_goes_through_whole(path):
  # A NUL byte used to end the text there (a: x, then nothing); non-ASCII
  # text and a lone surrogate (os.fsdecode's) come back as they went in,
  # in the keyword line, in dict keys (compared with JAX's pretty printer,
  # which takes no lone surrogate) and around the device's name.  The
  # Python path (a logging stream) formats with the same C printer.
  s = io.StringIO()
  value = {"k\x00\u00e9": np.arange(3.0), "z\u00e9": (np.int32(1), np.int32(2))}
  stream: Any = s
  if path == "python":
    stream = logging.getLogger("test_any_text_goes_through_whole")
    stream.propagate = False
    stream.setLevel(logging.INFO)
    handler = logging.StreamHandler(s)
    stream.addHandler(handler)
  try:
    jax.jit(lambda v: hcb.id_print(v, a="x\x00y", b="zz", c="\u00e9\udcff",
                                   output_stream=stream,
                                   tap_with_device=True))(value)
    hcb.barrier_wait()
  finally:
    if path == "python":
      stream.removeHandler(handler)
  dev = jax.devices()[0]
  assert s.getvalue() == (f"a: x\x00y b: zz c: \u00e9\udcff device: {dev}\n"
                          f"{expected_value(value)}\n")
  assert "k\x00\u00e9=[0. 1. 2.]" in s.getvalue()


def nested(value: Any, depth: int) -> Any:
  for _ in range(depth):
    value = [value]
  return value


@pytest.mark.parametrize("jit", [False, True])
def test_deep_containers_print_as_deep_as_id_tap_takes_them(collect, jit):
  # JAX flattens a pytree one level deeper per nesting, up to Python's
  # recursion limit.  id_tap took a container nested 500 deep while
  # id_print raised RecursionError when traced (and its C printer refused
  # more than 256 levels); now id_print takes what id_tap takes.
  s = io.StringIO()

  def both(x):
    y = hcb.id_tap(collect, nested(x, 500))
    return hcb.id_print(y, output_stream=s)

  (jax.jit(both) if jit else both)(jnp.int32(7))
  hcb.barrier_wait()
  (value,) = collect.args
  assert int(jax.tree_util.tree_leaves(value)[0]) == 7
  assert jax.tree_util.tree_structure(value) == jax.tree_util.tree_structure(
      nested(0, 500))
  assert s.getvalue() == "[ " * 500 + "7" + " ]" * 500 + "\n"


def test_too_deep_containers_are_refused_alike_by_id_tap_and_id_print():
  # Past what JAX flattens, both raise the same RecursionError, naming
  # themselves and the limit (it used to be a SystemError from nanobind
  # for id_tap, and Python's bare RecursionError for id_print).  20,000
  # levels is past the limit of every Python we support: 3.11's
  # sys.getrecursionlimit(), 3.12's and 3.13's fixed caps for C code.
  deep = nested(jnp.int32(7), 20_000)
  errors = {}
  for name, api in (("id_tap", lambda v: hcb.id_tap(lambda a, t: None, v)),
                    ("id_print", lambda v: hcb.id_print(
                        v, output_stream=io.StringIO()))):
    with pytest.raises(RecursionError) as e:
      api(deep)
    errors[name] = str(e.value)
  assert errors["id_tap"].startswith("id_tap: the argument nests deeper than "
                                     "JAX can flatten a pytree")
  if sys.version_info < (3, 12):
    assert f"sys.getrecursionlimit() is {sys.getrecursionlimit()}" in (
        errors["id_tap"])
  else:
    assert "sys.setrecursionlimit does not raise" in errors["id_tap"]
  assert errors["id_print"] == errors["id_tap"].replace("id_tap", "id_print")


def test_kwargs_are_converted_to_text_once_when_traced():
  class Counted:
    calls = 0

    def __str__(self) -> str:
      Counted.calls += 1
      return "counted"

  s = io.StringIO()
  tag = Counted()
  f = jax.jit(lambda x: hcb.id_print(x, output_stream=s, tag=tag))
  for i in range(5):
    f(jnp.int32(i))
  hcb.barrier_wait()
  assert Counted.calls == 1
  assert s.getvalue() == "".join(f"tag: counted\n{i}\n" for i in range(5))


def test_numpy_print_options_are_taken_when_traced():
  s = io.StringIO()
  with np.printoptions(precision=3, sign="+"):
    f = jax.jit(lambda x: hcb.id_print(x, output_stream=s))
    f(jnp.array([1 / 3, 2.0]))
  f(jnp.array([1 / 3, 2.0]))
  hcb.barrier_wait()
  assert s.getvalue() == "[+0.333 +2.   ]\n" * 2


@dataclasses.dataclass
class Point:
  x: Any
  y: Any


jax.tree_util.register_dataclass(Point, data_fields=["x", "y"],
                                 meta_fields=[])


def test_values_the_c_printer_cannot_lay_out_use_numpy():
  s = io.StringIO()
  p = Point(jnp.arange(2), jnp.float32(1.5))
  f8 = jnp.array([0.5, 2.0], jnp.float8_e4m3fn)
  jax.jit(lambda p, f8: hcb.id_print((p, f8), output_stream=s))(p, f8)
  with np.printoptions(legacy="1.13"):
    jax.jit(lambda x: hcb.id_print(x, output_stream=s))(jnp.arange(3.0))
  hcb.barrier_wait()
  host_p = Point(np.arange(2, dtype=np.int32), np.array(1.5, np.float32))
  with np.printoptions(legacy="1.13"):
    legacy = np.array2string(np.arange(3.0))
  assert s.getvalue() == (expected_tap((host_p, np.asarray(f8))) +
                          legacy + "\n")


def test_dtype_the_c_printer_does_not_know_falls_back_to_numpy():
  # A plain tuple would get the C target; the float8 array makes the C
  # printer refuse it at registration, so the site is a Python tap, which
  # prints that array with numpy.
  s = io.StringIO()
  f8 = jnp.array([0.5, 2.0, -448.0], jnp.float8_e4m3fn)
  jax.jit(lambda x, y: hcb.id_print((x, y), output_stream=s, n=1))(
      jnp.arange(2.0), f8)
  hcb.barrier_wait()
  assert s.getvalue() == expected_tap((np.arange(2.0), np.asarray(f8)), n=1)


# The dtypes libhcb's printer does not print (hcb_print_supports): numpy's.
FLOAT8 = [name for name in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu")
          if hasattr(jnp, name)]


@pytest.mark.parametrize("name", FLOAT8)
def test_dtypes_the_c_printer_does_not_print_are_numpys_text(name):
  dtype = getattr(jnp, name)
  small = jnp.array([0.5, 1.0, 2.0], dtype)
  large = jnp.full((4, 400), 2.0, dtype)
  s = io.StringIO()
  f = jax.jit(lambda a, b, c: hcb.id_print({"a": a, "b": (b, c)},
                                           output_stream=s, d=name))
  f(small, jnp.arange(3.0), large)
  with np.printoptions(precision=3):
    jax.jit(lambda a: hcb.id_print(a, output_stream=s, threshold=5))(small)
  hcb.barrier_wait()
  with np.printoptions(precision=3):
    summarised = expected_tap(np.asarray(small), threshold=5)
  assert s.getvalue() == expected_tap(
      {"a": np.asarray(small), "b": (np.arange(3.0, dtype=np.float32),
                                     np.asarray(large))},
      d=name) + summarised


def test_the_c_printer_decides_the_path_at_registration(monkeypatch):
  """Lowering registers the site: a value with a float8 leaf becomes a
  Python tap then, before anything runs; one the C printer prints becomes
  its C target."""
  paths = []
  register = _print.Printer.register_tap_site

  def spy(printer: _print.Printer, site: Any) -> int:
    site_id = register(printer, site)
    paths.append(printer.path)
    return site_id

  monkeypatch.setattr(_print.Printer, "register_tap_site", spy)
  s = io.StringIO()
  f8 = jnp.array([0.5, 2.0], jnp.float8_e4m3fn)
  jax.jit(lambda x, y: hcb.id_print((x, y), output_stream=s, at="f8")).lower(
      jnp.arange(2.0), f8)
  jax.jit(lambda x, y: hcb.id_print((x, y), output_stream=s, at="f32")).lower(
      jnp.arange(2.0), jnp.arange(2.0))
  assert paths == ["python", "c"]
  assert s.getvalue() == ""


def test_printing_outside_jit():
  s = io.StringIO()
  hcb.id_print({"b": jnp.ones(2), "a": None}, output_stream=s, k=1)
  hcb.barrier_wait()
  assert s.getvalue() == "k: 1\n{ a=None b=[1. 1.] }\n"


def test_64_bit_dtypes_with_x64(tmp_path):
  from conftest import run_python
  done = run_python("""
      import io, jax, jax.numpy as jnp, numpy as np
      import host_callback as hcb
      s = io.StringIO()
      vals = (jnp.array([2**62, -1], jnp.int64), jnp.array([2**64 - 1], jnp.uint64),
              jnp.array([0.1, 1e300]), jnp.array([1 + 2j], jnp.complex128))
      jax.jit(lambda *v: hcb.id_print(v, output_stream=s))(*vals)
      hcb.barrier_wait()
      print(s.getvalue(), end="")
      """, env={"JAX_ENABLE_X64": "1"})
  assert done.returncode == 0, done.stderr
  want = expected_value(tuple(np.array(v) for v in (
      np.array([2**62, -1], np.int64), np.array([2**64 - 1], np.uint64),
      np.array([0.1, 1e300]), np.array([1 + 2j], np.complex128)))) + "\n"
  assert done.stdout == want


# ---- a broken output stream ---------------------------------------------------

class BrokenStream:
  """A stream whose reader has gone: every write raises."""

  def __init__(self) -> None:
    self.writes = 0

  def write(self, s: str) -> None:
    self.writes += 1
    raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("path", ["C printer", "Python printer"])
def test_a_broken_stream_is_reported_once_and_written_no_more(path, caplog):
  stream = BrokenStream()
  step = lambda c, x: (c, hcb.id_print(x, what="x", output_stream=stream))
  f = jax.jit(lambda xs: jax.lax.scan(step, 0, xs)[1])
  if path == "C printer":
    f(jnp.arange(50.))
  else:  # print options the C printer does not implement
    with np.printoptions(formatter={"float": lambda v: f"<{v}>"}):
      f(jnp.arange(50.))
  with pytest.raises(hcb.CallbackException, match="BrokenPipeError"):
    hcb.barrier_wait()
  assert stream.writes == 1
  errors = [r for r in caplog.records if r.levelname == "ERROR"]
  assert len(errors) == 1, [r.getMessage() for r in errors]
  assert "this id_print writes nothing more" in errors[0].getMessage()
  f(jnp.arange(50.))  # the same printer: still nothing, no new error
  hcb.barrier_wait()
  assert stream.writes == 1


def test_stdout_a_closed_pipe_logs_once(tmp_path):
  # The case: `python prog.py | true`, 100 taps.
  prog = tmp_path / "prog.py"
  prog.write_text(textwrap.dedent("""
      import sys, time, jax, jax.numpy as jnp
      from jax import lax
      import host_callback as hcb
      time.sleep(0.5)  # the reader has gone: stdout is a closed pipe
      f = jax.jit(lambda xs: lax.scan(
          lambda c, x: (c, hcb.id_print(x, what="x")), 0, xs)[1])
      f(jnp.arange(100))
      try:
        hcb.barrier_wait()
      except hcb.CallbackException:
        print("barrier_wait raised", file=sys.stderr)
  """))
  proc = subprocess.run(f"'{sys.executable}' '{prog}' | true", shell=True,
                        capture_output=True, text=True, timeout=120)
  assert proc.stderr.count("exception in tap function") == 1, proc.stderr
  assert "this id_print writes nothing more" in proc.stderr
  assert "barrier_wait raised" in proc.stderr
