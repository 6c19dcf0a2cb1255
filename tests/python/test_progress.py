"""host_callback.progress: jax-tqdm 0.4's API on our taps, with real JAX and
real tqdm.  Bars write into an io.StringIO passed through as tqdm's
``file=``; most tests fix tqdm's ``bar_format`` so that the text has no
timings and can be compared exactly.  jax-tqdm 0.4.0 runs the same programs
where it can, for comparison."""

from __future__ import annotations

import io
import re
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tqdm
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import host_callback as hcb
from host_callback import progress
from host_callback.progress import PBar
from host_callback.progress import loop_tqdm
from host_callback.progress import scan_tqdm

from conftest import run_python

# Every redraw shown: tqdm's throttling off (passed through).
EVERY = {"mininterval": 0, "miniters": 1}
FMT = "{desc}|{n}/{total}"
STATE = re.compile(r"([^\r\n\x1b|]*)\|(\d+)/(\d+|None)")


def states(text: str) -> list[tuple[str, int, str]]:
  """Every bar state drawn with ``FMT``: (desc, n, total)."""
  return [(m[1], int(m[2]), m[3]) for m in STATE.finditer(text)]


def open_bars(sink: io.StringIO) -> list[Any]:
  """tqdm's open bars that draw into ``sink``."""
  return [b for b in list(tqdm.std.tqdm._instances) if b.fp is not None and
          getattr(b.fp, "file", b.fp) is sink]


# ---- jax-tqdm's README, only the import changed -----------------------------

README_SCAN = """
from {module} import scan_tqdm
from jax import lax
import jax.numpy as jnp

n = 10_000

@scan_tqdm(n)
def step(carry, x):
    return carry + 1, carry + 1

last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
"""

README_SCAN_TUPLE = """
from {module} import scan_tqdm
from jax import lax
import jax.numpy as jnp

n = 10
scan_data = jnp.zeros((n, 200, 100))

@scan_tqdm(n)
def step(carry, x):
    _, d = x
    return carry + 1, d

last_number, output_data = lax.scan(step, 0, (jnp.arange(n), scan_data))
"""

README_LOOP = """
from {module} import loop_tqdm
from jax import lax

n = 10_000

@loop_tqdm(n)
def step(i, val):
    return val + 1

last_number = lax.fori_loop(0, n, step, 0)
"""

README_VMAP = """
from {module} import PBar, scan_tqdm
import jax

n = 10_000

@scan_tqdm(n)
def step(carry, _):
    return carry + 1, carry + 1

def map_func(i):
    # Wrap the initial value and pass the
    # progress bar index
    init = PBar(id=i, carry=0)
    final_value, _all_numbers = jax.lax.scan(
        step, init, jax.numpy.arange(n)
    )
    return (
        final_value.carry,
        _all_numbers,
    )

last_numbers, all_numbers = jax.vmap(map_func)(jax.numpy.arange(10))
"""

README_PRINT_RATE = """
from {module} import scan_tqdm
from jax import lax
import jax.numpy as jnp

n = 10_000

@scan_tqdm(n, print_rate=2)
def step(carry, x):
    return carry + 1, carry + 1

last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
"""

README_TQDM_TYPE = """
from {module} import scan_tqdm
from jax import lax
import jax.numpy as jnp

n = 10_000

@scan_tqdm(n, print_rate=1, tqdm_type='std') # tqdm_type='std' or 'notebook' or 'auto'
def step(carry, x):
    return carry + 1, carry + 1

last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
"""

README_OPTIONS = """
from {module} import scan_tqdm
from jax import lax
import jax.numpy as jnp

n = 10_000

@scan_tqdm(n, print_rate=1, desc='progress bar', position=0, leave=False)
def step(carry, x):
    return carry + 1, carry + 1

last_number, all_numbers = lax.scan(step, 0, jnp.arange(n))
"""

# What a README example prints once it is done: the result, after the bars.
PRINT_RESULT = """
import numpy as np
print(np.asarray({name}).ravel()[:3].tolist())
"""

# Each example: its code, the name of its result, whether its bars stay
# (leave) and how many bars it opens.
README = {
    "scan": (README_SCAN, "last_number", True, 1),
    "scan_tuple": (README_SCAN_TUPLE, "last_number", True, 1),
    "fori_loop": (README_LOOP, "last_number", True, 1),
    "vmap": (README_VMAP, "last_numbers", True, 10),
    "print_rate": (README_PRINT_RATE, "last_number", True, 1),
    "tqdm_type": (README_TQDM_TYPE, "last_number", True, 1),
    "options": (README_OPTIONS, "last_number", False, 1),
}

# A bar's state as tqdm's default format draws it (timings left out).
DEFAULT_STATE = re.compile(r"([^\r\n\x1b]*?): +(\d+)%\|[^|]*\| (\d+)/(\d+) \[")
# What tqdm writes to a terminal: carriage return, new line, cursor up, text.
TERMINAL = re.compile(r"\r|\n|\x1b\[A|[^\r\n\x1b]+")


def final_states(stderr: str) -> list[tuple[str, int, int]]:
  """The complete bars (n == total) a program drew, in drawing order."""
  return [(m[1], int(m[3]), int(m[4])) for m in DEFAULT_STATE.finditer(stderr)
          if m[3] == m[4]]


def screen(stderr: str) -> list[str]:
  """The lines a terminal shows once it has drawn ``stderr``."""
  lines: list[list[str]] = [[]]
  row = col = 0
  for token in TERMINAL.findall(stderr):
    if token == "\r":
      col = 0
    elif token == "\n":
      row, col = row + 1, 0
      if row == len(lines):
        lines.append([])
    elif token == "\x1b[A":
      row = max(row - 1, 0)
    else:  # text overwrites what the line showed from the cursor on
      line = lines[row]
      line.extend(" " * (col + len(token) - len(line)))
      line[col:col + len(token)] = token
      col += len(token)
  return ["".join(line) for line in lines]


def run_readme(code: str, module: str, result: str) -> tuple[str, str]:
  done = run_python(textwrap.dedent(code.format(module=module)) +
                    PRINT_RESULT.format(name=result))
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout, done.stderr


@pytest.mark.parametrize("example", sorted(README))
def test_readme_example_with_only_the_import_changed(example):
  """Each example of jax-tqdm 0.4.0's README, as a program of its own
  (bars on stderr, no barrier: the bars are complete at exit), draws the
  bars jax-tqdm draws and computes the same values."""
  pytest.importorskip("jax_tqdm")
  code, result, leave, bars = README[example]
  ours_out, ours_err = run_readme(code, "host_callback.progress", result)
  theirs_out, theirs_err = run_readme(code, "jax_tqdm", result)
  assert ours_out == theirs_out
  ours, theirs = final_states(ours_err), final_states(theirs_err)
  if leave:
    # The same bars end complete.  How often tqdm redraws a complete bar
    # depends on timing (it redraws on the last update when its mininterval
    # has passed, and again on close), so the draws are not counted, only
    # that every bar was drawn complete.
    assert set(ours) == set(theirs), (ours_err, theirs_err)
    assert len(ours) >= bars and len(theirs) >= bars, (ours_err, theirs_err)
    # Ours draws the final count once, on close, so the terminal ends with
    # each bar complete, once.
    assert len(final_states("\n".join(screen(ours_err)))) == bars, ours_err
  else:  # leave=False: the bar is cleared when it closes
    for err in (ours_err, theirs_err):
      drawn = [line for line in re.split(r"[\r\n]", err) if line]
      assert drawn[-1].strip() == "", err
      assert "progress bar" in err
  assert "Traceback" not in ours_err


def test_migrating_is_one_import():
  """Every name of jax-tqdm 0.4.0 is here, with the same signature."""
  jax_tqdm = pytest.importorskip("jax_tqdm")
  import inspect
  for name in ("PBar", "loop_tqdm", "scan_tqdm"):
    assert hasattr(progress, name)
  for name in ("loop_tqdm", "scan_tqdm"):
    ours = inspect.signature(getattr(progress, name)).parameters
    theirs = inspect.signature(getattr(jax_tqdm, name)).parameters
    assert list(ours) == list(theirs)
    for p in ours:
      assert ours[p].default == theirs[p].default, p
  assert hcb.progress is progress


# ---- scan_tqdm and loop_tqdm -------------------------------------------------

def test_scan_under_jit_counts_every_step_and_keeps_the_values():
  sink = io.StringIO()

  def body(carry, x):
    return carry + x, carry * 2

  bar = scan_tqdm(10, file=sink, bar_format=FMT, **EVERY)(body)
  got = jax.jit(lambda: lax.scan(bar, 1, jnp.arange(10)))()
  want = lax.scan(body, 1, jnp.arange(10))
  hcb.barrier_wait()
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  desc = "Running for 10 iterations"
  assert states(sink.getvalue()) == [(desc, n, "10") for n in range(11)]
  assert sink.getvalue().endswith("\n")  # left (leave=True) and closed
  assert not open_bars(sink)


def test_scan_over_a_tuple_uses_its_first_element_as_the_step():
  sink = io.StringIO()

  @scan_tqdm(5, file=sink, bar_format=FMT, **EVERY)
  def body(carry, x):
    i, d = x
    return carry + d, i

  (total, steps) = jax.jit(lambda d: lax.scan(body, 0.0, (jnp.arange(5), d)))(
      jnp.ones(5))
  hcb.barrier_wait()
  assert float(total) == 5.0
  np.testing.assert_array_equal(steps, np.arange(5))
  assert [s[1] for s in states(sink.getvalue())] == [0, 1, 2, 3, 4, 5]


def test_fori_loop_under_jit():
  sink = io.StringIO()

  @loop_tqdm(7, file=sink, bar_format=FMT, **EVERY)
  def body(i, val):
    return val + i

  assert int(jax.jit(lambda: lax.fori_loop(0, 7, body, 0))()) == 21
  hcb.barrier_wait()
  assert [s[1] for s in states(sink.getvalue())] == list(range(8))


@pytest.mark.parametrize("lower,print_rate,want", [
    (3, None, list(range(8))),  # 7 steps, one tap each
    (4, 2, [0, 2, 4, 6]),       # taps after the steps that end at 6, 8, 10
])
def test_fori_loop_from_a_lower_bound_counts_steps(lower, print_rate, want):
  # fori_loop(3, 10) used to show 10/10 after 7 steps (the index, not the
  # steps).  jax-tqdm 0.4.0 fails there (its bar appears at index 0, which
  # such a loop never has); where both work (from 0) they agree.
  sink = io.StringIO()

  @loop_tqdm(10, print_rate=print_rate, file=sink, bar_format=FMT, **EVERY)
  def body(i, val):
    return val + i

  out = jax.jit(lambda: lax.fori_loop(lower, 10, body, 0))()
  hcb.barrier_wait()
  assert int(out) == sum(range(lower, 10))
  desc = "Running for 10 iterations"
  assert states(sink.getvalue()) == [(desc, n, "10") for n in want]
  assert sink.getvalue().endswith("\n")  # closed at the loop's last index
  assert not open_bars(sink)


@pytest.mark.parametrize("barrier", ["barrier_wait", "effects_barrier"])
def test_a_scan_shorter_than_its_bar_is_closed_by_a_barrier(barrier):
  # scan_tqdm(10) over 5 steps: the bar never reaches 10, and used to stay
  # open (drawn at 0/10) after the barrier.  A barrier closes it, showing
  # the 5 steps done; so does the next run of the loop, which draws a bar
  # of its own.
  sink = io.StringIO()

  @scan_tqdm(10, file=sink, bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  f = jax.jit(lambda: lax.scan(body, 0, jnp.arange(5))[0])
  f()
  f()
  if barrier == "barrier_wait":
    hcb.barrier_wait()
  else:
    jax.effects_barrier()
  desc = "Running for 10 iterations"
  finals = [st for st in states(sink.getvalue()) if st[1] > 0]
  assert finals[-1] == (desc, 5, "10"), sink.getvalue()
  assert sink.getvalue().count("\n") == 2  # two bars, each left and closed
  assert sink.getvalue().endswith("\n")
  assert not open_bars(sink)


def test_print_rate_sets_which_steps_update_the_bar():
  sink = io.StringIO()

  @scan_tqdm(10, print_rate=3, file=sink, bar_format=FMT, **EVERY)
  def body(carry, _):
    return carry + 1, None

  jax.jit(lambda: lax.scan(body, 0, jnp.arange(10)))()
  hcb.barrier_wait()
  # Before steps 0, 3, 6, 9, and the closing count after the last one.
  assert [s[1] for s in states(sink.getvalue())] == [0, 3, 6, 9, 10]


def test_host_throttles_redrawing_by_default():
  """Every step taps (a 1,000-step loop), but tqdm's own throttling
  (mininterval 0.1 s) leaves only a few redraws."""
  sink = io.StringIO()

  @scan_tqdm(1_000, file=sink, bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  jax.jit(lambda: lax.scan(body, 0, jnp.arange(1_000)))()
  hcb.barrier_wait()
  drawn = states(sink.getvalue())
  assert drawn[0][1] == 0 and drawn[-1][1] == 1_000
  assert len(drawn) < 100


def test_tqdm_keyword_arguments_pass_through():
  sink = io.StringIO()

  @scan_tqdm(4, file=sink, desc="training", leave=False, ncols=50,
             bar_format="{desc}:{n}/{total}{postfix}", postfix="p", **EVERY)
  def body(carry, _):
    return carry + 1, None

  jax.jit(lambda: lax.scan(body, 0, jnp.arange(4)))()
  hcb.barrier_wait()
  text = sink.getvalue()
  assert "training:0/4, p" in text and "training:3/4, p" in text
  # leave=False: cleared at the end, no line kept.
  assert not text.endswith("\n")
  assert not open_bars(sink)


def test_message_is_an_alias_of_desc_and_position_offsets_bars():
  sink = io.StringIO()

  @scan_tqdm(3, file=sink, message="msg", position=2, bar_format=FMT, **EVERY)
  def body(carry, _):
    return carry + 1, None

  jax.jit(lambda: lax.scan(body, 0, jnp.arange(3)))()
  hcb.barrier_wait()
  text = sink.getvalue()
  assert {s[0] for s in states(text)} == {"msg"}
  assert "\n\n" in text  # drawn two lines down


def test_settings_are_checked_as_jax_tqdm_checks_them():
  with pytest.raises(ValueError, match="tqdm_type"):
    scan_tqdm(10, tqdm_type="rich")
  with pytest.raises(ValueError, match="Print rate should be > 0"):
    scan_tqdm(10, print_rate=0)
  with pytest.raises(ValueError, match="less than the number of steps"):
    loop_tqdm(10, print_rate=11)


@pytest.mark.parametrize("tqdm_type", ["std", "auto"])
def test_tqdm_type_selects_the_bar_class(tqdm_type):
  sink = io.StringIO()

  @scan_tqdm(3, tqdm_type=tqdm_type, file=sink, bar_format=FMT, **EVERY)
  def body(carry, _):
    return carry + 1, None

  lax.scan(body, 0, jnp.arange(3))
  hcb.barrier_wait()
  assert states(sink.getvalue())[-1][1:] == (3, "3")


@pytest.mark.parametrize("print_rate", [1, 2])
def test_a_bar_in_a_differentiated_scan(print_rate):
  """Under grad the bar counts the steps of the forward pass and closes."""
  sink = io.StringIO()

  @scan_tqdm(6, print_rate=print_rate, file=sink, bar_format=FMT, **EVERY)
  def body(carry, _):
    return carry * 1.5, None

  loss = lambda x: lax.scan(body, x, jnp.arange(6))[0]
  np.testing.assert_allclose(jax.jit(jax.grad(loss))(1.0), 1.5 ** 6,
                             rtol=1e-6)
  hcb.barrier_wait()
  assert [s[1] for s in states(sink.getvalue())] == list(
      range(0, 7, print_rate))
  assert not open_bars(sink)


# ---- one bar per id, per device ------------------------------------------------

def test_vmap_of_pbar_draws_one_bar_per_id():
  sink = io.StringIO()

  @scan_tqdm(6, file=sink, bar_format=FMT, **EVERY)
  def body(carry, _):
    return carry + 1, carry

  def run(i):
    final, ys = lax.scan(body, PBar(id=i, carry=i * 10), jnp.arange(6))
    return final.carry, ys

  last, ys = jax.jit(jax.vmap(run))(jnp.arange(3))
  hcb.barrier_wait()
  np.testing.assert_array_equal(last, [6, 16, 26])
  np.testing.assert_array_equal(ys[:, 0], [0, 10, 20])
  drawn = states(sink.getvalue())
  # Each of the three bars is drawn at every count, once.
  assert sorted(s[1] for s in drawn) == sorted(list(range(7)) * 3)
  # Drawn at positions 0, 1 and 2: the deepest is two lines down.
  assert "\n\n" in sink.getvalue() and "\n\n\n" not in sink.getvalue()


def test_nested_vmap_of_pbar_ids():
  sink = io.StringIO()

  @loop_tqdm(4, file=sink, bar_format=FMT, **EVERY)
  def body(i, val):
    return val + 1

  def run(bar_id):
    return lax.fori_loop(0, 4, body, PBar(id=bar_id, carry=0)).carry

  out = jax.vmap(jax.vmap(run))(jnp.arange(6).reshape(2, 3))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.full((2, 3), 4))
  finals = [s for s in states(sink.getvalue()) if s[1] == 4]
  assert len(finals) == 6


def test_vmap_comparison_with_jax_tqdm():
  """The same number of complete bars as jax-tqdm draws under vmap."""
  jax_tqdm = pytest.importorskip("jax_tqdm")
  drawn = []
  for module in (progress, jax_tqdm):
    sink = io.StringIO()

    @module.scan_tqdm(20, file=sink, bar_format=FMT)
    def body(carry, _):
      return carry + 1, None

    def run(i):
      return lax.scan(body, module.PBar(id=i, carry=0), jnp.arange(20))[0].carry

    np.testing.assert_array_equal(jax.vmap(run)(jnp.arange(4)), [20] * 4)
    jax.effects_barrier()
    drawn.append(sorted(s for s in states(sink.getvalue()) if s[1] == 20))
  assert drawn[0] == drawn[1] and len(drawn[0]) == 4


def _device_bars(text: str, desc: str, n: int) -> list[str]:
  """The descriptions of the complete bars of ``desc``."""
  return [s[0] for s in states(text) if s[0].startswith(desc) and s[1] == n]


def test_shard_map_draws_one_bar_per_device():
  devices = jax.devices()
  assert len(devices) >= 2, "conftest sets several CPU devices"
  sink = io.StringIO()
  n = 2_000

  @scan_tqdm(n, file=sink, desc="dev", bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  def per_device(x):
    return lax.scan(body, x, jnp.arange(n))[0]

  mesh = Mesh(np.array(devices), ("d",))
  f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")))
  out = f(jnp.zeros(len(devices), jnp.int32))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [n] * len(devices))
  finals = _device_bars(sink.getvalue(), "dev", n)
  assert sorted(finals) == sorted(f"dev ({d})" for d in devices)
  assert not open_bars(sink)


@pytest.mark.parametrize("how", [
    "pmap", "jit of pmap",
    pytest.param("pmap of pmap", marks=pytest.mark.skipif(
        jax.__version_info__ >= (0, 8),
        reason="JAX 0.8 on (pmap through shard_map) nests no pmaps"))])
def test_pmap_draws_one_bar_per_device(how):
  devices = jax.devices()
  sink = io.StringIO()
  n = 2_000

  @loop_tqdm(n, file=sink, desc="pm", bar_format=FMT)
  def body(i, v):
    return v + 1.0

  loop = jax.pmap(lambda x: lax.fori_loop(0, n, body, x))
  x = jnp.zeros(len(devices))
  if how == "jit of pmap":
    out = jax.jit(loop)(x)
  elif how == "pmap of pmap":  # the outer map of one device
    out = jax.pmap(loop)(x[None])[0]
  else:
    out = loop(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [n] * len(devices))
  assert sorted(_device_bars(sink.getvalue(), "pm", n)) == sorted(
      f"pm ({d})" for d in devices)


@pytest.mark.parametrize("how", ["pmap", "shard_map"])
def test_short_loops_on_several_devices_always_name_their_device(how):
  # With bars of 3 steps, a device's bar could close before another
  # device's opened: it then kept the plain description (2 of 6 loops under
  # pmap, even after barrier_wait).  Whether the loop runs on several
  # devices is known when it is traced.
  devices = jax.devices()
  sink = io.StringIO()

  @scan_tqdm(3, file=sink, desc="short", bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  def loop(x):
    return lax.scan(body, x, jnp.arange(3))[0]

  if how == "pmap":
    f = jax.pmap(loop)
  else:
    f = jax.jit(jax.shard_map(loop, mesh=Mesh(np.array(devices), ("d",)),
                              in_specs=P("d"), out_specs=P("d")))
  for _ in range(6):
    f(jnp.zeros(len(devices), jnp.int32))
  hcb.barrier_wait()
  finals = _device_bars(sink.getvalue(), "short", 3)
  assert sorted(finals) == sorted([f"short ({d})" for d in devices] * 6)
  assert not open_bars(sink)


def test_a_loop_on_one_device_of_several_does_not_name_it():
  sink = io.StringIO()

  @scan_tqdm(3, file=sink, desc="one", bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  jax.jit(lambda: lax.scan(body, 0, jnp.arange(3))[0])()
  hcb.barrier_wait()
  assert _device_bars(sink.getvalue(), "one", 3) == ["one"]


# ---- while_loop ----------------------------------------------------------------

def test_while_loop_with_an_unknown_total():
  sink = io.StringIO()
  out = jax.jit(lambda x: progress.while_loop(
      lambda v: v < 100, lambda v: v + 7, x, file=sink, desc="solve",
      bar_format=FMT, **EVERY))(jnp.int32(0))
  hcb.barrier_wait()
  assert int(out) == 105
  drawn = states(sink.getvalue())
  assert drawn[0] == ("solve", 0, "None")
  assert drawn[-1] == ("solve", 15, "None")
  assert not open_bars(sink)


def test_while_loop_with_an_estimated_total_closes_at_the_end():
  sink = io.StringIO()
  progress.while_loop(lambda v: v < 5, lambda v: v + 1, 0, total=10,
                      file=sink, bar_format=FMT, **EVERY)
  hcb.barrier_wait()
  assert states(sink.getvalue())[-1] == ("Running", 5, "10")
  assert not open_bars(sink)


def test_while_loop_under_vmap_draws_one_bar_per_id():
  sink = io.StringIO()

  def run(i, limit):
    return progress.while_loop(lambda v: v < limit, lambda v: v + 1,
                               PBar(id=i, carry=0), file=sink,
                               bar_format=FMT).carry

  out = jax.jit(jax.vmap(run))(jnp.arange(3), jnp.array([3, 5, 8]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [3, 5, 8])
  finals = sorted(s[1] for s in states(sink.getvalue()) if s[0] == "Running")
  for count in (3, 5, 8):
    assert count in finals
  assert not open_bars(sink)


# ---- bars are complete and closed after a barrier -------------------------------

@pytest.mark.parametrize("barrier", ["barrier_wait", "effects_barrier"])
def test_bars_are_closed_after_a_barrier(barrier):
  sink = io.StringIO()
  n = 50_000

  @scan_tqdm(n, print_rate=7, file=sink, bar_format=FMT)
  def body(carry, _):
    return carry + 1.0, None

  f = jax.jit(lambda: lax.scan(body, 0.0, jnp.arange(n))[0])
  f()  # not waited for
  if barrier == "barrier_wait":
    hcb.barrier_wait()
  else:
    jax.effects_barrier()
  assert states(sink.getvalue())[-1][1] == n
  assert sink.getvalue().endswith("\n")
  assert not open_bars(sink)


def test_a_loop_run_again_draws_a_new_bar():
  sink = io.StringIO()

  @scan_tqdm(5, file=sink, bar_format=FMT)
  def body(carry, _):
    return carry + 1, None

  f = jax.jit(lambda: lax.scan(body, 0, jnp.arange(5))[0])
  f()
  f()
  hcb.barrier_wait()
  assert [s for s in states(sink.getvalue()) if s[1] == 5] == [
      ("Running for 5 iterations", 5, "5")] * 2


# ---- tqdm is optional --------------------------------------------------------------

def test_a_clear_error_without_tqdm():
  done = run_python("""
      import sys
      sys.modules["tqdm"] = None  # as if tqdm were not installed
      import host_callback as hcb
      print("package ok")
      try:
        from host_callback.progress import scan_tqdm
      except ImportError as e:
        print("error:", e)
      try:
        hcb.progress
      except ImportError as e:
        print("attribute error:", e)
      """)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0] == "package ok"
  for line in lines[1:]:
    assert "needs tqdm" in line
    assert "pip install tqdm" in line
    assert "pip install '.[progress]'" in line
  assert len(lines) == 3


def test_the_package_does_not_import_tqdm():
  done = run_python("""
      import sys
      import host_callback
      print("tqdm" in sys.modules, "host_callback.progress" in sys.modules)
      """)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["False", "False"]
