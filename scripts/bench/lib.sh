# Helpers scripts/bench.sh and scripts/bench/stdio.sh share; sourced after they set $root.
# Messages go to stderr, prefixed with $bench_name.

# a port below the ephemeral range, reserved across processes (scripts/free-port.py)
free_port() {
    python3 "$root/scripts/free-port.py"
}

# wait_port PORT [WHAT]: until something accepts on 127.0.0.1:PORT (20 s at most)
wait_port() {
    for _ in $(seq 1 400); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "$bench_name: ${2:-port $1} did not come up on port $1" >&2
    return 1
}

# gw_ready PORT ADMIN_PORT LOG WHAT: a gateway just started accepts on PORT and its /readyz
# answers 200 (its store and upstream are up); else the end of its LOG is printed
gw_ready() {
    wait_port "$1" "$4" || return 1
    for _ in $(seq 1 200); do
        curl -sf "http://127.0.0.1:$2/readyz" >/dev/null && return 0
        sleep 0.05
    done
    echo "$bench_name: $4 not ready:" >&2
    tail -n 20 "$3" >&2
    return 1
}

# metric ADMIN_PORT NAME: the value of one series of a gateway's /metrics (0 if absent)
metric() {
    curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2; f=1} END {if (!f) print 0}'
}

# bench_policy [TOOL...]: the configuration's tail every benchmark gateway shares: warn logs,
# one static subject, every tool non_idempotent for an hour but "search" and the TOOLs (reads)
bench_policy() {
    printf 'log:\n  level: warn\nsubject:\n  static: bench\ndefaults:\n  class: non_idempotent\n  window: 1h\ntools:\n  search: {class: read}\n'
    for t in "$@"; do printf '  %s: {class: read}\n' "$t"; done
}
