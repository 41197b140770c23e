#!/usr/bin/env python3
"""Turns the figures of scripts/bench/stdio.sh (tests/bench/stdio-bench.mjs's JSON lines) into
Markdown tables and one JSON document.

usage: stdio-report.py RESULTS.jsonl OUT.json [--meta JSON]

Each summary figure is the median over the rounds. Memory per session is the difference between
the process tree's RSS with the most and with the fewest sessions open, divided by the difference
in sessions (the same for PSS, which splits shared pages among the processes mapping them)."""
import json
import sys
from datetime import datetime, timezone
from statistics import median

TARGET_ORDER = ["idemgw_per_session", "idemgw_shared", "supergateway", "mcp_proxy"]


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


def main():
    src, dst = sys.argv[1], sys.argv[2]
    meta = json.loads(sys.argv[sys.argv.index("--meta") + 1]) if "--meta" in sys.argv else {}
    meta["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [json.loads(line) for line in open(src) if line.strip()]
    round_load = {r["round"]: r["loadavg"] for r in rows if r["kind"] == "round_end"}
    rows = [r for r in rows if r["kind"] != "round_end"]
    meta["loadavg_at_round_end"] = {str(k): v for k, v in sorted(round_load.items())}

    targets = [t for t in TARGET_ORDER if any(r["target"] == t for r in rows)]
    targets += sorted({r["target"] for r in rows} - set(targets))
    rounds = sorted({r["round"] for r in rows})
    counts = sorted({r["sessions"] for r in rows if r["kind"] in ("load", "memory")})

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
        for tool in ("append", "get"):
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

    doc = {"meta": meta, "summary": summary, "rounds": every_round}
    with open(dst, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    # ---- Markdown ----------------------------------------------------------------------------
    out = []
    out.append(f"idemgw stdio benchmark  {meta['date']}  commit {meta.get('commit', '?')}  "
               f"{meta.get('cpus', '?')} cpus  {len(rounds)} rounds, {meta.get('secs', '?')} s per load phase  "
               f"load avg at start {meta.get('loadavg_at_start', '?')}, at end {meta.get('loadavg_at_end', '?')}")
    out.append("")
    out.append("Calls (median of the rounds; latency per call, calls/s over all sessions):")
    out.append("")
    out.append("| target | sessions | append calls/s | append p50 ms | append p99 ms | get calls/s | get p50 ms | get p99 ms | errors |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in summary:
        for c in counts:
            a = next((x for x in e["load"] if x["tool"] == "append" and x["sessions"] == c), {})
            g = next((x for x in e["load"] if x["tool"] == "get" and x["sessions"] == c), {})
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
    for tool in ("append", "get"):
        for c in counts:
            head += f" {tool} x{c} |"
            rule += "---|"
    head += " RSS per session MiB |"
    rule += "---:|"
    out.append(head)
    out.append(rule)
    for er in every_round:
        line = f"| {er['round']} | {er['target']} | {fmt((er['first_answer'] or {}).get('mean_ms'))} |"
        for tool in ("append", "get"):
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
            if x["replays"]:
                problems.append(f"{e['target']}: {x['replays']} append calls answered as replays")
        if e["first_answer_errors"]:
            problems.append(f"{e['target']}: {e['first_answer_errors']} new sessions failed")
    for t in ("idemgw_per_session", "idemgw_shared"):
        if f"{t}_executions" in meta:
            sent = sum(x["calls"] for e in summary if e["target"] == t for x in e["load"] if x["tool"] == "append")
            out.append("")
            out.append(f"{t}: {sent} append calls answered, {meta[f'{t}_executions']:.0f} executions recorded "
                       f"(idemgw_executions_total); stdio children running at the end: "
                       f"{meta.get(f'{t}_children_left', 0):.0f}")
    if problems:
        out.append("")
        out.extend(f"WARNING: {p}" for p in problems)
    print("\n".join(out))


if __name__ == "__main__":
    main()
