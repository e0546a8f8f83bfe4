#!/bin/sh
# One-shot topic creation (docker-compose service `kafka-init`): every topic ragstream reads or
# writes, created explicitly (the broker does not auto-create topics). Idempotent.
#   TOPICS="name:partitions name:partitions ..."   (replication factor: REPLICATION_FACTOR)
# The partition count of the CDC topic bounds the useful number of ingest workers.
set -eu

BOOTSTRAP="${BOOTSTRAP_SERVERS:-kafka:9092}"
RF="${REPLICATION_FACTOR:-1}"
KAFKA_TOPICS="${KAFKA_TOPICS_BIN:-/opt/kafka/bin/kafka-topics.sh}"
: "${TOPICS:?TOPICS must list name:partitions pairs}"

for spec in $TOPICS; do
  topic="${spec%%:*}"
  partitions="${spec#*:}"
  echo "create-topics: $topic ($partitions partitions, replication factor $RF)"
  "$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists \
    --topic "$topic" --partitions "$partitions" --replication-factor "$RF"
done
"$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --list
