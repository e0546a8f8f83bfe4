"""Local service processes ragstream starts itself (the dev stack, the tests)."""
