"""host_callback.patch_jax, install_legacy_module, the start-up hook
(HOST_CALLBACK_PATCH, the .pth the wheel installs) and ``python -m
host_callback run``: code that calls JAX's callback APIs, or imports the
removed jax.experimental.host_callback, runs on host_callback with no edit.

How a test tells whose callback ran: under jit, JAX's pure_callback and
io_callback hand their function jax.Arrays, host_callback's numpy arrays
(docs/migrating.md); host_callback's debug callbacks are taps, which its
``stats()`` counts.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import types
import warnings

import jax
import jax.debug
import jax.experimental
import jax.experimental.buffer_callback as jax_buffer_callback
import jax.numpy as jnp
import numpy as np
import pytest

import _host_callback_startup as startup
import host_callback as hcb
from host_callback import debug as hcb_debug

# Other test files that share this process imported JAX's callbacks by
# name before these tests patch, so each patch_jax() warns about them; one
# test below checks that warning, with a module of its own.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:host_callback\.patch_jax\(\). these modules imported"
    ":RuntimeWarning")

LEGACY = "jax.experimental.host_callback"
# JAX 0.6 and 0.7 still ship a module of that name, whose functions raise
# (0.7's warns when imported); JAX 0.8 removed it.
JAX_SHIPS_LEGACY = jax.__version_info__ < (0, 8)
JAXS_LEGACY_WARNING = "jax.experimental.host_callback is deprecated"

# (module, name, host_callback's object) for every name patch_jax replaces.
PATCHED = [
    (jax, "pure_callback", hcb.pure_callback),
    (jax.experimental, "io_callback", hcb.io_callback),
    (jax.debug, "callback", hcb_debug.callback),
    (jax.debug, "print", hcb_debug.print),
    # (jax.debug.log from JAX 0.8)
    *([(jax.debug, "log", hcb_debug.log)] if hasattr(jax.debug, "log")
      else []),
    (jax_buffer_callback, "buffer_callback", hcb.buffer_callback),
    (jax_buffer_callback, "Buffer", hcb.Buffer),
    (jax_buffer_callback, "ExecutionContext", hcb.ExecutionContext),
    (jax_buffer_callback, "ExecutionStage", hcb.ExecutionStage),
]
JAX_OWN = {(m.__name__, n): getattr(m, n) for m, n, _ in PATCHED}


@pytest.fixture(autouse=True)
def jax_restored():
  """Every test starts and ends with JAX's own names."""
  hcb.unpatch_jax()
  hcb.uninstall_legacy_module()
  yield
  hcb.unpatch_jax()
  hcb.uninstall_legacy_module()
  for m, n, _ in PATCHED:
    assert getattr(m, n) is JAX_OWN[(m.__name__, n)], f"{m.__name__}.{n}"
  for legacy in (sys.modules.get(LEGACY),
                 vars(jax.experimental).get("host_callback")):
    assert not getattr(legacy, "__host_callback__", False)


def _arg_types(call_pure, call_io) -> tuple[type, type]:
  """The type of the argument the function of a jitted pure_callback and
  io_callback receives, each called through the given function."""
  seen: list[type] = []

  def fn(a):
    seen.append(type(a))
    return np.asarray(a)

  x = jnp.arange(3.0)
  jax.jit(lambda v: call_pure(fn, x, v))(x).block_until_ready()
  jax.jit(lambda v: call_io(fn, x, v))(x).block_until_ready()
  return seen[0], seen[1]


def _run(code: str, *, env: dict[str, str] | None = None,
         args: tuple[str, ...] = ("-c",), cwd: str | None = None
         ) -> subprocess.CompletedProcess[str]:
  full_env = {k: v for k, v in os.environ.items()
              if k != startup.ENV and k != "JAX_NUM_CPU_DEVICES"}
  full_env.update(env or {})
  cmd = [sys.executable, *args]
  if args[-1] == "-c":
    cmd.append(textwrap.dedent(code))
  return subprocess.run(cmd, capture_output=True, text=True, env=full_env,
                        timeout=240, cwd=cwd)


# ---- patch_jax ---------------------------------------------------------------

def test_patch_jax_serves_every_name_until_undone():
  before = _arg_types(lambda f, r, v: jax.pure_callback(f, r, v),
                      lambda f, r, v: jax.experimental.io_callback(f, r, v))
  assert all(issubclass(t, jax.Array) for t in before), before
  patch = hcb.patch_jax()
  assert patch.active
  for module, name, ours in PATCHED:
    assert getattr(module, name) is ours, f"{module.__name__}.{name}"
  assert _arg_types(lambda f, r, v: jax.pure_callback(f, r, v),
                    lambda f, r, v: jax.experimental.io_callback(f, r, v)
                    ) == (np.ndarray, np.ndarray)
  taps = hcb.stats()["records_in"]
  jax.jit(lambda x: jax.debug.print("x={}", x))(jnp.float32(1.5))
  jax.effects_barrier()
  assert hcb.stats()["records_in"] == taps + 1
  patch.undo()
  assert not patch.active
  for module, name, _ in PATCHED:
    assert getattr(module, name) is JAX_OWN[(module.__name__, name)]
  assert all(issubclass(t, jax.Array) for t in _arg_types(
      lambda f, r, v: jax.pure_callback(f, r, v),
      lambda f, r, v: jax.experimental.io_callback(f, r, v)))
  patch.undo()  # a second undo does nothing


def test_patched_jax_debug_prints_the_same_text(capfd):
  f = jax.jit(lambda x: jax.debug.print("x={} y={y}", x, y=x * 2))
  f(jnp.arange(3.0))
  jax.effects_barrier()
  theirs = capfd.readouterr().out
  with hcb.patch_jax():
    f = jax.jit(lambda x: jax.debug.print("x={} y={y}", x, y=x * 2))
    f(jnp.arange(3.0))
    jax.effects_barrier()
  assert capfd.readouterr().out == theirs == "x=[0. 1. 2.] y=[0. 2. 4.]\n"


def test_patch_as_context_manager_and_nested():
  with hcb.patch_jax() as outer:
    assert jax.pure_callback is hcb.pure_callback
    with hcb.patch_jax() as inner:
      assert inner is not outer and inner.active
    # the outer patch still holds: JAX's names stay ours
    assert jax.pure_callback is hcb.pure_callback
    assert not inner.active and outer.active
  assert jax.pure_callback is JAX_OWN[("jax", "pure_callback")]
  assert "active" in repr(hcb.patch_jax())
  hcb.unpatch_jax()  # every patch at once
  assert jax.debug.print is JAX_OWN[("jax.debug", "print")]


def test_patch_undo_leaves_a_name_someone_else_replaced():
  patch = hcb.patch_jax()

  def theirs(*args, **kwargs):
    raise AssertionError("not called")

  jax.debug.callback = theirs
  try:
    patch.undo()
    assert jax.debug.callback is theirs
    assert jax.debug.print is JAX_OWN[("jax.debug", "print")]
  finally:
    jax.debug.callback = JAX_OWN[("jax.debug", "callback")]


def test_patch_from_many_threads_restores_exactly():
  errors: list[BaseException] = []
  start = threading.Barrier(8)

  def worker():
    try:
      start.wait()
      for _ in range(50):
        with hcb.patch_jax():
          assert jax.experimental.io_callback is hcb.io_callback
    except BaseException as e:  # noqa: BLE001 -- reported below
      errors.append(e)

  threads = [threading.Thread(target=worker) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  for module, name, _ in PATCHED:
    assert getattr(module, name) is JAX_OWN[(module.__name__, name)]


def test_patch_warns_about_modules_that_imported_jax_callbacks_before(
    tmp_path, monkeypatch):
  (tmp_path / "early_lib.py").write_text(
      "from jax.experimental import io_callback\n"
      "from jax.debug import callback as debug_callback\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  early = importlib.import_module("early_lib")
  try:
    with pytest.warns(RuntimeWarning) as record:
      patch = hcb.patch_jax()
    message = str(record[0].message)
    assert ("early_lib (jax.debug.callback, jax.experimental.io_callback)"
            in message)
    assert "HOST_CALLBACK_PATCH=jax" in message
    # what the warning says: the early module keeps JAX's
    assert early.io_callback is JAX_OWN[("jax.experimental", "io_callback")]
    patch.undo()
  finally:
    del sys.modules["early_lib"]


def test_patched_dropins_under_sharded_jit_print_as_unpatched(capfd):
  """The drop-ins' own machinery (JAX's Python callback under jit over
  sharded operands) does not go through the names the patch replaced."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("i",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("i"))
  x = jax.device_put(jnp.arange(4.0), sharding)

  def run(debug_print, pure):
    def f(v):
      debug_print("v={}", v)
      return pure(lambda a: np.asarray(a) * 2, v, v)
    out = jax.jit(f)(x)
    jax.effects_barrier()
    return np.asarray(out)

  ours = run(hcb_debug.print, hcb.pure_callback)
  unpatched = capfd.readouterr().out
  with hcb.patch_jax():
    patched = run(jax.debug.print, jax.pure_callback)
  assert capfd.readouterr().out == unpatched == "v=[0. 1. 2. 3.]\n"
  np.testing.assert_array_equal(patched, ours)


def _package_sources() -> list[pathlib.Path]:
  root = pathlib.Path(hcb.__file__).parent
  return sorted(root.glob("*.py")) + [pathlib.Path(startup.__file__)]


def test_host_callback_never_calls_jax_callbacks_by_their_patched_names():
  """Re-entrancy: when patched, a drop-in that called jax.pure_callback
  (or any patched name) would call itself, or another drop-in, instead of
  JAX's.  No module of the package refers to those names."""
  patched = {"jax.pure_callback", "jax.experimental.io_callback",
             "jax.debug.callback", "jax.debug.print", "jax.debug.log",
             "jax.experimental.buffer_callback.buffer_callback"}
  found = []
  for path in _package_sources():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Attribute):
        parts, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
          parts.append(inner.attr)
          inner = inner.value
        if isinstance(inner, ast.Name):
          dotted = ".".join([inner.id, *reversed(parts)])
          if dotted in patched:
            found.append(f"{path.name}:{node.lineno}: {dotted}")
      elif isinstance(node, ast.ImportFrom) and node.module:
        for alias in node.names:
          if f"{node.module}.{alias.name}" in patched:
            found.append(f"{path.name}:{node.lineno}: from {node.module} "
                         f"import {alias.name}")
  assert not found, found


# ---- install_legacy_module ---------------------------------------------------

def _import_jaxs_legacy_module() -> types.ModuleType | None:
  """Imports ``jax.experimental.host_callback`` as JAX alone has it, and
  checks what that is: nothing from JAX 0.8 on, before it a module whose
  functions raise."""
  if not JAX_SHIPS_LEGACY:
    with pytest.raises(ModuleNotFoundError):
      importlib.import_module(LEGACY)
    return None
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", JAXS_LEGACY_WARNING)
    module = importlib.import_module(LEGACY)
  with pytest.raises(NotImplementedError, match="no longer supported"):
    module.id_tap(print, 1)
  return module


def test_legacy_module_both_import_forms_until_undone(collect):
  jaxs = _import_jaxs_legacy_module()
  with hcb.install_legacy_module():
    import jax.experimental.host_callback as old_hcb
    from jax.experimental import host_callback as old_hcb2
    assert old_hcb is old_hcb2
    assert old_hcb.id_tap is hcb.id_tap and old_hcb.call is hcb.call
    assert old_hcb.TapFunctionException is hcb.CallbackException
    assert sorted(old_hcb.__all__) == sorted(
        ["barrier_wait", "call", "id_print", "id_tap",
         "stop_outfeed_receiver", "CallbackException", "CallbackFlavor",
         "TapFunctionException"])
    assert "(host_callback)" in repr(old_hcb)
    y = jax.jit(lambda x: old_hcb.id_tap(collect, x) * 2)(jnp.arange(2))
    old_hcb.barrier_wait()
    assert y.tolist() == [0, 2]
    assert [a.tolist() for a in collect.args] == [[0, 1]]
    with pytest.raises(AttributeError, match="removed module's API: "
                       "barrier_wait, call"):
      old_hcb.outfeed_receiver  # noqa: B018 -- not part of the old API
  # JAX's own comes back: none, or its module.
  assert sys.modules.get(LEGACY) is jaxs
  assert vars(jax.experimental).get("host_callback") is jaxs
  assert _import_jaxs_legacy_module() is jaxs


# ---- the supported JAX releases ----------------------------------------------

def test_supported_jax_range_is_the_packages_dependency():
  requires = importlib.metadata.requires("host_callback") or []
  jax_req = next(r for r in requires if r.split(">")[0].split("<")[0] == "jax")
  assert sorted(jax_req[3:].split(",")) == sorted(
      startup.SUPPORTED_JAX.split(","))
  for version in ("0.6.2", "0.7.2", "0.8.3", "0.9.2", "0.10.2", "0.11.2",
                  "0.12.0.1", "0.12.9"):
    assert startup.jax_version_problem(version) is None, version
  for version in ("0.6.1", "0.5.3", "0.4.38", "0.13.0", "1.0.0", "0.13.0rc1"):
    problem = startup.jax_version_problem(version)
    assert problem == (
        f"JAX {version} is installed; host_callback supports "
        "jax>=0.6.2,<0.13 (install one of those, or unset "
        "HOST_CALLBACK_PATCH)"), version


def test_patch_refuses_a_jax_outside_the_range_and_leaves_it_alone():
  done = _run("""
      import jax
      jax.__version__ = "0.4.38"   # a release that host_callback refuses
      import host_callback as hcb
      for api in (hcb.patch_jax, hcb.install_legacy_module):
        try:
          api()
        except RuntimeError as e:
          print(e)
      print(jax.pure_callback.__module__)
  """)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == [
      "host_callback.patch_jax(): JAX 0.4.38 is installed; host_callback "
      "supports jax>=0.6.2,<0.13 (install one of those, or unset "
      "HOST_CALLBACK_PATCH)",
      "host_callback.install_legacy_module(): JAX 0.4.38 is installed; "
      "host_callback supports jax>=0.6.2,<0.13 (install one of those, or "
      "unset HOST_CALLBACK_PATCH)",
      "jax._src.callback"]


def test_startup_hook_on_an_unsupported_jax_says_so_and_keeps_jax(capfd):
  old = types.ModuleType("jax")
  old.__version__ = "0.4.38"  # type: ignore[attr-defined]
  startup._patch_jax(old)  # what the hook runs once `import jax` is done
  assert capfd.readouterr().err == (
      "host_callback: HOST_CALLBACK_PATCH=jax not applied, JAX's callbacks "
      "stay: JAX 0.4.38 is installed; host_callback supports "
      "jax>=0.6.2,<0.13 (install one of those, or unset "
      "HOST_CALLBACK_PATCH)\n")
  assert jax.pure_callback is JAX_OWN[("jax", "pure_callback")]


# ---- the start-up hook -------------------------------------------------------

# A library as the real ones are written: names imported from JAX at the
# top of the module, before any code of the program runs.
EARLY_LIB = """\
from jax.experimental import io_callback
from jax.debug import callback as debug_callback
import jax
def whose():
    return [f.__module__.split(".")[0] for f in
            (io_callback, debug_callback, jax.pure_callback, jax.debug.print)]
"""

WHOSE = f"""
    import sys, warnings
    import early_lib
    print(early_lib.whose())
    warnings.filterwarnings("ignore", {JAXS_LEGACY_WARNING!r})
    try:
        import jax.experimental.host_callback as hcb
        print("legacy", hcb.id_tap.__module__)
    except ImportError as e:
        print("legacy", type(e).__name__)
"""


def test_startup_hook_patches_before_libraries_import(tmp_path):
  (tmp_path / "early_lib.py").write_text(EARLY_LIB)
  env = {"PYTHONPATH": str(tmp_path)}
  runs = {value: _run(WHOSE, env={**env, startup.ENV: value})
          for value in ("", "jax", "legacy", "JAX, legacy")}
  for value, done in runs.items():
    assert done.returncode == 0, (value, done.stderr)
    assert done.stderr == "", (value, done.stderr)
  own, ours = "['jax', 'jax', 'jax', 'jax']", str(["host_callback"] * 4)
  jaxs = "legacy " + (LEGACY if JAX_SHIPS_LEGACY else "ModuleNotFoundError")
  assert runs[""].stdout.split("\n")[:2] == [own, jaxs]
  assert runs["jax"].stdout.split("\n")[:2] == [ours, jaxs]
  assert runs["legacy"].stdout.split("\n")[:2] == [
      own, "legacy host_callback._tap"]
  assert runs["JAX, legacy"].stdout.split("\n")[:2] == [
      ours, "legacy host_callback._tap"]


def test_startup_hook_imports_nothing_where_jax_is_not_used():
  """With the variable set, a program that never imports JAX (pip, a build
  tool) imports neither JAX nor host_callback, and pip works."""
  done = _run("""
      import json, sys
      print(sorted(m for m in sys.modules
                   if m.split(".")[0] in ("jax", "host_callback")))
  """, env={startup.ENV: "jax,legacy"})
  assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
  pip = _run("", args=("-m", "pip", "--version"),
             env={startup.ENV: "jax,legacy"})
  assert pip.returncode == 0 and pip.stdout.startswith("pip "), pip.stderr
  assert pip.stderr == ""


def test_without_the_variable_the_pth_imports_nothing():
  done = _run("""
      import sys
      print(sorted(m for m in sys.modules if "host_callback" in m))
  """)
  assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
  pth = pathlib.Path(startup.__file__).with_name("host_callback_patch.pth")
  assert pth.is_file()


def test_startup_hook_names_a_word_it_does_not_know():
  done = _run("import jax; print(jax.debug.print.__module__)",
              env={startup.ENV: "jax,legcy"})
  assert done.returncode == 0, done.stderr
  assert done.stdout == "host_callback.debug\n"
  assert done.stderr == (
      "host_callback: HOST_CALLBACK_PATCH='jax,legcy': ignoring 'legcy'; "
      "the parts are jax, legacy (comma separated)\n")


# ---- python -m host_callback run ---------------------------------------------

SCRIPT = """\
import sys, os, subprocess
import early_lib
print(sys.argv[1:], early_lib.whose()[0])
import jax.experimental.host_callback as hcb
print("legacy", hcb.call.__module__)
child = subprocess.run([sys.executable, "-c",
                        "import early_lib; print(early_lib.whose()[0])"],
                       capture_output=True, text=True)
print("child", child.stdout.strip(), os.environ["HOST_CALLBACK_PATCH"])
sys.exit(int(sys.argv[1]))
"""


def test_run_a_script_patched(tmp_path):
  (tmp_path / "early_lib.py").write_text(EARLY_LIB)
  (tmp_path / "prog.py").write_text(SCRIPT)
  done = _run("", args=("-m", "host_callback", "run",
                        str(tmp_path / "prog.py"), "3", "--flag"),
              env={"PYTHONPATH": str(tmp_path)}, cwd="/")
  assert done.returncode == 3, done.stderr
  assert done.stdout.splitlines() == [
      "['3', '--flag'] host_callback", "legacy host_callback._call",
      "child host_callback jax,legacy"]


def test_run_a_module_patched_with_chosen_parts(tmp_path):
  (tmp_path / "early_lib.py").write_text(EARLY_LIB)
  (tmp_path / "prog.py").write_text(SCRIPT.replace(
      'import jax.experimental.host_callback as hcb\nprint("legacy", '
      'hcb.call.__module__)\n', ""))
  done = _run("", args=("-m", "host_callback", "run", "--patch", "jax",
                        "-m", "prog", "0"),
              env={"PYTHONPATH": str(tmp_path)})
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == [
      "['0'] host_callback", "child host_callback jax"]


def test_run_usage_errors():
  for argv, message in (
      (("--patch", "jx", "x.py"), "--patch 'jx': the parts are jax, legacy"),
      (("--frobnicate", "x.py"), "unknown option '--frobnicate'"),
      ((), "no script, -m module or -c command to run"),
      (("-m",), "-m needs a module name")):
    done = _run("", args=("-m", "host_callback", "run", *argv))
    assert done.returncode == 2, argv
    assert done.stderr.endswith(
        f"python -m host_callback run: {message}\n"), done.stderr
    assert done.stderr.startswith("usage: python -m host_callback run")
  shown = _run("", args=("-m", "host_callback", "run", "--help"))
  assert shown.returncode == 0 and "--patch PARTS" in shown.stdout


# What a script can observe of how it was started; run by python and by
# python -m host_callback run, the two must agree.
OBSERVER = """\
import os, sys
print(__file__ == os.path.abspath(__file__), os.path.basename(__file__))
print(sys.argv)
os.chdir("/")
print(os.path.exists(__file__))
if sys.argv[1:] == ["raise"]:
  def inner():
    raise ValueError("from the script")
  inner()
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


def _both_ways(args: tuple[str, ...], cwd: str
               ) -> tuple[subprocess.CompletedProcess[str], ...]:
  """``python ARGS`` and ``python -m host_callback run ARGS``."""
  return (_run("", args=args, cwd=cwd),
          _run("", args=("-m", "host_callback", "run", *args), cwd=cwd))


def test_run_looks_to_the_script_as_python_does(tmp_path):
  (tmp_path / "prog.py").write_text(OBSERVER)
  for args in (("prog.py",), ("prog.py", "3", "--flag"),
               ("./prog.py", "0")):
    plain, ours = _both_ways(args, str(tmp_path))
    assert ours.returncode == plain.returncode, (args, ours.stderr)
    assert ours.stdout == plain.stdout, args
  assert plain.stdout.splitlines()[:3] == ["False prog.py",
                                           "['./prog.py', '0']", "True"]


def test_run_reports_the_scripts_exception_as_python_does(tmp_path):
  (tmp_path / "prog.py").write_text(OBSERVER)
  plain, ours = _both_ways(("prog.py", "raise"), str(tmp_path))
  assert ours.returncode == plain.returncode == 1
  # the traceback holds the script's frames alone, as python's
  assert ours.stderr == plain.stderr, ours.stderr


def test_run_of_a_missing_script_fails_as_python_does(tmp_path):
  plain, ours = _both_ways(("missing.py",), str(tmp_path))
  assert ours.returncode == plain.returncode == 2
  assert ours.stderr == plain.stderr.replace(
      sys.executable, "python -m host_callback run", 1)
  assert ours.stderr.count("\n") == 1


def test_run_a_command():
  plain = _run("import sys; print(sys.argv, sys.path[0] == '')",
               args=("-c",))
  ours = _run("", args=("-m", "host_callback", "run", "-c",
                        "import sys; print(sys.argv, sys.path[0] == '')",
                        "a", "b"))
  assert plain.stdout == "['-c'] True\n"
  assert ours.returncode == 0, ours.stderr
  assert ours.stdout == "['-c', 'a', 'b'] True\n"


def test_the_runner_leads_its_help_with_run_and_knows_near_misses():
  shown = _run("", args=("-m", "host_callback", "--help"))
  assert shown.returncode == 0
  assert shown.stdout.startswith(
      "usage: python -m host_callback run [--patch PARTS] script.py")
  missed = _run("", args=("-m", "host_callback", "rn", "x.py"))
  assert missed.returncode == 2
  assert missed.stderr.splitlines()[-1] == (
      "python -m host_callback: unknown command 'rn' (did you mean "
      "'run'?)")


def test_run_refuses_a_jax_outside_the_range(tmp_path):
  # A JAX that reports a release host_callback refuses, from start-up on.
  (tmp_path / "sitecustomize.py").write_text(
      "import jax\njax.__version__ = '0.13.1'\n")
  (tmp_path / "prog.py").write_text("print('ran')\n")
  done = _run("", args=("-m", "host_callback", "run",
                        str(tmp_path / "prog.py")),
              env={"PYTHONPATH": str(tmp_path)})
  assert (done.returncode, done.stdout) == (2, ""), done.stderr
  assert done.stderr == (
      "python -m host_callback run: cannot patch: JAX 0.13.1 is installed; "
      "host_callback supports jax>=0.6.2,<0.13 (install one of those, or "
      "unset HOST_CALLBACK_PATCH)\n")
