"""ragstream: the production command line on top of both services (see docs/architecture.md).

`ragstream` (cli) with query, reindex and its parity gate, calibrate, reconcile, index, config,
inspect-event and chunk-preview. The dev tools (dev stack, benchmarks, eval) add their
subcommands from the separate ragstream-dev distribution (`devtools/ragdev`).
"""

__version__ = "0.1.0"
