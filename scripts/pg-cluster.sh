#!/usr/bin/env bash
# A private PostgreSQL cluster for the demo and the tests, named by a local folder DIR.
#   scripts/pg-cluster.sh start DIR [PORT]   initdb (once) and start; prints the database URL
#   scripts/pg-cluster.sh standby DIR PRIMARY_DIR [PORT]
#                                            a streaming standby of the running cluster of
#                                            PRIMARY_DIR (pg_basebackup -R, once), started;
#                                            prints its URL
#   scripts/pg-cluster.sh promote DIR        makes a standby the primary (waits until it is)
#   scripts/pg-cluster.sh stop DIR           fast shutdown (the data stays for the next start)
#   scripts/pg-cluster.sh url DIR            prints the URL of a running cluster
#   scripts/pg-cluster.sh remove DIR         stop, then delete the cluster and DIR
# initdb and pg_ctl refuse to run as root, so as root they run as the postgres user, which may
# not be able to reach DIR. The cluster then lives in a folder of its own that this script
# makes for it (mktemp -d in /dev/shm when DIR is there, else /tmp; owned by postgres, mode
# 700); DIR/cluster names that folder. No other folder's permissions are changed. Such a
# folder goes with `remove`, or else is deleted by a later start once its DIR is gone and it no
# longer runs, so a caller that only stops the cluster and removes DIR leaves nothing for long.
# The cluster keeps Postgres's durability defaults (fsync, synchronous_commit, full page
# writes): the gateway's promise rests on a claim surviving a crash. Tests that want speed put
# DIR in a RAM-backed folder (tests/run-all.sh uses /dev/shm) rather than turning them off.
set -euo pipefail

PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
usage="usage: pg-cluster.sh start|standby|promote|stop|url|remove DIR [PRIMARY_DIR] [PORT]"
cmd=${1:?$usage}
dir=${2:?$usage}
is_root=0
[ "$(id -u)" = 0 ] && is_root=1

as_pg() {
    if [ "$is_root" = 1 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
    python3 "$(dirname "$0")/free-port.py" 2>/dev/null || echo $((20000 + RANDOM % 12000))
}

# The folder holding data/, the socket and the logs: DIR itself, or as root the folder
# DIR/cluster names (empty when there is none yet).
cluster_of() {
    if [ "$is_root" = 0 ]; then
        echo "$1"
    elif [ -f "$1/cluster" ]; then
        cat "$1/cluster"
    fi
}

# Removes clusters made for a DIR that no longer exists, unless they still run.
sweep_orphans() {
    local c owner
    for c in /dev/shm/idemgw-pgc.* /tmp/idemgw-pgc.*; do
        [ -f "$c/owner" ] || continue # not ours, or still being made
        owner=$(cat "$c/owner")
        [ "$(cat "$owner/cluster" 2>/dev/null)" = "$c" ] && continue
        as_pg "$PGBIN/pg_ctl" -D "$c/data" status >/dev/null 2>&1 && continue
        rm -rf "$c"
    done
}

# Makes sure DIR has the folder of its cluster (as root: one of its own, owned by postgres);
# sets dir (absolute) and cluster.
cluster_dir() {
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    cluster=$(cluster_of "$dir")
    if [ "$is_root" = 1 ] && { [ -z "$cluster" ] || [ ! -d "$cluster" ]; }; then
        sweep_orphans
        base=/tmp
        case "$dir" in /dev/shm/*) base=/dev/shm ;; esac
        cluster=$(mktemp -d "$base/idemgw-pgc.XXXXXX")
        chown postgres: "$cluster"
        chmod 700 "$cluster"
        # in this order: a folder without an owner is never swept
        echo "$cluster" >"$dir/cluster"
        echo "$dir" >"$cluster/owner"
    fi
}

# Starts the cluster of DIR (unless it runs) on PORT, else its last port, else a free one;
# prints its URL.
run_cluster() {
    port=${1:-$(cat "$dir/port" 2>/dev/null || free_port)}
    echo "$port" >"$dir/port"
    if ! as_pg "$PGBIN/pg_ctl" -D "$cluster/data" status >/dev/null 2>&1; then
        as_pg "$PGBIN/pg_ctl" -D "$cluster/data" -l "$cluster/postgres.log" -w -t 60 \
            -o "-p $port -k $cluster -c listen_addresses=127.0.0.1 -c max_connections=200" \
            start >/dev/null || { cat "$cluster/postgres.log" >&2; exit 1; }
    fi
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
}

case "$cmd" in
start)
    cluster_dir
    if [ ! -f "$cluster/data/PG_VERSION" ]; then
        as_pg "$PGBIN/initdb" -D "$cluster/data" -U postgres -A trust -E UTF8 --no-locale \
            >"$cluster/initdb.log" 2>&1 || { cat "$cluster/initdb.log" >&2; exit 1; }
    fi
    run_cluster "${3:-}"
    ;;
standby)
    primary=${3:?$usage}
    primary_port=$(cat "$primary/port")
    cluster_dir
    if [ ! -f "$cluster/data/PG_VERSION" ]; then
        # -R: standby.signal and primary_conninfo, so it starts streaming from the primary
        as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
            -D "$cluster/data" -R -X stream -c fast >"$cluster/basebackup.log" 2>&1 ||
            { cat "$cluster/basebackup.log" >&2; exit 1; }
    fi
    run_cluster "${4:-}"
    ;;
promote)
    cluster=$(cluster_of "$(cd "$dir" && pwd)")
    as_pg "$PGBIN/pg_ctl" -D "$cluster/data" -w -t 60 promote >/dev/null
    ;;
stop | remove)
    cluster=$(cluster_of "$dir" 2>/dev/null || true)
    if [ -n "$cluster" ] && [ -d "$cluster/data" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$cluster/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    if [ "$cmd" = remove ]; then
        [ "$is_root" = 1 ] && [ -n "$cluster" ] && rm -rf "$cluster"
        rm -rf "$dir"
    fi
    ;;
url)
    echo "postgresql://postgres@127.0.0.1:$(cat "$dir/port")/postgres"
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
