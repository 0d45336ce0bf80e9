#!/usr/bin/env python3
"""gilscan --time START,STOP on real recordings, against perf script.

For stored recordings made here (scheduler tracepoints per process and
system-wide, GIL uprobes, uprobes with DWARF stacks, lost events), and
windows at the start, in the middle, open-ended and past the end:
golden_expect.py --time applies the documented rules to perf script's text
and gilscan's summary must give the same per-thread sleeps and D waits (to
the nanosecond), event counts, and GIL waits, holds and GIL loads (within
0.5% of the window, as the golden test). Every span, counter and thread of
the outputs lies inside the window; the summary states it; the figures of
[0, a) and [a, end) add up to the whole run's; bad windows are usage errors.

    window_e2e.py GILSCAN TESTDATA
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, DATA = sys.argv[1], sys.argv[2]
EXPECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_expect.py")
tmp = tempfile.mkdtemp(prefix="gilscan-window-")


def analyse(rec, *extra):
    summ, trace = os.path.join(tmp, "s.json"), os.path.join(tmp, "t.json")
    r = subprocess.run([GILSCAN, rec, "-q", "--running", "--summary-json", summ, "-o", trace, *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, r.stderr
    return json.load(open(summ)), json.load(open(trace))["traceEvents"], r.stderr


def expected(rec, window, threads=True):
    args = ["python3", EXPECT, rec] + (["--time", window] if window else []) + ([] if threads else ["--no-threads"])
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def ns(us):
    return round(us * 1000)


def compare(name, rec, window, threads=True, sleeps=True):
    got, trace, err = analyse(rec, "--time", window)
    check(got is not None, f"{name} --time {window}: runs ({err[-300:] if err else ''})")
    if got is None:
        return None
    exp = expected(rec, window, threads)
    w = got["window"]
    first = got["first_time_ns"]
    start, stop = window.split(",")
    want_lo = first + round(float(start) * 1e9) if start else first
    want_hi = min(first + round(float(stop) * 1e9), got["last_time_ns"]) if stop else got["last_time_ns"]
    check(w is not None and w["start_ns"] == min(want_lo, got["last_time_ns"]) and w["stop_ns"] == want_hi
          and w["start_s"] == (float(start) if start else None) and w["stop_s"] == (float(stop) if stop else None),
          f"{name} --time {window}: the summary states the window ({w})")
    lo, hi = w["start_ns"], w["stop_ns"]
    check(got["event_counts"] == exp["event_counts"],
          f"{name} --time {window}: event counts inside the window ({got['event_counts']} against {exp['event_counts']})")
    rows = {str(t["tid"]): t for t in got["threads"]}
    if threads:
        bad = []
        for tid, e in exp["threads"].items():
            if e["sleep_count"] + e["disk_count"] == 0:
                continue
            t = rows.get(tid)
            mine = t and (t["sleep_count"], ns(t["sleep_us"]), t["disk_sleep_count"], ns(t["disk_sleep_us"]))
            if mine != (e["sleep_count"], e["sleep_ns"], e["disk_count"], e["disk_ns"]):
                bad.append((tid, mine, e))
        extra = [tid for tid, t in rows.items() if t["sleep_count"] and tid not in exp["threads"]]
        waits = sum(e["sleep_count"] for e in exp["threads"].values())
        check(not bad and not extra and (waits > 0 or not sleeps),
              f"{name} --time {window}: each thread's sleeps and D waits as perf script's ({waits} sleeps; "
              f"{bad[:2]}, {extra[:2]})")
    # (Open-ended, the window runs to the recording's end, past its last
    # sample where an exit record comes after it.)
    top = max(hi, lo) if stop else float("inf")
    check(all(lo <= t["first_ns"] <= t["last_ns"] <= top for t in got["threads"]) and got["threads"],
          f"{name} --time {window}: every thread's span inside the window")
    if "gil" in exp:
        tol = 0.005 * max(hi - lo, 1)
        bad = [(tid, e) for tid, e in exp["gil"].items() if rows.get(tid) and (
            abs(ns(rows[tid]["gil_wait_us"] or 0) - e["wait_ns"]) > tol or
            abs(ns(rows[tid]["gil_hold_us"] or 0) - e["hold_ns"]) > tol)]
        check(not bad, f"{name} --time {window}: GIL waits and holds per thread as perf script's ({bad[:2]})")
        procs = got["gil"]["processes"] if got.get("gil") else []
        egils = [g for g in exp["gils"] if g["span_ns"] >= 0]
        pairs = list(zip(procs, [g for g in egils if g["held_ns"] or g["waiting_ns"] or g["max_waiters"]]))
        check(pairs and all(abs(ns(p["held_us"]) - g["held_ns"]) <= tol and
                            abs(ns(p["contended_us"]) - g["contended_ns"]) <= tol and
                            abs(ns(p["waiting_us"]) - g["waiting_ns"]) <= tol and
                            p["max_waiters"] == g["max_waiters"] for p, g in pairs),
              f"{name} --time {window}: each GIL's load as perf script's ({[(p, g) for p, g in pairs][:1]})")
    outside = [e for e in trace if e.get("ph") == "X" and (e["ts"] < lo / 1000 - 1e-3 or
                                                           e["ts"] + e["dur"] > top / 1000 + 1e-3)]
    outside += [e for e in trace if e.get("ph") == "C" and not lo / 1000 - 1e-3 <= e["ts"] <= top / 1000 + 1e-3]
    spans = sum(e.get("ph") == "X" for e in trace)
    check(not outside and spans > 0, f"{name} --time {window}: every span and counter of the trace inside the "
          f"window ({spans} spans; {outside[:2]})")
    return got


# (name, file, per-thread sleeps compared, sleeps in each window): lost.data's
# states around its losses are gilscan's to mark unknown; gil_uprobes.data
# has no scheduler events; the others start with one thread before any sleep.
CASES = [
    ("plain", "plain.data", True, False),
    ("system_wide", "system_wide.data", True, True),
    ("gil_combined", "gil_combined.data", True, False),
    ("gil_uprobes", "gil_uprobes.data", True, False),
    ("mixed_callgraph", "mixed_callgraph.data", True, False),
    ("lost", "lost.data", False, False),
]
for name, f, threads, always in CASES:
    rec = os.path.join(DATA, f)
    whole, _, _ = analyse(rec)
    span_s = (whole["last_time_ns"] - whole["first_time_ns"]) / 1e9
    a, b = round(span_s * 0.3, 3), round(span_s * 0.55, 3)
    compare(name, rec, f"{a},{b}", threads, name != "gil_uprobes")
    before = compare(name, rec, f",{a}", threads, always)
    after = compare(name, rec, f"{a},", threads, name != "gil_uprobes")
    compare(name, rec, f"0,{round(span_s * 0.1, 4)}", threads, always)
    if before and after:
        # The two halves add up to the whole run, thread by thread.
        def totals(s):
            return {t["tid"]: (ns(t["sleep_us"]), ns(t["disk_sleep_us"]), ns(t["running_us"]), ns(t["runnable_us"]),
                               ns(t["gil_wait_us"] or 0), ns(t["gil_hold_us"] or 0)) for t in s["threads"]}
        w, x, y = totals(whole), totals(before), totals(after)
        summed = {tid: tuple(p + q for p, q in zip(x.get(tid, (0,) * 6), y.get(tid, (0,) * 6))) for tid in w}
        off = {tid: (w[tid], summed[tid]) for tid in w if any(abs(p - q) > 1 for p, q in zip(w[tid], summed[tid]))}
        check(not off, f"{name}: --time ,{a} and --time {a}, add up to the whole run ({list(off.items())[:2]})")

# GIL blame (uprobes and CPU samples with stacks): the rows of the two halves
# add up to the whole run's, function by function.
def blame_rows(*extra):
    got, _, _ = analyse(os.path.join(DATA, "blame_py312.data"), *extra)
    out = {}
    for row in got["gil_blame"] if got else []:
        k = (row["pid"], row["function"], row["native"])
        out[k] = out.get(k, 0) + ns(row["contended_us"])
    return out


whole, x, y = blame_rows(), blame_rows("--time", ",0.15"), blame_rows("--time", "0.15,")
off = {k: (v, x.get(k, 0) + y.get(k, 0)) for k, v in whole.items() if abs(v - x.get(k, 0) - y.get(k, 0)) > 2}
check(whole and x and y and not off, f"blame: the halves' contended holds add up to the whole run's ({off})")

# Sleeps unwound on workers (-j 3): the same figures and trace as on one thread.
rec = os.path.join(DATA, "stacks_py312.data")
outs = []
for j in ("1", "3"):
    got, trace, _ = analyse(rec, "--time", "0.1,0.2", "--sleep-stacks", "8", "-j", j)
    outs.append((got and got["threads"], sorted(json.dumps(e, sort_keys=True) for e in trace or [])))
check(outs[0][0] and outs[0] == outs[1] and any(t["gil_sleep_count"] for t in outs[0][0]),
      "--time with sleeps unwound on workers (-j 3): figures and trace as at -j 1")

# A window past the recording's end: nothing in it, said as such.
rec = os.path.join(DATA, "plain.data")
got, trace, err = analyse(rec, "--time", "1000,")
check(got is not None and not got["threads"] and not any(e.get("ph") == "X" for e in trace)
      and sum(got["event_counts"].values()) == 0,
      f"--time past the end: no thread, span or event ({err[-200:]})")
r = subprocess.run([GILSCAN, rec, "--time", "0.05,0.1"], capture_output=True, text=True)
check(r.returncode == 0 and "50.0 ms from 0.05 s to 0.1 s of" in r.stdout,
      f"the table states the window ({r.stdout[:300]})")

# batch --time: each recording's rows are of the same window.
rows = os.path.join(tmp, "rows.jsonl")
recs = [os.path.join(DATA, f) for f in ("plain.data", "gil_combined.data")]
r = subprocess.run([GILSCAN, "batch", "--time", "0.05,0.15", "--summary", rows, *recs], capture_output=True, text=True)
brows = {(json.loads(x)["recording"], json.loads(x)["tid"]): json.loads(x) for x in open(rows)} if r.returncode == 0 else {}
same = 0
for rec in recs:
    got, _, _ = analyse(rec, "--time", "0.05,0.15")
    for t in got["threads"] if got else []:
        b = brows.get((rec, t["tid"]))
        same += bool(b) and all(b[k] == t[k] for k in ("sleep_count", "sleep_us", "running_us", "span_us", "gil_wait_us"))
check(r.returncode == 0 and same == len(brows) and same >= 8,
      f"batch --time: every row as gilscan --time's ({same} of {len(brows)}; {r.stderr[-200:]})")

for bad in ("", ",", "abc", "2,1", "1,1", "-1,2", "1,2,3", "nan,", "1e400,"):
    for cmd in ([GILSCAN, rec], [GILSCAN, "batch", rec]):
        r = subprocess.run(cmd + ["--time", bad], capture_output=True, text=True)
        check(r.returncode == 2 and "--time" in r.stderr and "Traceback" not in r.stderr,
              f"{cmd[1]} --time {bad!r}: a usage error ({r.returncode}, {r.stderr[-200:]})")

done("window e2e")
