"""The pass/fail bookkeeping shared by the Python end-to-end tests: each
check counts, failures print one line, and done() prints the closing
"N passed, N failed" line and exits non-zero on any failure."""
import sys

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, flush=True)


def runner(gilscan):
    """run(*args, **kw): gilscan run with those arguments, its output
    captured as text (kw as subprocess.run's: env, timeout...)."""
    import subprocess
    return lambda *args, **kw: subprocess.run([gilscan, *args], capture_output=True, text=True, **kw)


def remove_perf_maps_of(script):
    """Removes the /tmp/perf-PID.map files that name functions of script (an
    absolute path): the maps a test's Python programs left (CPython 3.12+
    writes one per process under -X perf or PYTHONPERFSUPPORT=1 and never
    removes it). Left there, a later process given the same pid (pids wrap
    at pid_max, 32768 by default) would be named by a map not its own."""
    import glob
    import os
    for m in glob.glob("/tmp/perf-*.map"):
        try:
            with open(m, errors="replace") as f:
                if f":{script}" in f.read():
                    os.remove(m)
        except OSError:
            pass


def done(name):
    print(f"{name}: {passed} passed, {failed} failed ({traces_checked} traces checked)")
    sys.exit(1 if failed else 0)


# Every Chrome trace gilscan writes in an end-to-end test is checked as a
# viewer would read it: subprocess.run is wrapped so that after a gilscan
# run that succeeded, the trace it wrote (-o FILE, or record's --trace
# FILE) must have no span of zero or negative length, no two spans on one
# row (pid, tid) that overlap partially (they are disjoint or nested), and
# no "E" without its "B". done() says how many were checked.
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

traces_checked = 0
_real_run = subprocess.run


def trace_problems(path):
    """What a viewer would draw wrong in the trace at path (empty: none)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    problems, rows, open_b = [], {}, {}
    for e in events:
        row = (e.get("pid"), e.get("tid"))
        if e["ph"] == "X":
            start, dur = round(e["ts"] * 1000), round(e["dur"] * 1000)
            if dur <= 0:
                problems.append(f"{e['name']} at {e['ts']} on {row}: dur {e['dur']}")
            rows.setdefault(row, []).append((start, start + dur, e["name"]))
        elif e["ph"] == "B":
            open_b.setdefault(row, []).append(e)
        elif e["ph"] == "E":
            if open_b.get(row):
                open_b[row].pop()
            else:
                problems.append(f"E without B at {e['ts']} on {row}")
    for row, spans in rows.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, name in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"{name} [{start}, {end}] overlaps {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] "
                                f"partially on {row}")
                break
            stack.append((start, end, name))
    return problems


def _written_trace(args):
    """The trace file a gilscan command line writes, or None."""
    if not isinstance(args, (list, tuple)) or not args or os.path.basename(str(args[0])) != "gilscan":
        return None
    args = [str(a) for a in args]
    flag = "--trace" if len(args) > 1 and args[1] == "record" else "-o"
    if len(args) > 1 and args[1] in ("batch", "probe"):
        return None
    end = args.index("--") if "--" in args else len(args)
    for i in range(1, end - 1):
        if args[i] == flag:
            out = args[i + 1]
            return out if out.endswith((".json", ".json.gz")) else None
    return "trace.json" if flag == "--trace" else None


def _audited_run(args, *a, **kw):
    global traces_checked
    r = _real_run(args, *a, **kw)
    path = _written_trace(args)
    if path and r.returncode == 0:
        path = os.path.join(kw.get("cwd") or "", path)
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            problems = trace_problems(path)
            check(not problems, f"the trace {path} draws right ({problems[:3]})")
            traces_checked += 1
    return r


subprocess.run = _audited_run
