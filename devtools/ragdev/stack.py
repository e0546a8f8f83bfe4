"""The running dev stack as other commands see it: its stack file and its SoR's tables.

Kept apart from ragdev.dev (which starts the stack and imports both services) so that
`ragstream sor` and `ragstream config --dev` load only what they use and answer at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragcore.errors import ConfigError
from ragcore.plan import PlanConfig
from ragdev.sample import SAMPLE_TABLES
from ragdev.sor.rows import SorWriter
from ragstream.cli import DEV_STACK_FILE

STACK_FILE = DEV_STACK_FILE
#: The dev stack's SoR tables (two, shaped differently) and record policy.
DEV_PLAN = PlanConfig(tables=SAMPLE_TABLES)


def read_stack(data_dir: Path) -> dict[str, Any]:
    """The running dev stack's endpoints and settings (for `ragstream sor`, `ragstream query`
    and `ragstream config --dev`)."""
    path = data_dir / STACK_FILE
    if not path.exists():
        raise ConfigError(f"no running dev stack: {path} not found (start `ragstream dev`)")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def open_sor_writer(data_dir: Path) -> SorWriter:
    """A writer to the running dev stack's system of record (`ragstream sor`): SQL to its
    PostgreSQL (Debezium captures the change), or the embedded SQLite SoR (which publishes
    the change event itself). Only the writer in use is imported."""
    stack = read_stack(data_dir)
    if stack.get("sor_kind") == "postgres":
        from ragdev.sor.postgres_writer import PostgresWriter  # noqa: PLC0415 - psycopg

        return PostgresWriter(stack["sor_dsn"], DEV_PLAN)
    from ragdev.sor.embedded import EmbeddedSor  # noqa: PLC0415 - confluent_kafka

    return EmbeddedSor(Path(stack["sor"]), stack["kafka"], plan=DEV_PLAN)
