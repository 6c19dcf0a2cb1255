"""debug.print formatted in C (issue 19): a format whose fields are plain
replacement fields over arrays (``{}``, ``{0}``, ``{name}``: no conversion,
no format spec, no attribute or index access) is registered as id_print's
C target and formatted without the GIL; its text is jax.debug.print's,
character for character.  Every other format goes through Python, and
``debug._print_paths`` counts which path each site took, so a simple format
that silently went through Python fails here."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import host_callback as hcb
from host_callback import debug as hdebug

from conftest import DTYPES, HAS_SKIP_FORMAT_CHECK, flush


def text_and_path(capsys, run, sort: bool = False, theirs: str | None = None
                  ) -> str:
  """Runs ``run(jax.debug)`` and ``run(host_callback.debug)``, checks that
  their texts are the same, and returns which path ours took ("c",
  "python", or "c+python" when one run registered sites of both).
  ``sort``: compare sorted lines (JAX runs the calls of a vmapped print in
  no fixed order).  ``theirs``: the text to expect instead of JAX's."""
  run(jax.debug)
  flush()
  jaxs = capsys.readouterr().out
  theirs = jaxs if theirs is None else theirs
  before = hdebug._print_paths.copy()
  run(hdebug)
  flush()
  ours = capsys.readouterr().out
  if sort:
    ours, theirs = (sorted(t.splitlines()) for t in (ours, theirs))
  assert ours == theirs
  assert theirs
  paths = hdebug._print_paths - before
  return "+".join(sorted(paths))


def _values():
  values = {}
  for dtype in DTYPES + [np.float64, np.int64, np.complex128]:
    name = np.dtype(dtype).name
    values[f"{name}[2,3]"] = (np.arange(6) % 4 - 1).reshape(2, 3).astype(
        dtype) if np.dtype(dtype).kind not in "bu" else (
            np.arange(6) % 4).reshape(2, 3).astype(dtype)
    values[f"{name}[]"] = np.array(3, dtype)
  values["float32 0.1"] = np.array(0.1, np.float32)
  values["float32 1e7"] = np.array(1e7, np.float32)
  values["float16 specials"] = np.array([np.nan, -np.inf, 1e-4, 1e3],
                                        np.float16)
  values["float32[2000]"] = np.linspace(0, 1, 2000, dtype=np.float32)
  values["int32[40,50]"] = np.arange(2000, dtype=np.int32).reshape(40, 50)
  values["float32[0]"] = np.zeros((0,), np.float32)
  values["complex64 nan"] = np.array(complex(1, np.nan), np.complex64)
  values["complex64 2j"] = np.array(2j, np.complex64)
  values["bfloat16 0.1"] = np.array(0.1, ml_dtypes.bfloat16)
  values["int4[3]"] = np.array([-8, 0, 7], ml_dtypes.int4)
  values["python int"] = 7
  values["python float"] = 0.1
  values["python bool"] = True
  return values


VALUES = _values()


@pytest.mark.parametrize("key", list(VALUES))
def test_plain_fields_of_each_value_are_formatted_in_c(capsys, key):
  value = VALUES[key]  # 64-bit ones become 32-bit (no x64), in both

  def run(mod):
    def f(x):
      mod.print(f"c-path {key}: x={{x}} {{0}} {{0}}", x, x=x)
      mod.print(f"c-path {key}, auto: {{}}", x)
      if HAS_SKIP_FORMAT_CHECK:
        mod.print(f"c-path {key}, no placeholders:", x, x,
                  skip_format_check=True)
    jax.jit(f)(value)

  expected = None
  if key.startswith("int4") and jax.__version_info__ < (0, 10):
    # JAX 0.8 and 0.9 print int4 values from bytes they unpacked wrong, not
    # the same on each run (7 as -7, -1, 1, 3 or 5); ours prints the
    # values, as numpy does and as JAX from 0.10 does.
    text = str(np.asarray(value))
    expected = (f"c-path {key}: x={text} {text} {text}\n"
                f"c-path {key}, auto: {text}\n")
    if HAS_SKIP_FORMAT_CHECK:
      expected += f"c-path {key}, no placeholders: {text} {text}\n"
  assert text_and_path(capsys, run, theirs=expected) == "c"


@pytest.mark.parametrize("fmt", [
    "c-path kw: {b} then {a}",
    "c-path positional: {1} {0} {1}",
    "c-path auto: {} {}",
    "c-path braces {a}: {{literal}} {{ {b} }}",
    "c-path unicode: α={a} — β={b} ✓",
    "c-path NUL: a\x00b {a} c\x00 {b}",
    "{a}{b}",
])
def test_keyword_positional_braces_and_unicode_in_c(capsys, fmt):
  def run(mod):
    @jax.jit
    def f(a, b):
      if "{1}" in fmt or "{}" in fmt:
        mod.print(fmt, a, b)
      else:
        mod.print(fmt, a=a, b=b)
    f(jnp.arange(3.0), jnp.int32(-4))

  assert text_and_path(capsys, run) == "c"


def test_print_options_of_the_trace_in_c(capsys):
  x = jnp.linspace(0, 1, 7)

  def run(mod):
    f = jax.jit(lambda v: mod.print("c-path options: {v} {s}", v=v, s=v[1]))
    with np.printoptions(precision=2, suppress=True, linewidth=20,
                         sign="+"):
      f.lower(x)  # traced here: the options are taken now
      f(x)
    f(x)  # the same compiled program

  assert text_and_path(capsys, run) == "c"


def test_print_in_a_scan_in_c(capsys):
  def run(mod):
    def body(c, i):
      mod.print("c-path scan: step {i} carry {c}", i=i, c=c)
      return c * 2, None
    jax.jit(lambda: lax.scan(body, jnp.float32(0.5), jnp.arange(5))[0])()

  assert text_and_path(capsys, run) == "c"


@pytest.mark.parametrize("fmt", [
    "py-path {x!r}", "py-path {x!s}", "py-path {x:.3f}", "py-path {x:>12}",
    "py-path {x.shape}", "py-path {y[1]}", "py-path {s} {x}",
])
def test_other_formats_go_through_python(capsys, fmt):
  def run(mod):
    @jax.jit
    def f(x, y):
      fields = {"x": x, "y": y, "s": "static"}
      if HAS_SKIP_FORMAT_CHECK:
        mod.print(fmt, **fields, skip_format_check=True)
      else:  # JAX 0.6: only the arguments the format uses
        mod.print(fmt, **{k: v for k, v in fields.items() if f"{{{k}" in fmt})
    f(jnp.float32(2.5), jnp.arange(3, dtype=jnp.int32))

  assert text_and_path(capsys, run) == "python"


def test_containers_float8_legacy_and_vmap_go_through_python(capsys):
  def run_tree(mod):
    jax.jit(lambda t: mod.print("py-path tree {t}", t=t))(
        (jnp.ones(2), jnp.int32(3)))

  def run_f8(mod):
    jax.jit(lambda x: mod.print("py-path f8 {x}", x=x))(
        jnp.array([0.5, 2.0], jnp.float8_e4m3fn))

  def run_legacy(mod):
    f = jax.jit(lambda x: mod.print("py-path legacy {x}", x=x))
    with np.printoptions(legacy="1.13"):
      f(jnp.arange(3.0))

  def run_vmap(mod):
    jax.jit(jax.vmap(lambda x: mod.print("py-path vmap {x}", x=x)))(
        jnp.arange(3.0))

  for run in (run_tree, run_f8, run_legacy, run_vmap):
    assert text_and_path(capsys, run, sort=True) == "python"


def test_fields_in_another_order_under_vmap_go_through_python(capsys):
  # The tap gets its leaves in field order; under vmap the Python path
  # takes them (and their batch dims) back to argument order.
  def run(mod):
    @jax.jit
    @partial(jax.vmap, in_axes=(0, None))
    def f(x, y):
      mod.print("py-path vmap order: {1} {0} {1} {z}", x, y, z=x * 2)
    f(jnp.arange(6.0).reshape(3, 2), jnp.int32(7))

  assert text_and_path(capsys, run, sort=True) == "python"
