"""ragcore: what both ragstream services build on (see docs/architecture.md).

Contracts beyond `schemas` (errors, the table mapping and the plan of a change event, content
hashing), text preparation (normalize, chunking, tokenizers, the BM25 encoder), fusion, and the
ports with their adapters: embedders, rerankers, vector stores and the index registry, SoR
readers, Kafka publishing. `ragcore.settings` is the settings base of both services and
`ragcore.wiring` builds the shared parts from it. Imports nothing of ours but `schemas`.
"""
