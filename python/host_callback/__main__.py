"""``python -m host_callback --cflags --libs``: build flags for C users.

  --cflags         -I for hcb/hcb.h and hcb/ffi.h (with jaxlib's XLA headers)
  --libs           link flags for libhcb (with an rpath to it)
  --includedir     the directory of hcb/*.h
  --library        the path of libhcb.so
  --cmakedir       the directory of hcbConfig.cmake (hcb_DIR)
  --pkgconfigdir   the directory of hcb.pc (PKG_CONFIG_PATH)
  --version        the package version
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
  from host_callback import __version__
  from host_callback import _install

  parser = argparse.ArgumentParser(
      prog="python -m host_callback",
      description="Build flags and paths for C users of libhcb.")
  for flag in ("cflags", "libs", "includedir", "library", "cmakedir",
               "pkgconfigdir", "version"):
    parser.add_argument(f"--{flag}", action="store_true")
  args = parser.parse_args(argv)
  out: list[str] = []
  if args.cflags:
    import jax.ffi  # only this flag needs JAX (the XLA FFI headers)
    out += [f"-I{_install.get_include()}", f"-I{jax.ffi.include_dir()}"]
  if args.libs:
    libdir = os.path.dirname(_install.get_library())
    out += [f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lhcb"]
  if args.includedir:
    out.append(_install.get_include())
  if args.library:
    out.append(_install.get_library())
  if args.cmakedir:
    out.append(_install.get_cmake_dir())
  if args.pkgconfigdir:
    out.append(_install.get_pkgconfig_dir())
  if args.version:
    out.append(__version__)
  if not out:
    parser.print_help()
    return 2
  print(" ".join(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
