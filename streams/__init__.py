"""The ingest service: Debezium change events in, per-tenant vector index out."""
