"""The production wheel, built as the Dockerfile builds it: the five lower layers, no dev tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_the_built_base_wheel_carries_no_dev_tools_or_eval_data(tmp_path: Path) -> None:
    """Build the production wheel as the Dockerfile does (from the same build context) and
    list what it holds. The build runs on a copy: setuptools writes build/ beside its input."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in ("schemas", "ragcore", "streams", "retrieval_api", "ragstream"):
        shutil.copytree(
            REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("ragstream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("ragstream-")}
    assert packages == {"schemas", "ragcore", "streams", "retrieval_api", "ragstream"}
    assert "ragcore/errors.py" in names and "retrieval_api/synonyms.json" in names
    assert not [n for n in names if "golden" in n or "/bench/" in n or "/eval/" in n], names
    assert not [n for n in names if n.endswith((".java", ".properties"))]
