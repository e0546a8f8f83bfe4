"""Small measurement scripts (run by hand or via `ragstream bench ...`, never as timed tests)."""
