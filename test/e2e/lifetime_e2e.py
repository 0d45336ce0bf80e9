#!/usr/bin/env python3
"""Threads that start and exit at different times, recorded for real (needs
root and perf): each thread's span must be its life, and its GIL figures
those of a second, system-wide recording of the same GIL uprobes, computed
from `perf script` by test/e2e/golden_expect.py (gilscan never reads it).

usage: lifetime_e2e.py GILSCAN TESTDATA_DIR
Prints "N passed, N failed".
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/root/.pyenv/versions/3.11.7/bin/python3.11"
SPAN_SLACK_NS = 1_000_000   # a thread's span starts within 1 ms of its clone
# and ends within 6 ms of its function's return: the thread then takes the
# GIL once more to finish (its bootstrap's last Python code), behind threads
# that may each hold it for a switch interval (5 ms).
END_SLACK_NS = 6_000_000
GIL_TOLERANCE = 0.005       # GIL figures within 0.5% of the truth, plus the probes' jitter:
# the truth's uprobes are a second probe at each address, so every GIL event
# is stamped twice, by two handlers run one after the other. Their stamps
# differ by about a microsecond, more when an interrupt or a vCPU steal falls
# between the two handlers; a hold or wait measured on each side differs by
# that jitter, which the test measures per event from the two recordings.


def gil_events(data):
    """tid -> [(probe name, ns)] of the GIL probe events in data, from perf script."""
    out = {}
    for line in subprocess.run(["perf", "script", "-i", data, "--ns", "-F", "tid,time,event"],
                               capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+)\.(\d{9}):\s+\S+:(\w*(?:take|drop)_gil\w*):", line)
        if m:
            out.setdefault(int(m.group(1)), []).append((m.group(4), int(m.group(2)) * 1_000_000_000 + int(m.group(3))))
    return out


def jitter_ns(ours, theirs):
    """How far two recordings' stamps of the same events stray from their usual
    offset, summed over the events (None: the events do not pair one to one)."""
    if [n for n, _ in ours] != [n for n, _ in theirs]:
        return None
    deltas = sorted(a - b for (_, a), (_, b) in zip(ours, theirs))
    if not deltas:
        return 0
    median = deltas[len(deltas) // 2]
    return sum(abs(d - median) for d in deltas)


with tempfile.TemporaryDirectory() as tmp:
    # The GIL probes, placed once; the truth records them system-wide.
    r = subprocess.run([GILSCAN, "probe", PYTHON], capture_output=True, text=True)
    check(r.returncode == 0, f"probes placed ({r.stderr[-300:]})")
    group = r.stdout.split("in group ", 1)[1].split()[0] if "in group " in r.stdout else ""
    truth_data = os.path.join(tmp, "truth.data")
    # The truth's sched_process_fork events say when each thread really began.
    truth = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", f"{group}:*",
                              "-e", "sched:sched_process_fork", "-o", truth_data],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # perf has opened its events on every CPU
    log, data, summ = (os.path.join(tmp, n) for n in ("life.json", "r.data", "s.json"))
    r = subprocess.run([GILSCAN, "record", "-q", "--gil", "--state", "-o", data, "--trace", os.path.join(tmp, "t.json"),
                        "--summary-json", summ, "--", PYTHON, os.path.join(DATA, "lifetimes.py"), log],
                       capture_output=True, text=True)
    time.sleep(0.2)
    truth.send_signal(signal.SIGINT)
    truth.wait(timeout=60)
    check(r.returncode == 0, f"record exits 0 ({r.stderr[-400:]})")
    life = json.load(open(log))
    s = json.load(open(summ))
    by_tid = {t["tid"]: t for t in s["threads"]}
    expect = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "golden_expect.py"), truth_data],
                                       capture_output=True, text=True, check=True).stdout)
    truth_gil = expect.get("gil", {})
    ours_events, truth_events = gil_events(data), gil_events(truth_data)
    cloned = {}  # tid -> CLOCK_MONOTONIC ns of its sched_process_fork, from perf's own decoding
    for line in subprocess.run(["perf", "script", "-i", truth_data, "--ns", "-F", "time,event,trace"],
                               capture_output=True, text=True).stdout.splitlines():
        m = re.match(r"\s*(\d+)\.(\d{9}):\s+sched:sched_process_fork:.*child_pid=(\d+)", line)
        if m:
            cloned[int(m.group(3))] = int(m.group(1)) * 1_000_000_000 + int(m.group(2))
    for name, real in sorted(life.items()):
        t = by_tid.get(real["tid"])
        check(t is not None, f"{name}: its thread is in the summary")
        if t is None:
            continue
        # The thread lives from its clone, right after it was created (its
        # function starts only once it has the GIL), to its exit, right
        # after its function ends: the span is that (END_SLACK_NS).
        clone = cloned.get(real["tid"])
        check(clone is not None and real["created_ns"] <= clone, f"{name}: its clone in the truth, after its creation")
        starts_after = t["first_ns"] - (clone or 0)
        ends_after = t["last_ns"] - real["end_ns"]
        check(abs(starts_after) <= SPAN_SLACK_NS and t["first_ns"] <= real["start_ns"] and 0 <= ends_after <= END_SLACK_NS,
              f"{name}: span {t['first_ns']}..{t['last_ns']} within its life {clone}..{real['end_ns']}"
              f" (starts {starts_after} ns after its clone, ends {ends_after} ns after its function)")
        accounted = t["running_us"] + t["runnable_us"] + t["sleep_us"] + t["disk_sleep_us"] + t["other_state_us"] + \
            t["unknown_us"]
        check(accounted <= t["span_us"] + 1, f"{name}: its states fit in its span ({accounted} us of {t['span_us']} us)")
        g = truth_gil.get(str(real["tid"]))
        check(g is not None and t["gil_wait_us"] is not None, f"{name}: GIL figures on both sides")
        if g is None or t["gil_wait_us"] is None:
            continue
        # gilscan's recording holds every GIL event the truth holds, in order.
        jitter = jitter_ns(ours_events.get(real["tid"], []), truth_events.get(real["tid"], []))
        check(jitter is not None and ours_events.get(real["tid"]),
              f"{name}: its GIL events pair one to one with the truth's"
              f" ({len(ours_events.get(real['tid'], []))} and {len(truth_events.get(real['tid'], []))})")
        for ours, theirs, what in ((t["gil_wait_us"] * 1000, g["wait_ns"], "wait"),
                                   (t["gil_hold_us"] * 1000, g["hold_ns"], "hold")):
            check(abs(ours - theirs) <= GIL_TOLERANCE * max(theirs, 1) + 1000 + (jitter or 0),
                  f"{name}: GIL {what} {ours / 1e6:.3f} ms against the truth's {theirs / 1e6:.3f} ms"
                  f" (the probes' jitter {(jitter or 0) / 1e3:.1f} us)")
    subprocess.run([GILSCAN, "probe", "--remove", "--group", group], capture_output=True)

done("thread lifetimes")
