#!/usr/bin/env bash
# Start the machine's Redis on 127.0.0.1:6379 without persistence (Debian package layout).
# Idempotent: does nothing when the port already answers. Used by tests/CI (fixture `redis_url`).
set -euo pipefail
HOST=127.0.0.1
PORT=${REDIS_PORT:-6379}

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; }

if answers; then
  echo "redis: already answering on $HOST:$PORT"
  exit 0
fi
if ! command -v redis-server >/dev/null; then
  echo "redis: redis-server not found; install it (apt-get install redis-server)" >&2
  exit 1
fi
mkdir -p /var/lib/redis /var/log/redis
redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$PORT" --save "" --appendonly no \
  --dir /var/lib/redis --logfile /var/log/redis/ci.log
for _ in $(seq 1 100); do
  if answers; then echo "redis: started on $HOST:$PORT"; exit 0; fi
  sleep 0.1
done
echo "redis: did not answer on $HOST:$PORT within 10 s; see /var/log/redis/ci.log" >&2
exit 1
