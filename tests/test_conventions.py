"""The suite's own rules: one kind marker per test, no skip under CI outside `external`, no test
that returns early to pass. The hooks are the real conftest's, run on throwaway test files
through pytest's own `pytester`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent
CONFTEST = (TESTS / "conftest.py").read_text()


def test_a_test_without_a_kind_or_with_two_is_refused_at_collection(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_kinds="""
        import pytest

        def test_no_kind():
            assert 1 + 1 == 2

        @pytest.mark.unit
        @pytest.mark.integration
        def test_two_kinds():
            assert True

        @pytest.mark.unit
        def test_one_kind():
            assert True
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_no_kind: no kind*", "*test_two_kinds: integration, unit*"])
    assert "test_one_kind:" not in result.stderr.str()


@pytest.mark.parametrize(
    ("module", "external"),
    [
        ("pytest.skip('no broker here', allow_module_level=True)", False),
        ("pytest.importorskip('no_such_module_anywhere')", False),
        (
            "pytestmark = pytest.mark.external\npytest.skip('no server', allow_module_level=True)",
            True,
        ),
    ],
)
def test_a_module_skipped_at_collection_fails_under_ci_unless_external(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, module: str, external: bool
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_skipping=f"import pytest\n{module}\n\ndef test_x():\n    pass\n")
    monkeypatch.setenv("CI", "true")
    ci = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    monkeypatch.setenv("CI", "")
    local = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert local.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    if external:
        assert ci.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    else:
        assert ci.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the run
        ci.stdout.fnmatch_lines(["*skipped at collection under CI*"])


def _returns_in_tests(path: Path, root: Path = TESTS) -> list[str]:
    """`return` statements in test functions (outside nested functions and classes)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        stack: list[ast.AST] = list(node.body)
        while stack:
            child = stack.pop()
            if isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
            ):
                continue
            if isinstance(child, ast.Return):
                found.append(f"{path.relative_to(root)}:{child.lineno} in {node.name}")
            stack.extend(ast.iter_child_nodes(child))
    return found


def test_no_test_returns_early() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50
    assert [r for f in files for r in _returns_in_tests(f)] == []


def test_the_return_check_sees_an_early_return(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "def test_x(flag):\n    if flag:\n        return\n    def helper():\n        return 1\n"
    )
    assert _returns_in_tests(sample, root=tmp_path) == ["test_sample.py:3 in test_x"]
