#!/usr/bin/env python3
"""Ground truth for stack classification, from a second, concurrent recording.

usage: stack_truth.py TEST.data TRUTH.data > TEST.truth.json

TRUTH.data is a system-wide `perf record -a` of take_gil entry and return
uprobes made beside TEST.data (both -k CLOCK_MONOTONIC). A sleep of TEST.data
(a sched_switch with prev_state S of the recorded program: not of perf's or
gilscan record's child before it became the program) is a GIL wait iff its
switch-out time lies inside a take_gil entry..return interval of the same
thread. gilscan never reads TRUTH.data or this output: the tests compare.
Also counts, for docs/figures.md, the sleeps whose `perf script --no-inline`
callchain shows a take_gil frame.

usage: stack_truth.py --jit TEST.data > TEST.jit.json
The JIT frames `perf script` names from /tmp/perf-PID.map (Python's -X
perf), for each sleep whose stack has any: run while the map is there.

usage: stack_truth.py --gil-functions TEST.data > TEST.gilfn.json
For each sleep whose `perf script` stack holds take_gil, the first JIT frame
past it (the Python function that waits, or null): the same condition.
"""
import collections
import json
import re
import subprocess
import sys

LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<tid>\d+)\s+(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>\S+):\s*(?P<rest>.*)$")


# The threads a recording holds before the program's exec: named after the
# command that forked it (the program's threads may carry any name: record
# names them after threading's names).
PRE_EXEC = re.compile(r"prev_comm=(perf|gilscan) ")


def script(path, fields, extra=()):
    return subprocess.run(["perf", "script", "-i", path, "--ns", "-F", fields, *extra], check=True,
                          capture_output=True, text=True).stdout


def sleep_stacks(test):
    """(tid, switch-out ns) and perf script's frames, "ip sym" lines, of each python thread's sleep.
    A sample perf wrote twice (the same switch-out and stack, one after the other) is one sleep, as
    gilscan counts it; perf script shows both."""
    out, block, switch = [], [], None
    for line in script(test, "tid,time,event,trace,ip,sym", ["--no-inline"]).splitlines() + [""]:
        if not line.strip():
            if switch and (not out or out[-1] != (switch, block)):
                out.append((switch, block))
            block, switch = [], None
        elif "sched:sched_switch" in line and "prev_state=S " in line and not PRE_EXEC.search(line):
            m = re.match(r"^\s*(\d+)\s+(\d+)\.(\d{9}):", line)
            switch = (int(m.group(1)), int(m.group(2)) * 10**9 + int(m.group(3)))
        elif switch:
            block.append(line.strip())
    return out


def jit_frames(test):
    """[tid, ns, [names]] of each sleep whose stack perf script names JIT frames in (from /tmp/perf-PID.map)."""
    out = []
    for (tid, t), frames in sleep_stacks(test):
        names = [f.split(None, 1)[1] for f in frames if len(f.split(None, 1)) == 2]
        if any(n.startswith("py::") for n in names):
            out.append([tid, t, [n for n in names if n.startswith("py::")]])
    return out


def gil_functions(test):
    """[tid, ns, name] of each sleep whose perf script stack holds take_gil: name is the first JIT frame
    past it (from /tmp/perf-PID.map), the Python function that waits, or None."""
    out = []
    for (tid, t), frames in sleep_stacks(test):
        names = [f.split(None, 1)[1] if len(f.split(None, 1)) == 2 else "" for f in frames]
        take = [i for i, n in enumerate(names) if n.split("+")[0] == "take_gil"]
        if not take:
            continue
        py = [n for n in names[take[0]:] if n.startswith("py::")]
        out.append([tid, t, py[0] if py else None])
    return out


def gil_function_diff(test, truth, summary, trace):
    """Why gilscan's GIL waits by function differ from perf script's (truth: gil_functions(test)), for a
    failing check's message: the sleeps of one and not the other (from trace, gilscan's Chrome trace,
    or None), the threads whose summary counts a GIL wait the trace does not draw, and perf script's
    events of the first differing sleep's thread around it."""
    per = {(tid, t): f for tid, t, f in truth}
    spans, drawn = {}, collections.Counter()
    for e in json.load(open(trace))["traceEvents"] if trace else []:
        if e.get("cat") == "process state" and e["name"] == "S(GIL)":
            spans[(e["tid"], round(e["ts"] * 1000))] = e["args"].get("function")
            drawn[e["tid"]] += 1
    only_perf = sorted(k for k in per if trace and k not in spans)
    only_gilscan = sorted(k for k in spans if k not in per)
    counted = {t["tid"]: t.get("gil_sleep_count", 0) for t in json.load(open(summary)).get("threads", [])}
    undrawn = {tid: (n, drawn[tid]) for tid, n in counted.items() if trace and n != drawn[tid]}
    out = [f"sleeps in take_gil per perf script only {only_perf[:4]}", f"S(GIL) spans only {only_gilscan[:4]}",
           f"threads counting GIL waits the trace does not draw (summary, trace) {undrawn}"]
    first = (only_perf + only_gilscan)[:1]
    if first:
        tid, t = first[0]
        lines = [ln.strip() for ln in script(test, "cpu,tid,time,event,trace").splitlines()]
        near = [ln for ln in lines if (m := re.search(r"(\d+)\.(\d{9}):", ln))
                and abs(int(m.group(1)) * 10**9 + int(m.group(2)) - t) <= 50_000 and str(tid) in ln]
        out.append("perf script near it: " + " | ".join(near[:8]))
    return "; ".join(out)


def main(test, truth):
    intervals = {}  # tid -> list of [start, end]
    open_take = {}
    for line in script(truth, "comm,tid,time,event").splitlines():
        m = LINE.match(line + " x")
        if not m:
            continue
        ev = m.group("event").split(":")[-1]
        tid, t = int(m.group("tid")), int(m.group("sec")) * 10**9 + int(m.group("ns"))
        base = re.sub(r"_\d+$", "", re.sub(r"(__return)+$", "", ev))
        if base != "take_gil":
            continue
        if ev.endswith("__return"):
            if tid in open_take:
                intervals.setdefault(tid, []).append((open_take.pop(tid), t))
        else:
            open_take[tid] = t
    sleeps = []
    for line in script(test, "comm,tid,time,event,trace").splitlines():
        m = LINE.match(line)
        if not m or m.group("event") != "sched:sched_switch":
            continue
        f = dict(re.findall(r"(\w+)=(\S+)", m.group("rest")))
        if f.get("prev_state") != "S" or f.get("prev_comm") in ("perf", "gilscan"):
            continue
        tid, t = int(f["prev_pid"]), int(m.group("sec")) * 10**9 + int(m.group("ns"))
        if sleeps and sleeps[-1][:2] == [tid, t]:
            continue  # perf wrote the sample twice: one sleep
        gil = any(a <= t <= b for a, b in intervals.get(tid, ()))
        sleeps.append([tid, t, gil])
    # How perf script itself sees these stacks.
    perf_take = sum(any("take_gil" in f for f in frames) for _, frames in sleep_stacks(test))
    json.dump({"sleeps": sleeps, "gil_waits": sum(s[2] for s in sleeps), "take_gil_intervals":
               sum(len(v) for v in intervals.values()), "perf_script_take_gil_frames": perf_take}, sys.stdout)
    print()


if __name__ == "__main__":
    if sys.argv[1] == "--jit":  # stack_truth.py --jit TEST.data > TEST.jit.json
        json.dump(jit_frames(sys.argv[2]), sys.stdout)
        print()
    elif sys.argv[1] == "--gil-functions":  # stack_truth.py --gil-functions TEST.data > TEST.gilfn.json
        json.dump(gil_functions(sys.argv[2]), sys.stdout)
        print()
    else:
        main(sys.argv[1], sys.argv[2])
