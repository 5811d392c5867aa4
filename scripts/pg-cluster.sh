#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for trying or measuring `strom sink
# postgres` by hand (the tests use crates/strom-cli/tests/common/pg.rs):
#
#   scripts/pg-cluster.sh start DIR   # initdb DIR/data if new, start; prints the DSN
#   scripts/pg-cluster.sh stop DIR    # fast shutdown
#
# The server listens only on a Unix socket in DIR (no TCP port). Binaries:
# the newest /usr/lib/postgresql/<version>/bin, or $STROM_PG_BIN. initdb and
# postgres refuse to run as root, so under root they run as `postgres`.
# Settings are PostgreSQL's defaults (fsync and synchronous_commit on).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(realpath -m "$2")

bin=${STROM_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$bin/initdb" ] || { echo "$0: no PostgreSQL binaries (run scripts/setup.sh)" >&2; exit 1; }

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case $cmd in
  start)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_pg "$bin/initdb" -A trust -U postgres -E UTF8 --locale=C -D "$dir/data" >/dev/null
    fi
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
      -o "-k $dir -c listen_addresses= -p 5432" start >/dev/null
    echo "host=$dir port=5432 user=postgres dbname=postgres"
    ;;
  stop)
    as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
  *) usage ;;
esac
