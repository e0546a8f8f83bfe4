-- The embedded SoR's tickets table: the same columns as tickets.postgres.sql. Timestamps are
-- ISO-8601 UTC text.
CREATE TABLE IF NOT EXISTS tickets (
    id            TEXT PRIMARY KEY,
    company_id    TEXT NOT NULL,
    subject       TEXT NOT NULL,
    body          TEXT NOT NULL DEFAULT '',
    status        TEXT NOT NULL DEFAULT 'open',
    priority      TEXT NOT NULL DEFAULT 'normal',
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    deleted_at    TEXT
);
CREATE INDEX IF NOT EXISTS tickets_company_idx ON tickets (company_id, id);
