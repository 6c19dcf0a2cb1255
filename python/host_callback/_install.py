"""Where the C library, its headers, the CMake package config and the
pkg-config file are installed (inside this package: ``include/``,
``lib/``), for C users -- as ``numpy.get_include()`` is for numpy's."""

from __future__ import annotations

import os

_ROOT = os.path.dirname(os.path.abspath(__file__))


def get_include() -> str:
  """The directory holding ``hcb/hcb.h`` and ``hcb/ffi.h`` (``-I`` this).

  ``hcb/ffi.h`` also needs XLA's headers: ``jax.ffi.include_dir()``."""
  return os.path.join(_ROOT, "include")


def get_library() -> str:
  """The path of ``libhcb.so``, the runtime the Python package itself uses
  (a C program or library that links it shares one runtime with Python)."""
  return os.path.join(_ROOT, "lib", "libhcb.so")


def get_cmake_dir() -> str:
  """The directory of ``hcbConfig.cmake``: ``-Dhcb_DIR=`` this, then
  ``find_package(hcb CONFIG REQUIRED)`` gives ``hcb::hcb`` and
  ``hcb::ffi``."""
  return os.path.join(_ROOT, "lib", "cmake", "hcb")


def get_pkgconfig_dir() -> str:
  """The directory of ``hcb.pc``: add it to ``PKG_CONFIG_PATH``."""
  return os.path.join(_ROOT, "lib", "pkgconfig")
