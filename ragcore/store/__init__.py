"""Vector stores behind the `VectorStore` port (`base`), ids and names (`ids`), the index registry.

Import adapters from their modules (`ragcore.store.edge`, `ragcore.store.qdrant_remote`) so
that importing the port never imports a vendor client.
"""
