#!/usr/bin/env python3
"""Python's JIT frames end to end (needs root and perf): CPython 3.12's -X
perf maps and 3.13's -X perf_jit dumps, GIL waits by Python function
(--gil-functions: the first JIT frame past take_gil, on the recording and
through gilscan record, with and without the GIL uprobes), and a forked
pool's processes, each with its own map. The truth is perf script's, on
the same recording (stack_truth.py): gilscan never reads it.

usage: jit_e2e.py GILSCAN WORKLOAD
Prints "N passed, N failed".
"""
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402
from stack_truth import gil_function_diff, gil_functions, jit_frames  # noqa: E402

GILSCAN, WORKLOAD = sys.argv[1], sys.argv[2]


def summary_functions(path, ok):
    """GIL waits by Python function in a --summary-json: nothing when the run that wrote it failed."""
    got = collections.Counter()
    for row in json.load(open(path)).get("gil_functions", []) if ok else []:
        got[row["function"]] += row["sleep_count"]
    return got


with tempfile.TemporaryDirectory() as tmp:
    data, trace = os.path.join(tmp, "r.data"), os.path.join(tmp, "t.json")
    # Python 3.12 -X perf: the trampolines' names come from the map it
    # writes to /tmp, where gilscan looks by default (as perf does). No GIL
    # uprobes (--state --stacks): take_gil's return probe would end the GIL
    # waits' stacks before the trampolines.
    r = subprocess.run([GILSCAN, "record", "--state", "--stacks", "--no-analyse", "-o", data, "--",
                        "/root/.pyenv/versions/3.12.1/bin/python3", "-X", "perf", WORKLOAD, "0.1"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"record --state --stacks -- python3.12 -X perf ({r.stderr[-300:]})")
    check("return probe" not in r.stderr, f"no return-probe note without --gil ({r.stderr[-300:]})")
    r = subprocess.run([GILSCAN, data, "-q", "--sleep-stacks", "16", "-o", trace], capture_output=True, text=True)
    maps_used = set()
    gil_named = 0
    for e in json.load(open(trace))["traceEvents"] if r.returncode == 0 else []:
        jit = [f for f in e.get("args", {}).get("stack", []) if " (perf-" in f]
        maps_used.update(f.rsplit(" (", 1)[1][:-1] for f in jit)
        gil_named += e["name"] == "S(GIL)" and any(f.startswith("py::spin:") for f in jit)
    check(r.returncode == 0 and "perf map" not in r.stderr and len(maps_used) == 1 and gil_named > 5,
          f"-X perf frames named from /tmp's perf map ({maps_used}, {gil_named} GIL waits in spin; {r.stderr[-300:]})")
    # --gil-functions on the same live recording: each GIL wait under the
    # first JIT frame past take_gil that perf script's stack shows.
    summ_gf = os.path.join(tmp, "gf.json")
    r = subprocess.run([GILSCAN, data, "-q", "--gil-functions", "--summary-json", summ_gf], capture_output=True, text=True)
    want = collections.Counter(f for _, _, f in gil_functions(data))
    got = summary_functions(summ_gf, r.returncode == 0)
    check(r.returncode == 0 and got == want and want["py::spin:" + WORKLOAD] > 5,
          f"--gil-functions: perf script's functions of the GIL waits ({dict(got)} against {dict(want)}; "
          f"{gil_function_diff(data, gil_functions(data), summ_gf, None) if r.returncode == 0 else ''})")
    for m in maps_used:  # the map the recorded python left
        if os.path.exists(os.path.join("/tmp", m)):
            os.remove(os.path.join("/tmp", m))

    # Python 3.13 -X perf_jit: the trampolines' names and CFI in the jitdump
    # it writes to /tmp. perf script reads them only from the copy `perf
    # inject --jit` makes (one jitted-PID-N.so per trampoline, beside the
    # dump): gilscan on the recording and the dump, and on the injected copy,
    # must find perf script's function for each GIL wait and the same frames.
    dumps_before = set(glob.glob("/tmp/jit-*.dump"))
    r = subprocess.run([GILSCAN, "record", "--state", "--stacks", "--no-analyse", "-o", data, "--",
                        "/root/.pyenv/versions/3.13.0/bin/python3", "-X", "perf_jit", WORKLOAD, "0.1"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"record --state --stacks -- python3.13 -X perf_jit ({r.stderr[-300:]})")
    injected = os.path.join(tmp, "inj.data")
    ri = subprocess.run(["perf", "inject", "--jit", "-i", data, "-o", injected], capture_output=True, text=True)
    check(ri.returncode == 0, f"perf inject --jit ({ri.stderr[-300:]})")
    want = collections.Counter(f for _, _, f in gil_functions(injected))
    frames = {}
    for name, path in (("the recording and its jitdump", data), ("the injected copy", injected)):
        r = subprocess.run([GILSCAN, path, "-q", "--gil-functions", "--summary-json", summ_gf, "--sleep-stacks", "64",
                            "-o", trace], capture_output=True, text=True)
        got = summary_functions(summ_gf, r.returncode == 0)
        check(r.returncode == 0 and got == want and want["py::spin:" + WORKLOAD] > 5,
              f"-X perf_jit, {name}: perf script's functions of the GIL waits ({dict(got)} against {dict(want)}; "
              f"{r.stderr[-300:]})")
        frames[name] = [[f.rsplit("+0x", 1)[0] for f in e["args"]["stack"] if f.startswith("py::")]
                        for e in json.load(open(trace))["traceEvents"] if "stack" in e.get("args", {})] \
            if r.returncode == 0 else []
    deep = sum(len(f) >= 3 for f in frames["the injected copy"])
    check(frames["the recording and its jitdump"] == frames["the injected copy"] and deep > 20,
          f"-X perf_jit: the same Python frames from the jitdump as from inject's files ({deep} stacks 3 deep)")
    for d in set(glob.glob("/tmp/jit-*.dump")) - dumps_before:  # the recorded python's dump and inject's files
        pid = os.path.basename(d)[4:-5]
        for f in [d] + glob.glob(f"/tmp/jitted-{pid}-*.so"):
            os.remove(f)

    # gilscan record --gil-functions: Python 3.12 with perf support from the
    # environment (no -X perf on the command line), --state --stacks, no GIL
    # probes; the summary's functions and each S(GIL) span's args.function
    # are perf script's first JIT frame past take_gil.
    r = subprocess.run([GILSCAN, "record", "--gil-functions", "-o", data, "--trace", trace, "--summary-json", summ_gf,
                        "--", "/root/.pyenv/versions/3.12.1/bin/python3", WORKLOAD, "0.1"], capture_output=True, text=True)
    check(r.returncode == 0 and "GIL probes on" not in r.stderr and "GIL waits by Python function" in r.stderr,
          f"record --gil-functions: recorded without GIL probes, the table printed ({r.stderr[-300:]})")
    truth = gil_functions(data)
    want = collections.Counter(f for _, _, f in truth)
    got = summary_functions(summ_gf, r.returncode == 0)
    check(r.returncode == 0 and got == want and want["py::spin:" + WORKLOAD] > 5,
          f"record --gil-functions: perf script's functions ({dict(got)} against {dict(want)}; "
          f"{gil_function_diff(data, truth, summ_gf, trace) if r.returncode == 0 else ''})")
    per_sleep = {(tid, t): f for tid, t, f in truth}
    spans = {(e["tid"], round(e["ts"] * 1000)): e["args"].get("function")
             for e in (json.load(open(trace))["traceEvents"] if r.returncode == 0 else [])
             if e.get("cat") == "process state" and e["name"] == "S(GIL)"}
    check(spans and spans == per_sleep and sum(f is not None for f in spans.values()) > 5,
          f"record --gil-functions: each S(GIL) span's args.function is perf script's "
          f"({sum(spans.get(k) == v for k, v in per_sleep.items())} of {len(per_sleep)}, {len(spans)} spans)")
    pids = {row["pid"] for row in json.load(open(summ_gf)).get("gil_functions", [])} if r.returncode == 0 else set()
    maps_left = [f"/tmp/perf-{p}.map" for p in pids if os.path.exists(f"/tmp/perf-{p}.map")]
    check(len(pids) == 1 and len(maps_left) == 1 and f"py::spin:{WORKLOAD}" in open(maps_left[0]).read(),
          f"PYTHONPERFSUPPORT=1 made the recorded Python write its perf map ({pids}, {maps_left})")
    for m in maps_left:
        os.remove(m)
    # Before 3.12 there is no perf support: the analysis says why no function is named.
    r = subprocess.run([GILSCAN, "record", "--gil-functions", "-o", data, "--trace", "",
                        "--", "/root/.pyenv/versions/3.11.7/bin/python3", WORKLOAD, "0.1"], capture_output=True, text=True)
    check(r.returncode == 0 and "no GIL wait's stack reached a Python function named by a perf map" in r.stderr,
          f"record --gil-functions of Python 3.11: the warning ({r.stderr[-400:]})")
    # With the GIL uprobes too: take_gil's return probes sit on its rets, not
    # a uretprobe, so each GIL wait's stack still reaches the Python function
    # that waits, in gilscan (sleeps labelled by the uprobes) as in perf script.
    r = subprocess.run([GILSCAN, "record", "--gil", "--gil-functions", "-o", data, "--trace", trace, "--summary-json",
                        summ_gf, "--", "/root/.pyenv/versions/3.12.1/bin/python3", WORKLOAD, "0.1"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and "GIL probes on" in r.stderr and "return probe" not in r.stderr,
          f"record --gil --gil-functions: recorded with the GIL probes ({r.stderr[-300:]})")
    probes = subprocess.run(["perf", "script", "-i", data, "-F", "event"], capture_output=True, text=True).stdout
    check("take_gil__return" in probes, "record --gil --gil-functions: take_gil's return probe fired")
    s = json.load(open(summ_gf)) if r.returncode == 0 else {}
    truth = gil_functions(data)
    want = collections.Counter(f for _, _, f in truth)
    got = summary_functions(summ_gf, r.returncode == 0)
    check(s.get("gil_sleep_source") == "uprobes" and got == want and want["py::spin:" + WORKLOAD] > 5,
          f"record --gil --gil-functions: uprobe-labelled GIL waits by perf script's functions "
          f"({s.get('gil_sleep_source')}, {dict(got)} against {dict(want)}; "
          f"{gil_function_diff(data, truth, summ_gf, trace) if r.returncode == 0 else ''})")
    # --sleep-stacks on the same uprobe-labelled recording: each sleep's
    # stack in the trace, the same at -j 1 and -j 3.
    stacked = []
    for j in ("1", "3"):
        out = os.path.join(tmp, f"ss{j}.json")
        w = subprocess.run([GILSCAN, data, "-q", "-j", j, "--sleep-stacks", "16", "-o", out], capture_output=True)
        stacked.append(open(out, "rb").read() if w.returncode == 0 else b"")
    spans = [e for e in json.loads(stacked[0] or b'{"traceEvents":[]}')["traceEvents"]
             if e.get("cat") == "process state" and e["name"] == "S(GIL)"]
    check(stacked[0] == stacked[1] and len(spans) > 5 and all("stack" in e["args"] for e in spans) and
          all(e["args"].get("evidence", "").endswith("(uprobe)") for e in spans),
          f"--sleep-stacks with the uprobes labelling: every S(GIL) span has its stack, at -j 1 and 3 alike "
          f"({len(spans)} spans, {sum('stack' in e['args'] for e in spans)} with stacks)")
    w = subprocess.run([GILSCAN, data, "-q", "--wait-folded", os.path.join(tmp, "waits.txt")], capture_output=True)
    waits = open(os.path.join(tmp, "waits.txt")).read().splitlines() if w.returncode == 0 else []
    # Every GIL wait but a new thread's first (PyEval_AcquireThread, before
    # it runs any Python) has a Python function below take_gil.
    def weight(lines):
        return sum(int(l.rsplit(" ", 1)[1]) for l in lines)
    gil_waits = [l for l in waits if ";take_gil;" in l and ";PyEval_AcquireThread;take_gil;" not in l]
    past = [l for l in gil_waits if ";py::" in l.split(";take_gil;")[0]]
    check(any(";py::spin:" in l for l in past) and weight(past) >= 0.95 * weight(gil_waits),
          f"record --gil --gil-functions: waits' folded stacks go past take_gil to the Python function "
          f"({weight(past)} of {weight(gil_waits)} us)")
    for m in glob.glob("/tmp/perf-*.map"):
        if f"py::spin:{WORKLOAD}" in open(m).read():
            os.remove(m)

    # A forked pool under -X perf: each worker writes its own map, its
    # trampolines where its parent's were. Every sleep's JIT frames must be
    # the ones perf script names (stack_truth.jit_frames), process by process.
    pool = os.path.join(tmp, "pool.py")
    open(pool, "w").write(
        "import multiprocessing as mp, threading, time\n"
        "def spin(i):\n"
        "    t = time.monotonic() + 0.05\n"
        "    while time.monotonic() < t:\n"
        "        sum(range(1000))\n"
        "def work(i):\n"
        "    ts = [threading.Thread(target=spin, args=(i,)) for _ in range(3)]\n"
        "    [t.start() for t in ts]\n"
        "    [t.join() for t in ts]\n"
        "    return i\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('fork')\n"
        "    with mp.Pool(3) as p:\n"
        "        print(sum(p.map(work, range(6))))\n")
    r = subprocess.run([GILSCAN, "record", "-q", "--state", "--stacks", "--no-analyse", "-o", data, "--",
                        "/root/.pyenv/versions/3.12.1/bin/python3", "-X", "perf", pool], capture_output=True, text=True)
    check(r.returncode == 0, f"record a -X perf multiprocessing pool ({r.stderr[-300:]})")
    want = {(t, ns): names for t, ns, names in jit_frames(data)}
    r = subprocess.run([GILSCAN, data, "-q", "--sleep-stacks", "64", "-o", trace], capture_output=True, text=True)
    mine, maps_used = {}, set()
    for e in json.load(open(trace))["traceEvents"] if r.returncode == 0 else []:
        jit = [f for f in e.get("args", {}).get("stack", []) if " (perf-" in f]
        if jit:
            mine[(e["tid"], round(e["ts"] * 1000))] = [f.rsplit("+0x", 1)[0] for f in jit]
            maps_used.update(f.rsplit(" (", 1)[1][:-1] for f in jit)
    check(r.returncode == 0 and len(maps_used) >= 3 and len(want) > 20 and mine == want,
          f"a pool's JIT frames named from each process's own map as perf script names them "
          f"({len(maps_used)} maps, {len(want)} sleeps, {sum(mine.get(k) == v for k, v in want.items())} the same)")
    for m in maps_used:
        if os.path.exists(os.path.join("/tmp", m)):
            os.remove(os.path.join("/tmp", m))

done("jit e2e")
