"""The index converges to the system of record (docs/decisions/change-ordering.md): random
interleavings of commits (with skewed `updated_at` clocks), delayed stream delivery, SoR
re-reads (also racing with the stream from a second process) and restores of the SoR to an
earlier point, over a real PostgreSQL SoR and qdrant-edge, through the worker's real handler.

Without a restore the stream and the re-reads alone bring the index to the SoR; with one,
the runbook's `reconcile --repair` does (docs/runbooks/procedures/sor-restored.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragcore.plan import Plan
from ragcore.prepare import Preparer
from ragcore.sparse import Bm25Encoder
from ragcore.store.ids import TenantId
from ragcore.wiring import payload_schema
from ragdev.services.postgres import PostgresCluster
from ragdev.sor.debezium_format import change_event, encode_key, encode_value
from schemas.entities import Entity
from schemas.events import Op, RawRecord
from streams.adapters import SorRows
from streams.ingest import IngestHandler, RowSource, SorBatch
from streams.reconcile import reconcile
from tests.streams.support import eid
from tests.streams.test_reconcile import Env

pytestmark = pytest.mark.integration

KEYS = ("k0", "k1", "k2")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

#: one step of a run: ("commit", key, text, clock), ("delete", key), ("deliver", n),
#: ("reread", key), ("race", key, text, clock), ("save",), ("restore",)
Step = tuple[Any, ...]

_texts = st.sampled_from(
    ["Pump valve calibration.", "Valve replacement schedule.", "Boiler pressure limits."]
)
_clocks = st.integers(min_value=0, max_value=10_000)  # seconds: any order, like skewed servers
_key = st.sampled_from(KEYS)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), _key, _texts, _clocks),
        st.tuples(st.just("commit"), _key, _texts, _clocks),
        st.tuples(st.just("delete"), _key),
        st.tuples(st.just("deliver"), st.integers(min_value=1, max_value=3)),
        st.tuples(st.just("reread"), _key),
        st.tuples(st.just("race"), _key, _texts, _clocks),
        st.tuples(st.just("save")),
        st.tuples(st.just("restore")),
    ),
    min_size=1,
    max_size=14,
)


class _Racing:
    """A `RowSource` whose read is followed, before the re-read is written, by a hook (a
    commit the worker streams in meanwhile: the race of a second process)."""

    def __init__(self, inner: RowSource) -> None:
        self.inner = inner
        self.after_read: Callable[[], None] | None = None

    def fetch_entity(self, plan: Plan) -> Entity | None:
        found = self.inner.fetch_entity(plan)
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return found


def _unused(_: object) -> Any:
    raise AssertionError("the second handler only re-reads")


class Model:
    """A SoR whose commits become pending change events (delivered in commit order when asked),
    the worker's handler, and a second handler (another process: `ragstream reconcile`)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.lsn = 1000
        self.pending: list[RawRecord] = []
        self.offsets = itertools.count(1)
        self.saved: tuple[list[dict[str, object]], int] | None = None
        self.restored = False
        worker = env.worker
        assert worker.sor is not None
        self.racing = _Racing(SorRows(worker.sor))
        self.cli = IngestHandler(
            decode=_unused,
            plan=_unused,
            preparer=Preparer(worker.embedder.spec, worker.settings.chunking),
            embedder=worker.embedder,
            sparse=Bm25Encoder(),
            store=env.store,
            targets=worker.targets,
            metrics=worker.metrics,
            rows=self.racing,
            keyword_fields=payload_schema(worker.settings.plan).keyword_fields,
        )

    def row(self, key: str) -> dict[str, object] | None:
        rows = self.env.sql("SELECT * FROM entities WHERE id = %s", (key,))
        return rows[0] if rows else None

    def commit(self, key: str, text: str, clock: int) -> None:
        before = self.row(key)
        self.env.sql(
            "INSERT INTO entities (id, company_id, content, updated_at) VALUES (%s, 'acme', %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET content = EXCLUDED.content,"
            " updated_at = EXCLUDED.updated_at",
            (key, text, EPOCH + timedelta(seconds=clock)),
        )
        op = Op.UPDATE if before is not None else Op.CREATE
        self._event(key, change_event(op, before=before, after=self.row(key), lsn=self._lsn()))

    def delete(self, key: str) -> None:
        before = self.row(key)
        if before is None:
            return
        self.env.sql("DELETE FROM entities WHERE id = %s", (key,))
        self._event(key, change_event(Op.DELETE, before=before, after=None, lsn=self._lsn()))

    def deliver(self, n: int) -> None:
        batch, self.pending = self.pending[:n], self.pending[n:]
        if batch:
            assert not self.env.worker.handler.handle(batch)

    def race(self, key: str, text: str, clock: int) -> None:
        """A re-read by the second handler; between its SoR read and its write, the row is
        committed again and the worker streams everything pending in."""

        def meanwhile() -> None:
            self.commit(key, text, clock)
            self.deliver(len(self.pending))

        self.racing.after_read = meanwhile
        self.cli.apply_rows(SorBatch(TenantId("acme"), "test", reread=(eid(key),)))

    def save(self) -> None:
        rows = self.env.sql("SELECT * FROM entities ORDER BY id")
        self.saved = (rows, self.lsn)

    def restore(self) -> None:
        """Point-in-time recovery: the table is as saved, without change events, and the
        new timeline's LSNs continue from the saved point (below what may be indexed)."""
        if self.saved is None:
            return
        rows, self.lsn = self.saved
        self.env.sql("DELETE FROM entities")
        for row in rows:
            self.env.sql(
                "INSERT INTO entities (id, company_id, content, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                (
                    row["id"],
                    row["company_id"],
                    row["content"],
                    row["created_at"],
                    row["updated_at"],
                ),
            )
        self.restored = True

    def run(self, step: Step) -> None:
        kind, *args = step
        if kind == "reread":
            self.env.worker.handler.reread("acme", [eid(args[0])], "test")
        else:
            getattr(self, kind)(*args)

    def drift(self) -> int:
        worker = self.env.worker
        assert worker.sor is not None
        if worker.registry.active_version("acme") is None:
            return len(self.env.sql("SELECT id FROM entities"))
        report = reconcile("acme", sor=worker.sor, store=self.env.store, registry=worker.registry)
        return report.drift

    def _lsn(self) -> int:
        self.lsn += 8
        return self.lsn

    def _event(self, key: str, value: dict[str, Any]) -> None:
        record = RawRecord(
            "sor.public.entities",
            0,
            next(self.offsets),
            encode_key({"id": key}),
            encode_value(value),
        )
        self.pending.append(record)


@pytest.fixture
def make_env(
    postgres: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], Env]:
    """A fresh schema and store per example (the test closes it)."""
    return lambda: Env(postgres.dsn, tmp_path_factory.mktemp("store"))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_steps)
# a re-read racing a newer streamed commit (the compare-and-set keeps the streamed one)
@example(
    steps=[
        ("commit", "k0", "Pump valve calibration.", 5),
        ("deliver", 1),
        ("race", "k0", "Boiler pressure limits.", 9),
    ]
)
# a newer commit with an older updated_at (clock skew)
@example(
    steps=[
        ("commit", "k1", "Pump valve calibration.", 900),
        ("deliver", 1),
        ("commit", "k1", "Boiler pressure limits.", 100),
        ("deliver", 1),
    ]
)
# restored: a row goes back in time, a deleted one reappears, an inserted one vanishes
@example(
    steps=[
        ("commit", "k0", "Pump valve calibration.", 1),
        ("commit", "k1", "Valve replacement schedule.", 2),
        ("save",),
        ("commit", "k0", "Boiler pressure limits.", 3),
        ("delete", "k1"),
        ("commit", "k2", "Pump valve calibration.", 4),
        ("deliver", 3),
        ("restore",),
    ]
)
def test_random_interleavings_end_with_the_index_equal_to_the_sor(
    make_env: Callable[[], Env], steps: list[Step]
) -> None:
    model = Model(make_env())
    try:
        for step in steps:
            model.run(step)
        model.deliver(len(model.pending))
        if not model.restored:
            # commit order and compare-and-set re-reads alone converge
            assert model.drift() == 0, steps
        worker = model.env.worker
        assert worker.sor is not None
        if worker.registry.active_version("acme") is not None:
            # the runbook: reconcile --repair, then no drift is left
            repaired = reconcile(
                "acme",
                sor=worker.sor,
                store=model.env.store,
                registry=worker.registry,
                handler=worker.handler,
                repair=True,
            )
            if not model.restored:
                assert repaired.repaired == 0, steps  # nothing to change: nothing reported
        assert model.drift() == 0, steps
    finally:
        model.env.close()
