#!/usr/bin/env python3
"""gilscan record end to end on every Python of this machine kind (needs root
and perf): probes are placed by gilscan itself, the workload runs under perf,
and the analysis must show GIL wait and hold for the contending threads with
no anomalies. Also the errors users hit, one clear sentence each.

usage: record_e2e.py GILSCAN WORKLOAD
Prints "N passed, N failed".
"""
import fcntl
import glob
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402


def read_terminal(master, on_read=None):
    """All a pseudo-terminal's master gives until every writer has closed
    the terminal (EIO), decoded; on_read(bytes so far) after each read."""
    got = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO
            break
        if not chunk:
            break
        got += chunk
        if on_read:
            on_read(got)
    os.close(master)
    return got.decode(errors="replace")


GILSCAN, WORKLOAD = sys.argv[1], sys.argv[2]
PYTHONS = [f"/root/.pyenv/versions/{v}/bin/python3" for v in
           ("3.6.15", "3.7.16", "3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0")]
PYTHONS += ["/usr/bin/python3.11", "/root/.pyenv/shims/python3"]


with tempfile.TemporaryDirectory() as tmp:
    data, trace, summ = (os.path.join(tmp, n) for n in ("r.data", "t.json", "s.json"))
    for py in PYTHONS:
        if not os.path.exists(py):
            check(False, f"{py} missing on this machine")
            continue
        r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--trace", trace, "--summary-json", summ,
                            "--", py, WORKLOAD, "0.1"], capture_output=True, text=True)
        check(r.returncode == 0, f"{py}: record exits with the program's status 0 ({r.returncode}: {r.stderr[-500:]})")
        if r.returncode != 0:
            continue
        check("[ perf record:" not in r.stderr, f"{py}: -q leaves out perf's own lines ({r.stderr[-300:]})")
        s = json.load(open(summ))
        g = s["gil"]
        check(g["uprobes"] and g["probe_events"] > 50, f"{py}: GIL uprobes fired ({g['probe_events']})")
        a = g["anomalies"]
        check(a["take_without_return"] == a["return_without_take"] == a["drop_without_take"] == 0,
              f"{py}: no GIL anomalies ({a})")
        # Every release probed: Debian's python3.11 too, where drop_gil's
        # copies inlined into _Py_read and others are probed where they signal.
        check(a["implicit_drops"] == a["releases_not_seen"] == 0,
              f"{py}: every drop probed ({a['implicit_drops']} implicit, {a['releases_not_seen']} not seen)")
        workers = [t for t in s["threads"] if t["gil_wait_us"] and not t["main_thread"]]
        check(len(workers) >= 3, f"{py}: 3+ threads wait for the GIL ({len(workers)})")
        check(sum(1 for t in workers if t["gil_hold_us"] > 1000) >= 2, f"{py}: 2+ threads hold the GIL")
        check(any(t["gil_sleep_count"] for t in s["threads"]), f"{py}: S(GIL) sleeps labelled from the probes")
        names = {e["name"] for e in json.load(open(trace))["traceEvents"]}
        check({"LOCK", "GIL wait", "S(GIL)"} <= names, f"{py}: GIL spans in the trace")

    # record -q: perf's "[ perf record: ... ]" lines only are left out: the
    # program's own stderr passes (a line, and a progress line with no
    # newline), perf's errors still show, and without -q perf's lines are there.
    py = "/root/.pyenv/versions/3.11.7/bin/python3"
    prog = "import sys; sys.stderr.write('the program [ perf record: x ]\\n50%\\r'); sys.exit(3)"
    r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--trace", "", "--", py, "-c", prog], capture_output=True)
    r.stderr = r.stderr.decode(errors="replace")  # not text=True: that would turn the \r into \n
    check(r.returncode == 3 and r.stderr.startswith("the program [ perf record: x ]\n50%\r") and
          "Captured and wrote" not in r.stderr,
          f"record -q: the program's stderr passed, its status 3, perf's lines left out ({r.returncode}, {r.stderr!r})")
    # With stderr on a terminal the program still finds one there (a
    # pseudo-terminal of the same size, its bytes passed as written).
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 77, 0, 0))
    prog = ("import os, sys; sys.stderr.write('tty=%s cols=%d\\n' % (os.isatty(2), os.get_terminal_size(2).columns)); "
            "sys.stderr.write('50%\\r'); sys.exit(4)")
    p = subprocess.Popen([GILSCAN, "record", "-q", "-o", data, "--trace", "", "--", py, "-c", prog],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    text = read_terminal(master)
    rc = p.wait()
    # This terminal turns gilscan's "\n" into "\r\n" (its default output
    # processing); gilscan's own pseudo-terminal must not do so first ("\r\r\n").
    check(rc == 4 and text.startswith("tty=True cols=77\r\n50%\r") and "perf record:" not in text,
          f"record -q on a terminal: the program's stderr a terminal of the same size, bytes as written, "
          f"perf's lines left out ({rc}, {text!r})")
    # A resize of that terminal reaches the program's: gilscan runs with the
    # terminal as its controlling one (its own session, as under a shell), and
    # copies the size on the SIGWINCH of a resize; the program waits for its
    # stderr's size to change and prints it. (perf record starts the program
    # with SIGWINCH blocked, so the program asks instead of being told.)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 77, 0, 0))
    prog = ("import os, sys, time\n"
            "sys.stderr.write('cols=%d\\n' % os.get_terminal_size(2).columns); sys.stderr.flush()\n"
            "end = time.time() + 20\n"
            "while os.get_terminal_size(2).columns == 77 and time.time() < end: time.sleep(0.01)\n"
            "sz = os.get_terminal_size(2)\n"
            "sys.stderr.write('now cols=%d rows=%d\\n' % (sz.columns, sz.lines)); sys.exit(5)\n")
    p = subprocess.Popen([GILSCAN, "record", "-q", "-o", data, "--trace", "", "--", py, "-c", prog],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, start_new_session=True,
                         preexec_fn=lambda: fcntl.ioctl(2, termios.TIOCSCTTY, 0))
    os.close(slave)
    resized = []

    def resize_once(got):
        if not resized and b"cols=77\r\n" in got:
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 101, 0, 0))
            resized.append(True)
    text = read_terminal(master, resize_once)
    rc = p.wait()
    check(rc == 5 and "now cols=101 rows=40" in text and "perf record:" not in text,
          f"record -q on a terminal: a resize reaches the program's stderr ({rc}, {text!r})")
    r = subprocess.run([GILSCAN, "record", "-o", data, "--trace", "", "--", py, "-c", "1"], capture_output=True, text=True)
    check(r.returncode == 0 and "[ perf record: Captured and wrote" in r.stderr, f"record without -q: perf's lines ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record", "-q", "-o", "/nonexistent/r.data", "--", py, "-c", "1"], capture_output=True, text=True)
    check(r.returncode != 0 and "/nonexistent/r.data" in r.stderr.split("gilscan: error:")[0],
          f"record -q: perf's error still shown ({r.stderr!r})")

    # 3.12+: subinterpreters that own their GIL. The take_gil probe reads
    # which GIL (its gil= argument, from libpython's DWARF): three GILs in one
    # process, only the main interpreter's contended, no overlapping holders.
    subinterp = os.path.join(os.path.dirname(os.path.abspath(WORKLOAD)), "subinterp.py")
    for v in ("3.12.1", "3.13.0"):
        py = f"/root/.pyenv/versions/{v}/bin/python3"
        # The fetch argument against perf's own reading of the same DWARF:
        # perf probe turns the C expression into a uprobe_events argument.
        lib = glob.glob(f"/root/.pyenv/versions/{v}/lib/libpython3.*.so.1.0")[0]
        r = subprocess.run([GILSCAN, "probe", "--print", lib], capture_output=True, text=True)
        ours = [l.split(" gil=", 1)[1].split("'", 1)[0] for l in r.stdout.splitlines()
                if l.startswith("echo 'p:") and "/take_gil " in l and " gil=" in l]
        group = "gilscan_e2e_" + v.replace(".", "_")
        p = subprocess.run(["perf", "probe", "-q", "-f", "-x", lib, "-a",
                            f"{group}:take_gil=take_gil gil=tstate->interp->ceval.gil:x64"], capture_output=True, text=True)
        theirs = [l.split(" gil=", 1)[1] for l in open("/sys/kernel/tracing/uprobe_events").read().splitlines()
                  if l.startswith(f"p:{group}/") and " gil=" in l]
        subprocess.run(["perf", "probe", "-q", "-d", f"{group}:*"], capture_output=True)
        check(p.returncode == 0 and len(ours) == 1 and ours == theirs,
              f"{v}: take_gil's gil= argument is perf probe's for tstate->interp->ceval.gil ({ours} {theirs} {p.stderr})")
        r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--trace", trace, "--summary-json", summ,
                            "--", py, subinterp], capture_output=True, text=True)
        check(r.returncode == 0, f"{v} subinterpreters: record ({r.stderr[-300:]})")
        if r.returncode != 0:
            continue
        g = json.load(open(summ))["gil"]
        procs = g["processes"]
        check(len(procs) == 3 and len({p["pid"] for p in procs}) == 1 and [p["gil_index"] for p in procs] == [0, 1, 2]
              and len({p["gil_address"] for p in procs}) == 3 and all(p["gil_address"] for p in procs),
              f"{v} subinterpreters: three GILs in one process ({procs})")
        check(len(procs) == 3 and procs[0]["contended_us"] > 0 and procs[1]["contended_us"] == procs[2]["contended_us"] == 0,
              f"{v} subinterpreters: only the main GIL contended ({procs})")
        check(all(n == 0 for k, n in g["anomalies"].items() if k != "implicit_drops"),
              f"{v} subinterpreters: no GIL anomalies ({g['anomalies']})")
        names = {e["args"]["name"] for e in json.load(open(trace))["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        check({"GIL holder", "GIL holder (GIL 2)", "GIL holder (GIL 3)"} <= names, f"{v} subinterpreters: a track per GIL")

    # Debian's python3.11 releases the GIL from copies of drop_gil inlined
    # into _Py_read and others: each is probed where it signals the GIL's
    # condition variable, so with file I/O every release is seen, no thread
    # holds the GIL longer than it lives and the holds of a process never
    # overlap. (A release no probe sees ends at the next take: one GIL, one
    # holder; gil_probes_test.cc.)
    r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--trace", trace, "--summary-json", summ, "--",
                        "/usr/bin/python3.11", os.path.join(os.path.dirname(WORKLOAD), "io_readers.py"), "0.3"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"Debian python3.11 file I/O: recorded ({r.stderr[-300:]})")
    s = json.load(open(summ)) if r.returncode == 0 else {"threads": [], "gil": {"anomalies": {}, "processes": [{}]}}
    a = s["gil"]["anomalies"]
    probes = subprocess.run(["perf", "script", "-i", data, "-F", "event"], capture_output=True, text=True).stdout
    check(a.get("releases_not_seen") == 0 and a.get("implicit_drops") == 0 and
          any(f":drop_gil_{n}:" in probes for n in range(2, 6)),
          f"Debian python3.11 file I/O: every release probed, the inlined copies' among them ({a})")
    holders = [t for t in s["threads"] if t["gil_hold_us"]]
    check(len(holders) >= 4 and all(t["gil_hold_us"] <= t["span_us"] for t in holders),
          f"Debian python3.11 file I/O: each thread holds the GIL at most its span "
          f"({[(t['gil_hold_us'], t['span_us']) for t in holders]})")
    held = s["gil"]["processes"][0].get("held_us", 0)
    check(abs(sum(t["gil_hold_us"] for t in holders) - held) <= 0.001 * held + 1,
          f"Debian python3.11 file I/O: the threads' holds add up to the GIL's held time "
          f"({sum(t['gil_hold_us'] for t in holders)} vs {held})")
    locks = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in
                   (json.load(open(trace))["traceEvents"] if r.returncode == 0 else []) if e.get("name") == "LOCK")
    overlaps = [(x, y) for x, y in zip(locks, locks[1:]) if y[0] < x[1] - 1e-3]
    check(len(locks) > 100 and not overlaps,
          f"Debian python3.11 file I/O: no two threads' GIL holds overlap ({len(locks)} holds, {overlaps[:2]})")

    # Probes: each run places its own group and removes it when perf is
    # done; --keep-probes leaves them, in the group `gilscan probe` uses.
    py39 = "/root/.pyenv/versions/3.9.18/bin/python3"
    subprocess.run([GILSCAN, "probe", "--remove", "--group", "gilscan_libpython3_9"], capture_output=True)

    def groups():
        return {l.split(":", 1)[1].split("/", 1)[0] for l in open("/sys/kernel/tracing/uprobe_events")
                if "libpython3.9" in l}
    r = subprocess.run([GILSCAN, "record", "--gil", "-o", data, "--trace", "", "--", py39, "-c", "pass"],
                       capture_output=True, text=True)
    placed = re.search(r"\(group (\S+)\)", r.stderr)
    check(r.returncode == 0 and placed and re.fullmatch(r"gilscan_libpython3_9_pid\d+", placed.group(1)) and
          not groups(), f"record --gil: its own group, removed at the end ({placed and placed.group(1)}, {groups()})")
    r = subprocess.run([GILSCAN, "record", "--gil", "--keep-probes", "-o", data, "--trace", "", "--", py39, "-c", "pass"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and groups() == {"gilscan_libpython3_9"},
          f"record --gil --keep-probes: left in gilscan probe's group ({groups()})")
    subprocess.run([GILSCAN, "probe", "--remove", "--group", "gilscan_libpython3_9"], capture_output=True)

    # --state comes with --gil (as the help says), not with --no-state.
    def evlist(*opts):
        r = subprocess.run([GILSCAN, "record", "-q", "--no-analyse", "-o", data, *opts, "--",
                            "/root/.pyenv/versions/3.12.1/bin/python3", "-c", "pass"], capture_output=True, text=True)
        check(r.returncode == 0, f"record {' '.join(opts)} ({r.stderr[-300:]})")
        return subprocess.run(["perf", "evlist", "-i", data], capture_output=True, text=True).stdout.split()
    events = evlist("--gil")
    check("sched:sched_switch" in events and "sched:sched_process_exit" in events and
          any(e.endswith(":take_gil") for e in events), f"record --gil: the GIL probes and --state ({events})")
    events = evlist("--gil", "--no-state")
    check(not any(e.startswith("sched:") for e in events) and any(e.endswith(":take_gil") for e in events),
          f"record --gil --no-state: the GIL probes alone ({events})")
    r = subprocess.run([GILSCAN, "record", "--state", "--no-state", "--", "/bin/true"], capture_output=True, text=True)
    check(r.returncode == 2 and "contradict" in r.stderr, f"--state --no-state: a usage error ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record", "-o", data, "--gil", "--", "/bin/true"], capture_output=True, text=True)
    check(r.returncode != 0 and "no Python found" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"a non-Python program with --gil: one sentence ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record"], capture_output=True, text=True)
    check(r.returncode == 2 and "nothing to record" in r.stderr, f"no program, -p or -a: a usage error ({r.stderr!r})")
    # Ways of starting Python: through env (its settings skipped), and a
    # wrapper that hides the interpreter (uv run, poetry run, a shell
    # script), which --python names; the GIL probes fire in each.
    def probe_events():
        return subprocess.run(["perf", "script", "-i", data, "-F", "event"], capture_output=True, text=True).stdout
    r = subprocess.run([GILSCAN, "record", "-q", "--no-analyse", "-o", data, "--", "/usr/bin/env", "-u", "NOPE",
                        "PYTHONHASHSEED=0", "/root/.pyenv/versions/3.11.7/bin/python3", WORKLOAD, "0.05"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and ":take_gil__return:" in probe_events(),
          f"record -- env NAME=VALUE python3: the probes on its interpreter fired ({r.stderr[-300:]})")
    wrapper = os.path.join(tmp, "wrap.sh")
    with open(wrapper, "w") as w:
        w.write('#!/bin/sh\nexec /root/.pyenv/versions/3.12.1/bin/python3 "$@"\n')
    os.chmod(wrapper, 0o755)
    r = subprocess.run([GILSCAN, "record", "-o", data, "--", wrapper, WORKLOAD, "0.05"], capture_output=True, text=True)
    check(r.returncode != 0 and "--python PATH" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"a wrapper that hides the interpreter: one sentence naming --python ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record", "-q", "--no-analyse", "--python", "/root/.pyenv/versions/3.12.1/bin/python3",
                        "-o", data, "--", wrapper, WORKLOAD, "0.05"], capture_output=True, text=True)
    check(r.returncode == 0 and ":take_gil__return:" in probe_events(),
          f"record --python PATH -- wrapper: the probes on the Python it names fired ({r.stderr[-300:]})")

    # Python 2 has no take_gil, and switches its GIL every 100 bytecodes:
    # by default record takes stacks instead of the GIL uprobes (and says
    # so), from which its GIL waits are told.
    py2 = "/root/.pyenv/versions/2.7.18/bin/python2.7"
    workload2 = os.path.join(os.path.dirname(WORKLOAD), "workload2.py")
    r = subprocess.run([GILSCAN, "record", "-o", data, "--trace", trace, "--summary-json", summ, "--", py2, workload2,
                        "0.1"], capture_output=True, text=True)
    check(r.returncode == 0 and "is Python 2, which switches the GIL every 100 bytecodes, too often for uprobes: "
          "recording stacks instead" in r.stderr,
          f"Python 2: record by default takes stacks instead of uprobes, with a note ({r.stderr[-500:]})")
    if r.returncode == 0:
        s = json.load(open(summ))
        check(s["gil_sleep_source"] == "stacks" and sum(t["gil_sleep_count"] for t in s["threads"]) > 50,
              f"Python 2: S(GIL) sleeps from stacks ({sum(t['gil_sleep_count'] for t in s['threads'])})")
        check("(Python 2: in PyThread_acquire_lock called by the GIL's takers)" in r.stderr,
              "Python 2: the table's footnote says what S(GIL) is there")
    # --gil asked for: the calls of the lock functions in ceval.c are probed
    # (py2_gil.h), with the stacks beside them (plain probes where a call
    # returns leave the stacks whole): each sleep's label from the probes
    # and from its stack, two independent ways, must agree.
    r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--gil", "--state", "--stacks", "--trace", trace,
                        "--summary-json", summ, "--", py2, workload2, "0.3"], capture_output=True, text=True)
    # (0.3 s: at 0.1 s a loaded machine gave 42 GIL waits, under the 50 asked for)
    check(r.returncode == 0, f"Python 2 with --gil --stacks: recorded ({r.stderr[-500:]})")
    if r.returncode == 0:
        g = json.load(open(summ))["gil"]
        check(g["uprobes"] and g["probe_events"] > 500, f"Python 2: GIL probes fired ({g['probe_events']})")
        check(all(n == 0 for n in g["anomalies"].values()), f"Python 2: every take and drop paired ({g['anomalies']})")
        labels = {}
        for how in ("probes", "stacks"):
            rr = subprocess.run([GILSCAN, data, "-q", "--gil-evidence", how, "-o", trace], capture_output=True, text=True)
            check(rr.returncode == 0, f"Python 2: analysed with --gil-evidence {how} ({rr.stderr[-300:]})")
            labels[how] = {(e["tid"], e["ts"]): e["name"] == "S(GIL)" for e in json.load(open(trace))["traceEvents"]
                           if e.get("cat") == "process state" and e["name"] in ("S", "S(GIL)", "S(GIL handoff)")}
        both = labels["probes"].keys() & labels["stacks"].keys()
        gil = sum(labels["stacks"][k] for k in both)
        agree = sum(labels["probes"][k] == labels["stacks"][k] for k in both)
        check(len(both) == len(labels["probes"]) and gil > 50 and agree >= 0.97 * len(both),
              f"Python 2: S(GIL) from the probes agrees with the stacks ({agree} of {len(both)}, {gil} GIL waits)")

    r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--state", "--trace", trace, "--", "/bin/sh", "-c", "exit 5"],
                       capture_output=True, text=True)
    check(r.returncode == 5, f"the program's exit status is gilscan's ({r.returncode})")
    r = subprocess.run([GILSCAN, "record", "-q", "-o", data, "--", "/bin/true"], capture_output=True, text=True,
                       env={**os.environ, "PATH": "/nonexistent"})
    check(r.returncode != 0 and "perf is not installed" in r.stderr, f"perf missing ({r.stderr!r})")

    # python -m: the interpreter is the first word
    r = subprocess.run([GILSCAN, "record", "-o", data, "--trace", trace, "--", "/root/.pyenv/versions/3.12.1/bin/python3",
                        "-m", "timeit", "-n", "20", "sum(range(10000))"], capture_output=True, text=True)
    check(r.returncode == 0 and "GIL load of process" in r.stderr, f"record -- python3 -m module ({r.stderr[-300:]})")
    check("GIL(ms)" in r.stderr and "no-GIL%" in r.stderr, "table with per4m's columns and absolute figures")
    check(r.stdout.endswith(" per loop\n") and "GIL" not in r.stdout, f"stdout is timeit's alone ({r.stdout!r})")
    # The program's stdout is the program's, byte for byte; the table goes
    # to stderr, or to --summary FILE.
    prog = "import sys, threading; sys.stdout.write('out\\n'); sys.stdout.flush(); sys.stderr.write('err\\n')"
    with open(os.path.join(tmp, "out.txt"), "w") as out:
        r = subprocess.run([GILSCAN, "record", "-o", data, "--trace", "", "--", "/root/.pyenv/versions/3.12.1/bin/python3",
                            "-c", prog], stdout=out, stderr=subprocess.PIPE, text=True)
    check(r.returncode == 0 and open(os.path.join(tmp, "out.txt")).read() == "out\n" and
          "GIL load of process" in r.stderr and "err\n" in r.stderr,
          f"record -- python3 > out.txt: out.txt is the program's output, the table on stderr ({r.stderr[-300:]})")
    table = os.path.join(tmp, "table.txt")
    r = subprocess.run([GILSCAN, "record", "-o", data, "--trace", "", "--summary", table, "--",
                        "/root/.pyenv/versions/3.12.1/bin/python3", "-c", prog], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout == "out\n" and "GIL load of process" in open(table).read() and
          "GIL load of process" not in r.stderr, f"record --summary FILE: the table there ({r.stderr[-300:]})")

    # Sleep stacks' kernel frames, named when the recording's kernel (its
    # build-id, as perf recorded it) is this machine's: named alike at every -j.
    r = subprocess.run([GILSCAN, "record", "--stacks", "--no-analyse", "-o", data, "--",
                        "/root/.pyenv/versions/3.11.7/bin/python3", WORKLOAD, "0.1"], capture_output=True, text=True)
    check(r.returncode == 0, f"record --stacks ({r.stderr[-300:]})")
    # --stacks with the GIL probes (the default): take_gil's return is a
    # plain probe on its ret, so nothing cuts the stacks and nothing is noted.
    check("return probe" not in r.stderr, f"record --stacks: no return-probe note ({r.stderr[-400:]})")
    # The kernel's symbols from /proc/kallsyms the first time (-j 1, which
    # writes them to a fresh cache directory), from that cache after (-j 2,
    # 3), and without any cache: the same names.
    kernel_traces = []
    kcache = os.path.join(tmp, "kcache")
    for j, extra in ((1, ()), (2, ()), (3, ()), (2, ("--no-cache",))):
        kt = os.path.join(tmp, f"k{j}{len(extra)}.json")
        r = subprocess.run([GILSCAN, data, "-q", "-j", str(j), "--sleep-stacks", "16", "--gil-evidence", "stacks",
                            "--cache-dir", kcache, *extra, "-o", kt],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"-j {j} --sleep-stacks {extra} ({r.stderr[-300:]})")
        kernel_traces.append(open(kt, "rb").read() if r.returncode == 0 else b"")
        if j == 1:
            entries = glob.glob(os.path.join(kcache, "gilscan-cache", "kallsyms-*"))
            check(len(entries) == 1 and os.stat(entries[0]).st_mode & 0o777 == 0o600,
                  f"the kernel's symbols cached, readable by this user only ({entries})")
    check(kernel_traces[0] == kernel_traces[1] == kernel_traces[2] == kernel_traces[3],
          "-j 1, 2 and 3 write the same trace, kernel symbols read, cached or not")
    stacks = [e["args"]["stack"] for e in json.loads(kernel_traces[0] or b'{"traceEvents":[]}')["traceEvents"]
              if "stack" in e.get("args", {})]
    kernel = [f for st in stacks for f in st if f.endswith("([kernel])")]
    named = [f for f in kernel if not f.startswith("0x")]
    check(len(stacks) > 20 and len(kernel) > 2 * len(stacks), f"sleep stacks with kernel frames ({len(stacks)}, {len(kernel)})")
    check(len(named) == len(kernel) and any(f.startswith("schedule+0x") for f in named),
          f"every kernel frame named on this boot ({len(named)} of {len(kernel)}: {kernel[:3]})")
    # Not root: one sentence with the fix (setpriv drops to nobody)
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode == 0:
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        r = subprocess.run(nobody + [GILSCAN, "probe", "/usr/bin/python3.11"], capture_output=True, text=True)
        check(r.returncode != 0 and "root" in r.stderr and r.stderr.startswith("gilscan: error:"),
              f"probe without root ({r.stderr!r})")
        r = subprocess.run(nobody + [GILSCAN, "probe", "--print", "/usr/bin/python3.11"], capture_output=True, text=True)
        check(r.returncode == 0 and "uprobe_events" in r.stdout, "probe --print works without root")
        r = subprocess.run(nobody + [GILSCAN, "record", "-o", "/tmp/x.data", "--", "/usr/bin/python3.11", "-c", "1"],
                           capture_output=True, text=True)
        check(r.returncode != 0 and ("perf_event_paranoid" in r.stderr or "root" in r.stderr),
              f"record without root ({r.stderr!r})")
    else:
        check(False, "setpriv (util-linux) missing")

done("record e2e")
