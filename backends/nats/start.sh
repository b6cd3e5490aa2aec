#!/usr/bin/env bash
# Start the machine's NATS server with JetStream on 127.0.0.1:4222 (Debian package layout).
# Idempotent: does nothing when the port already answers. Used by tests/CI (fixture `nats_url`).
set -euo pipefail
HOST=127.0.0.1
PORT=${NATS_PORT:-4222}
STORE=${NATS_STORE_DIR:-/var/lib/nats-server}
LOG=${NATS_LOG:-/var/log/nats-server.log}

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; }

if answers; then
  echo "nats: already answering on $HOST:$PORT"
  exit 0
fi
BIN=${NATS_SERVER_BIN:-/usr/sbin/nats-server}
if [ ! -x "$BIN" ]; then
  echo "nats: $BIN not found; install the nats-server package (apt-get install nats-server)" >&2
  exit 1
fi
mkdir -p "$STORE"
start-stop-daemon --start --oknodo --background --exec "$BIN" -- \
  -a "$HOST" -p "$PORT" -js -sd "$STORE" -l "$LOG"
for _ in $(seq 1 100); do
  if answers; then echo "nats: started on $HOST:$PORT"; exit 0; fi
  sleep 0.1
done
echo "nats: did not answer on $HOST:$PORT within 10 s; see $LOG" >&2
exit 1
