#!/usr/bin/env python3
"""Turns the figures of scripts/bench/stdio.sh (the JSON lines of tests/bench/stdio-bench.mjs and
tests/bench/stdio-failures.mjs) into Markdown tables and one JSON document.

usage: stdio-report.py RESULTS.jsonl OUT.json [--meta JSON]

Each server (bench, memory) has its tables. Each summary figure is the median over the rounds.
Memory per session is the difference between the process tree's RSS with the most and with the
fewest sessions open, divided by the difference in sessions (the same for PSS, which splits
shared pages among the processes mapping them). The failure classes are one table: a row per
class, a column per target, each cell pass/FAIL (n/a where the class does not apply as such)
and what the agent saw.

The document: meta; summary (the bench server's targets, as before a second server existed);
servers (each server's name, tools and summary); rounds (every round of every server, with
its server); failures (one entry per class and target)."""
import json
import sys
from datetime import datetime, timezone
from statistics import median

TARGET_ORDER = ["idemgw_per_session", "idemgw_shared", "supergateway", "mcp_proxy"]
FAILURE_TARGETS = ["idemgw", "supergateway", "mcp_proxy"]
SERVER_ORDER = ["bench", "memory"]
SERVER_TITLE = {
    "bench": "tests/bench/stdio-server.mjs (the MCP SDK {sdk})",
    "memory": "@modelcontextprotocol/server-memory {server_memory} (npm)",
}
FAILURE_CLASSES = [
    ("a", "(a) child dies mid-call (SIGKILL): the protected call in flight"),
    ("b", "(b) server never answers initialize: the agent's initialize"),
    ("c", "(c) agents never send DELETE: one session past max_children"),
    ("d", "(d) SIGTERM to the gateway/bridge with a call in flight (1.5 s left)"),
    ("e1", "(e) helpers (one in the group, one setsid) after the session's DELETE"),
    ("e2", "(e) helpers after the server crashes (SIGKILL)"),
    ("e3", "(e) helpers (and the server) after SIGTERM to the gateway/bridge"),
    ("f1", "(f) protected write retried after its answer, same session: runs"),
    ("f2", "(f) protected write retried while the first runs: runs"),
]


def med(values):
    values = [v for v in values if v is not None]
    return round(median(values), 3) if values else None


def per_session(mem):
    """{sessions: figure} of one round -> (rss KiB, pss KiB) per added session, or Nones."""
    if len(mem) < 2:
        return None, None
    lo, hi = min(mem), max(mem)
    n = hi - lo
    return ((mem[hi]["rss_kib"] - mem[lo]["rss_kib"]) / n, (mem[hi]["pss_kib"] - mem[lo]["pss_kib"]) / n)


def fmt(v, digits=1):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def mib(kib):
    return None if kib is None else kib / 1024.0


def summarise(rows):
    """One server's figures -> (targets, rounds, counts, tools, summary, every_round)."""
    targets = [t for t in TARGET_ORDER if any(r["target"] == t for r in rows)]
    targets += sorted({r["target"] for r in rows} - set(targets))
    rounds = sorted({r["round"] for r in rows})
    counts = sorted({r["sessions"] for r in rows if r["kind"] in ("load", "memory")})
    # the write first, then the read (figures of old carry no op: append is the write)
    tools = []
    for op in ("write", "read"):
        for r in rows:
            if r["kind"] == "load" and r.get("op", "write" if r["tool"] == "append" else "read") == op:
                tools.append(r["tool"])
                break

    # per target and round: every figure of that run
    runs = {}
    for r in rows:
        run = runs.setdefault((r["target"], r["round"]), {"load": {}, "memory": {}, "first_answer": None})
        if r["kind"] == "load":
            run["load"][(r["tool"], r["sessions"])] = r
        elif r["kind"] == "memory":
            run["memory"][r["sessions"]] = r
        elif r["kind"] == "first_answer":
            run["first_answer"] = r
    for run in runs.values():
        run["rss_per_session_kib"], run["pss_per_session_kib"] = per_session(run["memory"])

    summary = []
    for t in targets:
        mine = [runs[(t, rd)] for rd in rounds if (t, rd) in runs]
        e = {"target": t, "rounds": len(mine)}
        fa = [m["first_answer"] for m in mine if m["first_answer"]]
        e["first_answer_mean_ms"] = med([f["mean_ms"] for f in fa])
        e["connect_mean_ms"] = med([f["connect_mean_ms"] for f in fa])
        e["first_answer_errors"] = sum(f["errors"] for f in fa)
        e["load"] = []
        for tool in tools:
            for c in counts:
                ls = [m["load"][(tool, c)] for m in mine if (tool, c) in m["load"]]
                if not ls:
                    continue
                e["load"].append({
                    "tool": tool, "sessions": c,
                    "calls_per_s": med([x["calls_per_s"] for x in ls]),
                    "p50_ms": med([x["p50_ms"] for x in ls]),
                    "p99_ms": med([x["p99_ms"] for x in ls]),
                    "calls": sum(x["calls"] for x in ls),
                    "errors": sum(x["errors"] for x in ls),
                    "replays": sum(x["replays"] for x in ls),
                })
        e["memory"] = {}
        for c in counts:
            ms = [m["memory"][c] for m in mine if c in m["memory"]]
            if ms:
                e["memory"][str(c)] = {"rss_kib": med([x["rss_kib"] for x in ms]),
                                       "pss_kib": med([x["pss_kib"] for x in ms]),
                                       "procs": med([x["procs"] for x in ms])}
        e["rss_per_session_kib"] = med([m["rss_per_session_kib"] for m in mine])
        e["pss_per_session_kib"] = med([m["pss_per_session_kib"] for m in mine])
        summary.append(e)

    every_round = []
    for rd in rounds:
        for t in targets:
            run = runs.get((t, rd))
            if not run:
                continue
            every_round.append({
                "round": rd, "target": t,
                "first_answer": run["first_answer"],
                "load": list(run["load"].values()),
                "memory": list(run["memory"].values()),
                "rss_per_session_kib": run["rss_per_session_kib"],
                "pss_per_session_kib": run["pss_per_session_kib"],
            })
    return targets, rounds, counts, tools, summary, every_round


def render_server(out, meta, server, rounds, counts, tools, summary, every_round, round_load):
    """Appends one server's Markdown tables to out."""
    write, read = (tools + ["-", "-"])[:2]
    n_rounds = len(rounds)
    out.append(f"### Server {server}: " + SERVER_TITLE.get(server, server).format(
        sdk=meta.get("sdk", "?"), server_memory=meta.get("server_memory", "?")) +
        f"; write `{write}`, read `{read}`; {n_rounds} round{'s' if n_rounds != 1 else ''}")
    out.append("")
    out.append("Calls (median of the rounds; latency per call, calls/s over all sessions):")
    out.append("")
    out.append(f"| target | sessions | {write} calls/s | {write} p50 ms | {write} p99 ms | {read} calls/s | "
               f"{read} p50 ms | {read} p99 ms | errors |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in summary:
        for c in counts:
            a = next((x for x in e["load"] if x["tool"] == write and x["sessions"] == c), {})
            g = next((x for x in e["load"] if x["tool"] == read and x["sessions"] == c), {})
            errs = a.get("errors", 0) + g.get("errors", 0)
            out.append(f"| {e['target']} | {c} | {fmt(a.get('calls_per_s'), 0)} | {fmt(a.get('p50_ms'), 2)} | "
                       f"{fmt(a.get('p99_ms'), 2)} | {fmt(g.get('calls_per_s'), 0)} | {fmt(g.get('p50_ms'), 2)} | "
                       f"{fmt(g.get('p99_ms'), 2)} | {errs} |")
    out.append("")
    lo, hi = (counts[0], counts[-1]) if counts else (None, None)
    out.append(f"Sessions (median of the rounds; first answer: connect + first tools/call, mean over "
               f"{meta.get('new_sessions', '?')} new sessions; memory: the process and its descendants):")
    out.append("")
    out.append(f"| target | first answer ms | of which connect ms | RSS at {lo} MiB | RSS at {hi} MiB | "
               f"processes at {hi} | RSS per session MiB | PSS per session MiB |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for e in summary:
        m_lo, m_hi = e["memory"].get(str(lo), {}), e["memory"].get(str(hi), {})
        out.append(f"| {e['target']} | {fmt(e['first_answer_mean_ms'])} | {fmt(e['connect_mean_ms'])} | "
                   f"{fmt(mib(m_lo.get('rss_kib')))} | {fmt(mib(m_hi.get('rss_kib')))} | {fmt(m_hi.get('procs'), 0)} | "
                   f"{fmt(mib(e['rss_per_session_kib']), 2)} | {fmt(mib(e['pss_per_session_kib']), 2)} |")
    out.append("")
    out.append("Every round (calls/s, p50 / p99 ms):")
    out.append("")
    head = "| round | target | first answer ms |"
    rule = "|---:|---|---:|"
    for tool in tools:
        for c in counts:
            head += f" {tool} x{c} |"
            rule += "---|"
    head += " RSS per session MiB |"
    rule += "---:|"
    out.append(head)
    out.append(rule)
    for er in every_round:
        line = f"| {er['round']} | {er['target']} | {fmt((er['first_answer'] or {}).get('mean_ms'))} |"
        for tool in tools:
            for c in counts:
                x = next((y for y in er["load"] if y["tool"] == tool and y["sessions"] == c), None)
                line += (f" {fmt(x['calls_per_s'], 0)}, {fmt(x['p50_ms'], 2)} / {fmt(x['p99_ms'], 2)} |"
                         if x else " - |")
        line += f" {fmt(mib(er['rss_per_session_kib']), 2)} |"
        out.append(line)

    if round_load:
        out.append("")
        out.append("Load average at the end of each round: " +
                   "; ".join(f"round {k}: {v}" for k, v in sorted(round_load.items())))

    problems = []
    for e in summary:
        for x in e["load"]:
            if x["errors"]:
                problems.append(f"{e['target']}: {x['errors']} failed {x['tool']} calls at {x['sessions']} sessions")
            if x["replays"] and x["tool"] == write:
                problems.append(f"{e['target']}: {x['replays']} {write} calls answered as replays")
        if e["first_answer_errors"]:
            problems.append(f"{e['target']}: {e['first_answer_errors']} new sessions failed")
    prefix = "" if server == "bench" else f"{server}_"
    for t in ("idemgw_per_session", "idemgw_shared"):
        if f"{prefix}{t}_executions" in meta:
            sent = sum(x["calls"] for e in summary if e["target"] == t for x in e["load"] if x["tool"] == write)
            out.append("")
            out.append(f"{t}: {sent} {write} calls answered, {meta[f'{prefix}{t}_executions']:.0f} executions recorded "
                       f"(idemgw_executions_total); stdio children running at the end: "
                       f"{meta.get(f'{prefix}{t}_children_left', 0):.0f}")
    if problems:
        out.append("")
        out.extend(f"WARNING: {p}" for p in problems)
    out.append("")


def cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def render_failures(out, meta, failures):
    targets = [t for t in FAILURE_TARGETS if any(f["target"] == t for f in failures)]
    heads = {"idemgw": f"idemgw {meta.get('commit', '?')} (per_session)",
             "supergateway": f"supergateway {meta.get('supergateway', '?')} (--stateful)",
             "mcp_proxy": f"mcp-proxy {meta.get('mcp_proxy', '?')}"}
    waits = meta.get("failure_waits_s", "? ? ?").split()
    out.append("### Failure classes")
    out.append("")
    out.append("Server: tests/fixtures/ledger-stdio.mjs (the silent one of (b): tests/bench/silent-stdio.mjs); "
               "each class on fresh copies of every target; idemgw with its defaults but max_children 4; "
               "times from the event (the kill, the signal, the request) to the agent's answer; "
               f"waits: {' / '.join(waits)} s for a call / an initialize / a helper to go. "
               "pass/FAIL is what the agent would want, not a limit on the times.")
    out.append("")
    out.append("| class | " + " | ".join(heads.get(t, t) for t in targets) + " |")
    out.append("|---|" + "---|" * len(targets))
    by = {(f["class"], f["target"]): f for f in failures}
    known = [c for c, _ in FAILURE_CLASSES]
    extra = sorted({f["class"] for f in failures} - set(known))
    for c, title in FAILURE_CLASSES + [(c, c) for c in extra]:
        if not any((c, t) in by for t in targets):
            continue
        cells = []
        for t in targets:
            f = by.get((c, t))
            if not f:
                cells.append("-")
                continue
            mark = "n/a" if f["pass"] is None else ("pass" if f["pass"] else "**FAIL**")
            cells.append(f"{mark}: {cell(f['saw'])}")
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    tally = []
    for t in targets:
        mine = [f for f in failures if f["target"] == t and f["pass"] is not None]
        tally.append(f"{heads.get(t, t)} {sum(1 for f in mine if f['pass'])}/{len(mine)}")
    out.append("")
    out.append("Passed: " + "; ".join(tally))
    out.append("")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    meta = json.loads(sys.argv[sys.argv.index("--meta") + 1]) if "--meta" in sys.argv else {}
    meta["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [json.loads(line) for line in open(src) if line.strip()]
    failures = [r for r in rows if r["kind"] == "failure"]
    ends = [r for r in rows if r["kind"] == "round_end"]
    rows = [r for r in rows if r["kind"] not in ("round_end", "failure")]
    for r in rows + ends:
        r.setdefault("server", "bench")
    meta["loadavg_at_round_end"] = {f"{r['server']} {r['round']}": r["loadavg"] for r in ends}

    servers = [s for s in SERVER_ORDER if any(r["server"] == s for r in rows)]
    servers += sorted({r["server"] for r in rows} - set(servers))
    per_server = {}
    for srv in servers:
        per_server[srv] = summarise([r for r in rows if r["server"] == srv])

    doc = {"meta": meta,
           "summary": per_server["bench"][4] if "bench" in per_server else [],
           "servers": [{"server": srv, "tools": per_server[srv][3], "summary": per_server[srv][4]}
                       for srv in servers],
           "rounds": [{"server": srv, **er} for srv in servers for er in per_server[srv][5]],
           "failures": failures}
    with open(dst, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    # ---- Markdown ----------------------------------------------------------------------------
    out = []
    out.append(f"idemgw stdio benchmark  {meta['date']}  commit {meta.get('commit', '?')}  "
               f"{meta.get('cpus', '?')} cpus  {meta.get('secs', '?')} s per load phase  "
               f"load avg at start {meta.get('loadavg_at_start', '?')}, at end {meta.get('loadavg_at_end', '?')}")
    out.append(f"Versions: supergateway {meta.get('supergateway', '?')}, mcp-proxy {meta.get('mcp_proxy', '?')}, "
               f"@modelcontextprotocol/sdk {meta.get('sdk', '?')}, @modelcontextprotocol/server-memory "
               f"{meta.get('server_memory', '?')}, node {meta.get('node', '?')} (from their package.json)")
    out.append("")
    for srv in servers:
        targets, rounds, counts, tools, summary, every_round = per_server[srv]
        round_load = {r["round"]: r["loadavg"] for r in ends if r["server"] == srv}
        render_server(out, meta, srv, rounds, counts, tools, summary, every_round, round_load)
    if failures:
        render_failures(out, meta, failures)
    print("\n".join(out).rstrip("\n"))


if __name__ == "__main__":
    main()
