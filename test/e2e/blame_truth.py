#!/usr/bin/env python3
"""Ground truth for GIL blame, from a second, concurrent recording.

usage: blame_truth.py TRUTH.data ROLES.txt > NAME.blame_truth.json

TRUTH.data is a system-wide `perf record -a` of the GIL uprobes (take_gil,
take_gil__return, drop_gil) made beside the recording under test. ROLES.txt
is what testdata/blame.py printed: "role tid" per thread. For the program's
process: contended hold per thread (it holds the GIL while at least one other
thread waits in take_gil), summed by role, and the time in which at least one
thread waits. gilscan never reads TRUTH.data or this output: the tests compare.
"""
import json
import re
import subprocess
import sys

LINE = re.compile(r"^\s*(?P<pid>\d+)/(?P<tid>\d+)\s+(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>\S+):")


def events(truth):
    out = subprocess.run(["perf", "script", "-i", truth, "--ns", "-F", "pid,tid,time,event"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        ev = m.group("event").split(":")[-1]
        base = re.sub(r"_\d+$", "", re.sub(r"(__return)+$", "", ev))
        kind = base + ("__return" if ev.endswith("__return") else "")
        yield int(m.group("pid")), int(m.group("tid")), int(m.group("sec")) * 10**9 + int(m.group("ns")), kind


def main(truth, roles_path):
    roles = {}
    for line in open(roles_path):
        role, tid = line.split()
        roles[int(tid)] = role
    pid = None
    holder, since, waiting = None, 0, set()
    contended, hold = {}, {}
    waiting_ns, last = 0, None

    def advance(t):
        nonlocal waiting_ns, last
        if last is not None and t > last:
            others = waiting - {holder}
            if others:
                waiting_ns += t - last
                if holder is not None:
                    contended[holder] = contended.get(holder, 0) + t - last
            if holder is not None:
                hold[holder] = hold.get(holder, 0) + t - last
        last = t

    for p, tid, t, kind in events(truth):
        if tid in roles:
            pid = p
        if pid is None or p != pid:
            continue
        advance(t)
        if kind == "take_gil":
            waiting.add(tid)
            if holder == tid:  # an unseen drop
                holder = None
        elif kind == "take_gil__return":
            waiting.discard(tid)
            holder = tid
        elif kind == "drop_gil" and holder == tid:
            holder = None
    by_role = {}
    for tid, ns in contended.items():
        by_role[roles.get(tid, "main")] = by_role.get(roles.get(tid, "main"), 0) + ns
    json.dump({"pid": pid, "waiting_us": waiting_ns // 1000,
               "contended_us": {r: ns // 1000 for r, ns in sorted(by_role.items())},
               "contended_by_tid_us": {str(t): ns // 1000 for t, ns in sorted(contended.items())},
               "roles": {str(t): r for t, r in sorted(roles.items())}}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
