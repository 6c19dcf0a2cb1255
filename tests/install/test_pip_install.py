"""Installing host_callback the way users do: plain ``pip``.

Each test works on a copy of the checkout's tracked files (what a user
clones), builds with pip's build isolation (build-system.requires fetched
from PyPI into a throwaway environment) and installs into a fresh venv.
They need PyPI (pip's cache makes later runs quick) and take a few minutes,
so `make test` runs them once, in the development environment
(`make test-install`), not in every JAX combination.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What a user's first program does: a tap, a barrier, a checked call.
SMOKE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import host_callback as hcb

    seen = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(a.tolist()), x) * 2)
    y = f(jnp.arange(3.0))
    hcb.barrier_wait()
    r = jax.jit(lambda x: hcb.call(np.sin, x, result_shape=x))(jnp.zeros(2))
    print("jax", jax.__version__, "tapped", seen, "doubled", y.tolist(),
          "called", r.tolist())
""")
SMOKE_OUTPUT = "tapped [[0.0, 1.0, 2.0]] doubled [0.0, 2.0, 4.0] called [0.0, 0.0]"


def _run(*cmd: object, cwd: pathlib.Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  env.pop("HCB_XLA_INCLUDE_DIR", None)
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True,
                        capture_output=True, timeout=900)
  if check:
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}")
  return done


def _tracked_files() -> list[str]:
  out = _run("git", "ls-files", "-z", cwd=ROOT).stdout
  return [p for p in out.split("\0") if p]


def _snapshot(tree: pathlib.Path) -> set[str]:
  return {str(p.relative_to(tree)) for p in tree.rglob("*")}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """A copy of the tracked files: the source tree a user clones."""
  dest = tmp_path_factory.mktemp("checkout") / "host_callback"
  for rel in _tracked_files():
    src = ROOT / rel
    if src.is_file():
      target = dest / rel
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(src.read_bytes())
      target.chmod(src.stat().st_mode)
  return dest


def _venv(where: pathlib.Path) -> pathlib.Path:
  _run(sys.executable, "-m", "venv", where)
  return where / "bin" / "python"


def _install_and_run_smoke(what: pathlib.Path, tmp_path: pathlib.Path) -> None:
  """Installs ``what`` (a source tree or a wheel) into a fresh venv and runs
  the first program there."""
  py = _venv(tmp_path / "venv")
  _run(py, "-m", "pip", "install", "-q", what)
  done = _run(py, "-c", SMOKE, cwd=tmp_path)
  assert SMOKE_OUTPUT in done.stdout, done.stdout + done.stderr
  # The wheel's start-up hook (HOST_CALLBACK_PATCH, docs/migrating.md):
  # JAX's callbacks and the removed module are host_callback's, no edit.
  patched = _run("env", "HOST_CALLBACK_PATCH=jax,legacy", py, "-c",
                 "import jax.experimental.host_callback as old, jax; "
                 "print(old.id_tap.__module__, jax.debug.print.__module__)",
                 cwd=tmp_path)
  assert patched.stdout == "host_callback._tap host_callback.debug\n", (
      patched.stdout + patched.stderr)


def test_pip_install_with_build_isolation_into_a_fresh_venv(
    checkout: pathlib.Path, tmp_path: pathlib.Path) -> None:
  before = _snapshot(checkout)
  _install_and_run_smoke(checkout, tmp_path)
  # The build happened elsewhere: the source tree is as it was.
  assert _snapshot(checkout) == before


def test_sdist_carries_the_docs_and_builds_a_wheel(
    checkout: pathlib.Path, tmp_path: pathlib.Path) -> None:
  before = _snapshot(checkout)
  dist = tmp_path / "dist"
  _run(sys.executable, "-m", "build", "--sdist", "--outdir", dist, checkout)
  (sdist,) = dist.glob("host_callback-*.tar.gz")
  with tarfile.open(sdist) as tar:
    names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
  for needed in ("LICENSE", "README.md", "pyproject.toml", "CMakeLists.txt",
                 "docs/c_api.md", "docs/runtime.md", "include/hcb/hcb.h",
                 "src/runtime/runtime.c", "python/_hcb/module.c",
                 "python/host_callback/__init__.py",
                 "python/host_callback/_hcb.pyi",
                 "python/_host_callback_startup.py",
                 "python/host_callback_patch.pth"):
    assert needed in names, f"{needed} is missing from {sdist.name}"

  # pip wheel from the sdist (isolated), then the wheel into a fresh venv.
  wheels = tmp_path / "wheels"
  _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels,
       sdist)
  (wheel,) = wheels.glob("host_callback-*.whl")
  _install_and_run_smoke(wheel, tmp_path)
  assert _snapshot(checkout) == before


def test_a_build_without_jaxlib_says_what_is_missing(
    checkout: pathlib.Path, tmp_path: pathlib.Path) -> None:
  # Everything the build needs except jaxlib, and no isolation: CMake must
  # say that the XLA FFI header comes with jaxlib.
  py = _venv(tmp_path / "venv")
  _run(py, "-m", "pip", "install", "-q", "scikit-build-core", "numpy")
  done = _run(py, "-m", "pip", "install", "--no-build-isolation", checkout,
              check=False)
  assert done.returncode != 0
  out = done.stdout + done.stderr
  assert "cannot find the XLA FFI header" in out, out[-4000:]
  assert "jaxlib" in out, out[-4000:]
