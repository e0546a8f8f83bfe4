"""Writers of a system of record for the dev stack and the tests: the embedded SQLite SoR that
publishes Debezium-format change events itself, and SQL writes to PostgreSQL for real Debezium."""
