"""The gRPC Retrieve service: search, rerank, verify against the SoR, evidence packs."""
