"""Adapter configs told apart by their `kind` field: what a config without one means."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, BeforeValidator


def missing_kind(default: str | None, *classes: type[BaseModel]) -> BeforeValidator:
    """A validator to put beside `Field(discriminator="kind")`: a mapping without `kind` is read
    as `default` (so `RAGSTREAM_EMBEDDER__EXECUTION=int8` alone configures the default local
    embedder), or, without a default, is refused with the field and its choices named instead
    of pydantic's "Unable to extract tag using discriminator 'kind'"."""
    choices = [cls.model_fields["kind"].default for cls in classes]
    if default is not None and default not in choices:
        raise ValueError(f"default kind {default!r} is not one of {choices}")
    named = ", ".join(repr(c) for c in choices)

    def fill(value: Any) -> Any:
        if not isinstance(value, Mapping) or "kind" in value:
            return value
        if default is None:
            raise ValueError(
                f"'kind' is missing (in the environment: RAGSTREAM_<FIELD>__KIND); one of {named}"
            )
        return {**value, "kind": default}

    return BeforeValidator(fill)
