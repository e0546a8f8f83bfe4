"""Find data files shipped inside installed packages without importing those packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ragcore.errors import ConfigError


def package_dir(package: str) -> Path:
    """The directory of an installed package, found without executing its `__init__`."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package {package!r} is not installed (see README: Local embedder)")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, relative: str) -> Path:
    """A file inside an installed package; a clear ConfigError when it is absent."""
    path = package_dir(package) / relative
    if not path.is_file():
        raise ConfigError(f"{relative!r} not found in package {package!r} at {path}")
    return path
