"""The package's rooms import one way only, the core stays framework-free, and code comments say what
and why, never what was measured (docs/DESIGN.md holds decisions, docs/RESULTS.md figures)."""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "byteps_prophet"

# Each room's layer: a room imports only rooms of a lower layer (ARCHITECTURE: data flows one way).
LAYERS = {
    "errors": 0, "units": 1,
    "core": 2,
    "backends": 3, "profile": 3, "switch": 3,
    "sim": 4, "torch": 4, "mxnet": 4,
    "cluster": 5,
    "calibrate": 6, "ab": 6,
    "deploy": 7,
    "cli": 8, "__main__": 9, "__init__": 9,
}
FRAMEWORK_FREE = ("core", "sim", "profile", "switch", "units", "errors")
FRAMEWORKS = ("torch", "mxnet")


def _room(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path):
    """Every absolute module name ``path`` imports, module-level or inside a function."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_room_has_a_layer():
    assert {_room(path) for path in MODULES} <= set(LAYERS)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_only(path):
    room = _room(path)
    upward = [name for name in _imports(path) if name.startswith("byteps_prophet.")
              and (target := name.split(".")[1]) != room and LAYERS[target] >= LAYERS[room]]
    assert not upward, f"{room} (layer {LAYERS[room]}) imports {upward}"


@pytest.mark.parametrize("path", [p for p in MODULES if _room(p) in FRAMEWORK_FREE],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_and_simulator_import_no_framework(path):
    frameworks = [name for name in _imports(path) if name.split(".")[0] in FRAMEWORKS]
    assert not frameworks, frameworks


# A figure with an "x" (0.864x, 1.29x), a notebook or the history folder: measurements and their story.
MEASURED = re.compile(r"\b\d+\.\d+x\b|notebook|docs/history|rounds pooled", re.IGNORECASE)


def _prose(path: Path):
    """``(line, text)`` of every comment and docstring in ``path``."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_comments_carry_no_measurements(path):
    found = [f"{path.name}:{line}: {match.group(0)!r}" for line, text in _prose(path)
             for match in [MEASURED.search(text)] if match]
    assert not found, found
