#!/usr/bin/env python3
"""Ground truth for stack classification, from a second, concurrent recording.

usage: stack_truth.py TEST.data TRUTH.data > TEST.truth.json

TRUTH.data is a system-wide `perf record -a` of take_gil entry and return
uprobes made beside TEST.data (both -k CLOCK_MONOTONIC). A sleep of TEST.data
(a sched_switch with prev_state S, of a python* thread) is a GIL wait iff its
switch-out time lies inside a take_gil entry..return interval of the same
thread. gilscan never reads TRUTH.data or this output: the tests compare.
Also counts, for the README, the sleeps whose `perf script --no-inline`
callchain shows a take_gil frame.
"""
import json
import re
import subprocess
import sys

LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<tid>\d+)\s+(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>\S+):\s*(?P<rest>.*)$")


def script(path, fields, extra=()):
    return subprocess.run(["perf", "script", "-i", path, "--ns", "-F", fields, *extra], check=True,
                          capture_output=True, text=True).stdout


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
        if f.get("prev_state") != "S" or not f.get("prev_comm", "").startswith("python"):
            continue
        tid, t = int(f["prev_pid"]), int(m.group("sec")) * 10**9 + int(m.group("ns"))
        gil = any(a <= t <= b for a, b in intervals.get(tid, ()))
        sleeps.append([tid, t, gil])
    # How perf script itself sees these stacks.
    perf_take = 0
    block, in_switch = [], False
    for line in script(test, "tid,time,event,trace,ip,sym", ["--no-inline"]).splitlines() + [""]:
        if not line.strip():
            if in_switch and any("take_gil" in b for b in block):
                perf_take += 1
            block, in_switch = [], False
        elif "sched:sched_switch" in line and "prev_state=S " in line and "prev_comm=python" in line:
            in_switch = True
        else:
            block.append(line)
    json.dump({"sleeps": sleeps, "gil_waits": sum(s[2] for s in sleeps), "take_gil_intervals":
               sum(len(v) for v in intervals.values()), "perf_script_take_gil_frames": perf_take}, sys.stdout)
    print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
