#!/usr/bin/env python3
"""End-to-end checks of the gilscan command line (run by meson test).

usage: cli_test.py GILSCAN TESTDATA_DIR
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done, runner  # noqa: E402

GILSCAN, DATA = sys.argv[1], sys.argv[2]

run = runner(GILSCAN)


with tempfile.TemporaryDirectory() as tmp:
    trace, summ = os.path.join(tmp, "trace.json"), os.path.join(tmp, "s.json")
    # The debuginfo cache of every run here: not the user's ~/.cache.
    os.environ["GILSCAN_CACHE_DIR"] = os.path.join(tmp, "cache")

    # A real recording: trace and summary
    r = run(os.path.join(DATA, "plain.data"), "-o", trace, "--summary-json", summ)
    check(r.returncode == 0, f"plain.data exits 0 ({r.returncode}: {r.stderr})")
    check("total(ms)" in r.stdout and "sleep%" in r.stdout, "summary table on stdout")
    t = json.load(open(trace))
    check(isinstance(t.get("traceEvents"), list) and "viztracer_metadata" in t, "Chrome trace object layout")
    ev = t["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    check(len(xs) > 50, "complete events written")
    check(all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in ev), "integer pid/tid")
    check(all(e["dur"] >= 0 and e["ts"] > 0 for e in xs), "non-negative durations")
    check({"S", "R+"} <= {e["name"] for e in xs}, "sleep and runnable spans named per4m-style")
    check(not any(e["name"] == "R" for e in xs), "running spans only with --running")
    check(any(e["ph"] == "M" and e["name"] == "thread_name" for e in ev), "thread name metadata")
    raw = open(trace).read()
    check('"ts":' in raw and '.' in raw.split('"ts":', 1)[1][:25], "ts in microseconds with a fraction")
    check(not glob.glob(os.path.join(tmp, ".*.gilscan-*")), "no temporary files left")
    s = json.load(open(summ))
    keys = {"pid", "tid", "comm", "span_us", "running_us", "runnable_us", "sleep_us", "sleep_count",
            "gil_sleep_us", "gil_wait_us", "gil_hold_us", "no_gil_us"}
    check(s["threads"] and all(keys <= set(th) for th in s["threads"]), "summary fields per thread")
    check(all(th["gil_wait_us"] is None for th in s["threads"]), "GIL figures null without GIL data")
    check("lost_events" in s and "warnings" in s and s["clock"] == "CLOCK_MONOTONIC", "file-level fields")

    # gilscan FILE ends the process as soon as its outputs are complete
    # (the run's memory left to the kernel): nothing of them may be lost.
    # Every thread of the summary has its row in the table (on a pipe, fully
    # buffered), the warnings are all on stderr, and the exit status is 0,
    # also with the sleep stacks' threads (-j 2) at work.
    for extra in ([], ["-j", "2", "--sleep-stacks", "8"]):
        f = "stacks_py311.data"
        r = run(os.path.join(DATA, f), "-o", trace, "--summary-json", summ, "--all-threads", *extra)
        s2 = json.load(open(summ))
        rows = [ln for ln in r.stdout.splitlines() if ln.split()[1:2] and ln.split()[1].isdigit()]
        check(r.returncode == 0 and len(rows) == len(s2["threads"]) > 0,
              f"{' '.join(extra) or 'default'}: one table row per summary thread ({len(rows)}, {len(s2['threads'])})")
        # The per-thread table's legend, then the blame table to its last row.
        blame = [l for l in r.stdout[r.stdout.find("GIL blame"):].splitlines()[2:] if l.strip()]
        check("(* main thread;" in r.stdout and "GIL blame" in r.stdout and
              len(blame) == min(10, len(s2["gil_blame"])) + (len(s2["gil_blame"]) > 10) and r.stdout.endswith("\n"),
              f"the table's legend, and the blame table to its last line ({len(blame)} rows)")
        check(r.stderr.count("gilscan: warning:") == len(s2["warnings"]), "every warning on stderr")
        check(json.load(open(trace))["traceEvents"], "the trace complete")

    r = run(os.path.join(DATA, "plain.data"), "-o", trace, "--running", "-q")
    check(r.returncode == 0 and r.stdout == "", "-q prints no table")
    check(any(e["name"] == "R" for e in json.load(open(trace))["traceEvents"]), "--running adds R spans")

    pid = s["threads"][0]["pid"]
    r = run(os.path.join(DATA, "system_wide.data"), "-o", trace, "--pid", str(pid), "-q")
    check(r.returncode == 0, "--pid on a system-wide recording")
    # Unrecorded switch-ins: "record with -a" only where the recording is not.
    r = run(os.path.join(DATA, "system_wide.data"))
    check(r.returncode == 0 and "in this system-wide recording" in r.stderr and "Record with -a" not in r.stderr,
          f"a system-wide recording's unrecorded switch-ins, without the advice to record with -a ({r.stderr})")
    r = run(os.path.join(DATA, "plain.data"))
    check(r.returncode == 0 and "(a per-process recording" in r.stderr and "Record with -a" in r.stderr,
          f"a per-process recording's unrecorded switch-ins, with the advice to record with -a ({r.stderr})")

    # Stacks: S(GIL) from DWARF unwinding, with the symbolized stack on request
    r = run(os.path.join(DATA, "stacks_py311.data"), "-o", trace, "--summary-json", summ, "--sleep-stacks", "40", "-q")
    check(r.returncode == 0, f"stacks recording ({r.stderr})")
    ev = json.load(open(trace))["traceEvents"]
    gil = [e for e in ev if e["name"] == "S(GIL)"]
    check(len(gil) > 50, "S(GIL) sleeps from stacks")
    st = gil[0]["args"].get("stack", [])
    check(any("([kernel])" in f for f in st), "kernel frames kept from CALLCHAIN")
    check(any(f.startswith("take_gil+") for f in st), "take_gil frame symbolized")
    check(any(f.startswith("[inlined] PyCOND_TIMEDWAIT") for f in st), "DWARF inline frames")
    check(not any("@" in f for f in st), "symbol versions removed")
    check("take_gil" in gil[0]["args"]["evidence"], "evidence names the matching frame")
    s = json.load(open(summ))
    check(s["gil_sleep_source"] == "stacks" and s["stacks"]["decided"] == s["stacks"]["sleeps_seen"] > 0,
          "every sleep stack unwound to a CPython frame")
    check(any(t["gil_sleep_us"] for t in s["threads"]), "gil_sleep_us filled from stacks")
    check("Python 2" not in run(os.path.join(DATA, "stacks_py311.data")).stdout, "no Python 2 note on Python 3")
    # perf record -g: frame-pointer chains that end in glibc; said, with what to record instead
    r = run(os.path.join(DATA, "callchain_fp.data"), "--summary-json", summ)
    fp = [w for w in json.load(open(summ))["warnings"] if "frame-pointer call chains only" in w]
    check(r.returncode == 0 and len(fp) == 1 and "--call-graph dwarf" in fp[0] and "S(GIL)%" not in r.stdout,
          f"perf record -g: a warning that its chains cannot tell GIL waits, and what to record ({fp})")
    r = run(os.path.join(DATA, "stacks_py311.data"), "--summary-json", summ, "-q")
    check(not any("frame-pointer" in w for w in json.load(open(summ))["warnings"]), "no such warning with DWARF stacks")
    # Python 2: no take_gil; the GIL is PyThread_acquire_lock called by ceval.c's GIL takers
    r = run(os.path.join(DATA, "stacks_py27.data"), "-o", trace, "--sleep-stacks", "8")
    ev = json.load(open(trace))["traceEvents"]
    gil = [e for e in ev if e["name"] == "S(GIL)"]
    lock = [e for e in ev if e["name"] == "S" and any("lock_PyThread_acquire_lock" in f for f in e["args"].get("stack", []))]
    check(r.returncode == 0 and len(gil) > 50 and all(" called from PyEval_" in e["args"]["evidence"] and
          e["args"]["evidence"].startswith("PyThread_acquire_lock+") for e in gil),
          f"Python 2: S(GIL) with PyThread_acquire_lock and its GIL-taking caller as evidence ({len(gil)} spans)")
    check(lock, "Python 2: a threading.Lock's wait (lock_PyThread_acquire_lock) stays S")
    check("(Python 2: in PyThread_acquire_lock called by the GIL's takers)" in r.stdout,
          f"Python 2: the summary says what S(GIL) means there ({r.stdout[-300:]})")
    r = run(os.path.join(DATA, "gil_combined.data"), "--gil-evidence", "stacks", "--summary-json", summ, "-q")
    check(r.returncode == 0 and json.load(open(summ))["gil_sleep_source"] is None,
          "--gil-evidence stacks on a recording without stacks labels nothing")
    r = run(os.path.join(DATA, "gil_combined.data"), "--summary-json", summ, "-q")
    check(json.load(open(summ))["gil_sleep_source"] == "uprobes", "auto: uprobes when present")
    # Subinterpreters that own their GIL (3.13): a line per GIL, no anomalies.
    r = run(os.path.join(DATA, "gil_subinterp.data"))
    loads = [l for l in r.stdout.splitlines() if l.startswith("GIL load of process")]
    check(r.returncode == 0 and len(loads) == 3 and all(f", GIL {i + 1} at 0x" in l for i, l in enumerate(loads))
          and "contended 0.0%" in loads[1] and "contended 0.0%" in loads[2] and "contended 0.0%" not in loads[0]
          and "anomal" not in r.stdout + r.stderr, f"one summary line per GIL ({loads}, {r.stderr})")
    rows = [l.split() for l in r.stdout.split("GIL blame")[0].splitlines() if l.strip()[:1].isdigit()]
    check("  GILs" in r.stdout and sorted(row[-1] for row in rows) == ["1", "1", "1", "1,2", "1,3"],
          f"a GILs column: the sub threads took the main GIL and their own ({[row[-1] for row in rows]})")
    r = run(os.path.join(DATA, "gil_subinterp.data"), "--summary-json", summ, "-q")
    check(sorted(tuple(t["gil_indices"]) for t in json.load(open(summ))["threads"])
          == [(0,), (0,), (0,), (0, 1), (0, 2)], "gil_indices per thread in the JSON")
    r = run(os.path.join(DATA, "gil_combined.data"), "--summary-json", summ)
    check([l for l in r.stdout.splitlines() if l.startswith("GIL load of process")][0].startswith(
        "GIL load of process 7941: held"), "one GIL: no GIL number or address")
    check("GILs" not in r.stdout and all(t["gil_indices"] in ([0], None) for t in json.load(open(summ))["threads"]),
          "one GIL: no GILs column; gil_indices [0]")
    r = run(os.path.join(DATA, "plain.data"), "--gil-evidence", "bogus")
    check(r.returncode == 2, "bad --gil-evidence is a usage error")

    # -X perf trampolines named from perf maps: --perf-maps DIR (perf's
    # /tmp by default), --no-perf-maps; a missing map is one warning.
    pm = os.path.join(DATA, "stacks_py312_perfmap.data")
    maps = os.path.join(DATA, "perf-maps")
    (pm_map,) = [f for f in os.listdir(maps) if f.startswith("perf-")]  # perf-PID.map of the recording's python
    r = run(pm, "-o", trace, "--sleep-stacks", "40", "-q", "--perf-maps", maps)
    stacks = [e for e in json.load(open(trace))["traceEvents"] if "stack" in e.get("args", {})]
    named = [e for e in stacks if any(f.endswith(f" ({pm_map})") for f in e["args"]["stack"])]
    check(r.returncode == 0 and "perf map" not in r.stderr, f"--perf-maps DIR ({r.stderr})")
    check(len(named) > 50 and all(f.startswith("py::") for e in named for f in e["args"]["stack"] if pm_map in f),
          f"JIT frames named py::function:file from {pm_map} ({len(named)} of {len(stacks)} stacks)")
    check(any(e["name"] == "S(GIL)" and any(f.startswith("py::spin:") for f in e["args"]["stack"]) for e in named),
          "a GIL wait names the Python function that waits (spin)")
    named_trace = open(trace, "rb").read()
    for j in ("1", "2", "3"):
        run(pm, "-o", trace, "--sleep-stacks", "40", "-q", "--perf-maps", maps, "-j", j)
        check(open(trace, "rb").read() == named_trace, f"-j {j}: the same trace with perf maps")
    r = run(pm, "-o", trace, "--sleep-stacks", "40", "-q", "--no-perf-maps")
    raw = open(trace).read()
    check(r.returncode == 0 and "perf map" not in r.stderr and "py::" not in raw and "(anon)" in raw,
          "--no-perf-maps: JIT frames unnamed, nothing reported")
    empty = os.path.join(tmp, "no-maps")
    os.makedirs(empty)
    r = run(pm, "-o", trace, "--sleep-stacks", "40", "--perf-maps", empty)
    check(r.returncode == 0 and r.stderr.count(f"no perf map {empty}/{pm_map}") == 1 and "py::" not in open(trace).read(),
          f"a missing perf map: one warning, frames unnamed ({r.stderr})")
    if not os.path.exists(os.path.join("/tmp", pm_map)):
        r = run(pm, "-o", trace, "--sleep-stacks", "40")
        check(f"no perf map /tmp/{pm_map}" in r.stderr, "perf maps are looked for in /tmp by default, as perf does")
    r = run(pm, "-o", trace, "-q", "--perf-maps", empty, "--no-blame")
    check(r.returncode == 0 and "perf map" not in r.stderr, "without --sleep-stacks or blame no perf map is read")
    # Blame names the holders' Python functions: on a recording with CPU
    # samples in JIT code, it looks for the perf map (one warning).
    r = run(os.path.join(DATA, "blame_py312.data"), "--perf-maps", empty)
    check(r.returncode == 0 and r.stderr.count(f"no perf map {empty}/perf-20297.map") == 1,
          f"blame names the holders' Python functions: it looks for the perf map ({r.stderr})")
    check(run(pm, "--perf-maps", "").returncode == 2, "--perf-maps needs a directory")

    # -X perf_jit (CPython 3.13+): its jitdump, DIR/jit-PID.dump, names the
    # trampolines and gives their CFI: the stacks go on through every Python
    # function, as perf script's do after perf inject --jit.
    pj = os.path.join(DATA, "stacks_py313_perfjit.data")
    (pj_dump,) = [f for f in os.listdir(maps) if f.startswith("jit-")]
    r = run(pj, "-o", trace, "--sleep-stacks", "64", "-q", "--perf-maps", maps)
    stacks = [e["args"]["stack"] for e in json.load(open(trace))["traceEvents"] if "stack" in e.get("args", {})]
    jit = [[f for f in st if f.endswith(f" ({pj_dump})")] for st in stacks]
    check(r.returncode == 0 and "jitdump" not in r.stderr and "cannot unwind" not in r.stderr,
          f"--perf-maps DIR with a jitdump: nothing to report ({r.stderr})")
    check(sum(len(j) >= 3 for j in jit) > 50 and all(f.startswith("py::") for j in jit for f in j)
          and not any("(anon)" in f for st in stacks for f in st),
          f"jitdump frames named and unwound through ({sum(len(j) >= 3 for j in jit)} of {len(stacks)} stacks 3 deep)")
    named_trace = open(trace, "rb").read()
    for j in ("2", "3"):
        run(pj, "-o", trace, "--sleep-stacks", "64", "-q", "--perf-maps", maps, "-j", j)
        check(open(trace, "rb").read() == named_trace, f"-j {j}: the same trace with a jitdump")
    r = run(pj, "-o", trace, "--sleep-stacks", "64", "--perf-maps", empty)
    check(r.returncode == 0 and f"or jitdump {pj_dump}" in r.stderr and "(anon)" in open(trace).read()
          and "cannot unwind" not in r.stderr, f"no jitdump: one warning, the unwind ends at the first trampoline ({r.stderr})")

    # --gil-functions: the summary's GIL waits by Python function, the same
    # at any -j, with and without a trace; in the trace, each S(GIL) span's
    # args.function, the rest of the trace unchanged.
    gsumm = os.path.join(tmp, "gf.json")
    r = run(pm, "--gil-functions", "--perf-maps", maps, "--summary-json", gsumm)
    out = r.stdout
    rows = rows_gf = json.load(open(gsumm)).get("gil_functions", [])
    check(r.returncode == 0 and "GIL waits by Python function" in out and "py::spin:" in out
          and "(no function named)" in out, f"--gil-functions: the table ({out[-600:]})")
    check(rows and rows[0]["function"].startswith("py::spin:") and all(x["pid"] == 23131 for x in rows)
          and sum(x["sleep_count"] for x in rows) == 63, f"--gil-functions: the JSON rows ({rows})")
    # perf script's first py:: frame past take_gil, per GIL wait (tid, switch-out ns).
    truth = {(tid, t): fn for tid, t, fn in json.load(open(os.path.join(DATA, "stacks_py312_perfmap.gilfn.json")))}

    def without_functions(events):
        for e in events:
            if e.get("cat") == "process state":
                e.get("args", {}).pop("function", None)
        return events

    for stacks in ([], ["--sleep-stacks", "8"]):
        run(pm, "-o", trace, "-q", "--perf-maps", maps, *stacks)
        plain = json.load(open(trace))
        first = None
        for j in ("1", "2", "3"):
            r = run(pm, "--gil-functions", "--perf-maps", maps, "-o", trace, *stacks, "-j", j, "--summary-json", gsumm)
            check(r.returncode == 0 and json.load(open(gsumm))["gil_functions"] == rows,
                  f"{stacks} -j {j}: the same rows")
            raw = open(trace, "rb").read()
            if first is None:
                first = raw
                got = json.loads(raw)
                named = {(e["tid"], round(e["ts"] * 1000)): e["args"].get("function")
                         for e in got["traceEvents"] if e.get("cat") == "process state" and e["name"] == "S(GIL)"}
                check(named == truth and len(named) > 50,
                      f"{stacks}: each S(GIL) span's args.function is perf script's "
                      f"({sum(named.get(k) == v for k, v in truth.items())} of {len(truth)} equal, {len(named)} spans)")
                others = [e for e in got["traceEvents"] if "function" in e.get("args", {}) and e.get("name") != "S(GIL)"]
                check(not others, f"args.function on S(GIL) spans only ({others[:2]})")
                check(without_functions(got["traceEvents"]) == plain["traceEvents"],
                      f"{stacks}: the trace is otherwise unchanged by --gil-functions")
            else:
                check(raw == first, f"{stacks} -j {j}: the trace byte-identical to -j 1's")
    r = run(pm, "--summary-json", gsumm, "-q")
    check("gil_functions" not in json.load(open(gsumm)) and "GIL waits by" not in r.stdout,
          "no GIL functions unless asked for")
    r = run(os.path.join(DATA, "gil_combined.data"), "--gil-functions")
    check("--gil-functions: no event of the recording has user stacks" in r.stderr,
          f"--gil-functions on a recording without stacks: a warning ({r.stderr[-300:]})")

    # Batch: a directory of archived recordings, compressed ones, a bad one
    import csv
    import shutil
    arch = os.path.join(tmp, "archive")
    os.makedirs(os.path.join(arch, "sub"))
    shutil.copy(os.path.join(DATA, "plain.data"), arch)
    shutil.copy(os.path.join(DATA, "gil_combined.data"), os.path.join(arch, "sub"))
    subprocess.run(["zstd", "-q", "-f", os.path.join(DATA, "pipe.data"), "-o", os.path.join(arch, "sub", "p.data.zst")],
                   check=True)
    open(os.path.join(arch, "sub", "broken.data"), "wb").write(b"not perf" * 100)
    open(os.path.join(arch, "notes.txt"), "w").write("not a recording name: skipped")
    rows_csv, traces = os.path.join(tmp, "rows.csv"), os.path.join(tmp, "traces")
    r = run("batch", "-j", "2", "--summary", rows_csv, "--traces", traces, arch)
    check(r.returncode == 0, f"batch exits 0 when something was read ({r.stderr[-300:]})")
    rows = list(csv.DictReader(open(rows_csv)))
    recs = {row["recording"] for row in rows}
    check(len(recs) == 4, f"four recordings found recursively ({recs})")
    errs = [row for row in rows if row["error"]]
    check(len(errs) == 1 and "broken.data" in errs[0]["recording"] and "PERFILE2" in errs[0]["error"],
          "the bad file is a row with its error")
    ok = [row for row in rows if not row["error"]]
    check(all(row["host"] and row["date"] and row["tid"] for row in ok), "host, date, tid on every row")
    check(any(row["gil_wait_us"] for row in ok if "gil_combined" in row["recording"]), "GIL figures in rows")
    check(any(row["recording"].endswith("p.data.zst") and row["sleep_count"] for row in ok), ".data.zst read")
    check(len(os.listdir(traces)) == 3, f"a trace per readable recording ({os.listdir(traces)})")
    rows_jsonl = os.path.join(tmp, "rows.jsonl")
    r = run("batch", "--summary", rows_jsonl, os.path.join(arch, "sub"))
    lines = [json.loads(l) for l in open(rows_jsonl)]
    check(r.returncode == 0 and lines and all("recording" in l and "gil_hold_us" in l for l in lines), "JSONL rows")
    r = run("batch", os.path.join(arch, "sub", "broken.data"))
    check(r.returncode == 1, "batch fails only when nothing could be read")
    # batch --gil-functions: the rows each recording's --summary-json has
    # (gil_functions), with the recording, as JSON lines or CSV; JIT frames
    # named from --perf-maps; any -j; none without the option.
    pm_copy = os.path.join(arch, "pm.data")
    shutil.copy(pm, pm_copy)
    fn_jsonl, fn_csv = os.path.join(tmp, "fn.jsonl"), os.path.join(tmp, "fn.csv")
    want_fn = [dict(recording=pm_copy, **row) for row in rows_gf]
    for j in ("1", "2", "3"):
        r = run("batch", "-j", j, "--summary", rows_jsonl, "--gil-functions", fn_jsonl, "--perf-maps", maps, arch)
        fl = [json.loads(l) for l in open(fn_jsonl)] if r.returncode == 0 else []
        mine = [l for l in fl if l["recording"] == pm_copy]
        check(r.returncode == 0 and mine == want_fn and len(mine) >= 5,
              f"batch -j {j} --gil-functions: the recording's rows as its --summary-json has them ({mine[:2]})")
        check({l["recording"] for l in fl} <= {pm_copy, os.path.join(arch, "sub", "gil_combined.data")},
              f"batch --gil-functions: rows only where GIL waits were labelled ({sorted({l['recording'] for l in fl})})")
        check(all(set(l) == {"recording", "pid", "function", "sleep_count", "sleep_us"} for l in fl),
              "batch --gil-functions: the columns")
    r = run("batch", "--gil-functions", fn_csv, "--perf-maps", maps, pm_copy)
    got_csv = list(csv.DictReader(open(fn_csv))) if r.returncode == 0 else []
    check([(c["recording"], int(c["pid"]), c["function"] or None, int(c["sleep_count"]), float(c["sleep_us"]))
           for c in got_csv] == [(w["recording"], w["pid"], w["function"], w["sleep_count"], w["sleep_us"])
                                 for w in want_fn], f"batch --gil-functions CSV: the same rows ({got_csv[:2]})")
    r = run("batch", "--gil-functions", fn_jsonl, "--no-perf-maps", pm_copy)
    fl = [json.loads(l) for l in open(fn_jsonl)] if r.returncode == 0 else []
    check(fl and all(l["function"] is None for l in fl) and sum(l["sleep_count"] for l in fl) == 63,
          f"batch --no-perf-maps: GIL waits counted, no function named ({fl[:2]})")
    os.remove(fn_jsonl)
    r = run("batch", "--summary", rows_jsonl, pm_copy)
    check(r.returncode == 0 and not os.path.exists(fn_jsonl), "batch: no functions file without --gil-functions")
    check(run("batch", "--gil-functions", "", pm_copy).returncode != 0, "batch --gil-functions needs a file")
    os.remove(pm_copy)

    # Binaries absent (an empty --symfs): scheduler figures still, unwinding said once per module
    empty = os.path.join(tmp, "symfs")
    os.makedirs(empty)
    r = run("batch", "--summary", rows_jsonl, "--symfs", empty, os.path.join(DATA, "stacks_py311.data"))
    lines = [json.loads(l) for l in open(rows_jsonl)]
    check(r.returncode == 0 and all(l["sleep_count"] is not None for l in lines), "sleep figures without binaries")
    check(all(l["gil_sleep_us"] is None for l in lines), "no S(GIL) figures invented without binaries")
    w = lines[0]["warnings"]
    check(w.count("libpython3.11.so.1.0: not found") == 1, f"missing module said once ({w[:300]})")

    # -j: one thread, the reader and writer threads, stacks unwound on worker
    # threads: byte-identical results (the default is all cores)
    outs = []
    for j in ("1", "2", "3", "5", None):
        t_, s_ = os.path.join(tmp, f"j{j}.json"), os.path.join(tmp, f"j{j}.s.json")
        r = run(os.path.join(DATA, "stacks_zstd.data"), *(("-j", j) if j else ()), "-q", "--sleep-stacks", "16",
                "-o", t_, "--summary-json", s_)
        check(r.returncode == 0, f"-j {j}")
        outs.append((open(t_, "rb").read(), open(s_, "rb").read()))
    check(outs[0] == outs[1], "-j 1 and -j 2 give byte-identical traces and summaries")
    check(outs[0] == outs[2], "-j 3 (one unwinding worker) too")
    check(outs[0] == outs[3], "-j 5 (more workers than cores, part-filled job batches) too")
    check(outs[0] == outs[4], "the default -j too")
    check(b'"S(GIL)"' in outs[0][0], "the -j comparison covers S(GIL) sleeps")
    plain = []
    for j in ("1", "2"):
        t_ = os.path.join(tmp, f"plain-j{j}.json")
        r = run(os.path.join(DATA, "stacks_zstd.data"), "-j", j, "-q", "-o", t_)
        check(r.returncode == 0, f"-j {j} without --sleep-stacks")
        plain.append(open(t_, "rb").read())
    check(plain[0] == plain[1] and b'"S(GIL)"' in plain[0], "-j without --sleep-stacks: the same classification")

    # The debuginfo cache (inflated copies of compressed debug files, by
    # build-id): $GILSCAN_CACHE_DIR/gilscan-cache by default, --cache-dir DIR (DIR/gilscan-cache),
    # --no-cache; the same trace cold, warm and without it. stacks_py311's
    # glibc frames are named from libc6-dbg's zlib-compressed debug file.
    stk = os.path.join(DATA, "stacks_py311.data")
    dirs = {"env": os.path.join(tmp, "env-cache"), "flag": os.path.join(tmp, "flag-cache"),
            "none": os.path.join(tmp, "no-cache")}
    cached = []
    for name, env_dir, extra in (("cold", dirs["env"], ()), ("warm", dirs["env"], ()),
                                 ("flag", dirs["none"], ("--cache-dir", dirs["flag"])),
                                 ("off", dirs["none"], ("--no-cache",))):
        t_ = os.path.join(tmp, f"cache-{name}.json")
        r = subprocess.run([GILSCAN, stk, "-q", "--sleep-stacks", "16", "-o", t_, *extra], capture_output=True,
                           text=True, env={**os.environ, "GILSCAN_CACHE_DIR": env_dir})
        check(r.returncode == 0, f"cache run {name} ({r.stderr[-300:]})")
        cached.append(open(t_, "rb").read())
    check(b"[inlined] __pthread_cond_wait_common (libc.so.6)" in cached[0], "glibc inline frames named")
    check(all(c == cached[3] for c in cached), "the same trace cold, warm, with --cache-dir and with --no-cache")
    check(len(glob.glob(os.path.join(dirs["env"], "gilscan-cache", "*.debug"))) == 1, "default: $GILSCAN_CACHE_DIR/gilscan-cache")
    check(len(glob.glob(os.path.join(dirs["flag"], "gilscan-cache", "*.debug"))) == 1, "--cache-dir DIR: entries in DIR/gilscan-cache")
    check(not os.path.exists(dirs["none"]), "--no-cache writes nothing")
    # Frame names kept beside them (name_store.h), one file per binary named.
    kept = glob.glob(os.path.join(dirs["env"], "gilscan-cache", "names-*"))
    check(len(kept) >= 2 and all(os.stat(k).st_mode & 0o077 == 0 for k in kept),
          f"frame names kept per binary, mode 0600 ({kept})")
    check(glob.glob(os.path.join(dirs["flag"], "gilscan-cache", "names-*")), "--cache-dir DIR: frame names in DIR/gilscan-cache")

    # Errors: one line, non-zero, no output left behind
    bad = {
        "empty.data": b"",
        "garbage.data": os.urandom(4096),
        "text.data": b"this is not a perf recording\n" * 10,
        "short.data": b"PERFILE2",
    }
    for name, content in bad.items():
        p = os.path.join(tmp, name)
        open(p, "wb").write(content)
        out = os.path.join(tmp, name + ".json")
        r = run(p, "-o", out)
        check(r.returncode != 0, f"{name}: non-zero exit")
        check(r.stderr.startswith(f"gilscan: error: {p}:"), f"{name}: 'gilscan: error: FILE: reason' ({r.stderr!r})")
        check(len(r.stderr.strip().splitlines()) == 1, f"{name}: one line")
        check(not os.path.exists(out) and not glob.glob(os.path.join(os.path.dirname(out), "." + os.path.basename(out) + ".gilscan-*")), f"{name}: no output file left")
    r = run(os.path.join(tmp, "missing.data"), "-o", os.path.join(tmp, "m.json"))
    check(r.returncode != 0 and "gilscan: error:" in r.stderr, "missing file")
    r = run(tmp)
    check(r.returncode != 0 and "directory" in r.stderr, "a directory")
    r = run("--bogus")
    check(r.returncode == 2, "unknown option is a usage error")
    # One option table per command prints its help: the main help fits a
    # screen and names every command; `gilscan help CMD` is `CMD --help`;
    # every option a help lists is described in docs/usage.md.
    r = run("--help")
    check(r.returncode == 0 and len(r.stdout.splitlines()) <= 40, "--help exits 0 and fits in 40 lines")
    for cmd in ("record", "top", "batch", "probe"):
        check(f"gilscan {cmd} [" in r.stdout, f"--help names gilscan {cmd}")
    check("gilscan help COMMAND" in r.stdout, "--help names gilscan help")
    usage_md = open(os.path.join(DATA, "..", "docs", "usage.md")).read()
    for cmd in ("", "record", "top", "batch", "probe"):
        h = run("help", cmd) if cmd else run("help")
        rh = run(cmd, "--help") if cmd else r
        check(h.returncode == 0 and rh.returncode == 0 and h.stdout == rh.stdout, f"help {cmd} is {cmd} --help")
        opts = re.findall(r"^  (?:(-\w), )?\s*(--[\w-]+)?", h.stdout, re.M)
        names = [n for pair in opts for n in pair if n]
        check(len(names) >= 3, f"help {cmd} lists its options ({names})")
        missing = [n for n in names if f"`{n}" not in usage_md and f", {n}" not in usage_md]
        check(not missing, f"docs/usage.md describes every option of help {cmd} (missing {missing})")
    rb = run("batch", "--help")
    for opt in ("-j N", "--summary out.jsonl|out.csv", "--traces DIR", "--gil-functions out.jsonl|out.csv"):
        check(opt in rb.stdout, f"batch --help names {opt!r}")
    r = run("record", "--bogus")
    check(r.returncode == 2 and "(see gilscan help record)" in r.stderr, "record: an unknown option is a usage error")

    # libcapstone is loaded only to disassemble a stripped Python (its
    # relocations cost every process start some 375 page faults, 5 ms on
    # this VM): not for an analysis, but for locating the GIL without symbols.
    def loads_capstone(*args):
        r = subprocess.run([GILSCAN, *args], capture_output=True, text=True, env={**os.environ, "LD_DEBUG": "files"})
        return r.returncode, "libcapstone" in r.stderr
    check(loads_capstone(os.path.join(DATA, "plain.data"), "-q") == (0, False), "an analysis does not load libcapstone")
    if os.path.exists("/usr/bin/python3.11"):
        rc, loaded = loads_capstone("probe", "--print", "/usr/bin/python3.11")
        check(rc == 0 and loaded, "locating the GIL in stripped python3.11 loads libcapstone")

    # The README's quick start: its gilscan command runs as written (from the
    # source tree) and prints the blame rows the README shows.
    root = os.path.abspath(os.path.join(DATA, ".."))
    readme = open(os.path.join(root, "README.md")).read()
    start = readme.index("## Quick start")
    first = readme[readme.index("```\n", start) + 4:].splitlines()[0]
    check(first.startswith("scripts/build && build/gilscan "), f"quick start: build, then gilscan ({first!r})")
    with tempfile.TemporaryDirectory() as qs:
        argv = first.split(" && ", 1)[1].split()[1:]
        argv = [a if a.startswith("-") or i == 0 or argv[i - 1] == "--perf-maps" else os.path.join(qs, a)
                for i, a in enumerate(argv)]  # the files it writes, here
        r = subprocess.run([os.path.abspath(GILSCAN), *argv], capture_output=True, text=True, cwd=root,
                           env={**os.environ, "TMPDIR": qs})
        check(r.returncode == 0 and os.path.getsize(os.path.join(qs, "trace.json")) > 0 and
              os.path.getsize(os.path.join(qs, "report.html")) > 0, f"quick start: runs, writes its files ({r.stderr})")
        shown = readme[readme.index("GIL blame: who held"):].split("```")[0].splitlines()[2:]
        check(len(shown) >= 2 and all(row in r.stdout for row in shown),
              f"quick start: prints the README's blame rows ({shown})")

done("cli")
