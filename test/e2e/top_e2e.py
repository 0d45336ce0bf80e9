#!/usr/bin/env python3
"""gilscan top on real programs (needs root, perf and tmux).

- `top --json --duration` on testdata/top_workload.py: each interval's
  figures (per thread CPU, GIL held and GIL wait; per GIL held, contended,
  waiting) against a second, system-wide recording of the same run (GIL
  uprobes of a group of its own and sched_switch), computed from `perf
  script` by golden_expect.py and here (gilscan never reads it); the whole
  run's summary too; the program gets SIGINT at --duration.
- `top -p PID`: attached, the process lives on; q in a real terminal (tmux):
  the screen draws, q leaves it, the program gets SIGINT, the probes go.
- memory stays flat while it runs; usage errors.

usage: top_e2e.py GILSCAN TESTDATA_DIR
Prints "N passed, N failed".
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done, remove_perf_maps_of  # noqa: E402

GILSCAN, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/root/.pyenv/versions/3.12.1/bin/python3"
WORKLOAD = os.path.join(DATA, "top_workload.py")
TRACEFS = "/sys/kernel/tracing"
# An interval's figures against the truth's, as a share of the interval:
# the live figures count open states up to the interval's end, and events
# of other CPUs not yet handed over by then are the difference.
INTERVAL_TOLERANCE = 0.02
# Under AddressSanitizer (scripts/test's second suite) the
# analysis of DWARF stacks cannot keep up with a live stream on two cores:
# perf then loses events, and no figure can match. The comparison with the
# truth runs there without blame's stacks (--no-blame); the runs with blame
# (-p, the terminal) still exercise its live path under the sanitizer, and
# resident memory means nothing beside ASan's quarantine of freed memory.
SANITIZED = "ASAN_OPTIONS" in os.environ
WHOLE_TOLERANCE = 0.005     # the whole run's summary, as gilscan FILE's figures (and 1 ms)
SWITCH = re.compile(r"^\s*(\d+)\s+(\d+)\.(\d{9}):\s+\S*sched_switch:.*prev_pid=(\d+).*prev_state=(\S+)"
                    r".*next_pid=(\d+)")


def own_groups():
    return sorted(g for g in os.listdir(f"{TRACEFS}/events") if re.match(r"gilscan_.*_pid\d+$", g))


def running_in(truth, windows, tids):
    """Per window and tid: ns on a CPU, from the truth's sched_switch (system-wide: every switch).
    gilscan top's recording holds switch records (perf record --switch-events), which show every
    switch-in of the program's threads, by another process's task too (docs/figures.md,
    "Per-process recordings"): it sees the same running time, each switch-in a few microseconds
    after the truth's sched_switch (the record is written once the switch is done)."""
    text = subprocess.run(["perf", "script", "-i", truth, "--ns", "-F", "tid,time,event,trace"],
                          capture_output=True, text=True, check=True).stdout
    since, out = {}, [dict.fromkeys(tids, 0) for _ in windows]

    def add(tid, a, b):
        for i, (lo, hi) in enumerate(windows):
            d = min(b, hi) - max(a, lo)
            if d > 0:
                out[i][tid] += d
    for line in text.splitlines():
        m = SWITCH.match(line)
        if not m:
            continue
        t = int(m.group(2)) * 10**9 + int(m.group(3))
        prev, nxt = int(m.group(4)), int(m.group(6))
        if prev in since:
            add(prev, since.pop(prev), t)
        if nxt in tids:
            since[nxt] = t
    return out


def truth_gil(truth, lo, hi):
    r = subprocess.run([sys.executable, os.path.join(HERE, "golden_expect.py"), truth, "--time", f"@{lo},{hi}",
                        "--no-threads"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def start_truth(tmp, group):
    data = os.path.join(tmp, "truth.data")
    p = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", f"{group}:*",
                          "-e", "sched:sched_switch", "-e", "sched:sched_waking", "-e", "sched:sched_process_exit", "-o", data], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # perf has opened its events on every CPU
    return p, data


def stop_truth(p):
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=120)


def compare_intervals(rows, truth, pid):
    """Each interval's per-thread figures against the truth's."""
    tids = {t["tid"] for r in rows for t in r["threads"]}
    windows = [(r["start_ns"], r["end_ns"]) for r in rows]
    run = running_in(truth, windows, tids)
    worst = {"cpu": 0.0, "held": 0.0, "wait": 0.0, "gil": 0.0}
    cpu_rows = []  # (interval, thread, ours, the truth's): printed when the cpu figures miss
    for i, r in enumerate(rows):
        span = r["end_ns"] - r["start_ns"]
        # On-CPU time is the program's own recording's (its sched_switch and
        # switch records): checked in the full intervals, not the first (the
        # program ran before its recording began) nor the last (cut by its
        # exit). Under ASan too: the figures are of the events' times, not
        # of when the slower analysis met them.
        cpu_checked = 0 < i < len(rows) - 1
        g = truth_gil(truth, *windows[i])
        for t in r["threads"]:
            truth_t = g.get("gil", {}).get(str(t["tid"]), {"wait_ns": 0, "hold_ns": 0})
            figures = [("held", t["gil_hold_us"] * 1000, truth_t["hold_ns"]),
                       ("wait", t["gil_wait_us"] * 1000, truth_t["wait_ns"])]
            if cpu_checked:
                figures.append(("cpu", t["running_us"] * 1000, run[i][t["tid"]]))
            for key, ours, theirs in figures:
                worst[key] = max(worst[key], abs(ours - theirs) / span)
                if key == "cpu":
                    cpu_rows.append(f"{i} {t['name']} {ours / 1e6:.1f} ms, the truth's {theirs / 1e6:.1f} ms")
                if os.environ.get("TOP_DEBUG"):
                    print(i, t["name"], key, ours, theirs, span)
        for gl in r["gils"]:
            tg = next((x for x in g.get("gils", []) if x["pid"] == pid), None)
            if tg:
                for ours, theirs in ((gl["held_us"], tg["held_ns"]), (gl["contended_us"], tg["contended_ns"]),
                                     (gl["waiting_us"], tg["waiting_ns"])):
                    worst["gil"] = max(worst["gil"], abs(ours * 1000 - theirs) / span)
    if worst["cpu"] > INTERVAL_TOLERANCE:
        print("note: the cpu figures (interval, thread, gilscan top's, the truth's): " + "; ".join(cpu_rows))
        whole = truth_gil(truth, 0, 2**63)  # golden_expect's lost counts, as perf report --stats gives them
        print(f"note: the truth lost {whole['lost_records']} records, {whole['lost_samples']} samples")
    for key, w in worst.items():
        check(w <= INTERVAL_TOLERANCE, f"every interval's {key} figures within {INTERVAL_TOLERANCE:.0%} of the "
              f"interval of the truth's (worst {w:.2%})")


def stall_perf(top, after, seconds):
    """Stops gilscan top's perf (SIGSTOP) `after` seconds for `seconds`: its buffers fill, nothing reaches
    the stream, and nothing proves it flushed (a perf starved of CPU, at worst)."""
    time.sleep(after)
    perf = subprocess.run(["pgrep", "-P", str(top.pid), "-x", "perf"], capture_output=True, text=True).stdout.split()
    check(len(perf) == 1, f"gilscan top's perf found ({perf})")
    if len(perf) == 1:
        os.kill(int(perf[0]), signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(int(perf[0]), signal.SIGCONT)


def run_program(tmp, group, stall=0.0):
    """top --json on the workload against the truth; `stall`: perf stopped that long mid-run, without
    blame's stacks (its buffers would overflow)."""
    truth_p, truth = start_truth(tmp, group)
    summ = os.path.join(tmp, "s.json")
    top = subprocess.Popen([GILSCAN, "top", "--json", "--duration", "4", "--summary-json", summ] +
                           (["--no-blame"] if SANITIZED or stall else []) + ["--", PY, "-X", "perf", WORKLOAD, "30"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if stall:
        stall_perf(top, 1.6, stall)
    out, err = top.communicate(timeout=120)
    stop_truth(truth_p)
    check(top.returncode == 3, f"--duration: the program got SIGINT and its status is gilscan's ({top.returncode}, "
          f"{err[-300:]!r})")
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    check(out.count("interrupted") == 1, "the program's own output passes through")
    check((3 if stall else 4) <= len(lines) <= 6, f"an interval a second for 4 s ({len(lines)})")
    if not lines:
        return
    names = {t["name"] for t in lines[-2]["threads"]}
    check({"spinner-0", "spinner-1", "napper"} <= names, f"threads by their threading names ({names})")
    for a, b in zip(lines, lines[1:]):
        check(b["start_ns"] == a["end_ns"], "intervals follow one another")
    check(all(r["lost_events"] == 0 for r in lines), "the analysis kept up with perf: no events lost")
    mid = lines[1:-1]
    check(all(r["end_ns"] - r["start_ns"] >= 0.5e9 for r in mid), "no full interval shorter than half the interval")
    spinners = [t for r in mid for t in r["threads"] if t["name"].startswith("spinner")]
    check(spinners and all(t["gil_wait_pct"] > 25 and t["gil_held_pct"] > 25 for t in spinners),
          f"the spinners hold and wait for the GIL in every full interval "
          f"({[(t['name'], t['gil_held_pct'], t['gil_wait_pct']) for t in spinners]})")
    check(all(r["gils"] and r["gils"][0]["load_pct"] > 80 and r["gils"][0]["mean_waiters"] > 0.8 for r in mid),
          "the GIL's load and mean waiters in every full interval")
    blamed = [r["gil_blame"][0]["function"] for r in mid if r["gil_blame"]]
    if SANITIZED or stall:
        check(not blamed, "--no-blame: no blame rows")
    else:
        check(len(blamed) == len(mid) and all(f.startswith("spin (") for f in blamed),
              f"the spinners' Python function is blamed first in every full interval ({blamed})")
    pid = lines[-1]["threads"][0]["pid"]
    compare_intervals(lines, truth, pid)
    # The whole run: the summary, as gilscan FILE would give it.
    s = json.load(open(summ))
    g = truth_gil(truth, 0, 2**63)
    for t in s["threads"]:
        tg = g["gil"].get(str(t["tid"]))
        if not tg or t.get("gil_wait_us") is None:
            continue
        for what, ours, theirs in (("wait", t["gil_wait_us"] * 1000, tg["wait_ns"]), ("held", t["gil_hold_us"] * 1000,
                                                                                        tg["hold_ns"])):
            check(abs(ours - theirs) <= WHOLE_TOLERANCE * theirs + 1e6,
                  f"whole run, {t['comm']}: GIL {what} {ours / 1e6:.1f} ms, the truth's {theirs / 1e6:.1f} ms")


def run_attached(tmp):
    target = subprocess.Popen([PY, WORKLOAD, "8"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    r = subprocess.run([GILSCAN, "top", "--batch", "--duration", "2", "-p", str(target.pid)],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and target.poll() is None, f"-p --duration 2: status 0, the process lives on "
          f"({r.returncode}, {r.stderr[-300:]!r})")
    check(r.stdout.count("gilscan top  pid ") >= 2 and "GIL of " in r.stdout and "spin (" not in r.stdout,
          "-p: snapshots of the process (no -X perf: no Python names)")
    check("Summary of threads" in r.stdout, "-p: the whole run's table at the end")
    target.send_signal(signal.SIGINT)
    target.wait(timeout=30)
    check(not own_groups(), f"-p: the probes removed ({own_groups()})")


def pane(session):
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def wait_for_pane(session, done):
    """The pane's text once done(text) (or after 15 s)."""
    screen = ""
    for _ in range(60):
        time.sleep(0.25)
        screen = pane(session)
        if done(screen):
            break
    return screen


def wait_for_status(path):
    """What the shell wrote to path once gilscan ended ("" after 20 s)."""
    for _ in range(80):
        time.sleep(0.25)
        if os.path.exists(path) and open(path).read().strip():
            break
    return open(path).read().strip() if os.path.exists(path) else ""


def run_terminal(tmp):
    out = os.path.join(tmp, "tmux.txt")
    subprocess.run(["tmux", "kill-session", "-t", "gilscan-top-test"], capture_output=True)
    cmd = f"{GILSCAN} top -- {PY} -X perf {WORKLOAD} 60; echo EXIT=$? > {out}; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", "gilscan-top-test", "-x", "120", "-y", "30", cmd], check=True)
    try:
        screen = wait_for_pane("gilscan-top-test", lambda text: "spinner-1" in text and "spin (" in text)
        check("GIL of " in screen and "spinner-0" in screen and "napper" in screen and "(q quits)" in screen,
              f"the screen draws the GIL, the threads and the hint ({screen[:400]!r})")
        check("spin (" in screen, "the screen names the blamed Python function")
        check(len(screen.splitlines()) <= 30, "the screen fits the terminal")
        check(own_groups(), "probes in place while it runs")
        subprocess.run(["tmux", "send-keys", "-t", "gilscan-top-test", "q"], check=True)
        status = wait_for_status(out)
        check(status == "EXIT=3", f"q: the program got SIGINT, its status is gilscan's ({status!r})")
        after = pane("gilscan-top-test")
        check("while other threads waited" in after and "(q quits)" not in after,
              "q: the screen left (the terminal's own back), the whole run's table printed")
        check(not own_groups(), f"q: the probes removed ({own_groups()})")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", "gilscan-top-test"], capture_output=True)


def ctrl_c_attached(tmp):
    """Ctrl-C in a real terminal on top -p: the view leaves, the process runs on, the probes go."""
    out = os.path.join(tmp, "tmux-c.txt")
    target = subprocess.Popen([PY, WORKLOAD, "60"], stdout=subprocess.DEVNULL)
    subprocess.run(["tmux", "kill-session", "-t", "gilscan-top-c"], capture_output=True)
    cmd = f"{GILSCAN} top -p {target.pid}; echo EXIT=$? > {out}; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", "gilscan-top-c", "-x", "120", "-y", "30", cmd], check=True)
    try:
        screen = wait_for_pane("gilscan-top-c", lambda text: "GIL of " in text)
        check(f"pid {target.pid}" in screen and "GIL of " in screen, f"-p: the screen draws ({screen[:300]!r})")
        subprocess.run(["tmux", "send-keys", "-t", "gilscan-top-c", "C-c"], check=True)
        status = wait_for_status(out)
        check(status == "EXIT=0" and target.poll() is None,
              f"Ctrl-C: gilscan top -p leaves with 0, the process runs on ({status!r}, {target.poll()})")
        check(not own_groups(), f"Ctrl-C: the probes removed ({own_groups()})")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", "gilscan-top-c"], capture_output=True)
        target.kill()
        target.wait()


def perf_args_of(pid):
    """The argument vector of the perf that process pid runs (its child), or []."""
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            args = open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace").split("\0")[:-1]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and args and os.path.basename(args[0]) == "perf":
            return ["perf"] + args[1:]
    return []


def memory_stays_flat():
    """gilscan's anonymous resident memory at 10 s and at 20 s of a busy
    run: the stages' (threads, GILs, stacks met), not the recording's. By
    10 s the buffers are allocated; what still grows is the caches of
    distinct stacks and frames, each of bounded size."""
    if SANITIZED:
        return
    p = subprocess.Popen([GILSCAN, "top", "--batch", "--duration", "21", "--", PY, "-X", "perf", WORKLOAD, "60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss():  # anonymous memory: the binaries' mapped debug info is page cache
        for line in open(f"/proc/{p.pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        return 0
    time.sleep(10)
    early = rss()
    perf = perf_args_of(p.pid)
    # Live, perf gets 8 MiB of ring buffer per CPU (root): a slow moment of the analysis drops no event.
    check(perf[:2] == ["perf", "record"] and "-m" in perf and perf[perf.index("-m") + 1] == "8M",
          f"top runs perf record with -m 8M ({perf[:6]})")
    check("--switch-events" in perf, f"top records switch records: the program's switch-ins by any task ({perf})")
    time.sleep(10)
    late = rss()
    p.wait(timeout=60)
    # The stream brings some 20 MB a second here (DWARF stacks); what the
    # analysis keeps grows far slower, into caches of bounded size.
    check(early > 0 and late - early < 6 << 20, f"memory flat: {early >> 20} MiB at 10 s, {late >> 20} MiB at 20 s")


def usage_errors():
    for args, text in ((["top"], "nothing to watch"), (["top", "-p", "1", "--", PY], "-p attaches"),
                       (["top", "--interval", "0.01", "-p", "1"], "--interval"), (["top", "-p", "x"], "-p")):
        r = subprocess.run([GILSCAN] + args, capture_output=True, text=True)
        check(r.returncode == 2 and text in r.stderr, f"{' '.join(args)}: a usage error ({r.stderr.strip()!r})")


def main():
    if shutil.which("tmux") is None:
        check(False, "tmux is installed (scripts/test installs it)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([GILSCAN, "probe", "--group", "top_truth", PY], capture_output=True, text=True)
        check(r.returncode == 0, f"truth probes placed ({r.stderr[-300:]})")
        try:
            run_program(tmp, "top_truth")
            # perf starved: the figures stay exact (docs/usage.md, gilscan top).
            run_program(tmp, "top_truth", stall=1.5)
        finally:
            subprocess.run([GILSCAN, "probe", "--remove", "--group", "top_truth"], capture_output=True)
        if os.environ.get("TOP_ONLY_PROGRAM"):
            return
        run_attached(tmp)
        run_terminal(tmp)
        ctrl_c_attached(tmp)
        memory_stays_flat()
        usage_errors()
        check(not glob.glob("/tmp/gilscan-hook-*"), "no hook directory left")


try:
    main()
finally:
    remove_perf_maps_of(WORKLOAD)
done("gilscan top")
