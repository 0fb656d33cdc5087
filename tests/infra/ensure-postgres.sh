#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on 127.0.0.1:5432 with a database the tests can use.
# Uses a running server when there is one; otherwise installs Debian's package and starts a
# cluster on loopback. The tests read BIDE_TEST_POSTGRES_URL (default below).
set -euo pipefail
PY=${PYTHON:-python3}
probe() {
  $PY - <<'PYEOF' >/dev/null 2>&1
import os, psycopg
url = os.environ.get("BIDE_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
psycopg.connect(url, connect_timeout=3).close()
PYEOF
}
if probe; then exit 0; fi
echo "PostgreSQL is not answering on 127.0.0.1:5432; installing and starting one" >&2
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /etc/postgresql | sort -V | tail -n 1)
conf=/etc/postgresql/$ver/main
# Loopback only, trust for local test connections.
sed -i "s/^#\?listen_addresses.*/listen_addresses = '127.0.0.1'/" "$conf/postgresql.conf"
if ! grep -q "bide-test" "$conf/pg_hba.conf"; then
  sed -i '1i host all all 127.0.0.1/32 trust # bide-test\nlocal all all trust # bide-test' "$conf/pg_hba.conf"
fi
pg_ctlcluster --skip-systemctl-redirect "$ver" main start || pg_ctlcluster --skip-systemctl-redirect "$ver" main restart
for _ in $(seq 1 30); do probe && break; sleep 1; done
su postgres -c "psql -h 127.0.0.1 -tc \"select 1 from pg_database where datname='test'\"" | grep -q 1 \
  || su postgres -c "createdb -h 127.0.0.1 test"
probe || { echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2; exit 1; }
