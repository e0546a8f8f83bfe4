"""Readers of the system of record: verification (Retrieve), refetch and scans (ingest, reindex)."""
