#!/usr/bin/env bash
# A private PostgreSQL cluster in a local folder, for the demo and the tests.
#   scripts/pg-cluster.sh start DIR [PORT]   initdb (once) and start; prints the database URL
#   scripts/pg-cluster.sh stop DIR           fast shutdown
#   scripts/pg-cluster.sh url DIR            prints the URL of a running cluster
# initdb and pg_ctl refuse to run as root, so as root they run as the postgres user.
# The cluster keeps Postgres's durability defaults (fsync, synchronous_commit, full page
# writes): the gateway's promise rests on a claim surviving a crash. Tests that want speed put
# DIR in a RAM-backed folder (tests/run-all.sh uses /dev/shm) rather than turning them off.
set -euo pipefail

PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
cmd=${1:?usage: pg-cluster.sh start|stop|url DIR [PORT]}
dir=${2:?usage: pg-cluster.sh start|stop|url DIR [PORT]}

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
    python3 - <<'PY' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

case "$cmd" in
start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
        chmod 700 "$dir"
        # the postgres user must be able to reach the folder
        p=$(dirname "$dir")
        while [ "$p" != / ]; do chmod o+x "$p" 2>/dev/null || true; p=$(dirname "$p"); done
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    port=${3:-$(cat "$dir/port" 2>/dev/null || free_port)}
    echo "$port" | as_pg tee "$dir/port" >/dev/null
    if ! as_pg "$PGBIN/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
            -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" \
            start >/dev/null || { cat "$dir/postgres.log" >&2; exit 1; }
    fi
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    [ -d "$dir/data" ] && as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
url)
    echo "postgresql://postgres@127.0.0.1:$(cat "$dir/port")/postgres"
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
