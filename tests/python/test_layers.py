"""The layers of docs/architecture.md hold: each folder of src/ includes only
the layers below it, and the extension sees libhcb only through its public
headers.  A file that reaches across (the printer into the runtime, the
runtime into the handlers) fails here, naming the file and the include."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

# What the repository holds, whatever JAX is installed: checked on .venv
# only (pyproject.toml's markers).
pytestmark = pytest.mark.repo

REPO = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

# What each layer may include, besides its own folder: the table in
# docs/architecture.md.  "hcb" is the public API in include/hcb/.
MAY_INCLUDE = {
    "src/base": {"hcb"},
    "src/runtime": {"hcb", "base"},
    "src/print": {"hcb", "base"},
    "src/ffi": {"hcb", "base", "runtime"},
}


def _includes(path: pathlib.Path) -> list[str]:
  return INCLUDE.findall(path.read_text())


def _sources(folder: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in folder.iterdir() if p.suffix in (".c", ".h"))


def test_every_source_folder_is_a_known_layer():
  folders = {f"src/{p.name}" for p in (REPO / "src").iterdir() if p.is_dir()}
  assert folders == set(MAY_INCLUDE)
  assert not _sources(REPO / "src"), "a source file outside any layer"


@pytest.mark.parametrize("layer", sorted(MAY_INCLUDE))
def test_a_layer_includes_only_the_layers_below_it(layer: str):
  allowed = MAY_INCLUDE[layer] | {layer.split("/")[1]}
  crossings = [
      f"{path.relative_to(REPO)}: #include \"{inc}\""
      for path in _sources(REPO / layer)
      for inc in _includes(path)
      if inc.split("/")[0] not in allowed
  ]
  assert not crossings, f"{layer} may include {sorted(allowed)}: {crossings}"


def test_the_extension_uses_only_libhcbs_public_headers():
  ext = REPO / "python" / "_hcb"
  own = {p.name for p in _sources(ext)}
  crossings = [
      f"{path.relative_to(REPO)}: #include \"{inc}\""
      for path in _sources(ext)
      for inc in _includes(path)
      if inc not in own and not inc.startswith("hcb/")
  ]
  assert not crossings, crossings


# ---- the Python package: no import cycles ------------------------------------

PACKAGE = REPO / "python" / "host_callback"


def _module_names() -> set[str]:
  """The package's modules: its Python files, and the extension (_hcb,
  known by its stub), which imports none of them."""
  return {p.stem for p in PACKAGE.iterdir() if p.suffix in (".py", ".pyi")}


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_modules(path: pathlib.Path, modules: set[str]) -> set[str]:
  """The package's modules that ``path`` imports, anywhere in it (inside
  functions too; not under ``if TYPE_CHECKING:``, which never runs).  An
  import of the package itself, or of a name it defines, is one of
  ``__init__``."""
  out: set[str] = set()

  def target(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] != "host_callback":
      return None
    return parts[1] if len(parts) > 1 and parts[1] in modules else "__init__"

  def visit(node: ast.AST) -> None:
    if isinstance(node, ast.If) and _is_type_checking(node.test):
      for child in node.orelse:
        visit(child)
      return
    if isinstance(node, ast.Import):
      for alias in node.names:
        if (t := target(alias.name)) is not None:
          out.add(t)
    elif isinstance(node, ast.ImportFrom):
      base = ("host_callback" + ("." + node.module if node.module else "")
              if node.level else node.module or "")
      if base == "host_callback":
        for alias in node.names:
          out.add(alias.name if alias.name in modules else "__init__")
      elif (t := target(base)) is not None:
        out.add(t)
    for child in ast.iter_child_nodes(node):
      visit(child)

  visit(ast.parse(path.read_text(), str(path)))
  out.discard(path.stem)
  return out


def import_graph() -> dict[str, set[str]]:
  """Module -> the package's modules it imports."""
  modules = _module_names()
  return {m: (_imported_modules(PACKAGE / f"{m}.py", modules)
              if (PACKAGE / f"{m}.py").exists() else set())
          for m in sorted(modules)}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a -> b -> ... -> a) through each group of modules that
  import one another, directly or not."""
  cycles = []
  done: set[str] = set()
  for start in sorted(graph):
    # Depth-first from start, through modules not yet in a reported cycle:
    # a path back to start is a cycle.
    stack = [(start, [start])]
    seen = {start}
    while stack:
      node, path = stack.pop()
      for nxt in sorted(graph[node]):
        if nxt == start:
          cycles.append(path + [start])
          done.update(path)
          stack = []
          break
        if nxt not in seen and nxt not in done:
          seen.add(nxt)
          stack.append((nxt, path + [nxt]))
    done.add(start)
  return cycles


def test_the_import_graph_sees_every_kind_of_import():
  graph = import_graph()
  assert "_tap" in graph["__init__"]           # from host_callback._tap import
  assert "_jax" in graph["_containers"]        # from host_callback import _jax
  assert "__init__" in graph["__main__"]       # from host_callback import __version__
  assert "_tap" in graph["progress"]
  assert "_hcb" in graph["debug"] and not graph["_hcb"]  # the extension
  assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
      ["a", "b", "c", "a"]]


def test_no_module_of_the_package_imports_itself_back():
  cycles = find_cycles(import_graph())
  assert not cycles, "import cycles: " + "; ".join(
      " -> ".join(c) for c in cycles)
