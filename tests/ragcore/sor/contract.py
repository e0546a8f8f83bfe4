"""Conformance suite every `SystemOfRecord` reader must pass.

Subclass `SystemOfRecordContract` and override the `sor` fixture: a reader over a SoR holding
`ROWS`, `LINES` and `PARTS` in three tables of different shapes (the seed `entities` table,
`order_lines` with a composite key, content from two columns and its own tenant column, and
`parts` with a constant tenant and a JSON column as content), read through `CATALOG` (which also
maps a `ghosts` table the SoR does not have) with `hasher`.
"""

from __future__ import annotations

import hashlib

import pytest

from ragcore.errors import ConfigError, SorTableError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.sor.base import SorVerdict, SystemOfRecord
from schemas.entities import ContentFormat
from tests.streams.support import order_lines_mapping


def hasher(content: str, fmt: ContentFormat) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


ROWS = [
    # id, tenant, name, content, hash, deleted
    ("e1", "acme", "Refunds", "Refunds within 30 days.", "h1", False),
    ("e2", "acme", "Shipping", "Ships in 2 days.", None, False),
    ("e3", "acme", "Old", "Gone.", "h3", True),
    ("e4", "globex", "Other", "Other tenant.", "h4", False),
]
LINES = [
    # order_id, line_no, org, product, note
    (1001, 1, "acme", "Seal kit K-27", "Urgent, ship by air."),
    (1001, 2, "acme", "Bearing set", "Standard delivery."),
    (1002, 1, "globex", "Impeller", "Duplex steel."),
]
PARTS = [
    ("GX-300", "seal", '{"material": "duplex", "bar": 16}'),
    ("GX-410", "bearing", '{"grease": "lithium"}'),
]
ORDER_LINES = order_lines_mapping()
PARTS_TABLE = TableMapping(
    table="public.parts",
    key_columns=("part_no",),
    tenant_column=None,
    tenant="globex",
    type_column=None,
    title_column="kind",
    content_columns=("kind", "spec"),
    json_columns=("spec",),
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column=None,
    deleted_at_column=None,
)
#: mapped, but no such table exists in the SoR
GHOSTS = TableMapping(table="public.ghosts", content_columns=("content",))
CATALOG = TableCatalog([TableMapping(), ORDER_LINES, PARTS_TABLE, GHOSTS], "sor")


class SystemOfRecordContract:
    """What Retrieve's verification, reconcile and reindex rely on, for one reader."""

    @pytest.fixture
    def sor(self) -> SystemOfRecord:
        raise NotImplementedError("subclasses provide the sor fixture")

    def test_check_passes_and_the_catalog_is_the_configured_one(self, sor: SystemOfRecord) -> None:
        sor.check()
        assert [m.label for m in sor.catalog] == [m.label for m in CATALOG]

    def test_verify_reports_exists_deleted_hash_and_missing_in_one_call(
        self, sor: SystemOfRecord
    ) -> None:
        ids = ["entities:e1", "entities:e2", "entities:e3", "entities:e4", "entities:nope"]
        verdicts = sor.verify("acme", ids)
        assert verdicts["entities:e1"] == SorVerdict(
            "entities:e1", True, False, "h1", "KNOWLEDGE_ARTIFACT"
        )
        # no hash column value: computed from the content, as ingest computes it
        assert verdicts["entities:e2"].content_hash == hasher(
            "Ships in 2 days.", ContentFormat.TEXT
        )
        assert verdicts["entities:e3"].deleted is True
        # another tenant's entity is invisible: the verification is tenant-scoped
        assert verdicts["entities:e4"].exists is False
        assert verdicts["entities:nope"].exists is False
        assert all(v.mapped for v in verdicts.values())

    def test_verify_spans_tables_and_never_denies_what_it_cannot_read(
        self, sor: SystemOfRecord
    ) -> None:
        verdicts = sor.verify(
            "acme",
            [
                "order_lines:1001,2",
                "order_lines:1002,1",  # globex's line
                "parts:GX-300",  # a globex-only table
                "ghosts:g1",  # mapped, but the table does not exist
                "invoices:7",  # no such mapping
                "entities:e1",
            ],
        )
        line = verdicts["order_lines:1001,2"]
        assert (line.exists, line.entity_type, line.mapped) == (True, "ORDER_LINES", True)
        assert line.content_hash == hasher("Bearing set\n\nStandard delivery.", ContentFormat.TEXT)
        assert verdicts["order_lines:1002,1"].exists is False
        assert (verdicts["parts:GX-300"].exists, verdicts["parts:GX-300"].mapped) == (False, True)
        for unknown in ("ghosts:g1", "invoices:7"):
            assert (verdicts[unknown].exists, verdicts[unknown].mapped) == (False, False)
        assert verdicts["entities:e1"].exists is True
        part = sor.verify("globex", ["parts:GX-300"])["parts:GX-300"]
        assert part.exists is True
        fetched = sor.fetch_entities("globex", ["parts:GX-300"])["parts:GX-300"]
        # the JSON column is rendered as lines (JSONB keeps its own key order: compare as a set)
        head, _, spec = fetched.content.partition("\n\n")
        assert (head, set(spec.splitlines())) == ("seal", {"material: duplex", "bar: 16"})
        assert part.content_hash == hasher(fetched.content, ContentFormat.TEXT)

    def test_fetch_entities_skips_soft_deleted_and_maps_like_ingest(
        self, sor: SystemOfRecord
    ) -> None:
        entities = sor.fetch_entities(
            None, ["entities:e1", "entities:e3", "entities:e4", "order_lines:1001,1", "invoices:1"]
        )
        assert sorted(entities) == ["entities:e1", "entities:e4", "order_lines:1001,1"]
        assert entities["entities:e1"].tenant_id == "acme"
        assert entities["entities:e1"].content == "Refunds within 30 days."
        assert entities["entities:e1"].version.updated_at_us is not None
        line = entities["order_lines:1001,1"]
        assert (line.tenant_id, line.title) == ("acme", "Seal kit K-27")
        assert line.content == "Seal kit K-27\n\nUrgent, ship by air."
        assert sor.fetch_entities("globex", ["entities:e1", "entities:e4"]).keys() == {
            "entities:e4"
        }
        assert sor.fetch_entities("acme", ["parts:GX-300"]) == {}
        with pytest.raises(SorTableError, match="ghosts"):
            sor.fetch_entities(None, ["ghosts:g1"])

    def test_scan_pages_through_live_rows_table_by_table(self, sor: SystemOfRecord) -> None:
        assert [e.entity_id for e in sor.scan("acme", batch=1, table="entities")] == [
            "entities:e1",
            "entities:e2",
        ]
        # keyset pages over a composite key
        assert [e.entity_id for e in sor.scan("acme", batch=1, table="order_lines")] == [
            "order_lines:1001,1",
            "order_lines:1001,2",
        ]
        assert [e.entity_id for e in sor.scan("globex", table="parts")] == [
            "parts:GX-300",
            "parts:GX-410",
        ]
        assert list(sor.scan("acme", table="parts")) == []
        assert sor.count("acme", table="order_lines") == 2
        assert sor.count("globex", table="parts") == 2
        with pytest.raises(SorTableError, match="ghosts"):
            list(sor.scan("acme", table="ghosts"))
        with pytest.raises(ConfigError, match="no mapped table 'invoices'"):
            list(sor.scan("acme", table="invoices"))
