-- Support tickets: a second SoR table of the sample corpus, shaped unlike `entities` (its content
-- is two columns, its type is constant, status and priority are plain columns copied into the
-- metadata, no content-hash column). Mapped by ragdev.sample.SAMPLE_TABLES.
CREATE TABLE IF NOT EXISTS tickets (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    subject       TEXT NOT NULL,
    body          TEXT NOT NULL DEFAULT '',
    status        TEXT NOT NULL DEFAULT 'open',
    priority      TEXT NOT NULL DEFAULT 'normal',
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at    TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS tickets_company_idx ON tickets (company_id, id);
ALTER TABLE tickets REPLICA IDENTITY FULL;
