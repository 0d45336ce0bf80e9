#!/usr/bin/env python3
"""gilscan --viztracer: a trace merged with a VizTracer trace, recorded here
(needs root and perf).

A threaded Python program traces its own calls into a file laid out as
VizTracer's (viztracer_like.py: VizTracer is not in Debian's archive; run
by a console script named viztracer, as pip installs VizTracer's) while
`perf record -a -k CLOCK_MONOTONIC` records the scheduler's events. The two
traces are merged as `viztracer --combine A B` merges them (its
ReportBuilder keeps A and appends B's traceEvents), in both orders, and
read as a viewer reads them (catapult and Perfetto give a row the last name
they read). Checked in both orders:

- every row and the process keep VizTracer's names;
- no row holds spans that overlap partially (checklib's trace check);
- each thread's gilscan state row sits right below VizTracer's row;
- the two clocks agree: each 20 ms time.sleep call of VizTracer's holds
  gilscan's sleep span of that thread, which ends at the call's deadline.

The same for `gilscan record --viztracer` (GIL uprobes, threads named after
`threading`). The same merge of the default layout fails the first two
checks (the test can tell). Also: -j 1 and -j 2 write the same file, the clock warning on a
recording without -k CLOCK_MONOTONIC, and the usage errors.

    viztracer_e2e.py GILSCAN        (KEEP=1: keep the recordings and traces, in /tmp/gilscan-viz-*)
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done, trace_problems  # noqa: E402

GILSCAN = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/root/.pyenv/versions/3.11.7/bin/python3.11"
SCHED = ["-e", "sched:sched_switch", "-e", "sched:sched_waking", "-e", "sched:sched_wakeup",
         "-e", "sched:sched_process_fork"]
SLACK_US = 20  # both clocks are CLOCK_MONOTONIC: a sleep's switch-out follows its call's start
# time.sleep (3.11) sleeps to a deadline 20 ms after its start: the thread wakes no earlier
# (on a busy CPU up to a tick later), however late it went to sleep.


def combine(first, second, out):
    """viztracer --combine first second -o out: the first file, the second's events appended."""
    merged = json.load(open(first))
    merged["traceEvents"].extend(json.load(open(second))["traceEvents"])
    with open(out, "w") as f:
        json.dump(merged, f)
    return merged


def viewer_names(trace):
    """Row and process names as a viewer shows them: each (pid, tid)'s last name read, each pid's."""
    threads, processes, sort = {}, {}, {}
    for e in trace["traceEvents"]:
        if e["ph"] != "M":
            continue
        if e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["name"] == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_sort_index":
            sort[(e["pid"], e["tid"])] = e["args"]["sort_index"]
    return threads, processes, sort


def check_merge(label, merged, path, viz):
    threads, processes, sort = viewer_names(merged)
    viz_threads, viz_processes, _ = viewer_names(viz)
    kept = [k for k, name in viz_threads.items() if threads.get(k) == name]
    check(len(kept) == len(viz_threads) == 4, f"{label}: every thread keeps VizTracer's name "
          f"({[(k, threads.get(k)) for k in viz_threads if k not in kept]})")
    check(all(processes.get(p) == n for p, n in viz_processes.items()),
          f"{label}: the process keeps VizTracer's name ({processes})")
    problems = trace_problems(path)
    check(not problems, f"{label}: no row holds partially overlapping spans ({problems[:2]})")
    rows = {}
    for e in merged["traceEvents"]:
        if e["ph"] == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
    for (pid, tid), name in viz_threads.items():
        state = [k for k, n in threads.items() if k[0] == pid and n.startswith("state \u00b7 ") and n.endswith(f" {tid}")]
        check(len(state) == 1 and rows.get(state[0]) and sort.get(state[0]) == sort.get((pid, tid), -9) + 1,
              f"{label}: {name} has its state row right below its own ({state}, {sort.get((pid, tid))})")


def check_clocks(label, merged, viz):
    """Each time.sleep call of VizTracer's holds a sleep span of gilscan's, on the same thread, that
    ends as the call's 20 ms are up."""
    threads, _, _ = viewer_names(merged)
    state_row = {}
    for (pid, tid), n in threads.items():
        if n.startswith("state \u00b7 "):
            state_row[(pid, int(n.rsplit(" ", 1)[1]))] = (pid, tid)
    sleeps = {}
    for e in merged["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "S":
            sleeps.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    calls = [e for e in viz["traceEvents"] if e["ph"] == "X" and e["name"] == "time.sleep"]
    held, missed = 0, []
    for c in calls:
        spans = sleeps.get(state_row.get((c["pid"], c["tid"])), [])
        if any(c["ts"] - SLACK_US <= a and b <= c["ts"] + c["dur"] + SLACK_US and
               c["ts"] + 20_000 <= b for a, b in spans):
            held += 1
        else:
            near = [(round(a - c["ts"], 3), round(b - a, 3)) for a, b in spans if a < c["ts"] + c["dur"] and b > c["ts"]]
            missed.append((c["tid"], round(c["dur"], 3), near))
    check(len(calls) == 30 and held == len(calls),
          f"{label}: each 20 ms time.sleep call holds gilscan's sleep of its thread ({held} of {len(calls)}; "
          f"missed, with the sleeps beside them as (start after the call's, length): {missed[:2]})")


def viztracer_command(tmp):
    """A console script named viztracer, as pip installs VizTracer's (its Python in the
    first line), that runs viztracer_like.py: the process's comm is "viztracer"."""
    path = os.path.join(tmp, "viztracer")
    with open(path, "w") as f:
        f.write(f"#!{PYTHON}\nimport runpy\nrunpy.run_path({os.path.join(HERE, 'viztracer_like.py')!r}, "
                "run_name='__main__')\n")
    os.chmod(path, 0o755)
    return path


def check_record(tmp):
    """gilscan record --viztracer: its threads named after `threading`, GIL uprobes, the same merge."""
    viz_path, trace = os.path.join(tmp, "viz-r.json"), os.path.join(tmp, "t-r.json")
    r = subprocess.run([GILSCAN, "record", "-q", "--viztracer", "-o", os.path.join(tmp, "r2.data"), "--trace", trace,
                        "--", viztracer_command(tmp), viz_path], capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(viz_path), f"record --viztracer runs ({r.stderr[-300:]})")
    if r.returncode != 0:
        return
    viz = json.load(open(viz_path))
    path = os.path.join(tmp, "m-r.json")
    merged = combine(trace, viz_path, path)
    check_merge("record --viztracer", merged, path, viz)
    threads, _, _ = viewer_names(merged)
    named = sorted(n for n in threads.values() if n.startswith(("state \u00b7 worker-", "GIL \u00b7 worker-")))
    check(len(named) == 6, f"record --viztracer: each worker's state and GIL rows carry its threading name ({named})")
    r = subprocess.run([GILSCAN, "record", "--viztracer", "--trace", os.path.join(tmp, "x.pftrace"), "--", "true"],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "--viztracer lays out a JSON trace" in r.stderr, "record --viztracer with a .pftrace: usage error")


def main(tmp):
    viz_path, data = os.path.join(tmp, "viz.json"), os.path.join(tmp, "r.data")
    # System-wide: a timer's wake-up of a sleeper fires on whatever the CPU ran.
    # Through a script named viztracer: with no GIL events, its comm says it is Python.
    r = subprocess.run(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", *SCHED, "-o", data, "--",
                        viztracer_command(tmp), viz_path], capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(viz_path), f"recorded with the VizTracer-like trace ({r.stderr[-300:]})")
    if r.returncode != 0:
        return
    viz = json.load(open(viz_path))
    ours, default = os.path.join(tmp, "g.json"), os.path.join(tmp, "d.json")
    r = subprocess.run([GILSCAN, data, "-q", "--running", "--viztracer", "-o", ours], capture_output=True, text=True)
    check(r.returncode == 0 and "--viztracer" not in r.stderr, f"--viztracer runs, no clock warning ({r.stderr[-300:]})")
    one = os.path.join(tmp, "g1.json")
    subprocess.run([GILSCAN, data, "-q", "--running", "--viztracer", "-j", "1", "-o", one], capture_output=True)
    check(open(one, "rb").read() == open(ours, "rb").read(), "--viztracer: -j 1 writes the same trace as -j 2")
    for label, first, second in (("viz first", viz_path, ours), ("gilscan first", ours, viz_path)):
        path = os.path.join(tmp, "m.json")
        merged = combine(first, second, path)
        check_merge(label, merged, path, viz)
        check_clocks(label, merged, viz)

    check_record(tmp)

    # The default layout, merged after VizTracer's: names taken over, rows overlapping.
    r = subprocess.run([GILSCAN, data, "-q", "--running", "-o", default], capture_output=True, text=True)
    path = os.path.join(tmp, "m.json")
    merged = combine(viz_path, default, path)
    threads, _, _ = viewer_names(merged)
    viz_threads, _, _ = viewer_names(viz)
    taken = sum(threads.get(k) != n for k, n in viz_threads.items())
    check(r.returncode == 0 and taken == 4 and trace_problems(path),
          f"without --viztracer the merge loses VizTracer's names ({taken}) and overlaps partially (the checks can fail)")

    # perf's own clock (no -k): the warning says the traces will not line up.
    plain = os.path.join(tmp, "p.data")
    subprocess.run(["perf", "record", "-q", *SCHED, "-o", plain, "--", "sleep", "0.05"], capture_output=True)
    r = subprocess.run([GILSCAN, plain, "-q", "--viztracer", "-o", os.path.join(tmp, "p.json")],
                       capture_output=True, text=True)
    check(r.returncode == 0 and "--viztracer: the recording's clock is perf_clock" in r.stderr,
          f"a recording without -k CLOCK_MONOTONIC is warned of ({r.stderr[-300:]})")
    r = subprocess.run([GILSCAN, plain, "-q", "-o", os.path.join(tmp, "p2.json")], capture_output=True, text=True)
    check(r.returncode == 0 and "--viztracer" not in r.stderr, "no clock warning without --viztracer")

    for args, why in ((["-o", os.path.join(tmp, "x.pftrace")], ".pftrace"), ([], "no -o")):
        r = subprocess.run([GILSCAN, data, "--viztracer", *args], capture_output=True, text=True)
        check(r.returncode == 2 and "--viztracer lays out a JSON trace" in r.stderr, f"--viztracer with {why}: usage error")


if os.environ.get("KEEP"):
    main(tempfile.mkdtemp(prefix="gilscan-viz-"))
else:
    with tempfile.TemporaryDirectory(prefix="gilscan-viz-") as tmp:
        main(tmp)
done("viztracer_e2e")
