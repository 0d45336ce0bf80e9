#!/usr/bin/env python3
"""gilscan record wraps the program as a shell would run it, on real runs
here (needs root and perf): Ctrl-C on a terminal reaches the program alone
(its KeyboardInterrupt handler runs once, the recording goes on until it
exits, gilscan exits with its status), signals sent to gilscan are passed
on, nothing lingers when gilscan is killed, the program reads the terminal;
attach (-p PID, --duration) and system-wide (-a); thread names from
threading; the permission lines an unprivileged user gets, and the run that
works once they are fixed; the switch-ins warning only where it belongs.

usage: record_wrap_e2e.py GILSCAN WORKLOAD
Prints "N passed, N failed".
"""
import glob
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, WORKLOAD = (os.path.abspath(a) for a in sys.argv[1:3])
PY = "/root/.pyenv/versions/3.11.7/bin/python3"

# Waits for "ready", then (KeyboardInterrupt) prints when it was handled on
# CLOCK_MONOTONIC and keeps running 0.3 s more: the recording must go on.
HANDLER = r"""
import sys, time, signal
def on_term(sig, frame):
    print("got SIGTERM", flush=True); sys.exit(9)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
try:
    time.sleep(30)
except KeyboardInterrupt:
    print("handled KeyboardInterrupt at %d" % time.monotonic_ns(), flush=True)
    end = time.time() + 0.3
    while time.time() < end: pass
    sys.exit(7)
"""


def on_terminal(args, keys_after_ready=None, signal_after_ready=None, timeout=60):
    """Runs args on a new pseudo-terminal as its session's foreground job;
    after "ready" appears, types keys_after_ready or sends gilscan
    signal_after_ready. Returns (exit status, everything written there)."""
    pid, master = pty.fork()
    if pid == 0:
        os.execv(args[0], args)
    out, acted, end = b"", False, time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if b"ready" in out and not acted:
            time.sleep(0.4)
            if keys_after_ready:
                os.write(master, keys_after_ready)
            if signal_after_ready:
                os.kill(pid, signal_after_ready)
            acted = True
    _, st = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(st), out.decode(errors="replace")


def summary(path):
    return json.load(open(path))


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    data, summ, trace = "r.data", "s.json", "t.json"
    rec = [GILSCAN, "record", "-o", data, "--trace", trace, "--summary-json", summ, "--"]

    # Ctrl-C typed on the terminal: the program's handler runs once, the
    # recording covers what it does afterwards, its status is gilscan's.
    rc, text = on_terminal(rec + [PY, "-c", HANDLER], keys_after_ready=b"\x03")
    handled = [int(n) for n in re.findall(r"handled KeyboardInterrupt at (\d+)", text)]
    check(rc == 7 and len(handled) == 1, f"Ctrl-C: the program handled one KeyboardInterrupt, status 7 ({rc}, {text[-800:]!r})")
    check("got SIGTERM" not in text, "Ctrl-C: the program got no SIGTERM")
    if rc == 7 and handled:
        main = [t for t in summary(summ)["threads"] if t["main_thread"]]
        check(main and main[0]["last_ns"] >= handled[0] + 250_000_000,
              f"Ctrl-C: recorded until the program exited, 0.3 s after its handler ({main and main[0]['last_ns'] - handled[0]} ns)")
        check(os.path.getsize(trace) > 0 and "Summary of threads" in text, "Ctrl-C: analysed, trace written")
    # SIGINT and SIGTERM sent to gilscan alone are passed on, once.
    rc, text = on_terminal(rec + [PY, "-c", HANDLER], signal_after_ready=signal.SIGINT)
    check(rc == 7 and text.count("handled KeyboardInterrupt") == 1,
          f"kill -INT gilscan: passed to the program once ({rc}, {text[-500:]!r})")
    rc, text = on_terminal(rec + [PY, "-c", HANDLER], signal_after_ready=signal.SIGTERM)
    check(rc == 9 and text.count("got SIGTERM") == 1 and os.path.getsize(trace) > 0,
          f"kill -TERM gilscan: passed to the program, then analysed ({rc}, {text[-500:]!r})")
    # The program is the terminal's foreground job: it reads it.
    rc, text = on_terminal(rec + [PY, "-c", "print('ready', flush=True); print('read', input())"],
                           keys_after_ready=b"hello\n")
    check(rc == 0 and "read hello" in text, f"the program reads the terminal ({rc}, {text[-300:]!r})")

    # gilscan killed: perf and the program go with it, and the next run
    # removes the probe group the killed one left.
    g = subprocess.Popen([GILSCAN, "record", "-q", "-o", "k.data", "--", PY, "-c", "import time; time.sleep(60)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    kids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(g.pid)], capture_output=True, text=True).stdout.split()
    g.kill()
    g.wait()
    time.sleep(1)
    alive = [k for k in kids if os.path.exists(f"/proc/{k}") and
             open(f"/proc/{k}/stat").read().split(")")[1].split()[0] != "Z"]
    check(len(kids) == 2 and not alive, f"gilscan killed: perf and the program do not linger ({kids}, {alive})")
    stale = f"gilscan_libpython3_11_pid{g.pid}"
    check(os.path.isdir(f"/sys/kernel/tracing/events/{stale}"), "gilscan killed: its probe group is left")
    subprocess.run(rec[:-1] + ["-q", "--", PY, "-c", "pass"], capture_output=True)
    check(not os.path.isdir(f"/sys/kernel/tracing/events/{stale}"), "the next record removes the killed run's group")

    # The blog's own probes (perf probe ... python:take_gil=take_gil) are
    # another group's: neither gilscan probe --remove nor a record run
    # touches them.
    lib39 = "/root/.pyenv/versions/3.9.18/lib/libpython3.9.so.1.0"
    p = subprocess.run(["perf", "probe", "-q", "-x", lib39, "python:take_gil=take_gil"], capture_output=True, text=True)
    check(p.returncode == 0, f"perf probe places python:take_gil ({p.stderr[-200:]})")
    subprocess.run([GILSCAN, "probe", "--remove"], capture_output=True)
    subprocess.run(rec[:-1] + ["-q", "--", "/root/.pyenv/versions/3.9.18/bin/python3", "-c", "pass"], capture_output=True)
    check(os.path.isdir("/sys/kernel/tracing/events/python/take_gil"),
          "gilscan probe --remove and record leave another group's probes (python:take_gil)")
    subprocess.run(["perf", "probe", "-q", "-d", "python:*"], capture_output=True)

    # Attach: -p PID with --duration, and until the process exits; the
    # process lives on after a --duration or a Ctrl-C.
    spin = ("import threading, time, sys\n"
            "def f(n):\n t = time.time()\n while time.time() - t < n: pass\n"
            "ts = [threading.Thread(target=f, args=(float(sys.argv[1]),)) for _ in range(2)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n")
    target = subprocess.Popen([PY, "-c", spin, "12"])
    time.sleep(0.5)
    t0 = time.time()
    r = subprocess.run([GILSCAN, "record", "-p", str(target.pid), "--duration", "1", "-o", data, "--trace", "",
                        "--summary-json", summ], capture_output=True, text=True)
    took = time.time() - t0
    check(r.returncode == 0 and target.poll() is None, f"-p --duration 1: status 0, the process still runs ({r.stderr[-400:]})")
    if r.returncode == 0:
        s = summary(summ)
        # (the main thread, blocked in join() throughout, has no event)
        mine = [t for t in s["threads"] if t["pid"] == target.pid]
        check(len(mine) >= 2 and s["gil"]["probe_events"] > 100 and
              all(0.8e6 < t["span_us"] < 1.3e6 for t in mine),
              f"-p: its threads for about 1 s, GIL probes fired ({[(t['tid'], t['span_us']) for t in mine]}, {took:.1f} s)")
        # A recording of one process: switch records show its threads
        # switched in by other processes' tasks, and each thread runs from
        # them (the spinners' waits for a CPU end at theirs).
        check("--switch-events" in s["cmdline"] and all(t["hidden_switch_ins"] == 0 for t in mine),
              f"-p: switch records, no switch-in unseen ({s['cmdline']}, {[t['hidden_switch_ins'] for t in mine]})")
        check(sum(t["gil_wait_us"] for t in mine) > 200_000, "-p: the spinning threads wait for the GIL")
    p = subprocess.Popen([GILSCAN, "record", "-q", "-p", str(target.pid), "-o", data, "--trace", ""],
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    err = p.communicate()[1]
    check(p.returncode == 0 and target.poll() is None, f"-p, then SIGINT: recording stopped, the process lives on ({p.returncode}, {err[-300:]})")
    t0 = time.time()
    r = subprocess.run([GILSCAN, "record", "-q", "-p", str(target.pid), "-o", data, "--trace", ""],
                       capture_output=True, text=True)
    check(r.returncode == 0 and target.wait() == 0, f"-p: ends when the process exits ({r.stderr[-300:]})")
    for bad in ("0", "12x", "-3"):
        r = subprocess.run([GILSCAN, "record", "-p", bad], capture_output=True, text=True)
        check(r.returncode == 2, f"-p {bad}: a usage error ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record", "-p", "4194000", "-o", data], capture_output=True, text=True)
    check(r.returncode == 1 and "no process 4194000" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
          f"-p with a pid that does not run: one sentence ({r.stderr!r})")
    r = subprocess.run([GILSCAN, "record", "--duration", "1", "--", PY, "-c", "pass"], capture_output=True, text=True)
    check(r.returncode == 2 and "--duration" in r.stderr, f"--duration with a program: a usage error ({r.stderr!r})")

    # -a: the whole system while the program runs, or for --duration.
    r = subprocess.run([GILSCAN, "record", "-a", "-o", data, "--trace", "", "--summary-json", summ, "--", PY,
                        WORKLOAD, "0.2"], capture_output=True, text=True)
    check(r.returncode == 0, f"-a -- PROGRAM: status 0 ({r.stderr[-300:]})")
    if r.returncode == 0:
        s = summary(summ)
        pids = {t["pid"] for t in s["threads"]}
        waiters = [t for t in s["threads"] if (t["gil_wait_us"] or 0) > 0]
        check(len(pids) > 3 and len(waiters) >= 3, f"-a: other processes too, and the program's GIL waits ({len(pids)}, {len(waiters)})")
        check("--switch-events" not in s["cmdline"], f"-a: no switch records: sched_switch shows every switch ({s['cmdline']})")
    r = subprocess.run([GILSCAN, "record", "-a", "--duration", "0.5", "-o", data, "--trace", "", "--summary-json",
                        summ], capture_output=True, text=True)
    check(r.returncode == 0 and "recording the scheduler only" in r.stderr and
          0.3e9 < summary(summ)["last_time_ns"] - summary(summ)["first_time_ns"] < 1.5e9,
          f"-a --duration 0.5: about half a second of the system ({r.stderr[-300:]})")

    # Thread names: threading's names in the recording (the first 15
    # bytes, whole UTF-8 characters), on Python 2.7 to 3.13 and Debian's;
    # the program's sitecustomize and PYTHONPATH are as without the hook.
    named = ("import threading, os, sys, time\n"
             "def f():\n t = time.time()\n while time.time() - t < 0.2: pass\n"
             "ts = [threading.Thread(target=f, name=n) for n in ('reader', 'writer-\\u00fc\\u00fc\\u00fc\\u00fc\\u00fc\\u00fc\\u00fc')]\n"
             "ts.append(threading.Thread(target=f)); ts[-1].name = 'renamed'\n"
             "[t.start() for t in ts]; [t.join() for t in ts]\n"
             "try:\n import sitecustomize\nexcept ImportError:\n sitecustomize = None\n"
             "print('site=%s path=%s' % (getattr(sitecustomize, '__file__', None), os.environ.get('PYTHONPATH')))\n")
    pythons = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3")) + ["/usr/bin/python3.11"]
    for py in pythons:
        env = dict(os.environ, PYTHONPATH=tmp)
        r = subprocess.run(rec[:-1] + ["-q", "--", py, "-c", named], capture_output=True, text=True, env=env)
        comms = {t["comm"] for t in summary(summ)["threads"]} if r.returncode == 0 else set()
        check({"reader", "writer-üüüü", "renamed"} <= comms, f"{py}: threads named from threading ({comms}, {r.stderr[-300:]})")
        check(f"path={tmp}" in r.stdout, f"{py}: the program's PYTHONPATH as given ({r.stdout!r})")
        if py == "/usr/bin/python3.11":
            check("site=/usr/lib/python3.11/sitecustomize.py" in r.stdout, f"Debian's sitecustomize still runs ({r.stdout!r})")
    r = subprocess.run(rec[:-1] + ["-q", "--no-thread-names", "--", PY, "-c", named], capture_output=True, text=True)
    comms = {t["comm"] for t in summary(summ)["threads"]}
    check(comms == {"python3"} and "path=None" in r.stdout, f"--no-thread-names: none named ({comms}, {r.stdout!r})")
    py2 = "/root/.pyenv/versions/2.7.18/bin/python2.7"
    r = subprocess.run(rec[:-1] + ["-q", "--", py2, "-c", named.replace("\\u00fc", "u")], capture_output=True, text=True)
    comms = {t["comm"] for t in summary(summ)["threads"]} if r.returncode == 0 else set()
    check({"reader", "writer-uuuuuuu", "renamed"} <= comms, f"Python 2.7: threads named ({comms}, {r.stderr[-300:]})")
    check(not glob.glob("/tmp/gilscan-hook-*"), f"the hook's directories are removed ({glob.glob('/tmp/gilscan-hook-*')})")

    # A program that cannot be run: its reason in one line, status 127, no recording.
    r = subprocess.run(rec[:-1] + ["--state", "-o", "none.data", "--", tmp], capture_output=True, text=True)
    check(r.returncode == 127 and r.stderr.strip() == f"gilscan: error: cannot run {tmp}: Permission denied" and
          not os.path.exists("none.data"), f"a program that cannot run: one line, 127, nothing recorded ({r.stderr!r})")

    # Scripts started by their shebang, direct and through env: the GIL
    # probes go on the Python they name.
    for shebang, env_path in (("#!/root/.pyenv/versions/3.10.13/bin/python3", None),
                              ("#!/usr/bin/env python3", "/root/.pyenv/versions/3.9.18/bin")):
        app = os.path.join(tmp, "app.py")
        with open(app, "w") as f:
            f.write(f"{shebang}\nimport runpy, sys\nsys.argv = [{WORKLOAD!r}, '0.1']\n"
                    f"runpy.run_path({WORKLOAD!r}, run_name='__main__')\n")
        os.chmod(app, 0o755)
        env = dict(os.environ, PATH=f"{env_path}:{os.environ['PATH']}") if env_path else None
        r = subprocess.run(rec[:-1] + ["-q", "--", app], capture_output=True, text=True, env=env)
        g = summary(summ)["gil"] if r.returncode == 0 else {}
        check(r.returncode == 0 and g.get("probe_events", 0) > 50,
              f"a script run by its shebang {shebang}: the GIL probes fired ({g.get('probe_events')}, {r.stderr[-300:]})")

    # The switch-ins warning: never for record's own recordings, which
    # follow one process; for a per-process perf record of one's own, where
    # the unseen switch-ins' time shows in the table, said once.
    subprocess.run(rec[:-1] + ["-q", "--", PY, WORKLOAD, "0.1"], capture_output=True)
    r = subprocess.run([GILSCAN, data, "-o", ""], capture_output=True, text=True)
    check(r.returncode == 0 and "switch-in" not in r.stderr, f"record's recording: no switch-ins warning ({r.stderr[:300]!r})")
    subprocess.run(["perf", "record", "-q", "-o", data, "-e", "sched:sched_switch", "-e", "sched:sched_waking", "--",
                    PY, WORKLOAD, "0.1"], capture_output=True)
    r = subprocess.run([GILSCAN, data, "-o", ""], capture_output=True, text=True)
    check(r.stderr.count("switch-in(s) were not recorded") == 1, f"a perf record of one's own: the warning once ({r.stderr[:400]!r})")
    # (Python 3.11 has no perf support: --gil-functions warns that no function is named)
    r = subprocess.run(rec[:-1] + ["-q", "--gil-functions", "--", PY, WORKLOAD, "0.1"], capture_output=True, text=True)
    check(r.returncode == 0 and r.stderr == "" and summary(summ)["warnings"],
          f"record -q: its warnings left out, kept in the summary JSON ({r.stderr[-300:]!r})")

done("record wraps the program")
