#!/usr/bin/env python3
"""Turns scripts/bench.sh's result lines into bench-results/latest.json and one table.

usage: report.py RESULTS.jsonl OUT.json --meta JSON
Every section is always present in the JSON (null figures when a section was not run), so a
smoke test can check the shape without looking at any timing."""
import json
import sys
from datetime import datetime, timezone


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def ms(us):
    return None if us is None else round(us / 1000.0, 3)


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def median_by(runs, key):
    """The run whose key is the median of the runs' (the lower middle of an even count)."""
    runs = sorted((r for r in runs if r and r.get(key) is not None), key=lambda r: r[key])
    return runs[(len(runs) - 1) // 2] if runs else None


def diff(a, b, key):
    return a[key] - b[key] if a and b and a.get(key) is not None and b.get(key) is not None else None


def round1(v):
    return None if v is None else round(v, 1)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    meta = json.loads(sys.argv[sys.argv.index("--meta") + 1]) if "--meta" in sys.argv else {}
    meta["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [json.loads(line) for line in open(src) if line.strip()]
    by = lambda s: [r for r in rows if r["section"] == s]

    def wrk(w):
        return {k: w.get(k) for k in ("rps", "p50_us", "p90_us", "p99_us", "max_us", "requests", "errors", "non2xx", "cpu_us")}

    # (1) pass-through: per connection count and target, the median of its rounds (by rate); the
    # ratios and added latencies are the medians of each round's own (the targets of a round ran
    # back to back), and rounds_ahead counts the rounds idemgw answered at least nginx's rate
    pt = {}
    for r in by("passthrough"):
        pt.setdefault(r["conns"], {}).setdefault(r.get("round", 1), {})[r["target"]] = wrk(r["wrk"])
    passthrough = []
    for c in sorted(pt):
        rounds = [pt[c][k] for k in sorted(pt[c])]
        e = {"conns": c, "rounds": len(rounds)}
        for t in ("direct", "nginx", "idemgw"):
            runs = [x[t] for x in rounds if x.get(t)]
            e[t] = dict(median_by(runs, "rps") or runs[0]) if runs else None
            if e[t]:  # an error in any round shows
                for k in ("errors", "non2xx"):
                    e[t][k] = sum(abs(x.get(k) or 0) for x in runs)
        per = [(x.get("direct") or {}, x.get("nginx") or {}, x.get("idemgw") or {}) for x in rounds]
        e["ratio_idemgw_nginx"] = median([ratio(g.get("rps"), n.get("rps")) for d, n, g in per])
        e["ratio_idemgw_direct"] = median([ratio(g.get("rps"), d.get("rps")) for d, n, g in per])
        e["rounds_idemgw_nginx"] = [ratio(g.get("rps"), n.get("rps")) for d, n, g in per]
        e["rounds_ahead_of_nginx"] = sum(1 for d, n, g in per if g.get("rps") and n.get("rps") and g["rps"] >= n["rps"])
        e["added_p50_us_vs_direct"] = median([diff(g, d, "p50_us") for d, n, g in per])
        e["added_p99_us_vs_direct"] = median([diff(g, d, "p99_us") for d, n, g in per])
        e["nginx_added_p99_us_vs_direct"] = median([diff(n, d, "p99_us") for d, n, g in per])
        passthrough.append(e)

    # (2) protected
    protected = None
    for r in by("protected"):
        protected = {k: v for k, v in r.items() if k != "section"}
        protected["idemgw"] = wrk(r["idemgw"])
        protected["ratio_idemgw_pgbench"] = ratio(r["idemgw"]["rps"], r["pgbench"]["tps"])

    # (2b) protected, embedded store
    protected_sqlite = None
    for r in by("protected_sqlite"):
        protected_sqlite = {"conns": r["conns"], "workers": r["workers"], "idemgw": wrk(r["idemgw"])}
        if protected:
            protected_sqlite["ratio_sqlite_postgres"] = ratio(r["idemgw"]["rps"], protected["idemgw"]["rps"])

    # (3) replay
    replay = None
    for r in by("replay"):
        replay = {"conns": r["conns"], "idemgw": wrk(r["idemgw"]), "passthrough": wrk(r["passthrough"]),
                  "ratio_replay_passthrough": ratio(r["idemgw"]["rps"], r["passthrough"]["rps"])}

    # (4) SSE: per target, the round with the median p99; the added latencies are the medians of
    # each round's own difference from the direct path
    sr = {}
    for r in by("sse"):
        sr.setdefault(r.get("round", 1), {})[r["target"]] = r["latency"]
    sse = None
    if sr:
        rounds = [sr[k] for k in sorted(sr)]
        targets = [t for t in ("direct", "nginx", "idemgw", "idemgw_protected") if any(t in x for x in rounds)]
        targets += sorted({t for x in rounds for t in x} - set(targets))
        sse = {}
        for t in targets:
            v = dict(median_by([x[t] for x in rounds if t in x], "p99_us") or {})
            v["rounds"] = len(rounds)
            v["rounds_p99_us"] = [x[t].get("p99_us") for x in rounds if t in x]
            if t != "direct":
                pairs = [(x[t], x["direct"]) for x in rounds if t in x and "direct" in x]
                v["added_p50_us_vs_direct"] = round1(median([diff(a, b, "p50_us") for a, b in pairs]))
                v["added_p99_us_vs_direct"] = round1(median([diff(a, b, "p99_us") for a, b in pairs]))
            sse[t] = v

    # (5) memory
    memory = None
    for r in by("memory"):
        memory = memory or {}
        per = round((r["rss_with_kib"] - r["rss_before_kib"]) / r["connections"], 2) if r["opened"] else None
        name = "idle_connections" if r["kind"] == "idle" else "sse_streams"
        memory[name] = {"count": r["connections"], "opened": r["opened"], "rss_before_kib": r["rss_before_kib"],
                        "rss_with_kib": r["rss_with_kib"], "kib_each": per}

    # (6) growth
    growth = None
    g = by("growth")
    if g:
        growth = {"runs": [{"rows": r["rows"], "live_rows_at_start": r["live_rows_at_start"], "conns": r["conns"],
                            "protected": wrk(r["protected"]), "replay": wrk(r["replay"]),
                            **({"bulk_insert_s": r["bulk_insert_s"]} if "bulk_insert_s" in r else {})} for r in g]}
        if len(g) >= 2:
            a, b = g[0], g[-1]
            growth["ratio_protected_large_small"] = ratio(b["protected"]["rps"], a["protected"]["rps"])
            growth["ratio_replay_large_small"] = ratio(b["replay"]["rps"], a["replay"]["rps"])

    # (7) JWT verification
    jwt = {r["alg"]: {"verifies": r["verifies"], "us_per_verify": r["us_per_verify"]} for r in by("jwt")} or None

    # (8) Powertools + durable Redis vs idemgw, around the same MCP SDK server
    powertools = None
    pr = by("powertools")
    if pr:
        # each figure is the median over the rounds; a ratio is taken within its round first
        by_round = {(r["mode"], r["conns"], r.get("round", 1), r["target"]): wrk(r["wrk"]) for r in pr}
        cells = {}
        ahead = {}  # (mode, conns, target) -> rounds at least Powertools' rate of the same round
        for (mode, conns, rnd, target), w in by_round.items():
            plain = by_round.get((mode, conns, rnd, "plain")) or {}
            cells.setdefault((mode, conns, target), []).append({**w, "ratio_to_plain": ratio(w.get("rps"), plain.get("rps"))})
            pt = (by_round.get((mode, conns, rnd, "powertools")) or {}).get("rps")
            if target.startswith("idemgw") and pt and w.get("rps") is not None:
                ahead[(mode, conns, target)] = ahead.get((mode, conns, target), 0) + (w["rps"] >= pt)
        med = lambda xs: None if not xs else sorted(xs)[len(xs) // 2] if len(xs) % 2 else (sorted(xs)[len(xs) // 2 - 1] + sorted(xs)[len(xs) // 2]) / 2
        runs, cell = [], {}
        for (mode, conns, target), ws in cells.items():
            m = {k: med([w[k] for w in ws if w.get(k) is not None]) for k in ("rps", "p50_us", "p99_us", "ratio_to_plain")}
            m["errors"] = sum(w.get("errors") or 0 for w in ws)
            m["non2xx"] = sum(w.get("non2xx") or 0 for w in ws)
            m["rounds"] = [round(w["rps"] or 0, 1) for w in ws]
            if (mode, conns, target) in ahead:
                m["rounds_ahead_of_powertools"] = ahead[(mode, conns, target)]
            cell[(mode, conns, target)] = m
            runs.append({"mode": mode, "conns": conns, "target": target, **m})
        powertools = {"runs": runs}
        for r in by("powertools_meta"):
            powertools.update({k: v for k, v in r.items() if k != "section"})
        gc = powertools.get("group_commit")
        if gc:
            gc["avg_claims_per_batch"] = ratio(gc.get("claims_batched"), gc.get("claim_batches"))
            gc["avg_finishes_per_batch"] = ratio(gc.get("finishes_batched"), gc.get("finish_batches"))
        ceiling = (powertools.get("pgbench") or {}).get("tps")
        powertools["ratio_pg_gc_first_to_pgbench"] = {
            str(c): ratio((cell.get(("protected", c, "idemgw_pg_gc")) or {}).get("rps"), ceiling)
            for (m, c, t) in cell if m == "protected" and t == "idemgw_pg_gc"}

    # (9) the cost of metrics and tracing: each variant's median run (by req/s) over its rounds,
    # and its ratio to tracing off
    observability = None
    runs = {}
    for r in by("observability"):
        runs.setdefault(r["mode"], {}).setdefault(r["variant"], []).append(r)
    for mode, vs in runs.items():
        observability = observability or {}
        for variant, rs in vs.items():
            rs = sorted(rs, key=lambda r: r["idemgw"]["rps"])
            med = rs[len(rs) // 2]
            observability.setdefault(mode, {})[variant] = {
                "idemgw": wrk(med["idemgw"]), "rounds": len(rs), "rps_all": [r["idemgw"]["rps"] for r in rs],
                "scrapes": med["scrapes"], "spans_exported": med["spans_exported"], "spans_dropped": med["spans_dropped"]}
        off = (observability[mode].get("off") or {}).get("idemgw", {}).get("rps")
        for v in observability[mode].values():
            v["ratio_to_off"] = ratio(v["idemgw"]["rps"], off)

    # (11) what a call costs the gateway: CPU and upstream connections per call, per round,
    # and the median of the rounds; protected against read within each store and conns
    cost = None
    cr = by("cost")
    if cr:
        cells = {}
        for r in cr:
            n = r["idemgw"].get("requests") or 0
            cells.setdefault((r["store"], r["conns"], r["mode"]), []).append({
                "round": r["round"], "requests": n, "rps": r["idemgw"].get("rps"),
                "cpu_us_per_call": round(r["cpu_ms"] * 1000 / n, 1) if n else None,
                "loop_cpu_us_per_call": round(r["loop_cpu_ms"] * 1000 / n, 1)
                if n and r.get("loop_cpu_ms") is not None else None,
                "postgres_cpu_us_per_call": round(r["postgres_cpu_ms"] * 1000 / n, 1)
                if n and r.get("postgres_cpu_ms") is not None else None,
                "upstream_connections_per_1000": round(r["upstream_connections"] * 1000 / n, 2) if n else None,
                "errors": r["idemgw"].get("errors"), "non2xx": r["idemgw"].get("non2xx")})
        med = lambda xs: None if not xs else sorted(xs)[len(xs) // 2]
        cost = []
        for (store, conns, mode), rs in sorted(cells.items()):
            cost.append({"store": store, "conns": conns, "mode": mode, "rounds": rs,
                         "cpu_us_per_call": med([x["cpu_us_per_call"] for x in rs if x["cpu_us_per_call"] is not None]),
                         "loop_cpu_us_per_call": med([x["loop_cpu_us_per_call"] for x in rs
                                                      if x["loop_cpu_us_per_call"] is not None]),
                         "postgres_cpu_us_per_call": med([x["postgres_cpu_us_per_call"] for x in rs
                                                          if x["postgres_cpu_us_per_call"] is not None]),
                         "upstream_connections_per_1000": med([x["upstream_connections_per_1000"] for x in rs
                                                               if x["upstream_connections_per_1000"] is not None])})
        for e in cost:
            read = next((x for x in cost if x["store"] == e["store"] and x["conns"] == e["conns"] and x["mode"] == "read"), None)
            e["cpu_x_read"] = ratio(e["cpu_us_per_call"], (read or {}).get("cpu_us_per_call"))
            e["loop_cpu_x_read"] = ratio(e["loop_cpu_us_per_call"], (read or {}).get("loop_cpu_us_per_call"))

    # (12) an https upstream against plain http, handshakes per 1,000 calls
    https = None
    for r in by("https"):
        n = r["idemgw"].get("requests") or 0
        per = lambda v: round(v * 1000 / n, 2) if n else None
        https = https or []
        https.append({"scheme": r["scheme"], "mode": r["mode"], "conns": r["conns"], "idemgw": wrk(r["idemgw"]),
                      "handshakes_full_per_1000": per(r["handshakes_full"]),
                      "handshakes_resumed_per_1000": per(r["handshakes_resumed"]),
                      "upstream_connections_per_1000": per(r["upstream_connections"])})

    doc = {"meta": meta, "passthrough": passthrough or None, "protected": protected,
           "protected_sqlite": protected_sqlite, "replay": replay,
           "sse": sse, "memory": memory, "growth": growth, "jwt": jwt, "powertools": powertools, "observability": observability, "cost": cost, "https": https}
    with open(dst, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print_table(doc)
    print(f"\nfigures written to {dst}")


def fmt(v, nd=0):
    if v is None:
        return "-"
    return f"{v:,.{nd}f}"


def print_table(d):
    m = d["meta"]
    lines = [f"idemgw benchmark  {m.get('date')}  commit {m.get('commit')}  {m.get('cpus')} cpus  "
             f"{m.get('duration')} per run  load avg at end {m.get('loadavg_at_end')}"
             + ("  [SMOKE: figures meaningless]" if m.get("smoke") else "")]
    if d["passthrough"]:
        lines += ["", "(1) pass-through: read tool, 1 KiB body, median of rounds    req/s                        p99 ms"
                      "                            cpu us/req",
                  "  conns      direct       nginx      idemgw  gw/nginx  ahead    direct  nginx idemgw  gw+p99 vs direct"
                  "   nginx idemgw"]
        for e in d["passthrough"]:
            dd, n, g = e["direct"] or {}, e["nginx"] or {}, e["idemgw"] or {}
            lines.append(f"  {e['conns']:5d} {fmt(dd.get('rps')):>11} {fmt(n.get('rps')):>11} {fmt(g.get('rps')):>11}"
                         f"  {fmt(e['ratio_idemgw_nginx'], 2):>8}  {e.get('rounds_ahead_of_nginx', 0)}/{e.get('rounds', 1)}"
                         f"  {fmt(ms(dd.get('p99_us')), 2):>8} {fmt(ms(n.get('p99_us')), 2):>6}"
                         f" {fmt(ms(g.get('p99_us')), 2):>6}  {fmt(ms(e['added_p99_us_vs_direct']), 2):>8} ms"
                         f"  {fmt(n.get('cpu_us'), 1):>6} {fmt(g.get('cpu_us'), 1):>6}")
    p = d["protected"]
    if p:
        lines += ["", f"(2) protected first executions ({p['conns']} conns, {p.get('workers', 1)} workers x store pool {p['store_pool']}): "
                      f"idemgw {fmt(p['idemgw']['rps'])} req/s (p50 {fmt(ms(p['idemgw']['p50_us']), 2)} ms, "
                      f"p99 {fmt(ms(p['idemgw']['p99_us']), 2)} ms, {fmt(p['rows_finished'])} keys finished)",
                  f"    pgbench ceiling (claim+finish, {p['pgbench'].get('clients')} clients): {fmt(p['pgbench']['tps'])} tps"
                  f"  -> idemgw / ceiling = {fmt(p['ratio_idemgw_pgbench'], 2)}"
                  + ("" if p.get("sql_matches_store") else "   [WARNING: pgbench SQL differs from src/store_pg.c]")]
    q = d.get("protected_sqlite")
    if q:
        lines += [f"    embedded SQLite store ({q['conns']} conns, {q['workers']} worker): {fmt(q['idemgw']['rps'])} req/s "
                  f"(p50 {fmt(ms(q['idemgw']['p50_us']), 2)} ms, p99 {fmt(ms(q['idemgw']['p99_us']), 2)} ms)"
                  f"  -> sqlite / postgres = {fmt(q.get('ratio_sqlite_postgres'), 2)}"]
    r = d["replay"]
    if r:
        lines += ["", f"(3) replays ({r['conns']} conns): {fmt(r['idemgw']['rps'])} req/s, p99 {fmt(ms(r['idemgw']['p99_us']), 2)} ms"
                      f"; pass-through same run {fmt(r['passthrough']['rps'])} req/s -> replay / pass-through = "
                      f"{fmt(r['ratio_replay_passthrough'], 2)}",
                  f"    gateway CPU per request: replay {fmt(r['idemgw'].get('cpu_us'), 1)} us,"
                  f" pass-through {fmt(r['passthrough'].get('cpu_us'), 1)} us"]
    s = d["sse"]
    if s:
        lines += ["", "(4) SSE, 100 progress events per call: upstream write -> agent receipt (median of rounds)",
                  "  path                  events   p50 us   p99 us   max us   +p50 vs direct  +p99 vs direct"]
        for t, v in s.items():
            lines.append(f"  {t:20s} {fmt(v.get('events')):>7} {fmt(v.get('p50_us')):>8} {fmt(v.get('p99_us')):>8}"
                         f" {fmt(v.get('max_us')):>8} {fmt(v.get('added_p50_us_vs_direct')):>15} {fmt(v.get('added_p99_us_vs_direct')):>15}")
    mm = d["memory"]
    if mm:
        lines += [""]
        for name, v in mm.items():
            lines.append(f"(5) memory, {fmt(v['count'])} {name.replace('_', ' ')}: RSS {fmt(v['rss_before_kib'])} -> "
                         f"{fmt(v['rss_with_kib'])} KiB = {fmt(v['kib_each'], 2)} KiB each"
                         + ("" if v["opened"] else "  [client failed to open them all]"))
    g = d["growth"]
    if g:
        lines += ["", "(6) growth               protected req/s   p99 ms    replay req/s   p99 ms"]
        for run in g["runs"]:
            lines.append(f"  {fmt(run['rows']):>10} rows {fmt(run['protected']['rps']):>17} {fmt(ms(run['protected']['p99_us']), 2):>8}"
                         f" {fmt(run['replay']['rps']):>15} {fmt(ms(run['replay']['p99_us']), 2):>8}")
        lines.append(f"  large / small: protected {fmt(g.get('ratio_protected_large_small'), 2)}, "
                     f"replay {fmt(g.get('ratio_replay_large_small'), 2)}")
    j = d.get("jwt")
    if j:
        lines += ["", "(7) JWT verification per protected call (subject: {jwt: ...})"]
        for alg, v in j.items():
            lines.append(f"  {alg:6s} {fmt(v['us_per_verify'], 1):>8} us per token ({fmt(v['verifies'])} verified)")
    pw = d.get("powertools")
    if pw:
        lines += ["", f"(8) idempotency inside the MCP SDK server (Powertools + Redis, appendfsync always) vs idemgw in front "
                      f"of it ({pw.get('workers')} worker x store pool {pw.get('store_pool')}; median of {pw.get('rounds')} rounds of {pw.get('duration')})",
                  "  mode     conns  target              req/s   p50 ms   p99 ms   x plain   req/s of each round"
                  "  (rounds at least Powertools' rate)"]
        for x in pw["runs"]:
            lines.append(f"  {'first' if x['mode'] == 'protected' else 'replay':7s} {x['conns']:5d}  {x['target']:15s}"
                         f" {fmt(x.get('rps')):>9} {fmt(ms(x.get('p50_us')), 2):>8} {fmt(ms(x.get('p99_us')), 2):>8}"
                         f" {fmt(x.get('ratio_to_plain'), 2):>9}   " + " ".join(fmt(v) for v in x.get("rounds", []))
                         + (f"  ({x['rounds_ahead_of_powertools']}/{len(x.get('rounds', []))})"
                            if "rounds_ahead_of_powertools" in x else ""))
        pg, gc = pw.get("pgbench") or {}, pw.get("group_commit") or {}
        lines.append(f"  group commit: pgbench ceiling (claim+finish, {pg.get('clients')} clients) {fmt(pg.get('tps'))} tps;"
                     " first executions / ceiling: "
                     + ", ".join(f"{c} conns {fmt(v, 2)}" for c, v in pw.get("ratio_pg_gc_first_to_pgbench", {}).items()))
        lines.append(f"  batches: {fmt(gc.get('claims_batched'))} claims in {fmt(gc.get('claim_batches'))} "
                     f"(avg {fmt(gc.get('avg_claims_per_batch'), 1)}), {fmt(gc.get('finishes_batched'))} finishes in "
                     f"{fmt(gc.get('finish_batches'))} (avg {fmt(gc.get('avg_finishes_per_batch'), 1)}); "
                     "the other calls went one statement each")
    o = d.get("observability")
    if o:
        lines += ["", "(9) cost of metrics and tracing  (scrape: /metrics 10/s during the load; sampled: 10 %; on: every span; median of the rounds)",
                  "  calls      variant        req/s   p99 ms  / off   scrapes  spans sent  dropped"]
        for mode, vs in o.items():
            for name, v in vs.items():
                lines.append(f"  {mode:10s} {name:8s} {fmt(v['idemgw']['rps']):>11} {fmt(ms(v['idemgw']['p99_us']), 2):>8}"
                             f" {fmt(v['ratio_to_off'], 3):>6} {fmt(v['scrapes']):>9} {fmt(v['spans_exported']):>11} {fmt(v['spans_dropped']):>8}")
    c = d.get("cost")
    if c:
        lines += ["", "(11) what a call costs the gateway (1 worker; CPU user+system per call; median of the rounds;",
                  "     loop: the event loop's thread alone, without the embedded store's writer thread;",
                  "     postgres: its server processes' CPU per call in the same runs)",
                  "  store     conns  calls        req/s  cpu us/call  x read  loop us/call  x read  postgres us/call  upstream conns/1000   cpu us of each round"]
        for e in c:
            rps = sorted(x["rps"] or 0 for x in e["rounds"])[len(e["rounds"]) // 2]
            pg = e.get("postgres_cpu_us_per_call")
            lines.append(f"  {e['store']:9s} {e['conns']:5d}  {e['mode']:10s} {fmt(rps):>8} {fmt(e['cpu_us_per_call'], 1):>12}"
                         f" {fmt(e['cpu_x_read'], 2):>7} {fmt(e['loop_cpu_us_per_call'], 1):>13} {fmt(e['loop_cpu_x_read'], 2):>7}"
                         f" {(fmt(pg, 1) if pg is not None else '-'):>17}"
                         f" {fmt(e['upstream_connections_per_1000'], 2):>20}   "
                         + " ".join(fmt(x["cpu_us_per_call"], 1) for x in e["rounds"]))
    h = d.get("https")
    if h:
        lines += ["", "(12) an https upstream (nginx, TLS 1.3) against plain http, the same C upstream behind",
                  "  calls      conns  upstream     req/s   p50 ms   p99 ms   conns/1000  full handshakes/1000  resumed/1000"]
        for e in h:
            w = e["idemgw"]
            lines.append(f"  {e['mode']:10s} {e['conns']:5d}  {e['scheme']:8s} {fmt(w.get('rps')):>9} {fmt(ms(w.get('p50_us')), 2):>8}"
                         f" {fmt(ms(w.get('p99_us')), 2):>8} {fmt(e['upstream_connections_per_1000'], 2):>12}"
                         f" {fmt(e['handshakes_full_per_1000'], 2):>21} {fmt(e['handshakes_resumed_per_1000'], 2):>13}")
    bad = []
    for e in d["passthrough"] or []:
        bad += [f"pass-through {t} c={e['conns']}" for t in ("direct", "nginx", "idemgw") if failed(e[t])]
    if p and failed(p["idemgw"]):
        bad.append("protected")
    if q and failed(q["idemgw"]):
        bad.append("protected (sqlite)")
    if r:
        bad += [n for n, w in (("replay", r["idemgw"]), ("replay pass-through", r["passthrough"])) if failed(w)]
    for x in (pw or {}).get("runs", []):
        if failed(x):
            bad.append(f"powertools {x['mode']} {x['target']} c={x['conns']}")
    for mode, vs in (o or {}).items():
        bad += [f"observability {mode} {name}" for name, v in vs.items() if failed(v["idemgw"])]
    for e in c or []:
        bad += [f"cost {e['store']} {e['mode']} c={e['conns']}" for x in e["rounds"] if failed(x)]
    for e in h or []:
        if failed(e["idemgw"]):
            bad.append(f"https {e['scheme']} {e['mode']} c={e['conns']}")
    for run in (g or {}).get("runs", []):
        bad += [f"growth {k} {run['rows']} rows" for k in ("protected", "replay") if failed(run[k])]
    if bad:
        lines += ["", "WARNING: runs with socket errors or non-2xx answers: " + ", ".join(bad)]
    print("\n".join(lines))


def failed(w):
    return bool(w) and ((w.get("errors") or 0) != 0 or (w.get("non2xx") or 0) != 0)


if __name__ == "__main__":
    main()
