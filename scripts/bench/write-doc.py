#!/usr/bin/env python3
"""Writes a benchmark run's table into the documentation: the text between the two marker
comments of DOC (docs/performance.md) is replaced by the table report.py prints for the run's
JSON (bench-results/latest.json), in a code block. Everything outside the markers is kept.

usage: write-doc.py LATEST.json DOC
Exits 1, leaving DOC as it was, when DOC lacks the markers or the JSON is not a run's."""
import contextlib
import importlib.util
import io
import json
import os
import sys

BEGIN = "<!-- make bench: begin. scripts/bench/write-doc.py writes this block; do not edit it by hand. -->"
END = "<!-- make bench: end -->"


def load_report():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.py")
    spec = importlib.util.spec_from_file_location("bench_report", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: write-doc.py LATEST.json DOC")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        run = json.load(f)
    if not isinstance(run, dict) or "meta" not in run:
        sys.exit(f"write-doc: {src} is not a benchmark run's JSON")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        load_report().print_table(run)
    table = out.getvalue().rstrip("\n")

    with open(dst) as f:
        text = f.read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        sys.exit(f"write-doc: {dst} has no benchmark markers ({BEGIN} ... {END})")
    block = f"{BEGIN}\n\n```\n{table}\n```\n\n"
    new = text[:i] + block + text[j:]
    if new != text:
        tmp = dst + ".tmp"
        with open(tmp, "w") as f:
            f.write(new)
        os.replace(tmp, dst)
    print(f"benchmark table written to {dst}")


if __name__ == "__main__":
    main()
