"""The layering of docs/architecture.md, checked on every import statement of the tree.

    devtools/ragdev  ->  ragstream  ->  streams | retrieval_api  ->  ragcore  ->  schemas

The layers are read from the diagram in docs/architecture.md and the packages from the tree, so a
new top-level package fails here until the diagram places it. An import may go down any number of
layers, never up, and never between two packages of one layer. Inside every package the rooms
(its subpackages and top-level modules) import each other without a cycle, so each room can be
read from the ones below it. The check reads the source (ast), so an import inside a function
counts like one at the top.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
#: Where top-level packages live: the repository root, and devtools for the dev distribution.
PACKAGE_HOMES = (REPO_ROOT, REPO_ROOT / "devtools")
NOT_SHIPPED = frozenset({"tests"})
#: The layer diagram: package paths and `|` between arrows, nothing else on the line.
DIAGRAM = re.compile(r"[\w/ |]+(?:──►[\w/ |]+)+")


def discover_packages(homes: Iterable[Path] = PACKAGE_HOMES) -> dict[str, Path]:
    """Every importable top-level package under `homes`: name -> its directory."""
    found: dict[str, Path] = {}
    for home in homes:
        for init in sorted(home.glob("*/__init__.py")):
            if init.parent.name not in NOT_SHIPPED:
                found[init.parent.name] = init.parent
    return found


def parse_layers(text: str) -> list[frozenset[str]]:
    """The layers of the diagram line (`a  ──►  b | c  ──►  d`), top first."""
    lines = [line for line in text.splitlines() if DIAGRAM.fullmatch(line.strip())]
    assert len(lines) == 1, f"expected one layer diagram line in {ARCHITECTURE.name}, got {lines}"
    return [
        frozenset(name.strip().rsplit("/", 1)[-1] for name in layer.split("|"))
        for layer in lines[0].split("──►")
    ]


def allowed_imports(layers: list[frozenset[str]]) -> dict[str, frozenset[str]]:
    """package -> the packages it may import: everything in the layers below its own."""
    allowed = {}
    for depth, layer in enumerate(layers):
        below = frozenset().union(*layers[depth + 1 :])
        for package in layer:
            allowed[package] = below
    return allowed


PACKAGES = discover_packages()
LAYERS = parse_layers(ARCHITECTURE.read_text())
ALLOWED = allowed_imports(LAYERS)


def _module_name(path: Path, package_root: Path) -> list[str]:
    parts = [package_root.name, *path.relative_to(package_root).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path, package_root: Path | None = None) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import in a file; relative imports are resolved when the
    file's package root is given."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                base = node.module
            elif node.level > 0 and package_root is not None:
                here = _module_name(path, package_root)
                is_package = path.name == "__init__.py"
                anchor = here[: len(here) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                continue
            # `from a.b import c` may import the module a.b.c: count both spellings.
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _violations(package: str) -> list[str]:
    root = PACKAGES[package]
    allowed = ALLOWED[package]
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, module in _imports(path, root):
            target = module.split(".")[0]
            if target in PACKAGES and target != package and target not in allowed:
                where = path.relative_to(REPO_ROOT)
                found.append(
                    f"{where}:{line} imports {target} ({package} may import {sorted(allowed)})"
                )
    return sorted(set(found))


def room_graph(root: Path) -> dict[str, set[str]]:
    """room -> the rooms it imports, for the rooms (subpackages and top-level modules) of the
    package at `root`; the package's own __init__ is not a room."""
    rooms = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    rooms |= {p.stem for p in root.glob("*.py") if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {room: set() for room in rooms}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        source = relative[0].removesuffix(".py")
        if source not in rooms:
            continue
        for _, module in _imports(path, root):
            parts = module.split(".")
            if parts[0] == root.name and len(parts) > 1 and parts[1] in rooms - {source}:
                graph[source].add(parts[1])
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_every_package_has_a_place_in_the_documented_layers() -> None:
    documented = frozenset().union(*LAYERS)
    assert set(PACKAGES) - documented == set(), (
        f"place the new package in the layer diagram of {ARCHITECTURE.relative_to(REPO_ROOT)}"
    )
    assert documented - set(PACKAGES) == set()


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_only_go_down_the_layers(package: str) -> None:
    root = PACKAGES[package]
    assert any(root.rglob("*.py")), f"{root} holds no Python file"
    assert _violations(package) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_rooms_of_a_package_import_each_other_without_a_cycle(package: str) -> None:
    assert cycles(room_graph(PACKAGES[package])) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from streams.ingest import IngestHandler\n    import ragcore\n"
    )
    assert list(_imports(module)) == [
        (2, "streams.ingest"),
        (2, "streams.ingest.IngestHandler"),
        (3, "ragcore"),
    ]


def test_the_check_sees_a_cycle_between_rooms(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for sub in ("a", "b"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from pkg.b.y import thing\n")
    (package / "b" / "y.py").write_text("def f():\n    from ..a import x\n")
    (package / "c.py").write_text("import pkg.a\n")
    assert room_graph(package) == {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(room_graph(package)) == [["a", "b"]]


def test_a_new_top_level_package_is_found_and_placed_by_the_diagram(tmp_path: Path) -> None:
    (tmp_path / "newpkg").mkdir()
    (tmp_path / "newpkg" / "__init__.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    assert set(discover_packages([tmp_path])) == {"newpkg"}
    layers = parse_layers("A ──► B: prose\n```\ntools/top  ──►  a | b  ──►  low\n```\n")
    assert layers == [frozenset({"top"}), frozenset({"a", "b"}), frozenset({"low"})]
    assert allowed_imports(layers) == {
        "top": frozenset({"a", "b", "low"}),
        "a": frozenset({"low"}),
        "b": frozenset({"low"}),
        "low": frozenset(),
    }


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
    roots = [*PACKAGES.values(), REPO_ROOT / "tests"]
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
