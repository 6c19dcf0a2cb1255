"""``python -m host_callback``: the compiler flags and paths that C code needs
to build against libhcb, and ``run``, which runs a program with JAX's
callbacks (and the removed ``jax.experimental.host_callback``) served by
host_callback, without editing it.

The flags and what they print are in ``_FLAGS`` below, which is also where
``--help`` gets its text; ``run``'s usage is ``_RUN_USAGE``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
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

Runs a Python program (a script, or a module as `python -m` does: pytest,
a notebook server, ...) with JAX's callbacks served by host_callback, with
no edit to the program or the libraries it uses.

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


def _run_usage_error(message: str) -> int:
  sys.stderr.write(f"{_RUN_USAGE}\npython -m host_callback run: {message}\n")
  return 2


def run(argv: list[str]) -> int:
  """``python -m host_callback run``: patches (``--patch``), then runs the
  script or module with ``argv``'s remaining arguments as its own, as
  ``__main__``.  Returns the exit status (the program's ``SystemExit``
  propagates)."""
  parts = "jax,legacy"
  i = 0
  while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
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
  module = None
  if rest[:1] == ["-m"]:
    if len(rest) < 2:
      return _run_usage_error("-m needs a module name")
    module, args = rest[1], rest[2:]
  elif rest:
    script, args = rest[0], rest[1:]
  else:
    return _run_usage_error("no script or -m module to run")
  what, unknown = startup.parse(parts)
  if unknown or not what:
    return _run_usage_error(
        f"--patch {parts!r}: the parts are {', '.join(startup.WHAT)}")
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
  if module is not None:
    sys.argv = [module, *args]  # runpy puts the module's path in argv[0]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  else:
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
  return 0


def main(argv: list[str] | None = None) -> int:
  if argv is None:
    argv = sys.argv[1:]
  if argv[:1] == ["run"]:
    return run(argv[1:])
  parser = argparse.ArgumentParser(
      prog="python -m host_callback",
      description="Print the compiler flags and paths for building C code "
                  "against libhcb.",
      epilog="Several flags print their values on one line, in the order "
             "above:\n"
             "  cc -shared -fPIC my_handlers.c "
             "$(python -m host_callback --cflags --libs)\n\n"
             "To run a program with JAX's callbacks served by host_callback:\n"
             "  python -m host_callback run [--patch jax,legacy] "
             "script.py [args ...]\n"
             "  python -m host_callback run [--patch jax,legacy] "
             "-m module [args ...]   (run --help says more)",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  for flag, (help_text, _) in _FLAGS.items():
    parser.add_argument(f"--{flag}", action="store_true", help=help_text)
  args = parser.parse_args(argv)
  out = [get() for flag, (_, get) in _FLAGS.items() if getattr(args, flag)]
  if not out:
    parser.print_help()
    return 2
  print(" ".join(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
