-- The embedded SoR: the same columns as entities.postgres.sql. Timestamps are ISO-8601 UTC
-- text; metadata is JSON text.
CREATE TABLE IF NOT EXISTS entities (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    entity_type   TEXT NOT NULL DEFAULT 'KNOWLEDGE_ARTIFACT',
    name          TEXT NOT NULL DEFAULT '',
    content       TEXT NOT NULL DEFAULT '',
    metadata      TEXT NOT NULL DEFAULT '{}',
    content_hash  TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    deleted_at    TEXT
);
CREATE INDEX IF NOT EXISTS entities_company_idx ON entities (company_id, id);
