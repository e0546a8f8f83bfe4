"""ragdev: ragstream's dev tools, a distribution of its own (ragstream-dev), never in the
production image (see docs/architecture.md).

The embedded dev stack (`ragstream dev`) and its sample corpus, the embedded SoR and the
Debezium-format writer, the local service launchers (tansu, PostgreSQL, real Debezium), the
benchmarks (`ragstream bench`) and the evaluation harness with its data (`ragstream eval`).
"""
