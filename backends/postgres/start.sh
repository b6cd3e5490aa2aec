#!/usr/bin/env bash
# Start the machine's PostgreSQL cluster (Debian layout, trust auth, database `test`) on 127.0.0.1:5432.
# Idempotent: does nothing when the port already answers. Used by tests/CI (fixture `postgres_url`).
set -euo pipefail
HOST=127.0.0.1
PORT=5432

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; }

if answers; then
  echo "postgres: already answering on $HOST:$PORT"
  exit 0
fi
if ! command -v pg_ctlcluster >/dev/null || [ ! -d /etc/postgresql ]; then
  echo "postgres: no Debian PostgreSQL cluster here; install postgresql (apt-get install postgresql)" >&2
  exit 1
fi
VERSION=$(ls /etc/postgresql | sort -V | tail -n 1)
pg_ctlcluster --skip-systemctl-redirect "$VERSION" main start
for _ in $(seq 1 150); do
  if answers; then echo "postgres: started cluster $VERSION/main on $HOST:$PORT"; exit 0; fi
  sleep 0.2
done
echo "postgres: did not answer on $HOST:$PORT within 30 s; see /var/log/postgresql/" >&2
exit 1
