#!/usr/bin/env python3
"""GIL blame end to end, against ground truth from concurrent uprobe recordings.

usage: blame_e2e.py GILSCAN TESTDATA

The stored recordings (testdata/record_blame.sh) of testdata/blame.py, whose
threads each do one kind of work, are compared with blame_NAME.truth.json
(test/e2e/blame_truth.py: contended hold per thread from a system-wide
recording of the GIL uprobes beside each). Then `gilscan record --blame` is
run here on the same program, with a new truth recording beside it.
Acceptance: holders from uprobes within 15% of the truth per culprit,
inferred within 25%; innocents (time.sleep, a GIL-releasing ctypes call)
below 2% of all blame; the blocking culprit at least 80% off CPU, named
`usleep` and, with -X perf, by its Python function.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from checklib import check, done, remove_perf_maps_of  # noqa: E402

GILSCAN, DATA = sys.argv[1], sys.argv[2]
MAPS = os.path.join(DATA, "blame-maps")
PY312 = "/root/.pyenv/versions/3.12.1/bin/python3"


def analyse(path, *extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "s.json")
        p = subprocess.run([GILSCAN, path, "-q", "--perf-maps", MAPS, "--summary-json", out, *extra],
                           capture_output=True, text=True)
        check(p.returncode == 0, f"{path}: exit {p.returncode}: {p.stderr[-500:]}")
        return json.load(open(out)), p.stderr


def row(rows, match):
    """The contended µs and the row of the blame row whose function (or native) contains match."""
    hits = [r for r in rows if match in r["function"]]
    return (sum(r["contended_us"] for r in hits), hits[0] if hits else None)


def near(got, want, tol, what):
    check(want > 0 and abs(got - want) <= tol * want, f"{what}: {got:.0f} us, truth {want:.0f} us (±{tol:.0%})")


def innocents(rows, total, what):
    for name in ("napper", "releaser"):
        got, _ = row(rows, name)
        check(got < 0.02 * total, f"{what}: innocent {name} blamed {got:.0f} us of {total:.0f}")


def by_function(name, tol, inferred):
    """A -X perf recording: every culprit named by its Python function."""
    truth = json.load(open(os.path.join(DATA, f"blame_{name}.truth.json")))["contended_us"]
    s, _ = analyse(os.path.join(DATA, f"blame_{name}.data"))
    rows = s["gil_blame"]
    check(s["gil_blame_source"] == ("inferred" if inferred else "uprobes"), f"{name}: source {s['gil_blame_source']}")
    check(all(r["inferred"] == inferred for r in rows), f"{name}: rows' inferred flag")
    total = sum(r["contended_us"] for r in rows)
    for culprit in ("hog", "blocker", "sorter"):
        got, r = row(rows, culprit + " (")
        near(got, truth[culprit], tol, f"{name} {culprit}")
    _, b = row(rows, "blocker (")
    check(b is not None and b["native"] == "usleep" and b["off_cpu_us"] >= 0.8 * b["contended_us"]
          and b["held_while_blocked"], f"{name}: blocker is usleep, held while blocked: {b}")
    _, so = row(rows, "sorter (")
    check(so is not None and so["native"] == "list_sort" and so["on_cpu_us"] >= 0.8 * so["contended_us"],
          f"{name}: sorter is list_sort on CPU: {so}")
    innocents(rows, total, name)
    return s


def by_native(name, tol, inferred, culprits):
    """No Python names (3.11): culprits with their own native frame."""
    truth = json.load(open(os.path.join(DATA, f"blame_{name}.truth.json")))["contended_us"]
    s, err = analyse(os.path.join(DATA, f"blame_{name}.data"))
    rows = s["gil_blame"]
    check(s["gil_blame_source"] == ("inferred" if inferred else "uprobes"), f"{name}: source {s['gil_blame_source']}")
    check(err.count("no stack reached a Python function's name") == 1, f"{name}: one line says no Python names")
    for culprit, native in culprits:
        got, r = row([x for x in rows if x["function"] == native], native)
        near(got, truth[culprit], tol, f"{name} {culprit} ({native})")
    _, b = row([x for x in rows if x["function"] == "usleep"], "usleep")
    check(b is not None and b["off_cpu_us"] >= 0.8 * b["contended_us"], f"{name}: usleep off CPU: {b}")
    total = sum(r["contended_us"] for r in rows)
    truth_total = sum(truth.values())
    near(total, truth_total, tol, f"{name}: all contended hold")


def folded(name):
    with tempfile.TemporaryDirectory() as d:
        bf, wf = os.path.join(d, "b.folded"), os.path.join(d, "w.folded")
        s, _ = analyse(os.path.join(DATA, f"blame_{name}.data"), "--blame-folded", bf, "--wait-folded", wf)
        lines = open(bf).read().splitlines()
        check(lines and all(l.rsplit(" ", 1)[1].isdigit() and ";" in l for l in lines), f"{name}: folded lines")
        weight = sum(int(l.rsplit(" ", 1)[1]) for l in lines)
        total = sum(r["contended_us"] for r in s["gil_blame"])
        check(abs(weight - total) <= 0.01 * total + len(lines), f"{name}: folded weights {weight} vs table {total:.0f}")
        check(any("py::blocker:" in l and l.split(" ")[-2].endswith("clock_nanosleep") for l in lines),
              f"{name}: the blocker's stack, root first, ends in the kernel's sleep call")
        waits = open(wf).read().splitlines()
        check(any("take_gil" in l for l in waits), f"{name}: waiters' stacks reach take_gil")
        pid = s["gil_blame"][0]["pid"]
        check(all(l.split(";")[0].endswith(f"({pid})") for l in lines + waits), f"{name}: root frame names the process")


def options():
    path = os.path.join(DATA, "blame_py312.data")
    p = subprocess.run([GILSCAN, path, "--perf-maps", MAPS, "--top", "2"], capture_output=True, text=True)
    table = p.stdout[p.stdout.index("GIL blame"):].splitlines()
    check(len([l for l in table[2:] if l.strip() and not l.startswith("(")]) == 2, "--top 2: two rows")
    check("--top N shows more" in p.stdout, "--top 2: says how many more")
    s, _ = analyse(path, "--no-blame")
    check("gil_blame" not in s, "--no-blame: no gil_blame")
    a, _ = analyse(path, "-j", "1")
    b, _ = analyse(path, "-j", "2")
    check(a["gil_blame"] == b["gil_blame"], "-j 1 and -j 2: the same blame")
    # No stacks at all: nothing to name holders by, and a warning says so.
    s, err = analyse(os.path.join(DATA, "gil_uprobes.data"))
    check("no event of the recording has user stacks" in err and "gil_blame" not in s, "no stacks: warned, no rows")
    # Stacks on sched_switch but no CPU samples: the on-CPU part is there, unnamed, and a warning says why.
    s, err = analyse(os.path.join(DATA, "gil_stacks.data"))
    check("no CPU samples" in err, "no CPU samples: warned")
    check(s.get("gil_blame") and any(r["function"] == "[on CPU, no sample]" for r in s["gil_blame"]),
          "no CPU samples: on-CPU hold charged to [on CPU, no sample]")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.csv")
        p = subprocess.run([GILSCAN, "batch", "--blame", out, "--perf-maps", MAPS, path], capture_output=True, text=True)
        rows = open(out).read().splitlines()
        check(p.returncode == 0 and rows[0].startswith("recording,pid,function,native") and
              any("blocker (" in r and ",usleep," in r for r in rows), "batch --blame rows")


def culprits():
    """The trace's holder spans carry args.culprit: the holder's own function, and the same at -j 1 and -j 2."""
    path = os.path.join(DATA, "blame_py312.data")
    roles = json.load(open(os.path.join(DATA, "blame_py312.truth.json")))["roles"]
    with tempfile.TemporaryDirectory() as d:
        traces = []
        for j in ("1", "2"):
            out = os.path.join(d, f"t{j}.json")
            subprocess.run([GILSCAN, path, "-q", "--perf-maps", MAPS, "-o", out, "-j", j], check=True,
                           capture_output=True)
            traces.append(open(out).read())
        check(traces[0] == traces[1], "culprits: -j 1 and -j 2 traces identical")
        events = json.loads(traces[0])
        events = events["traceEvents"] if isinstance(events, dict) else events
        holds = [e for e in events if e.get("cat") == "GIL holder"]
        named = [e for e in holds if "culprit" in e.get("args", {})]
        # Holds of a millisecond and more are the contended ones here; the
        # many short ones (a contender's few microseconds) have no sample.
        long = [e for e in holds if e["dur"] >= 1000]
        long_named = sum(e["dur"] for e in long if "culprit" in e["args"])
        check(long_named >= 0.85 * sum(e["dur"] for e in long),
              f"culprits: {long_named} of {sum(e['dur'] for e in long)} us of long holds named")
        for culprit in ("hog", "blocker", "sorter"):
            tid = [int(t) for t, r in roles.items() if r == culprit][0]
            mine = [e for e in named if e["args"]["holder"] == tid]
            right = sum(e["dur"] for e in mine if e["args"]["culprit"].startswith(culprit + " ("))
            check(mine and right >= 0.8 * sum(e["dur"] for e in mine),
                  f"culprits: the {culprit} thread's holds are named {culprit} ({right} of {sum(e['dur'] for e in mine)})")


def live():
    """gilscan record --blame here, a truth recording beside it."""
    group = subprocess.run([GILSCAN, "probe", PY312], capture_output=True, text=True).stdout
    group = [l.split(" in group ")[1].split()[0] for l in group.splitlines() if " in group " in l][0]
    with tempfile.TemporaryDirectory() as d:
        truth = os.path.join(d, "truth.data")
        t = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", f"{group}:*", "-o", truth],
                             stderr=subprocess.DEVNULL)
        time.sleep(1)
        roles = os.path.join(d, "roles")
        with open(roles, "w") as r:
            p = subprocess.run([GILSCAN, "record", "--blame", "-q", "-o", os.path.join(d, "rec.data"), "--trace", "",
                                "--summary-json", os.path.join(d, "s.json"), "--", PY312,
                                os.path.join(DATA, "blame.py"), "0.3"], stdout=r, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        t.send_signal(2)
        t.wait()
        check(p.returncode == 0, f"record --blame: exit {p.returncode}: {p.stderr[-400:]}")
        want = json.loads(subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "blame_truth.py"),
                                          truth, roles], capture_output=True, text=True, check=True).stdout)
        s = json.load(open(os.path.join(d, "s.json")))
        rows = s["gil_blame"]
        check(s["gil_blame_source"] == "uprobes", "record --blame: holders from uprobes")
        for culprit in ("hog", "blocker", "sorter"):
            got, _ = row(rows, culprit + " (")
            near(got, want["contended_us"][culprit], 0.15, f"record --blame {culprit}")
        innocents(rows, sum(r["contended_us"] for r in rows), "record --blame")


by_function("py312", 0.15, False)
by_function("py312_stacks", 0.25, True)
by_native("py311", 0.15, False, [("blocker", "usleep"), ("sorter", "list_sort")])
by_native("debian", 0.25, True, [("blocker", "usleep")])
folded("py312_stacks")
options()
culprits()
try:
    live()
finally:
    remove_perf_maps_of(os.path.abspath(os.path.join(DATA, "blame.py")))
done("blame end to end")
