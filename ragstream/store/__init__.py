"""Vector stores behind the `VectorStore` port (`base`), ids and names (`ids`), the index registry.

Import adapters from their modules (`ragstream.store.edge`, `ragstream.store.qdrant_remote`) so
that importing the port never imports a vendor client.
"""
