"""Lazy package attributes (PEP 562), so that importing a port or a spec never pulls in an
adapter's heavy dependencies (onnxruntime, openai, prometheus_client)."""

from __future__ import annotations

import functools
import importlib
import operator
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any


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


def kind_union(
    from_modules: Mapping[str, str], *names: str, default: str | None = None
) -> Callable[[], Any]:
    """A `computed` builder of the union of the config classes `names` (each imported from its
    module in `from_modules` only when built), told apart by their `kind` field, `default`
    when a mapping has none (`ragcore.kinds.missing_kind`): what settings validate an
    adapter's config with."""

    def build() -> Any:
        from pydantic import Field  # noqa: PLC0415 - only needed with the adapters

        from ragcore.kinds import missing_kind  # noqa: PLC0415 - imports pydantic

        classes = [getattr(importlib.import_module(from_modules[n]), n) for n in names]
        return Annotated[
            functools.reduce(operator.or_, classes),
            Field(discriminator="kind"),
            missing_kind(default, *classes),
        ]

    return build
