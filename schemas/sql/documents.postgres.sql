-- Documents: files kept in the SoR (PDF, DOCX, XLSX, CSV) in a bytea column, their MIME type and
-- file name beside them (README "Documents"). Mapped by ragdev.sample_documents.DOCUMENTS_TABLE;
-- Debezium sends `body` base64-encoded. REPLICA IDENTITY FULL like the other sample tables (with
-- DEFAULT an update of another column carries the unchanged TOASTed file as a placeholder and
-- the worker re-reads the row).
CREATE TABLE IF NOT EXISTS documents (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    title         TEXT NOT NULL,
    file_name     TEXT,
    mime_type     TEXT,
    body          BYTEA NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at    TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS documents_company_idx ON documents (company_id, id);
ALTER TABLE documents REPLICA IDENTITY FULL;
