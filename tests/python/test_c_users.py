"""Installation for C users: the headers, libhcb, the CMake package config
and the pkg-config file installed with the package, and a pure-C program
(examples/c_program, no Python in it) built both ways and run."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import host_callback as hcb

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
PROGRAM = os.path.join(REPO, "examples", "c_program")


def test_paths_point_at_the_installed_c_api():
  # hcb/ffi.h includes the other four: a user includes it alone
  for header in ("hcb.h", "ffi.h", "ffi_attrs.h", "ffi_version.h",
                 "ffi_handlers.h", "cuda.h"):
    assert os.path.isfile(os.path.join(hcb.get_include(), "hcb", header))
  assert os.path.isfile(os.path.join(hcb.get_cmake_dir(), "hcbConfig.cmake"))
  assert os.path.isfile(os.path.join(hcb.get_pkgconfig_dir(), "hcb.pc"))
  lib = ctypes.CDLL(hcb.get_library())
  lib.hcb_version_string.restype = ctypes.c_char_p
  assert lib.hcb_version_string().decode() == hcb.__version__
  major, minor, patch = map(int, hcb.__version__.split("."))
  assert lib.hcb_version() == major * 10000 + minor * 100 + patch


def test_command_line_flags():
  out = subprocess.run([sys.executable, "-m", "host_callback", "--cflags",
                        "--libs"], capture_output=True, text=True, check=True)
  flags = out.stdout.split()
  assert f"-I{hcb.get_include()}" in flags
  assert any(f.startswith("-I") and os.path.isfile(
      os.path.join(f[2:], "xla", "ffi", "api", "c_api.h")) for f in flags)
  assert "-lhcb" in flags
  bad = subprocess.run([sys.executable, "-m", "host_callback"],
                       capture_output=True, text=True)
  assert bad.returncode == 2 and "--cflags" in bad.stdout


def check_histogram_output(stdout: str) -> None:
  lines = stdout.splitlines()
  assert lines[0] == f"libhcb {hcb.__version__}"
  assert lines[1] == "device 0:" + " 12800" * 8
  assert lines[2] == "device 1:" + " 12800" * 8
  m = re.match(r"records 800 in, 800 out; 204800 samples binned; queue high "
               r"water (\d+) bytes \(bound 65536\)", lines[3])
  assert m and 0 < int(m.group(1)) <= 65536, lines[3]
  assert lines[4] == ("recorded error: bin_samples: expected one int32 "
                      "array, got 1 array(s) of float32")


def test_pure_c_program_built_with_pkg_config(tmp_path):
  env = dict(os.environ, PKG_CONFIG_PATH=hcb.get_pkgconfig_dir())
  flags = subprocess.run(["pkg-config", "--cflags", "--libs", "hcb"],
                         capture_output=True, text=True, check=True,
                         env=env).stdout.split()
  exe = str(tmp_path / "histogram")
  subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2",
                  os.path.join(PROGRAM, "histogram.c"), *flags, "-lpthread",
                  "-o", exe], check=True)
  run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  check_histogram_output(run.stdout)


def test_pure_c_program_built_with_cmake(tmp_path):
  build = str(tmp_path / "build")
  for cmd in (["cmake", "-S", PROGRAM, "-B", build, "-G", "Ninja",
               f"-Dhcb_DIR={hcb.get_cmake_dir()}"],
              ["cmake", "--build", build]):
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
  run = subprocess.run([os.path.join(build, "histogram")],
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  check_histogram_output(run.stdout)


def test_cmake_package_refuses_an_incompatible_version(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  (src / "CMakeLists.txt").write_text(
      "cmake_minimum_required(VERSION 3.18)\nproject(p LANGUAGES C)\n"
      "find_package(hcb 9.0 CONFIG REQUIRED)\n")
  done = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "b"),
                         f"-Dhcb_DIR={hcb.get_cmake_dir()}"],
                        capture_output=True, text=True)
  assert done.returncode != 0
  assert f"hcbConfig.cmake, version: {hcb.__version__}" in done.stderr
