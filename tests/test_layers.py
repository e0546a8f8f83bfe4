"""The layering of docs/architecture.md, checked on every import statement of the tree.

    devtools/ragdev  ->  ragstream  ->  streams | retrieval_api  ->  ragcore  ->  schemas

An import may go down any number of layers, never up, and never between the two services. The
check reads the source (ast), so an import inside a function counts like one at the top.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]

#: package -> (its source directory, the packages it may import besides itself)
LAYERS: dict[str, tuple[Path, frozenset[str]]] = {
    "schemas": (REPO_ROOT / "schemas", frozenset()),
    "ragcore": (REPO_ROOT / "ragcore", frozenset({"schemas"})),
    "streams": (REPO_ROOT / "streams", frozenset({"ragcore", "schemas"})),
    "retrieval_api": (REPO_ROOT / "retrieval_api", frozenset({"ragcore", "schemas"})),
    "ragstream": (
        REPO_ROOT / "ragstream",
        frozenset({"streams", "retrieval_api", "ragcore", "schemas"}),
    ),
    "ragdev": (
        REPO_ROOT / "devtools" / "ragdev",
        frozenset({"ragstream", "streams", "retrieval_api", "ragcore", "schemas"}),
    ),
}


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def _violations(package: str) -> list[str]:
    root, allowed = LAYERS[package]
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, target in _imports(path):
            if target in LAYERS and target != package and target not in allowed:
                where = path.relative_to(REPO_ROOT)
                found.append(
                    f"{where}:{line} imports {target} ({package} may import {sorted(allowed)})"
                )
    return found


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_only_go_down_the_layers(package: str) -> None:
    root, _ = LAYERS[package]
    assert any(root.rglob("*.py")), f"{root} holds no Python file"
    assert _violations(package) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from streams.ingest import IngestHandler\n    import ragcore\n"
    )
    assert list(_imports(module)) == [(2, "streams"), (3, "ragcore")]


def test_the_production_distribution_holds_no_dev_tools() -> None:
    """The base wheel's packages (pyproject) are the four lower layers and the command line."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in include} == {
        "schemas",
        "ragcore",
        "streams",
        "retrieval_api",
        "ragstream",
    }
    assert not (REPO_ROOT / "ragstream" / "eval").exists()
    assert not (REPO_ROOT / "ragstream" / "bench").exists()
    assert not (REPO_ROOT / "ragstream" / "services").exists()


#: Citations of documents that are not in the repository (the old design notes and seeds).
OUTSIDE = re.compile(r"DESIGN (?:decision|\d|:)|\.\./shared|seed 00\d|ENVIRONMENT\.md|MODELS\.md")
DOC_REF = re.compile(r"docs/[\w./-]+\.md")


def test_the_code_cites_only_documents_in_the_repository() -> None:
    roots = [*(root for root, _ in LAYERS.values()), REPO_ROOT / "tests"]
    files = [
        p for r in roots for p in sorted(r.rglob("*")) if p.suffix in {".py", ".pyi", ".proto"}
    ]
    outside, missing = [], []
    for path in [*files, REPO_ROOT / "README.md"]:
        text = path.read_text()
        where = path.relative_to(REPO_ROOT)
        outside += [f"{where}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
        missing += [f"{where}: {r}" for r in DOC_REF.findall(text) if not (REPO_ROOT / r).is_file()]
    assert outside == []
    assert missing == []
