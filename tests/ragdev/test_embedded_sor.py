"""The dev stack's embedded SoR (SQLite + Debezium-format publishing) against a real broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragdev.services.tansu import TansuBroker
from ragdev.sor.embedded import EmbeddedSor
from ragdev.stack import DEV_PLAN


@pytest.mark.integration
def test_closing_the_embedded_sor_twice_is_a_no_op(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    sor = EmbeddedSor(tmp_path / "sor.sqlite", kafka_broker.bootstrap_servers, plan=DEV_PLAN)
    sor.close()
    sor.close()  # e.g. a dev stack's shutdown path and its error path both close it
    assert (tmp_path / "sor.sqlite").exists()
