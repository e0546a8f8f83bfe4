#!/bin/sh
# One-shot registration of the Debezium connector (docker-compose service `connect-init`).
# Idempotent: PUT /connectors/<name>/config creates the connector or updates its config, so
# re-running after a config change applies it. Then waits until the connector and its task run.
# POSIX sh (the curl image has no bash).
set -eu

CONNECT_URL="${CONNECT_URL:-http://connect:8083}"
CONFIG="${CONNECTOR_CONFIG:-/config/entities-connector.json}"
CONNECTOR_CLASS="io.debezium.connector.postgresql.PostgresConnector"
TRIES="${TRIES:-90}"

fail() { echo "register-connector: $*" >&2; exit 1; }

[ -r "$CONFIG" ] || fail "cannot read $CONFIG"
name=$(sed -n 's/^[[:space:]]*"name":[[:space:]]*"\([^"]*\)".*/\1/p' "$CONFIG" | head -n 1)
[ -n "$name" ] || fail "no \"name\" in $CONFIG"

i=0
until plugins=$(curl -fsS "$CONNECT_URL/connector-plugins" 2>/dev/null); do
  i=$((i + 1))
  [ "$i" -lt "$TRIES" ] || fail "Kafka Connect at $CONNECT_URL not reachable"
  sleep 2
done
echo "$plugins" | grep -q "$CONNECTOR_CLASS" || fail "$CONNECTOR_CLASS is not installed in Connect"

echo "register-connector: PUT $CONNECT_URL/connectors/$name/config"
curl -fsS -X PUT -H 'Content-Type: application/json' --data @"$CONFIG" \
  "$CONNECT_URL/connectors/$name/config" >/dev/null || fail "Connect refused the config of $name"

i=0
while :; do
  status=$(curl -fsS "$CONNECT_URL/connectors/$name/status" 2>/dev/null || true)
  case "$status" in
    *'"FAILED"'*) fail "connector $name failed: $status" ;;
  esac
  running=$(printf '%s' "$status" | grep -o '"state"[[:space:]]*:[[:space:]]*"RUNNING"' | wc -l)
  # One for the connector, one for its task (tasks.max=1).
  if [ "$running" -ge 2 ]; then
    echo "register-connector: $name is RUNNING"
    exit 0
  fi
  i=$((i + 1))
  [ "$i" -lt "$TRIES" ] || fail "connector $name not running after $TRIES tries: $status"
  sleep 2
done
