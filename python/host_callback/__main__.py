"""``python -m host_callback``: ``run``, which runs a program with JAX's
callbacks (and the removed ``jax.experimental.host_callback``) served by
host_callback, without editing it, as ``python`` would run it; and the
compiler flags and paths that C code needs to build against libhcb.

The flags and what they print are in ``_FLAGS`` below, which is also where
``--help`` gets its text; ``run``'s usage is ``_RUN_USAGE``.
"""

from __future__ import annotations

import argparse
import builtins
import difflib
import importlib.machinery
import os
import runpy
import signal
import sys
import types
import zipfile
from types import TracebackType
from typing import Callable

import _host_callback_startup as startup

from host_callback import __version__
from host_callback import _install


def _cflags() -> str:
  import jax.ffi  # the XLA FFI headers that hcb/ffi.h includes
  return f"-I{_install.get_include()} -I{jax.ffi.include_dir()}"


def _libs() -> str:
  libdir = os.path.dirname(_install.get_library())
  return f"-L{libdir} -Wl,-rpath,{libdir} -lhcb"


# flag: (its --help text, what it prints), in the order the values print.
_FLAGS: dict[str, tuple[str, Callable[[], str]]] = {
    "cflags": ("-I flags for hcb/hcb.h and hcb/ffi.h, including jaxlib's "
               "XLA FFI headers that ffi.h needs", _cflags),
    "libs": ("link flags for libhcb, with an rpath to its directory", _libs),
    "includedir": ("the directory that holds hcb/hcb.h and hcb/ffi.h",
                   _install.get_include),
    "library": ("the path of libhcb.so", _install.get_library),
    "cmakedir": ("the directory of hcbConfig.cmake, for cmake -Dhcb_DIR=...",
                 _install.get_cmake_dir),
    "pkgconfigdir": ("the directory of hcb.pc, for PKG_CONFIG_PATH "
                     "(hcb.pc does not give the XLA FFI headers)",
                     _install.get_pkgconfig_dir),
    "version": ("the version of the host_callback package",
                lambda: __version__),
}


_RUN_USAGE = f"""\
usage: python -m host_callback run [--patch PARTS] script.py [args ...]
       python -m host_callback run [--patch PARTS] -m module [args ...]
       python -m host_callback run [--patch PARTS] -c command [args ...]

Runs a Python program (a script, a module as `python -m` does: pytest, a
notebook server, ...; or a command as `python -c` does) with JAX's
callbacks served by host_callback, with no edit to the program or the
libraries it uses.  The program sees what `python` would give it:
sys.argv, an absolute __file__, its exit status, tracebacks of its own
frames.

  --patch PARTS  what to patch, comma separated (default: jax,legacy):
                 jax     jax.pure_callback, jax.experimental.io_callback,
                         jax.debug.callback/print/log and
                         jax.experimental.buffer_callback are host_callback's
                 legacy  `import jax.experimental.host_callback` (removed
                         from JAX) gives host_callback's module

The program's own subprocesses are patched too: {startup.ENV} is set to
PARTS in its environment (the variable alone does the same for any Python
started with it; docs/migrating.md).
"""

# The files of the runner's own frames, which a traceback of the program
# leaves out, as python's leaves out its own.
_RUNNER_FILES = frozenset((__file__, os.path.abspath(__file__),
                           getattr(runpy, "__file__", ""), "<frozen runpy>"))


def _run_usage_error(message: str) -> int:
  sys.stderr.write(f"{_RUN_USAGE}\npython -m host_callback run: {message}\n")
  return 2


def _program_traceback(tb: TracebackType | None) -> TracebackType | None:
  """``tb`` without the runner's frames before the program's first."""
  while tb is not None and (
      tb.tb_frame.f_code.co_filename in _RUNNER_FILES):
    tb = tb.tb_next
  return tb


def _run_program(start: Callable[[], object]) -> int:
  """Runs the program (``start``) as python runs ``__main__``: returns its
  exit status; an exception it leaves is printed by ``sys.excepthook``
  without the runner's frames (status 1), and Ctrl-C it leaves ends the
  process by SIGINT, as python's does."""
  try:
    start()
  except SystemExit:
    raise
  except BaseException as exc:  # pylint: disable=broad-except
    tb = _program_traceback(exc.__traceback__)
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    if isinstance(exc, KeyboardInterrupt):
      sys.stdout.flush()
      sys.stderr.flush()
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
    return 1
  return 0


def _run_code(source: str | bytes, filename: str) -> None:
  """Runs ``source`` as python runs its ``__main__``: in a fresh module of
  that name, which stays ``sys.modules["__main__"]`` (pickle and
  multiprocessing look for the program's objects there), with
  ``__file__`` the script's absolute path."""
  main_module = types.ModuleType("__main__")
  main_module.__dict__["__builtins__"] = builtins
  if filename != "<string>":
    main_module.__file__ = filename
    main_module.__loader__ = importlib.machinery.SourceFileLoader(
        "__main__", filename)
  sys.modules["__main__"] = main_module
  code = compile(source, filename, "exec")
  exec(code, main_module.__dict__)  # pylint: disable=exec-used


def _run_script(script: str) -> None:
  """``python script``: a file as python runs it (a directory or zip file
  with a ``__main__.py``: as runpy does, which is what python does)."""
  if not os.path.isfile(script) or zipfile.is_zipfile(script):
    runpy.run_path(script, run_name="__main__")
    return
  with open(script, "rb") as f:
    source = f.read()
  _run_code(source, script)


def run(argv: list[str]) -> int:
  """``python -m host_callback run``: patches (``--patch``), then runs the
  script, module or command with ``argv``'s remaining arguments as its
  own, as ``__main__``.  Returns the exit status (the program's
  ``SystemExit`` propagates)."""
  parts = "jax,legacy"
  i = 0
  while (i < len(argv) and argv[i].startswith("-")
         and argv[i] not in ("-m", "-c")):
    arg = argv[i]
    if arg in ("-h", "--help"):
      sys.stdout.write(_RUN_USAGE)
      return 0
    if arg == "--patch" and i + 1 < len(argv):
      parts, i = argv[i + 1], i + 2
    elif arg.startswith("--patch="):
      parts, i = arg.partition("=")[2], i + 1
    else:
      return _run_usage_error(f"unknown option {arg!r}")
  rest = argv[i:]
  if rest[:1] in (["-m"], ["-c"]) and len(rest) < 2:
    return _run_usage_error(
        f"{rest[0]} needs {'a module name' if rest[0] == '-m' else 'a command'}")
  if not rest:
    return _run_usage_error("no script, -m module or -c command to run")
  what, unknown = startup.parse(parts)
  if unknown or not what:
    return _run_usage_error(
        f"--patch {parts!r}: the parts are {', '.join(startup.WHAT)}")
  if rest[0] not in ("-m", "-c"):
    # absolute as python makes it: joined to the working directory, not
    # normalised ("./x.py" stays "/cwd/./x.py")
    script = os.path.join(os.getcwd(), rest[0])
    if not os.path.exists(script):  # python's words and status
      sys.stderr.write(f"python -m host_callback run: can't open file "
                       f"{script!r}: [Errno 2] No such file or directory\n")
      return 2
  import jax
  problem = startup.jax_version_problem(jax.__version__)
  if problem is not None:
    sys.stderr.write(f"python -m host_callback run: cannot patch: "
                     f"{problem}\n")
    return 2
  from host_callback import _patch
  if "jax" in what:
    _patch.patch_jax()
  if "legacy" in what:
    startup.install("legacy")  # at the program's first import of it
  os.environ[startup.ENV] = ",".join(what)
  if rest[0] == "-m":
    sys.argv = [rest[1], *rest[2:]]  # runpy puts the module's path first
    return _run_program(lambda: runpy.run_module(
        rest[1], run_name="__main__", alter_sys=True))
  if rest[0] == "-c":
    sys.argv = ["-c", *rest[2:]]
    sys.path[0] = ""  # as python -c: the current directory
    return _run_program(lambda: _run_code(rest[1], "<string>"))
  sys.argv = list(rest)  # argv[0] as given, as python keeps it
  sys.path[0] = os.path.dirname(script)
  return _run_program(lambda: _run_script(script))


def _flags_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m host_callback",
      usage="python -m host_callback run [--patch PARTS] script.py "
            "[args ...]\n"
            "       python -m host_callback --cflags --libs ...",
      description="Run a program with JAX's callbacks (and the removed "
                  "jax.experimental.host_callback) served by host_callback, "
                  "unedited:\n"
                  "  python -m host_callback run script.py [args ...]\n"
                  "  python -m host_callback run -m module [args ...]\n"
                  "  python -m host_callback run -c command [args ...]\n"
                  "(`run --help` says more).  Or print the compiler flags "
                  "and paths for building C code against libhcb:",
      epilog="Several flags print their values on one line, in the order "
             "above:\n"
             "  cc -shared -fPIC my_handlers.c "
             "$(python -m host_callback --cflags --libs)",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  for flag, (help_text, _) in _FLAGS.items():
    parser.add_argument(f"--{flag}", action="store_true", help=help_text)
  return parser


def main(argv: list[str] | None = None) -> int:
  if argv is None:
    argv = sys.argv[1:]
  if argv[:1] == ["run"]:
    return run(argv[1:])
  parser = _flags_parser()
  if argv and not argv[0].startswith("-"):
    close = difflib.get_close_matches(argv[0], ["run"], n=1, cutoff=0.5)
    hint = " (did you mean 'run'?)" if close else ""
    parser.print_usage(sys.stderr)
    sys.stderr.write(f"python -m host_callback: unknown command "
                     f"{argv[0]!r}{hint}\n")
    return 2
  args = parser.parse_args(argv)
  out = [get() for flag, (_, get) in _FLAGS.items() if getattr(args, flag)]
  if not out:
    parser.print_help()
    return 2
  print(" ".join(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
