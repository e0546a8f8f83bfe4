#!/usr/bin/env bash
# PostgreSQL init (docker-entrypoint-initdb.d, runs once on an empty data directory, after
# 01-entities.sql created the table). Least privilege for the two clients of the SoR:
#   debezium         LOGIN REPLICATION + SELECT on entities (logical decoding via pgoutput);
#                    the publication is created here, so the connector runs with
#                    publication.autocreate.mode=disabled and needs no table ownership.
#   ragstream_reader LOGIN + SELECT on entities (Retrieve verification, ingest TOAST refetch).
# Passwords come from the environment (docker-compose.yml), never from this file.
set -euo pipefail
: "${DEBEZIUM_PASSWORD:?DEBEZIUM_PASSWORD must be set}"
: "${SOR_READER_PASSWORD:?SOR_READER_PASSWORD must be set}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v debezium_pw="$DEBEZIUM_PASSWORD" -v reader_pw="$SOR_READER_PASSWORD" <<'SQL'
CREATE ROLE debezium WITH LOGIN REPLICATION PASSWORD :'debezium_pw';
CREATE ROLE ragstream_reader WITH LOGIN PASSWORD :'reader_pw';
GRANT USAGE ON SCHEMA public TO debezium, ragstream_reader;
GRANT SELECT ON public.entities TO debezium, ragstream_reader;
CREATE PUBLICATION ragstream_entities FOR TABLE public.entities;
SQL
