"""Embedders: turn text into vectors (one `Embedder` port, several adapters)."""
