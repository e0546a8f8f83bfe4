"""ragstream: keeps a retrieval index true to its system of record.

This package holds what the ingest service (`streams`) and the Retrieve service
(`retrieval_api`) share: errors, settings, embedders, vector stores, the index registry and the
`ragstream` command line.
"""

__version__ = "0.1.0"
