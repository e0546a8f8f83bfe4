"""Lazy package attributes (PEP 562), so that importing a port or a spec never pulls in an
adapter's heavy dependencies (onnxruntime, openai, prometheus_client)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str,
    from_modules: Mapping[str, str],
    computed: Mapping[str, Callable[[], Any]] | None = None,
) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: a name in `from_modules` is imported from the
    module named there on first use, a name in `computed` is built by its function; either is
    then stored on the package, so the lookup runs once per name."""
    builders = dict(computed or {})

    def getattr_(name: str) -> Any:
        if name in from_modules:
            value = getattr(importlib.import_module(from_modules[name]), name)
        elif name in builders:
            value = builders[name]()
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    return getattr_
