"""A clone anywhere passes its tests: no test reads outside the checkout.

Two checks: statically, no test source names a path of one particular machine or climbs out of
the checkout (`".."` joined onto a path, `Path(__file__).parents[n]` above the repository);
at run time, tests/reads.py's audit hook fails any test (not marked `external`) that opens a file
outside the checkout, the temp dir, the tests' caches and the installed software.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reads import AUDIT, ReadAudit, is_outside

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = REPO_ROOT / "tests"
#: Absolute paths that belong to one machine's layout (a checkout, a home, a mount).
MACHINE_PATH = re.compile(r"/(?:work|home|root|mnt|media|srv|Users|data)(?:/|$)")
#: Calls that take a path.
PATH_CALLS = frozenset({"Path", "PurePath", "open", "join", "read_text", "read_bytes"})


def _escapes(path: Path, source: str) -> list[str]:
    """`line: what` for each place in `source` that names a machine path or leaves the checkout,
    in line order."""
    return sorted(_find_escapes(path, source), key=lambda found: int(found.split(":")[0]))


def _find_escapes(path: Path, source: str) -> Iterator[str]:
    tree = ast.parse(source, filename=str(path))
    parents: dict[ast.AST, ast.AST] = {
        child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
    }
    depth = len(path.relative_to(REPO_ROOT).parts) - 1  # parents[depth] is the repository
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if MACHINE_PATH.match(text):
                yield f"{node.lineno}: absolute path {text!r}"
            if text == ".." or text.startswith(("../", "..\\")):
                parent = parents.get(node)
                joined = isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div)
                called = isinstance(parent, ast.Call) and (
                    getattr(parent.func, "id", None) in PATH_CALLS
                    or getattr(parent.func, "attr", None) in PATH_CALLS
                )
                if joined or called:
                    yield f"{node.lineno}: climbs out with {text!r}"
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and node.slice.value > depth
            and "__file__" in ast.unparse(node.value)
        ):
            yield f"{node.lineno}: {ast.unparse(node)} is above the repository"


def test_no_test_source_names_a_machine_path_or_climbs_out_of_the_checkout() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{where}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()  # this file holds the examples below
        for where in _escapes(path, path.read_text())
    ]
    assert found == []


def test_the_static_check_sees_each_kind_of_escape() -> None:
    here = TESTS / "pkg" / "test_x.py"
    source = (
        'A = Path("/home/someone/vectors")\n'
        'B = Path(__file__).parents[1] / ".." / "elsewhere"\n'
        "C = Path(__file__).resolve().parents[3]\n"
        'D = open("../elsewhere/x")\n'
        'E = validate("../acme")\n'  # a bad tenant name, not a path
        'F = Path(__file__).parents[2] / "README.md"\n'
    )
    assert _escapes(here, source) == [
        "1: absolute path '/home/someone/vectors'",
        "2: climbs out with '..'",
        "3: Path(__file__).resolve().parents[3] is above the repository",
        "4: climbs out with '../elsewhere/x'",
    ]


def test_only_reads_outside_the_allowed_roots_count(tmp_path: Path) -> None:
    roots = [str(tmp_path / "repo"), "/usr"]
    assert not is_outside(str(tmp_path / "repo" / "tests" / "x"), roots)
    assert not is_outside("/usr/lib/python3/x.py", roots)
    assert is_outside(str(tmp_path / "shared" / "vectors" / "x"), roots)
    assert is_outside(str(tmp_path / "repo-other" / "x"), roots)  # a prefix, not a parent


def test_the_audit_hook_records_a_file_opened_outside(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("data")
    audit = ReadAudit(roots=[str(tmp_path / "repo")])
    sys.addaudithook(audit)  # stays installed, disarmed, for the rest of the process
    audit.arm()
    try:
        outside.read_text()
        (tmp_path / "repo").mkdir()
        (tmp_path / "repo" / "inside.txt").write_text("ok")
    finally:
        found = audit.disarm()
    outside.read_text()  # disarmed: not recorded
    assert found == [str(outside)]
    assert audit.disarm() == []


def test_the_session_audit_is_armed_while_a_test_runs() -> None:
    assert AUDIT.armed
    assert str(REPO_ROOT) in AUDIT.roots
