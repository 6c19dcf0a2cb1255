"""Every command that ``make test`` and ``make check`` run is installed by
the Makefile on a fresh Debian machine: by a package of ``DEBIAN_PACKAGES``
(or one it depends on), by Debian itself (its required packages, which
every installation has), in a virtualenv the Makefile makes, or in this
checkout.

How: ``make -n -B`` prints every recipe of those targets without running
it (``-B``: also those whose stamps are up to date); the first word of
each command in them (after ``;``, ``&&``, ``|``, ``$(``, ``then``, ...,
and the command that ``timeout`` runs) is a command the recipe needs, and
so is each command the tests start with ``subprocess`` and ``ninja`` for
``-G Ninja``.  dpkg says which package gives each command on this machine,
and apt which packages ``DEBIAN_PACKAGES`` brings.  A recipe that starts
using a command nothing installs (clang-format was one) fails here, naming
the command and the package that has it.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TARGETS = ("test", "check")

# What the Makefile cannot install, because it runs before it: make itself.
# (apt-get and sudo, which the debian target runs, are only reached through
# $SUDO and Debian's required packages.)
PREREQUISITES = {"make": "the reader runs make itself"}

SHELL_WORDS = {
    "if", "then", "else", "elif", "fi", "for", "in", "do", "done", "while",
    "until", "case", "esac", "!", "{", "}", "[[", "]]", "test", "[", "echo",
    "printf", "cd", "export", "set", "true", "false", "exit", "return",
    "read", "local", "shift", "eval", "exec", "wait", "command", "type", ":",
    "break", "continue", "trap", "unset", "source", ".", "kill", "umask"}
SEPARATORS = {";", "&", "&&", "|", "||", "(", "{", "then", "do", "else",
              "elif", "if", "while", "until", "!", "$("}

# What the repository holds, whatever JAX is installed: checked on .venv
# only (pyproject.toml's markers).
pytestmark = [pytest.mark.repo, pytest.mark.skipif(
    shutil.which("dpkg") is None or shutil.which("apt-cache") is None,
    reason="the Makefile installs Debian packages: checked on Debian only")]


@functools.lru_cache(maxsize=None)
def _make_dry_run(*targets: str) -> str:
  env = {k: v for k, v in os.environ.items()
         if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
  done = subprocess.run(["make", "-n", "-B", *targets], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  return done.stdout


def recipe_lines(text: str) -> list[str]:
  """The shell commands of ``make -n``'s output, continuation lines
  joined; make's own messages left out."""
  lines = []
  for line in text.replace("\\\n", " ").splitlines():
    if line.startswith(("make[", "make:")) or not line.strip():
      continue
    lines.append(line)
  return lines


def commands_of(line: str) -> list[str]:
  """The command words of one shell line: the first word of each simple
  command (after assignments and redirections), inside ``$(...)`` too, and
  the command that ``timeout``, ``env`` or ``xargs`` runs."""
  lexer = shlex.shlex(line.replace("$(", " $( ").replace("`", " ` "),
                      posix=True, punctuation_chars=";&|()<>")
  lexer.wordchars += "$-=./:+%,{}[]!@~^*?#"
  lexer.commenters = ""
  lexer.whitespace_split = False
  tokens = list(lexer)
  out = []
  for tok in tokens:  # substitutions inside quotes: "$(id -u)"
    if tok != "$(" and "$(" in tok:
      for inner in re.findall(r"\$\(\s*([^()]*)\)", tok):
        out.extend(commands_of(inner))
  start = True
  skip_to_separator = False
  i = 0
  while i < len(tokens):
    tok = tokens[i]
    i += 1
    if tok in SEPARATORS or tok == "`":
      start, skip_to_separator = True, False
      continue
    if tok in (")", ";;"):
      continue
    if tok in (">", ">>", "<", ">&", "<&", "2>", "&>") or re.fullmatch(
        r"\d*[<>]+&?", tok):
      i += 1  # the file (or fd) the redirection names
      continue
    if skip_to_separator or not start:
      continue
    if re.fullmatch(r"\w+=.*", tok):  # an assignment before the command
      continue
    start = False
    if tok in ("for", "case"):
      skip_to_separator = True
      continue
    if tok.startswith("$"):  # "$SUDO apt-get": the next word may be one
      start = True
      continue
    if tok in SHELL_WORDS:
      start = tok in ("if", "then", "else", "do", "while", "!", "{")
      continue
    out.append(tok)
    if tok in ("timeout", "env", "xargs", "nice"):
      # the command it runs: after its options (and timeout's duration)
      while i < len(tokens) and (tokens[i].startswith("-") or
                                 re.fullmatch(r"\w+=.*", tokens[i]) or
                                 (tok == "timeout" and
                                  re.fullmatch(r"[\d.]+[smhd]?", tokens[i]))):
        i += 1
      start = True
  return out


def test_the_command_parser_finds_each_command():
  line = ('test -x .venv/bin/python || $(tools/find-python 3.11) -m venv '
          '.venv; for t in build/c/test_*; do A=1 timeout 900 valgrind -q '
          '$t >log 2>&1 || { cat log; exit 1; }; done; if [ -n "$x" ]; then '
          'SUDO=$( [ "$(id -u)" = 0 ] || echo sudo ); $SUDO apt-get update '
          '-qq && $SUDO apt-get install -y $x; fi')
  assert set(commands_of(line)) == {"apt-get", "cat", "id", "timeout",
                                    "tools/find-python", "valgrind"}
  assert commands_of("clang-format --dry-run --Werror src/*.c") == [
      "clang-format"]
  assert commands_of("HCB_WERROR=ON .venv/bin/python -m pip install .") == [
      ".venv/bin/python"]


def _test_commands() -> set[str]:
  """The commands the tests start (literal first words of subprocess
  calls), and ninja for a ``-G Ninja`` anywhere."""
  found = set()
  for path in (REPO / "tests").rglob("*.py"):
    text = path.read_text()
    found.update(re.findall(
        r"subprocess\.(?:run|Popen|check_call|check_output)\(\s*\[\s*"
        r"[\"']([\w.+-]+)[\"']", text))
    found.update(re.findall(r"\b_run\(\s*[\"']([\w.+-]+)[\"']", text))
    if '"Ninja"' in text or "-G Ninja" in text:
      found.add("ninja")
  return found


def needed_commands() -> dict[str, str]:
  """Every bare command (no path) that the recipes of TARGETS and the
  tests run, with where it was seen."""
  needed: dict[str, str] = {}
  dry_run = _make_dry_run(*TARGETS)
  for line in recipe_lines(dry_run):
    for cmd in commands_of(line):
      needed.setdefault(cmd, f"make -n {' '.join(TARGETS)}: {line[:100]}")
  dry_run = _make_dry_run(*TARGETS)
  if "-G Ninja" in dry_run:
    needed.setdefault("ninja", "cmake -G Ninja")
  for compiler in re.findall(r"-DCMAKE_C(?:XX)?_COMPILER=(\S+)", dry_run):
    needed.setdefault(compiler, f"cmake -DCMAKE_C_COMPILER={compiler}")
  for cmd in _test_commands():
    needed.setdefault(cmd, "a test's subprocess")
  return needed


def _tracked() -> set[str]:
  out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                       text=True, check=True).stdout
  return set(out.splitlines())


def _made_or_tracked(cmd: str, tracked: set[str]) -> bool:
  """A path: made by the Makefile (a virtualenv, a build) or in the
  checkout."""
  path = pathlib.Path(cmd)
  if path.is_absolute():
    try:
      path = path.relative_to(REPO)
    except ValueError:
      return False
  first = path.parts[0]
  return (first.startswith(".venv") or first == "build" or
          str(path) in tracked)


def _dpkg_package(cmd: str) -> str | None:
  """The Debian package that gives ``cmd`` on this machine."""
  where = shutil.which(cmd)
  if where is None:
    return None
  real = os.path.realpath(where)
  # merged /usr: dpkg may know /bin/mkdir for what PATH finds in /usr/bin
  aliases = [re.sub(r"^/usr/(s?bin)/", r"/\1/", p) for p in (where, real)]
  for path in (where, real, *aliases):
    done = subprocess.run(["dpkg", "-S", path], capture_output=True,
                          text=True)
    if done.returncode == 0:
      return done.stdout.split(":")[0].split(",")[0].strip()
  return None


def _debian_packages() -> list[str]:
  text = (REPO / "Makefile").read_text().replace("\\\n", " ")
  m = re.search(r"^DEBIAN_PACKAGES\s*:=\s*(.*)$", text, re.MULTILINE)
  assert m, "the Makefile names its Debian packages in DEBIAN_PACKAGES"
  return m.group(1).split()


def _installed_by(packages: list[str]) -> set[str]:
  return set(_depends(tuple(packages)))


@functools.lru_cache(maxsize=None)
def _depends(packages: tuple[str, ...]) -> frozenset[str]:
  """The packages that installing ``packages`` brings (their dependencies,
  recursively; not what they only recommend)."""
  out = subprocess.run(
      ["apt-cache", "depends", "--recurse", "--no-recommends",
       "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
       "--no-enhances", *packages], capture_output=True, text=True,
      check=True, timeout=300).stdout
  return frozenset(line.strip("<>").split(":")[0]
                   for line in out.splitlines()
                   if line and not line.startswith(" "))


def _required() -> set[str]:
  """Debian's required packages: in every installation."""
  out = subprocess.run(["dpkg-query", "-W", "-f",
                        "${Package} ${Essential} ${Priority}\\n"],
                       capture_output=True, text=True, check=True).stdout
  return {f[0] for f in (line.split() for line in out.splitlines())
          if len(f) == 3 and (f[1] == "yes" or f[2] == "required")}


def test_every_command_of_make_test_is_installed_by_the_makefile():
  tracked = _tracked()
  brought = _installed_by(_debian_packages()) | _required()
  missing = []
  for cmd, where in sorted(needed_commands().items()):
    if "/" in cmd:
      if not _made_or_tracked(cmd, tracked):
        missing.append(f"{cmd}: a path the Makefile does not make ({where})")
      continue
    if cmd in PREREQUISITES:
      continue
    package = _dpkg_package(cmd)
    if package is None:
      missing.append(f"{cmd}: no Debian package gives it here ({where})")
    elif package not in brought:
      missing.append(f"{cmd}: from Debian's {package}, which DEBIAN_PACKAGES "
                     f"does not bring ({where})")
  assert not missing, "\n".join(missing)


# The compiler runtimes that clang links for the sanitizer and fuzzer
# builds (HCB_SANITIZE, HCB_BUILD_FUZZERS): files, not commands.
RUNTIMES = {"HCB_SANITIZE=address": ["asan", "ubsan_standalone"],
            "HCB_SANITIZE=thread": ["tsan"],
            "HCB_BUILD_FUZZERS=ON": ["fuzzer"]}


def test_the_sanitizer_and_fuzzer_runtimes_are_installed_by_the_makefile():
  dry_run = _make_dry_run(*TARGETS)
  brought = _installed_by(_debian_packages()) | _required()
  missing = []
  for option, runtimes in RUNTIMES.items():
    assert option in dry_run, f"make test no longer builds with {option}"
    for name in runtimes:
      path = subprocess.run(
          ["clang", f"-print-file-name=libclang_rt.{name}-x86_64.a"],
          capture_output=True, text=True, check=True).stdout.strip()
      done = subprocess.run(["dpkg", "-S", path], capture_output=True,
                            text=True)
      package = done.stdout.split(":")[0] if done.returncode == 0 else None
      if package not in brought:
        missing.append(f"{option} links {path}, from Debian's {package}, "
                       "which DEBIAN_PACKAGES does not bring")
  assert not missing, "\n".join(missing)


def test_the_check_sees_the_commands_it_must():
  needed = needed_commands()
  for cmd in ("clang-format", "clang", "cmake", "ctest", "valgrind",
              "pkg-config", "cc", "git", "ninja", "tools/find-python",
              "apt-get", "dpkg"):
    assert cmd in needed or any(c.endswith(cmd) for c in needed), cmd


# ---- make help and make demo ------------------------------------------------

def _targets_of_the_makefile() -> set[str]:
  """Every target a reader may name: the .PHONY ones."""
  text = (REPO / "Makefile").read_text().replace("\\\n", " ")
  return {t for line in re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE)
          for t in line.split()}


def test_make_help_lists_every_target_with_what_it_does():
  done = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  listed = {}
  for line in done.stdout.splitlines()[1:]:
    name, _, text = line.strip().partition(" ")
    listed[name] = text.strip()
  assert set(listed) == _targets_of_the_makefile()
  assert all(listed.values()), listed


def _path_without(tmp_path: pathlib.Path, *hidden: str) -> str:
  """A PATH of one directory that holds every command of this PATH but
  ``hidden`` (links to them)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for directory in os.environ["PATH"].split(os.pathsep):
    if not os.path.isdir(directory):
      continue
    for name in os.listdir(directory):
      path = os.path.join(directory, name)
      if (name not in hidden and not (bin_dir / name).exists()
          and os.access(path, os.X_OK) and not os.path.isdir(path)):
        (bin_dir / name).symlink_to(path)
  return str(bin_dir)


def test_the_demo_needs_no_apt_get_where_its_tools_are_there(tmp_path):
  # as on a machine without apt-get (or a user who is not root) that has a
  # C compiler and Python 3.11
  path = _path_without(tmp_path, "apt-get", "apt", "dpkg", "sudo")
  done = subprocess.run(["tools/demo-needs"], cwd=REPO, capture_output=True,
                        text=True, env={**os.environ, "PATH": path},
                        timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("== the machine has what the demo needs")


def test_the_demo_says_what_is_missing_where_it_cannot_install_it(tmp_path):
  compilers = ("cc", "gcc", "clang", "x86_64-linux-gnu-gcc")
  path = _path_without(tmp_path, "apt-get", "apt", "dpkg", "sudo",
                       *compilers)
  done = subprocess.run(["tools/demo-needs"], cwd=REPO, capture_output=True,
                        text=True, env={**os.environ, "PATH": path},
                        timeout=120)
  assert done.returncode == 1
  assert done.stderr == (
      "make demo needs a C compiler (cc, gcc or clang). Install it (on "
      "Debian or Ubuntu: apt-get install gcc), then run make demo again.\n")


def test_the_demo_pins_what_the_development_environment_pins():
  def pins(name: str) -> dict[str, str]:
    lines = (REPO / "requirements" / name).read_text().splitlines()
    return dict(line.split("==") for line in lines
                if line and not line.startswith("#"))
  demo, main = pins("demo.txt"), pins("py3.11-jax0.10.2.txt")
  shared = set(demo) & set(main)
  assert {"jax", "jaxlib", "numpy", "scikit-build-core"} <= shared
  assert {k: demo[k] for k in shared} == {k: main[k] for k in shared}
