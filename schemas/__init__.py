"""The contracts of ragstream: change events, entities, chunks, evidence packs, the gRPC API."""
