-- The embedded SoR's documents table: the same columns as documents.postgres.sql, the file in a
-- BLOB. Timestamps are ISO-8601 UTC text.
CREATE TABLE IF NOT EXISTS documents (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    title         TEXT NOT NULL,
    file_name     TEXT,
    mime_type     TEXT,
    body          BLOB NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    deleted_at    TEXT
);
CREATE INDEX IF NOT EXISTS documents_company_idx ON documents (company_id, id);
