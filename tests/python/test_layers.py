"""The layers of docs/architecture.md hold: each folder of src/ includes only
the layers below it, and the extension sees libhcb only through its public
headers.  A file that reaches across (the printer into the runtime, the
runtime into the handlers) fails here, naming the file and the include."""

from __future__ import annotations

import pathlib
import re

import pytest

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
