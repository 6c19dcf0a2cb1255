"""Every code block of README.md and docs/*.md runs as written.

The blocks of one document run in order, in one empty folder of their
own, the way a reader would paste them into a shell and files:

- ``python``: saved and run with this test's Python (the package as
  installed in its venv), from that folder, on one CPU device as a user
  has it.  Where a block says what it prints (``# prints: text``, lines
  that follow it as ``#         more text``), its standard output must be
  exactly those lines.
- ``sh``: run by ``bash -e`` in that folder, with the venv first on
  ``PATH`` (so ``python`` is its Python); ``# prints:`` as for Python.
- ``c``, ``cmake``: a file whose name is the block's first line, as a
  comment (``/* mine.c ... */``, ``# CMakeLists.txt``), saved before any
  block runs; some ``sh`` block of the same document must build it.
- ``text``: a diagram or a layout, not code: left alone.

A block that cannot run here (it needs a GPU, or is one of the project's
own ``make`` commands, which run this test) is preceded by a line
``<!-- not run: the reason -->``; the test lists it as skipped with that
reason.  A block without a language, or with another one, fails, so a
block added to any document is run or explicitly marked.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import NamedTuple

import pytest

from conftest import run_python

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = ("python", "sh", "c", "cmake", "text")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
FILE_NAME = re.compile(r"^\s*(?:/\*|//|#)\s*([\w.-]+\.(?:c|h)|CMakeLists\.txt)\b")
TIMEOUT = 600


class Block(NamedTuple):
  doc: pathlib.Path
  line: int  # of the opening fence, 1-based
  language: str
  code: str
  not_run: str | None  # the reason, for a block marked so

  def where(self) -> str:
    return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks_of(doc: pathlib.Path) -> list[Block]:
  """The fenced code blocks of a Markdown file, in order."""
  lines = doc.read_text().splitlines()
  out = []
  i = 0
  while i < len(lines):
    m = re.match(r"^(\s*)```(.*)$", lines[i])
    if not m:
      i += 1
      continue
    indent, language = len(m.group(1)), m.group(2).strip()
    start = i
    i += 1
    body = []
    while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
      body.append(lines[i][indent:])
      i += 1
    i += 1
    before = lines[start - 1] if start > 0 else ""
    reason = m2.group(1) if (m2 := NOT_RUN.match(before.strip())) else None
    out.append(Block(doc, start + 1, language, "\n".join(body) + "\n",
                     reason))
  return out


def expected_output(code: str) -> list[str] | None:
  """The lines a block says it prints, or None when it says nothing."""
  expected: list[str] = []
  column = None
  for line in code.splitlines():
    m = re.search(r"#\s?prints:\s?(.*)$", line)
    if m:
      expected.append(m.group(1).rstrip())
      column = m.start(1)
      continue
    stripped = line.rstrip()
    if (column is not None and stripped.lstrip().startswith("#") and
        len(line) > column and not line[:column].strip("# ")):
      expected.append(line[column:].rstrip())
      continue
    column = None
  return expected if expected else None


def _env(work: pathlib.Path) -> dict[str, str]:
  env = dict(os.environ)
  # As a user runs them: one CPU device, output as it comes.
  env.pop("JAX_NUM_CPU_DEVICES", None)
  env.pop("XLA_FLAGS", None)
  env["PYTHONUNBUFFERED"] = "1"
  env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env['PATH']}"
  env["PWD"] = str(work)
  return env


def run_block(block: Block, work: pathlib.Path, index: int) -> None:
  if block.language == "python":
    script = work / f"block_{index}.py"
    script.write_text(block.code)
    done = run_python(None, _env(work), TIMEOUT, path=script.name, cwd=work,
                      replace_env=True)
  else:
    done = subprocess.run(["bash", "-e", "-c", block.code], cwd=work,
                          env=_env(work), text=True, capture_output=True,
                          timeout=TIMEOUT)
  assert done.returncode == 0, (
      f"{block.where()}: the {block.language} block failed "
      f"(exit {done.returncode}):\n{block.code}\n--- stdout\n{done.stdout}"
      f"\n--- stderr\n{done.stderr}")
  expected = expected_output(block.code)
  if expected is not None:
    got = [line.rstrip() for line in done.stdout.splitlines()]
    assert got == expected, (
        f"{block.where()}: the block says it prints {expected}, it printed "
        f"{got}")


def _id(doc: pathlib.Path) -> str:
  return str(doc.relative_to(REPO))


def test_every_block_has_a_language_this_test_knows():
  unknown = [f"{b.where()}: ```{b.language}" for doc in DOCS
             for b in blocks_of(doc) if b.language not in LANGUAGES]
  assert not unknown, (
      f"tag each block with one of {LANGUAGES} (text: not code): {unknown}")


def test_the_output_convention_reads_continuation_lines():
  code = ("print(1)\n# prints: [[1 2]\n#          [3 4]]\nx = 1  # prints: 7\n"
          "# not output\n")
  assert expected_output(code) == ["[[1 2]", " [3 4]]", "7"]
  assert expected_output("print(1)\n") is None


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_block_of_the_document_runs(doc: pathlib.Path,
                                          tmp_path: pathlib.Path):
  blocks = [b for b in blocks_of(doc) if b.language in LANGUAGES]
  files = {}
  for b in blocks:
    if b.language in ("c", "cmake") and b.not_run is None:
      m = FILE_NAME.match(b.code.splitlines()[0] if b.code.strip() else "")
      assert m, (f"{b.where()}: a {b.language} block starts with a comment "
                 "that names its file (/* mine.c */, # CMakeLists.txt)")
      files[m.group(1)] = b
  commands = " ".join(b.code for b in blocks
                      if b.language == "sh" and b.not_run is None)
  never_built = [f"{b.where()}: {name}" for name, b in files.items()
                 if name not in commands and not (
                     name == "CMakeLists.txt" and "cmake -S" in commands)]
  assert not never_built, (
      f"no sh block of {_id(doc)} builds {never_built}")
  # The files first, as a reader saves them; then the commands, in order.
  for name, b in files.items():
    (tmp_path / name).write_text(b.code)
  skipped = []
  for index, b in enumerate(blocks):
    if b.not_run is not None:
      skipped.append(f"{b.where()} ({b.language}): {b.not_run}")
    elif b.language in ("python", "sh"):
      run_block(b, tmp_path, index)
  if skipped:
    print("not run:\n  " + "\n  ".join(skipped))


def not_run_blocks() -> list[str]:
  """Every block marked as not run, with its reason (for the docs)."""
  return [f"{b.where()}: {b.not_run}" for doc in DOCS
          for b in blocks_of(doc) if b.not_run is not None]


if __name__ == "__main__":
  # python tests/python/test_docs.py: every block, and whether it runs.
  for doc in DOCS:
    for b in blocks_of(doc):
      state = ("not run: " + b.not_run if b.not_run else
               "not code" if b.language == "text" else "runs")
      print(f"{b.where()}\t{b.language or '(none)'}\t{state}")


def test_the_demo_prints_what_its_docstring_says(tmp_path: pathlib.Path):
  """examples/demo.py (make demo): the device finishes before the host has
  seen most taps (its logger takes 10 ms a tap), barrier_wait returns
  after every tap, and the call and id_print lines follow."""
  done = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py")],
                        cwd=tmp_path, env=_env(tmp_path), text=True,
                        capture_output=True, timeout=TIMEOUT)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  finished = next(i for i, s in enumerate(lines) if "device finished" in s)
  barrier = next(i for i, s in enumerate(lines) if "barrier_wait returned" in s)
  loss_taps = [i for i, s in enumerate(lines) if re.search(r"tap  step .* loss",
                                                           s)]
  assert len(loss_taps) == 16 and loss_taps == sorted(loss_taps)
  assert finished < loss_taps[8], done.stdout  # before most of the 16
  assert loss_taps[-1] < barrier
  assert "call: eigenvalues of [[2.0, 1.0], [1.0, 2.0]] from the host: " \
         "[1.0, 3.0]" in lines[barrier + 1]
  assert lines[barrier + 2:barrier + 4] == ["what: x,x^2", "( 3. 9. )"]
