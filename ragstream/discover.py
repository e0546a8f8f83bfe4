"""Propose a table mapping for each table of a live database, with the reason for every choice.

Pure logic over what `ragcore.sor.pgcatalog` read (and, when rows were read, `TableSample`):
`propose` returns one `Proposal` (a valid `TableMapping` and why each field is what it is, and
why each column it leaves alone is left alone) per table it can map, and one `LeftOut` (the
reason and the fix) per table it cannot. Nothing is guessed silently: a choice between columns
names the others considered, and a table without a primary key or a tenant is left out rather
than mapped on a guess (`--tenant-column`, `--tenant` settle it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragcore.mapping import TableMapping
from ragcore.sor.mapcheck import ACCEPTED
from ragcore.sor.pgcatalog import ColumnInfo, ColumnKind, DatabaseInfo, TableInfo
from ragcore.store.ids import TenantId

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: Tenant column names, best first, in tiers: a column in a lower tier is chosen over one in a
#: higher tier; within a tier the order decides and the others are named in the reason.
TENANT_TIERS: tuple[tuple[str, ...], ...] = (
    ("tenant_id", "tenant", "tenant_key", "tenant_slug"),
    (
        "organization_id",
        "organisation_id",
        "org_id",
        "company_id",
        "workspace_id",
        "account_id",
        "organization",
        "organisation",
        "org",
        "company",
        "workspace",
        "account",
    ),
    ("customer_id", "client_id", "team_id"),
)
#: Tables a tenant column would reference (a foreign key to one makes a column a candidate
#: whatever its name).
TENANT_TABLES = frozenset(
    {
        "tenants",
        "tenant",
        "organizations",
        "organisations",
        "orgs",
        "companies",
        "company",
        "workspaces",
        "accounts",
    }
)
TITLE_NAMES = ("title", "subject", "name", "headline", "display_name", "label", "heading")
CONTENT_NAMES = (
    "content",
    "body",
    "text",
    "description",
    "details",
    "notes",
    "note",
    "message",
    "summary",
    "abstract",
    "comment",
    "comments",
    "answer",
    "question",
    "transcript",
    "html",
    "markdown",
    "excerpt",
)
CONTENT_SUFFIXES = ("_body", "_text", "_content", "_description", "_notes", "_html", "_markdown")
TYPE_NAMES = ("entity_type", "type", "kind", "doc_type", "document_type", "record_type")
FORMAT_NAMES = ("format", "content_format", "body_format", "markup")
METADATA_NAMES = ("metadata", "meta", "attributes", "properties", "extra", "custom_fields", "tags")
CATEGORY_NAMES = (
    "status",
    "state",
    "priority",
    "severity",
    "category",
    "language",
    "lang",
    "locale",
    "channel",
    "region",
    "visibility",
)
UPDATED_NAMES = (
    "updated_at",
    "modified_at",
    "last_modified",
    "last_modified_at",
    "updated_on",
    "modified_on",
    "changed_at",
    "last_updated",
    "updated",
    "modified",
)
CREATED_NAMES = ("created_at", "inserted_at", "created_on", "creation_date", "created")
DELETED_NAMES = ("deleted_at", "deleted_on", "removed_at", "trashed_at", "deletion_date")
BOOLEAN_DELETED_NAMES = ("is_deleted", "deleted", "is_removed", "removed", "trashed")
HASH_NAMES = ("content_hash",)
DOCUMENT_NAMES = (
    "file",
    "document",
    "doc",
    "body",
    "content",
    "data",
    "blob",
    "pdf",
    "attachment",
    "file_data",
    "file_content",
    "file_bytes",
    "contents",
    "payload",
)
MIME_NAMES = ("mime_type", "content_type", "mimetype", "media_type")
FILE_NAME_NAMES = ("file_name", "filename", "document_name", "original_name", "name")
DOCUMENT_FORMAT_NAMES = ("format", "file_type", "extension", "file_extension", "document_format")
#: Parts of a column name that mark a secret: such a column is never indexed.
SECRET_PARTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "salt",
    "api_key",
    "apikey",
    "private_key",
    "credential",
    "ssn",
    "otp",
)
#: Name endings of text that is an identifier or an address, never content.
IDENTIFIER_ENDINGS = (
    "_id",
    "_key",
    "_code",
    "url",
    "_uri",
    "email",
    "_path",
    "slug",
    "phone",
    "_ref",
    "_number",
    "_no",
)
#: Text averaging this many characters over the rows read is prose (content), below it a label.
PROSE_CHARS = 64


@dataclass(frozen=True, slots=True)
class TableSample:
    """What the first rows of a table say (`ragstream tables discover` reads them)."""

    rows: int
    #: text column -> its average length in characters over the rows read (non-NULL values)
    avg_chars: Mapping[str, float] = field(default_factory=dict)
    #: JSON column -> every non-NULL value read is a JSON object
    objects: Mapping[str, bool] = field(default_factory=dict)
    #: why the rows could not be read (then nothing was measured)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DiscoverOptions:
    """What the user settled on the command line."""

    #: the tenant column to use (tables without it are left out)
    tenant_column: str | None = None
    #: the tenant of tables without a tenant column
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """A proposed mapping and why."""

    table: str
    mapping: TableMapping
    #: mapping field -> why it is what it is
    reasons: Mapping[str, str]
    #: column -> why the mapping does not read it
    unused: Mapping[str, str]
    #: what to look at before using the mapping (a choice between close candidates, ...)
    notes: tuple[str, ...] = ()

    def mapping_json(self) -> dict[str, Any]:
        """The mapping as one element of `RAGSTREAM_PLAN__TABLES`: every field that names a
        column, nulls included (their defaults fit the seed table only), and the document."""
        m = self.mapping
        doc: dict[str, Any] = {"table": m.table}
        if m.name is not None:
            doc["name"] = m.name
        doc["key_columns"] = list(m.key_columns)
        if m.tenant is not None:
            doc["tenant_column"] = None
            doc["tenant"] = m.tenant
        else:
            doc["tenant_column"] = m.tenant_column
        doc["type_column"] = m.type_column
        doc["title_column"] = m.title_column
        if m.document is None:
            doc["content_columns"] = list(m.content_columns)
        if m.json_columns:
            doc["json_columns"] = list(m.json_columns)
        doc["metadata_column"] = m.metadata_column
        if m.metadata_columns:
            doc["metadata_columns"] = list(m.metadata_columns)
        if m.format_column is not None:
            doc["format_column"] = m.format_column
        doc["content_hash_column"] = m.content_hash_column
        doc["created_at_column"] = m.created_at_column
        doc["updated_at_column"] = m.updated_at_column
        doc["deleted_at_column"] = m.deleted_at_column
        if m.document is not None:
            doc["document"] = m.document.model_dump(mode="json", exclude_defaults=True)
        return doc


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A table no mapping is proposed for, why, and what would change that."""

    table: str
    reason: str
    fix: str


@dataclass(frozen=True, slots=True)
class Discovery:
    """Every table's outcome."""

    proposals: tuple[Proposal, ...]
    left_out: tuple[LeftOut, ...]

    def tables_json(self) -> list[dict[str, Any]]:
        """The value of `RAGSTREAM_PLAN__TABLES`."""
        return [p.mapping_json() for p in self.proposals]


def propose(
    db: DatabaseInfo,
    options: DiscoverOptions | None = None,
    samples: Mapping[str, TableSample] | None = None,
) -> Discovery:
    """A proposal or a reason to leave it out for every table of `db`, in name order."""
    options = options or DiscoverOptions()
    samples = samples or {}
    proposals: list[Proposal] = []
    left_out: list[LeftOut] = []
    for qualified in sorted(db.tables):
        outcome = propose_table(db.tables[qualified], options, samples.get(qualified))
        if isinstance(outcome, LeftOut):
            left_out.append(outcome)
        else:
            proposals.append(outcome)
    return Discovery(tuple(_unique_names(proposals)), tuple(left_out))


def _unique_names(proposals: list[Proposal]) -> list[Proposal]:
    """Tables of two schemas with one name get `<schema>_<table>` as their name (entity ids
    and topics must tell them apart)."""
    counts: dict[str, int] = {}
    for p in proposals:
        counts[p.mapping.table_name] = counts.get(p.mapping.table_name, 0) + 1
    out = []
    for p in proposals:
        if counts[p.mapping.table_name] == 1:
            out.append(p)
            continue
        name = f"{p.mapping.schema_name}_{p.mapping.table_name}"[:63]
        reasons = {
            **p.reasons,
            "name": f"another schema has a table {p.mapping.table_name!r} too: entity ids "
            f"start with {name!r}",
        }
        mapping = TableMapping.model_validate({**p.mapping_json(), "name": name})
        out.append(Proposal(p.table, mapping, reasons, p.unused, p.notes))
    return out


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in SECRET_PARTS)


def _rank(name: str, names: Sequence[str]) -> int | None:
    lowered = name.lower()
    return names.index(lowered) if lowered in names else None


def _first(columns: Sequence[ColumnInfo], names: Sequence[str]) -> ColumnInfo | None:
    ranked = [(r, c) for c in columns if (r := _rank(c.name, names)) is not None]
    return min(ranked, key=lambda rc: rc[0])[1] if ranked else None


def propose_table(
    table: TableInfo, options: DiscoverOptions, sample: TableSample | None = None
) -> Proposal | LeftOut:
    """The mapping of one table, or why there is none."""
    where = table.qualified
    if not (_IDENT.match(table.schema) and _IDENT.match(table.name)):
        return LeftOut(
            where,
            "its name is not a plain SQL identifier (letters, digits, _; not starting with a "
            "digit): table mappings name plain identifiers only",
            "rename the table, or map a view-free copy of it",
        )
    if not table.readable:
        return LeftOut(
            where,
            "the role of --dsn cannot read it (USAGE on the schema and SELECT on the table)",
            f"GRANT USAGE ON SCHEMA {table.schema} TO <role>; GRANT SELECT ON {where} TO <role>",
        )
    key = table.primary_key
    if not key:
        unique = [i for i in table.indexes if i.identifies_rows]
        fix = (
            f"ALTER TABLE {where} ADD PRIMARY KEY USING INDEX {unique[0].name}"
            if unique
            else f"ALTER TABLE {where} ADD PRIMARY KEY (<columns that identify a row>)"
        )
        return LeftOut(
            where,
            "no primary key: Debezium keys its change events by it, and an entity id is made of it",
            fix,
        )
    columns = {c.name: c for c in table.columns}
    bad_key = [c for c in key if columns[c].kind not in ACCEPTED["key_columns"]]
    if bad_key or not all(_IDENT.match(c) for c in key):
        return LeftOut(
            where,
            f"primary key column(s) {bad_key or list(key)} cannot form an entity id (text, "
            "integer, numeric, uuid or enum, with plain names)",
            "map the table by hand with key_columns of such a unique key",
        )
    usable = [c for c in table.columns if _IDENT.match(c.name) and not c.generated]
    unused: dict[str, str] = {
        c.name: "not a plain SQL identifier: table mappings name plain identifiers only"
        for c in table.columns
        if not _IDENT.match(c.name)
    }
    unused.update(
        {
            c.name: "a generated column: logical replication does not publish it (before "
            "PostgreSQL 18)"
            for c in table.columns
            if c.generated and _IDENT.match(c.name)
        }
    )
    for c in usable:
        if _is_secret(c.name):
            unused[c.name] = "named like a secret: never indexed"
    usable = [c for c in usable if c.name not in unused]
    reasons: dict[str, str] = {}
    notes: list[str] = []
    if sample is not None and sample.error is not None:
        notes.append(
            f"its rows could not be read ({sample.error}): text was judged by its name alone "
            "and JSON columns were not looked into"
        )
        sample = None
    reasons["key_columns"] = (
        f"the primary key ({len(key)} columns, in key order)" if len(key) > 1 else "the primary key"
    )
    used: set[str] = set(key)

    tenant = _choose_tenant(table, usable, options, key)
    if isinstance(tenant, LeftOut):
        return tenant
    tenant_column, tenant_constant, tenant_reason, tenant_notes = tenant
    reasons["tenant_column" if tenant_column else "tenant"] = tenant_reason
    notes += tenant_notes
    if tenant_column:
        used.add(tenant_column)

    free = [c for c in usable if c.name not in used]
    title = _first([c for c in free if c.kind in (ColumnKind.TEXT, ColumnKind.ENUM)], TITLE_NAMES)
    document = _choose_document(free)
    doc_fields: dict[str, Any] = {}
    content: list[str] = []
    json_columns: list[str] = []
    metadata_column: str | None = None
    if document is not None:
        doc_fields, doc_reason, doc_used = _document_fields(document, free, title)
        reasons["document"] = doc_reason
        used |= doc_used
    if title is None and "name_column" in doc_fields:
        title = table.column(doc_fields["name_column"])
        assert title is not None
        reasons["title_column"] = (
            f"no column named like a title: the file name {title.name!r} titles results"
        )
    elif title is not None:
        reasons["title_column"] = f"text column named like a title ({title.name!r})"
        used.add(title.name)
    else:
        reasons["title_column"] = (
            f"no text column named like a title ({', '.join(TITLE_NAMES)}): results show none"
        )
    type_col = _first(
        [c for c in usable if c.name not in used and c.kind in (ColumnKind.TEXT, ColumnKind.ENUM)],
        TYPE_NAMES,
    )
    if type_col is not None:
        reasons["type_column"] = f"{type_col.name!r} names the entity type"
        used.add(type_col.name)
    else:
        reasons["type_column"] = (
            f"no type column: every entity's type is {table.name.upper()!r} (the name in upper "
            "case; set default_entity_type to change it)"
        )
    meta = _choose_metadata(usable, used, sample)
    if meta is not None:
        metadata_column = meta.name
        used.add(meta.name)
        reasons["metadata_column"] = (
            f"{meta.name!r} is {meta.type} named like metadata"
            + (
                f", an object in every one of {sample.rows} rows read"
                if sample is not None and sample.rows
                else " (the table has no rows to confirm it holds JSON objects)"
            )
            + ": merged into each entity's metadata"
        )
    else:
        reasons["metadata_column"] = "no JSON column named like metadata holding objects"
    fmt = None
    if document is None:
        fmt = _first(
            [
                c
                for c in usable
                if c.name not in used and c.kind in (ColumnKind.TEXT, ColumnKind.ENUM)
            ],
            FORMAT_NAMES,
        )
        if fmt is not None:
            used.add(fmt.name)
            reasons["format_column"] = (
                f"{fmt.name!r} names each row's format (text, markdown or html; another value "
                "is the row's MAPPING_ERROR)"
            )
        content, json_columns, content_reason = _choose_content(usable, used, title, sample, unused)
        if not content:
            return LeftOut(
                where,
                "nothing to index: no text column named like content or long enough to be "
                "prose, no JSON column and no document (bytea) column",
                "map the table by hand if it holds text worth searching",
            )
        reasons["content_columns"] = content_reason
        if json_columns:
            reasons["json_columns"] = (
                f"{_names(json_columns)}: JSON, rendered as `key: value` lines"
            )
        used |= set(content)
    categories = [
        c.name
        for c in usable
        if c.name not in used
        and (
            _rank(c.name, CATEGORY_NAMES) is not None
            or (c.kind is ColumnKind.ENUM and not _is_secret(c.name))
        )
    ]
    if categories:
        reasons["metadata_columns"] = (
            f"{_names(categories)} named like categories (or enums): copied into the metadata "
            "(list them in keyword_fields to filter by them)"
        )
        used |= set(categories)
    times = _choose_times(usable, used, unused, notes)
    reasons.update(times.reasons)
    used |= times.used
    content_hash = _first(
        [c for c in usable if c.name not in used and c.kind is ColumnKind.TEXT], HASH_NAMES
    )
    if content_hash is not None:
        reasons["content_hash_column"] = (
            f"{content_hash.name!r} holds the content's hash, kept by the application: "
            "Retrieve compares it instead of hashing the content (it must change with the "
            "content)"
        )
        used.add(content_hash.name)
    else:
        reasons["content_hash_column"] = "none: the hash is computed from the content"
    for c in table.columns:
        if c.name not in used and c.name not in unused:
            unused[c.name] = _why_unused(c, table, document=document is not None)
    fields: dict[str, Any] = {
        "table": where,
        "key_columns": list(key),
        "tenant_column": tenant_column,
        "tenant": tenant_constant,
        "type_column": type_col.name if type_col is not None else None,
        "title_column": title.name if title is not None else None,
        "metadata_column": metadata_column,
        "metadata_columns": categories,
        "content_hash_column": content_hash.name if content_hash is not None else None,
        "created_at_column": times.created,
        "updated_at_column": times.updated,
        "deleted_at_column": times.deleted,
    }
    if document is not None:
        fields["document"] = doc_fields
    else:
        fields["content_columns"] = content
        fields["json_columns"] = json_columns
        fields["format_column"] = fmt.name if fmt is not None else None
    mapping = TableMapping.model_validate(fields)
    ordered = {k: reasons[k] for k in _REASON_ORDER if k in reasons}
    return Proposal(where, mapping, ordered, dict(sorted(unused.items())), tuple(notes))


_REASON_ORDER = (
    "key_columns",
    "tenant_column",
    "tenant",
    "type_column",
    "title_column",
    "content_columns",
    "json_columns",
    "document",
    "format_column",
    "metadata_column",
    "metadata_columns",
    "content_hash_column",
    "created_at_column",
    "updated_at_column",
    "deleted_at_column",
    "name",
)


def _names(columns: Sequence[str]) -> str:
    return ", ".join(repr(c) for c in columns)


def _choose_tenant(
    table: TableInfo,
    usable: Sequence[ColumnInfo],
    options: DiscoverOptions,
    key: Sequence[str],
) -> tuple[str | None, str | None, str, list[str]] | LeftOut:
    """(tenant column, constant tenant, reason, notes), or the table left out."""
    where = table.qualified
    accepted = ACCEPTED["tenant_column"]
    if options.tenant_column is not None:
        column = table.column(options.tenant_column)
        if column is None:
            return LeftOut(
                where,
                f"no column {options.tenant_column!r} (--tenant-column)",
                "map the table by hand with its tenant column, or --tenant for a one-tenant table",
            )
        if column.kind not in accepted:
            return LeftOut(
                where,
                f"--tenant-column {column.name!r} is {column.type}; a tenant column is text, "
                "integer, uuid or enum",
                "map the table by hand",
            )
        return column.name, None, f"{column.name!r}: given with --tenant-column", []
    references = {
        c: fk.references
        for fk in table.foreign_keys
        if fk.references.split(".")[-1].lower() in TENANT_TABLES and len(fk.columns) == 1
        for c in fk.columns
    }
    candidates: list[tuple[tuple[float, int, int, int], ColumnInfo, str]] = []
    for column in usable:
        if column.kind not in accepted:
            continue
        tier = next(
            (t for t, names in enumerate(TENANT_TIERS) if column.name.lower() in names), None
        )
        ref = references.get(column.name)
        if tier is None and ref is None:
            continue
        # a foreign key to a tenant-like table counts like the first tier's name
        rank = 0.5 if ref is not None and (tier is None or tier > 0) else float(tier or 0)
        order = TENANT_TIERS[tier].index(column.name.lower()) if tier is not None else 99
        why = []
        if tier is not None:
            why.append("named like a tenant column")
        if ref is not None:
            why.append(f"references {ref}")
        why.append("NOT NULL" if column.not_null else "nullable")
        if column.name in key:
            why.append("part of the primary key")
        score = (rank, 0 if column.not_null else 1, 0 if column.name in key else 1, order)
        candidates.append((score, column, ", ".join(why)))
    if not candidates:
        looked = ", ".join(n for tier in TENANT_TIERS for n in tier)
        if options.tenant is not None:
            return (
                None,
                str(TenantId(options.tenant)),
                f"no tenant column: the whole table belongs to tenant {options.tenant!r} "
                "(--tenant)",
                [],
            )
        if table.name.lower() in TENANT_TABLES:
            return LeftOut(
                where,
                "named like the tenants' own table, and no column names a tenant: it lists "
                "the tenants rather than holding a tenant's content",
                "--tenant-column COLUMN maps it anyway (each row then its own tenant)",
            )
        return LeftOut(
            where,
            f"no tenant column found (looked for {looked}, and foreign keys to a "
            f"{'/'.join(sorted(TENANT_TABLES))} table)",
            "pass --tenant-column COLUMN, or --tenant NAME when the whole table belongs to "
            "one tenant",
        )
    candidates.sort(key=lambda c: c[0])
    (score, chosen, chosen_why), *others = candidates
    reason = f"{chosen.name!r}: {chosen_why}"
    notes = []
    if others:
        reason += "; also considered: " + ", ".join(f"{c.name!r}" for _, c, _ in others)
        if others[0][0][0] == score[0]:
            notes.append(
                f"tenant column {chosen.name!r} was chosen over {others[0][1].name!r} by name "
                "order alone: confirm it (--tenant-column settles it)"
            )
    if score[0] >= 2:
        notes.append(
            f"tenant column {chosen.name!r} is named like a customer or team, which may be the "
            "tenant's own customer rather than the tenant: confirm it (--tenant-column)"
        )
    return chosen.name, None, reason, notes


def _choose_document(free: Sequence[ColumnInfo]) -> ColumnInfo | None:
    binary = [c for c in free if c.kind is ColumnKind.BYTEA]
    return _first(binary, DOCUMENT_NAMES)


def _document_fields(
    column: ColumnInfo, free: Sequence[ColumnInfo], title: ColumnInfo | None
) -> tuple[dict[str, Any], str, set[str]]:
    text = [c for c in free if c.kind in (ColumnKind.TEXT, ColumnKind.ENUM) and c is not title]
    fields: dict[str, Any] = {"column": column.name, "kind": "binary"}
    used = {column.name}
    parts = [f"{column.name!r} is bytea named like a file: each row's content is that document"]
    mime = _first(text, MIME_NAMES)
    if mime is not None:
        fields["mime_type_column"] = mime.name
        used.add(mime.name)
        parts.append(f"{mime.name!r} gives its MIME type")
    fmt = _first([c for c in text if c is not mime], DOCUMENT_FORMAT_NAMES)
    if fmt is not None:
        fields["format_column"] = fmt.name
        used.add(fmt.name)
        parts.append(f"{fmt.name!r} names its format")
    if mime is None and fmt is None:
        parts.append("the bytes tell the format (PDF, DOCX, XLSX; CSV needs a format column)")
    name = _first([c for c in text if c.name not in used], FILE_NAME_NAMES)
    if name is not None:
        fields["name_column"] = name.name
        used.add(name.name)
        parts.append(f"{name.name!r} is the file name results cite")
    return fields, "; ".join(parts), used


def _choose_metadata(
    usable: Sequence[ColumnInfo], used: set[str], sample: TableSample | None
) -> ColumnInfo | None:
    candidates = [
        c
        for c in usable
        if c.name not in used
        and c.kind is ColumnKind.JSON
        and _rank(c.name, METADATA_NAMES) is not None
        and (sample is None or sample.objects.get(c.name, True))
    ]
    return _first(candidates, METADATA_NAMES)


def _is_content_name(name: str) -> bool:
    lowered = name.lower()
    return lowered in CONTENT_NAMES or lowered.endswith(CONTENT_SUFFIXES)


def _choose_content(
    usable: Sequence[ColumnInfo],
    used: set[str],
    title: ColumnInfo | None,
    sample: TableSample | None,
    unused: dict[str, str],
) -> tuple[list[str], list[str], str]:
    """(content columns, JSON columns among them, reason)."""
    free = [c for c in usable if c.name not in used]
    named = [
        c for c in free if c.kind in (ColumnKind.TEXT, ColumnKind.ENUM) and _is_content_name(c.name)
    ]
    named.sort(
        key=lambda c: (
            CONTENT_NAMES.index(c.name.lower())
            if c.name.lower() in CONTENT_NAMES
            else len(CONTENT_NAMES)
        )
    )
    parts: list[str] = []
    content = [c.name for c in named]
    if named:
        parts.append(f"{_names(content)} named like content")
    measured = []
    for c in free:
        if (
            c.kind is not ColumnKind.TEXT
            or c.name in content
            or _rank(c.name, CATEGORY_NAMES) is not None
        ):
            continue
        if c.name.lower().endswith(IDENTIFIER_ENDINGS):
            unused[c.name] = "named like an identifier or an address, not content"
            continue
        if c.max_length is not None and c.max_length < PROSE_CHARS:
            unused[c.name] = f"{c.type}: too short for prose"
            continue
        chars = sample.avg_chars.get(c.name) if sample is not None else None
        if chars is not None and chars >= PROSE_CHARS:
            measured.append(c.name)
            rows = sample.rows if sample is not None else 0
            parts.append(f"{c.name!r} averages {chars:.0f} characters over {rows} rows read")
        elif chars is not None:
            unused[c.name] = (
                f"short text (averages {chars:.0f} characters over the rows read): a label, "
                "not content"
            )
        elif sample is not None and sample.rows:
            unused[c.name] = f"text not named like content, NULL in all {sample.rows} rows read"
        else:
            unused[c.name] = "text not named like content, and no rows to measure it by"
    content += measured
    json_columns = [c.name for c in free if c.kind is ColumnKind.JSON]
    if json_columns:
        parts.append(f"JSON column(s) {_names(json_columns)}")
    content += json_columns
    if content and title is not None:
        content.insert(0, title.name)
        parts.append(
            f"the title {title.name!r} comes first, so a search matches it (the title alone is "
            "not embedded)"
        )
    return content, json_columns, "; ".join(parts)


@dataclass
class _Times:
    created: str | None = None
    updated: str | None = None
    deleted: str | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)


def _choose_times(
    usable: Sequence[ColumnInfo], used: set[str], unused: dict[str, str], notes: list[str]
) -> _Times:
    times = _Times()
    stamps = [c for c in usable if c.name not in used and c.kind is ColumnKind.TIMESTAMP]
    updated = _first(stamps, UPDATED_NAMES)
    if updated is not None:
        times.updated = updated.name
        times.reasons["updated_at_column"] = (
            f"{updated.name!r} is a timestamp named like an update time: it orders two "
            "versions of a row that lack a source position (SoR re-reads)"
        )
    else:
        times.reasons["updated_at_column"] = "no timestamp named like an update time"
    created = _first([c for c in stamps if c is not updated], CREATED_NAMES)
    if created is not None:
        times.created = created.name
        times.reasons["created_at_column"] = (
            f"{created.name!r} is a timestamp named like a creation time"
        )
    else:
        times.reasons["created_at_column"] = "no timestamp named like a creation time"
    deleted = _first(
        [
            c
            for c in usable
            if c.name not in used
            and c.kind in (ColumnKind.TIMESTAMP, ColumnKind.DATE)
            and not c.not_null
        ],
        DELETED_NAMES,
    )
    if deleted is not None:
        times.deleted = deleted.name
        times.reasons["deleted_at_column"] = (
            f"{deleted.name!r} is a nullable timestamp named like a deletion time: a row where "
            "it is set leaves the index (soft delete)"
        )
    else:
        times.reasons["deleted_at_column"] = (
            "no soft-delete column: a row leaves the index when it is deleted"
        )
    flags = [
        c
        for c in usable
        if c.name not in used
        and c.kind is ColumnKind.BOOLEAN
        and _rank(c.name, BOOLEAN_DELETED_NAMES) is not None
    ]
    for flag in flags:
        unused[flag.name] = (
            "a boolean soft-delete flag: a mapping deletes a row where deleted_at_column is not "
            "NULL, and false is not NULL"
        )
        if deleted is None:
            notes.append(
                f"{flag.name!r} looks like a soft-delete flag, which a mapping cannot follow: "
                "rows flagged deleted stay searchable. Add a nullable timestamp set when the "
                f"flag is (e.g. `ALTER TABLE ... ADD COLUMN deleted_at timestamptz`, kept by the "
                "application or a trigger) and map it as deleted_at_column"
            )
    times.used = {c for c in (times.created, times.updated, times.deleted) if c is not None}
    return times


def _why_unused(column: ColumnInfo, table: TableInfo, *, document: bool) -> str:
    if document and column.kind in (ColumnKind.TEXT, ColumnKind.JSON):
        return (
            "a document table's content is its file (add the column to metadata_columns to "
            "keep it with each result)"
        )
    for fk in table.foreign_keys:
        if column.name in fk.columns:
            return f"a reference to {fk.references} (add it to metadata_columns to filter by it)"
    if column.kind is ColumnKind.BYTEA:
        return "binary, not named like a file (document.column takes one per table)"
    if column.kind is ColumnKind.JSON:
        return "JSON, but the table's content is a document"
    if column.kind in (ColumnKind.TIMESTAMP, ColumnKind.DATE, ColumnKind.TIME):
        return "a time not named like a creation, update or deletion time"
    return f"{column.type}, not named like a title, content, category or time column"
