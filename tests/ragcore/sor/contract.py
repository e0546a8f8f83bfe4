"""Conformance suite every `SystemOfRecord` reader must pass.

Subclass `SystemOfRecordContract` and override the `sor` fixture: a reader over a SoR holding
`ROWS`, `LINES` and `PARTS` in three tables of different shapes (the seed `entities` table,
`order_lines` with a composite key, content from two columns and its own tenant column, and
`parts` with a constant tenant and a JSON column as content), read through `CATALOG` (which also
maps a `ghosts` table the SoR does not have) with `hasher`.

Tenant `initech` holds the rows that cannot be mapped: `BAD_ROWS` in `entities` (metadata that
is not JSON, JSON nested deeper than Python parses, a timestamp Python cannot hold) and `FILES`
in `files`, a document table whose rows reference files under a root directory
(`with_document_root`; `write_documents` writes them, but never `f2.csv`: its file was
deleted). The `set_metadata` fixture writes the metadata column of one `entities` row.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragcore.documents import DocumentSource
from ragcore.errors import ConfigError, SorRowError, SorTableError
from ragcore.mapping import TableCatalog, TableMapping
from ragcore.sor.base import SorVerdict, SystemOfRecord
from schemas.entities import ContentFormat, Entity
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
#: a document table: each row references a CSV file under the root (`with_document_root`)
FILES_TABLE = TableMapping(
    table="public.files",
    key_columns=("id",),
    tenant_column=None,
    tenant="initech",
    type_column=None,
    title_column="title",
    metadata_column=None,
    content_hash_column=None,
    created_at_column=None,
    updated_at_column=None,
    deleted_at_column=None,
    document=DocumentSource(
        column="path", kind="reference", root=Path("/set-by-the-fixture"), format_column="kind"
    ),
)
CATALOG = TableCatalog([TableMapping(), ORDER_LINES, PARTS_TABLE, GHOSTS, FILES_TABLE], "sor")

#: JSON nested deeper than Python's parser goes (PostgreSQL stores it as jsonb)
DEEP_JSON = "[" * 3000 + "]" * 3000
NOT_JSON = '{"format": "text"'
#: tenant initech's rows in `entities` (content: `bad_row_content`): id -> (metadata text,
#: whether updated_at is a timestamp Python can hold, stored hash, soft-deleted)
BAD_ROWS = {
    "i1": ('{"format": "text"}', True, None, False),  # readable: the others must not hide it
    "b-json": (NOT_JSON, True, None, False),
    "b-deep": (DEEP_JSON, True, None, False),
    "b-time": ('{"format": "text"}', False, None, False),  # updated_at Python cannot hold
    "b-hashed": (NOT_JSON, True, "hb", False),  # a stored hash: a verdict reads no content
    "b-gone": (NOT_JSON, True, None, True),  # soft-deleted: deleted, whatever its content
}


def bad_row_content(key: str) -> str:
    """The content column of a `BAD_ROWS` row."""
    return f"Initech row {key}."


#: the `files` rows: id, title, format, path under the document root
FILES = [("f1", "Pump sheet", "csv", "f1.csv"), ("f2", "Valve sheet", "csv", "f2.csv")]
FILE_BODY = b"part,flow\nP-1,40 m3/h\n"


def write_documents(root: Path) -> Path:
    """The document root of `FILES`: f1.csv only (f2.csv was deleted)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "f1.csv").write_bytes(FILE_BODY)
    return root


def with_document_root(catalog: TableCatalog, root: Path) -> TableCatalog:
    """`catalog` with the document table's files under `root`."""
    return TableCatalog(
        [
            m
            if m.document is None
            else m.model_copy(update={"document": m.document.model_copy(update={"root": root})})
            for m in catalog
        ],
        "sor",
    )


def entities(rows: Iterable[Entity | SorRowError]) -> list[Entity]:
    """Rows a test expects to be readable, each checked to be an entity."""
    out = []
    for row in rows:
        assert isinstance(row, Entity), row
        out.append(row)
    return out


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
        assert isinstance(fetched, Entity), fetched
        # the JSON column is rendered as lines (JSONB keeps its own key order: compare as a set)
        head, _, spec = fetched.content.partition("\n\n")
        assert (head, set(spec.splitlines())) == ("seal", {"material: duplex", "bar: 16"})
        assert part.content_hash == hasher(fetched.content, ContentFormat.TEXT)

    def test_fetch_entities_skips_soft_deleted_and_maps_like_ingest(
        self, sor: SystemOfRecord
    ) -> None:
        found = sor.fetch_entities(
            None, ["entities:e1", "entities:e3", "entities:e4", "order_lines:1001,1", "invoices:1"]
        )
        assert sorted(found) == ["entities:e1", "entities:e4", "order_lines:1001,1"]
        fetched = dict(zip(found, entities(found.values()), strict=True))
        assert fetched["entities:e1"].tenant_id == "acme"
        assert fetched["entities:e1"].content == "Refunds within 30 days."
        assert fetched["entities:e1"].version.updated_at_us is not None
        line = fetched["order_lines:1001,1"]
        assert (line.tenant_id, line.title) == ("acme", "Seal kit K-27")
        assert line.content == "Seal kit K-27\n\nUrgent, ship by air."
        assert sor.fetch_entities("globex", ["entities:e1", "entities:e4"]).keys() == {
            "entities:e4"
        }
        assert sor.fetch_entities("acme", ["parts:GX-300"]) == {}
        with pytest.raises(SorTableError, match="ghosts"):
            sor.fetch_entities(None, ["ghosts:g1"])

    def test_scan_pages_through_live_rows_table_by_table(self, sor: SystemOfRecord) -> None:
        assert [e.entity_id for e in entities(sor.scan("acme", batch=1, table="entities"))] == [
            "entities:e1",
            "entities:e2",
        ]
        # keyset pages over a composite key
        lines = entities(sor.scan("acme", batch=1, table="order_lines"))
        assert [e.entity_id for e in lines] == [
            "order_lines:1001,1",
            "order_lines:1001,2",
        ]
        assert [e.entity_id for e in entities(sor.scan("globex", table="parts"))] == [
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

    # --- rows that cannot be mapped: each one's own fault, never the call's -------------------

    @pytest.fixture
    def set_metadata(self) -> Callable[[str, str], None]:
        """Writes the metadata column of one `entities` row (key, text) in the reader's SoR."""
        raise NotImplementedError("subclasses provide the set_metadata fixture")

    def test_verify_judges_every_row_and_excludes_none_for_anothers_fault(
        self, sor: SystemOfRecord, caplog: pytest.LogCaptureFixture
    ) -> None:
        ids = [f"entities:{k}" for k in BAD_ROWS] + ["entities:nope", "files:f1", "files:f2"]
        with caplog.at_level(logging.WARNING, logger="ragcore.sor.base"):
            verdicts = sor.verify("initech", ids)
        good = verdicts["entities:i1"]
        assert (good.exists, good.row_error) == (True, None)
        assert good.content_hash == hasher(bad_row_content("i1"), ContentFormat.TEXT)
        reasons = {k: verdicts[f"entities:{k}"].row_error for k in ("b-json", "b-deep", "b-time")}
        # a MappingError keeps its code; what Python itself raises is named by its type
        assert reasons["b-json"] == "MAPPING_ERROR"
        # nested past the mapping's depth limit (or PostgreSQL's loader could not decode it)
        assert reasons["b-deep"] in {"MAPPING_ERROR", "VALUE_UNDECODABLE"}
        assert reasons["b-time"] in {"MAPPING_ERROR", "VALUE_UNDECODABLE"}
        for key in ("b-json", "b-deep", "b-time"):
            verdict = verdicts[f"entities:{key}"]
            assert (verdict.exists, verdict.mapped, verdict.deleted) == (True, True, False)
            assert verdict.content_hash is None
        # a stored hash is read without the content, so bad metadata does not matter
        assert verdicts["entities:b-hashed"] == SorVerdict(
            "entities:b-hashed", True, False, "hb", "KNOWLEDGE_ARTIFACT"
        )
        # soft deletion is read without the content too: a deleted row is deleted
        assert verdicts["entities:b-gone"].deleted is True
        assert verdicts["entities:nope"] == SorVerdict("entities:nope", False)
        assert verdicts["files:f1"].content_hash == hasher(
            verdicts_content(sor, "files:f1"), ContentFormat.CSV
        )
        assert verdicts["files:f2"].row_error == "DOCUMENT_UNAVAILABLE"
        # one line per unreadable row, naming its table, entity and reason
        lines = [r.getMessage() for r in caplog.records if "SoR row unreadable" in r.getMessage()]
        assert len(lines) == 4, lines
        for entity_id, reason in [
            ("entities:b-json", "MAPPING_ERROR"),
            ("files:f2", "DOCUMENT_UNAVAILABLE"),
        ]:
            (line,) = [x for x in lines if f"entity {entity_id}," in x]
            assert f"reason {reason}" in line and "table " in line

    def test_fetch_entities_returns_the_readable_rows_and_each_bad_ones_error(
        self, sor: SystemOfRecord
    ) -> None:
        ids = [f"entities:{k}" for k in BAD_ROWS] + ["files:f1", "files:f2"]
        found = sor.fetch_entities(None, ids)
        # the soft-deleted row is left out as ever, whatever its content
        assert sorted(found) == sorted(set(ids) - {"entities:b-gone"})
        assert isinstance(found["entities:i1"], Entity)
        assert isinstance(found["files:f1"], Entity)
        assert found["files:f1"].content_format is ContentFormat.CSV
        columns = {}
        for entity_id in ("entities:b-json", "entities:b-deep", "entities:b-time", "files:f2"):
            error = found[entity_id]
            assert isinstance(error, SorRowError), error
            assert (error.code, error.entity_id) == ("SOR_ROW_UNREADABLE", entity_id)
            assert error.table.endswith((".entities", ".files"))
            assert error.table in str(error) and entity_id in str(error)
            columns[entity_id] = error.column
        assert columns == {
            "entities:b-json": "metadata",
            "entities:b-deep": "metadata",
            "entities:b-time": "updated_at",
            "files:f2": "path",
        }
        # a stored hash does not make bad metadata mappable: the entity needs it
        hashed = found["entities:b-hashed"]
        assert isinstance(hashed, SorRowError) and hashed.column == "metadata"
        assert "MappingError" in str(hashed)  # the cause's type is named

    def test_scan_reports_each_bad_row_and_goes_on(self, sor: SystemOfRecord) -> None:
        rows = [
            *sor.scan("initech", batch=2, table="entities"),
            *sor.scan("initech", table="files"),
        ]
        read = [r.entity_id for r in rows if isinstance(r, Entity)]
        unreadable = [r.entity_id for r in rows if isinstance(r, SorRowError)]
        # in key order; the deleted row is not live
        assert read == ["entities:i1", "files:f1"]
        assert unreadable == [
            "entities:b-deep",
            "entities:b-hashed",
            "entities:b-json",
            "entities:b-time",
            "files:f2",
        ]
        assert sor.count("initech", table="entities") + sor.count("initech", table="files") == 7

    @settings(
        max_examples=40,
        deadline=None,
        # the fixture writes the one row each example reads; each reader is its own subclass
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    # a text column holds no NUL and no lone surrogate (a JSON `\ud800` escape it may hold)
    @given(
        metadata=st.text(
            alphabet=st.characters(exclude_characters="\x00", exclude_categories=["Cs"]),
            max_size=60,
        )
    )
    def test_any_metadata_text_is_a_verdict_never_an_error(
        self, sor: SystemOfRecord, set_metadata: Callable[[str, str], None], metadata: str
    ) -> None:
        set_metadata("i1", metadata)
        verdict = sor.verify("initech", ["entities:i1"])["entities:i1"]
        fetched = sor.fetch_entities("initech", ["entities:i1"])["entities:i1"]
        assert verdict.exists and verdict.mapped
        # verification and the re-read agree on whether the row can be mapped
        assert (verdict.row_error is None) == isinstance(fetched, Entity)
        if isinstance(fetched, Entity):
            assert verdict.content_hash == fetched.content_hash
        else:
            assert verdict.content_hash is None and fetched.column == "metadata"
            try:
                parsed = json.loads(metadata) if metadata.strip() else {}
            except (ValueError, RecursionError):
                parsed = None
            # only metadata that is not an object (or names an unknown format) is at fault
            assert not isinstance(parsed, dict) or "format" in parsed


def verdicts_content(sor: SystemOfRecord, entity_id: str) -> str:
    """The content a re-read maps the entity to (what its verdict's hash is of)."""
    fetched = sor.fetch_entities(None, [entity_id])[entity_id]
    assert isinstance(fetched, Entity), fetched
    return fetched.content
