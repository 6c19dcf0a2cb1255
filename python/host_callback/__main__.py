"""``python -m host_callback``: the compiler flags and paths that C code needs
to build against libhcb.

The flags and what they print are in ``_FLAGS`` below, which is also where
``--help`` gets its text.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

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


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m host_callback",
      description="Print the compiler flags and paths for building C code "
                  "against libhcb.",
      epilog="Several flags print their values on one line, in the order "
             "above:\n"
             "  cc -shared -fPIC my_handlers.c "
             "$(python -m host_callback --cflags --libs)",
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
