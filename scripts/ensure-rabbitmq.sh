#!/usr/bin/env bash
# Makes sure a RabbitMQ broker answers on 127.0.0.1:5672 for the AMQP tests and benchmarks.
#
# Order: already listening -> start the installed server (`rabbitmq-server -detached`) ->
# install Debian's rabbitmq-server (needs root) and start it. Waits for the broker to boot.
# Set LEASE_TEST_AMQP_URL to use a broker elsewhere; then this script does nothing.
set -euo pipefail

log() { echo "ensure-rabbitmq: $*" >&2; }
listening() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

if [[ -n "${LEASE_TEST_AMQP_URL:-}" ]]; then
  log "using LEASE_TEST_AMQP_URL"; exit 0
fi
if listening; then exit 0; fi

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  if [[ $(id -u) -ne 0 ]]; then
    log "RabbitMQ is not installed; run: sudo apt-get install rabbitmq-server && sudo rabbitmq-server -detached"
    exit 1
  fi
  log "installing rabbitmq-server from the machine's Debian archive"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >&2
fi

log "starting rabbitmq-server"
rabbitmq-server -detached >&2 || true
if command -v rabbitmqctl >/dev/null 2>&1; then
  rabbitmqctl -q --timeout 120 await_startup >&2 || true
fi
for _ in $(seq 1 240); do
  if listening; then log "RabbitMQ is up"; exit 0; fi
  sleep 0.5
done
log "RabbitMQ did not start listening on 127.0.0.1:5672; see /var/log/rabbitmq/"
exit 1
