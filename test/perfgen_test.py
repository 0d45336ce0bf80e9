#!/usr/bin/env python3
"""bench/perfgen writes recordings perf itself reads without complaint, and
gilscan decodes to the same event counts (every mode: file, pipe, -z, stacks).

usage: perfgen_test.py PERFGEN GILSCAN
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

PERFGEN, GILSCAN = sys.argv[1], sys.argv[2]


with tempfile.TemporaryDirectory() as tmp:
    for mode in ([], ["--pipe"], ["-z"], ["--pipe", "-z"], ["--stacks"], ["--cpus", "64", "--threads", "1000"],
                 ["--pid-base", "3000000"]):
        name = " ".join(mode) or "file"
        out = os.path.join(tmp, "g.data")
        r = subprocess.run([PERFGEN, "--events", "20000", *mode, "-o", out], capture_output=True, text=True)
        check(r.returncode == 0, f"{name}: perfgen ({r.stderr})")
        p = subprocess.run(["perf", "script", "-i", out, "-F", "event"], capture_output=True, text=True)
        check(p.returncode == 0 and p.stderr.strip() == "", f"{name}: perf script reads it without complaint ({p.stderr[:300]!r})")
        perf_counts = {}
        for line in p.stdout.splitlines():
            ev = line.strip().rstrip(":")
            if ev:
                perf_counts[ev] = perf_counts.get(ev, 0) + 1
        s = os.path.join(tmp, "s.json")
        g = subprocess.run([GILSCAN, out, "-q", "--summary-json", s], capture_output=True, text=True)
        check(g.returncode == 0, f"{name}: gilscan reads it")
        summ = json.load(open(s))
        check(summ["event_counts"] == perf_counts, f"{name}: same event counts as perf ({summ['event_counts']} vs {perf_counts})")
        check(sum(perf_counts.values()) >= 20000, f"{name}: the events asked for")
        a = summ["gil"]["anomalies"]
        check(sum(a.values()) == 0, f"{name}: plausible GIL sequences, no anomalies ({a})")
        if "--pid-base" in mode:
            tids = [t["tid"] for t in summ["threads"]]
            check(tids and min(tids) >= 3000000, f"tids from --pid-base ({min(tids) if tids else None})")
        if "--stacks" in mode:
            st = summ["stacks"]
            check(st["sleeps_seen"] > 1000 and st["decided"] == st["sleeps_seen"], f"copied stacks unwind ({st})")

done("perfgen")
