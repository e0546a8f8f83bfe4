-- The SoR table of the seed pipeline (FIT-RAG-PIPELINE-001), as ragstream's default mapping
-- expects it. REPLICA IDENTITY FULL makes Debezium put the whole old row in `before`, so
-- deletes and tenant moves carry the tenant (ragstream copes without it, at a higher cost).
CREATE TABLE IF NOT EXISTS entities (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    entity_type   TEXT NOT NULL DEFAULT 'KNOWLEDGE_ARTIFACT',
    name          TEXT NOT NULL DEFAULT '',
    content       TEXT NOT NULL DEFAULT '',
    metadata      JSONB NOT NULL DEFAULT '{}'::jsonb,
    content_hash  TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at    TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS entities_company_idx ON entities (company_id, id);
ALTER TABLE entities REPLICA IDENTITY FULL;
