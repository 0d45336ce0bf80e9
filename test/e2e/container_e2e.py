#!/usr/bin/env python3
"""JIT frames of a Python in a container, end to end (needs root, perf and
unshare(1)): a Python run in its own pid and mount namespaces, with a /tmp of
its own, writes /tmp/perf-1.map (3.12 -X perf) or /tmp/jit-1.dump (3.13
-X perf_jit) where the host's /tmp does not show it, named by the pid it
sees. It is recorded from outside by its host pid (perf record -p) while it
waits to be released. Then:

- while it runs, gilscan reads its map through /proc/PID/root/tmp, by its pid
  in its namespace, as perf does: GIL waits by Python function exactly as
  with a copy of the map named by the host pid in a directory of its own;
- a jitdump is found after the process has exited by the name the process
  mapped it under (jit-1.dump) in a directory it was copied to;
- a map in the host's /tmp by its host pid, left by an earlier process of
  that pid, is passed over and said (planted there for the test);
- once it has exited, a missing map is said, with where else was looked.

(perf script unwound these recordings no further than the first user frame
here, so the copies are the reference.)

usage: container_e2e.py GILSCAN WORKLOAD
Prints "N passed, N failed".
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, SOURCE = sys.argv[1], os.path.abspath(sys.argv[2])
WORKLOAD = None  # its copy outside /tmp, which the contained process's /tmp hides
STALE_MAP = b"10000 40 py::stale:/elsewhere.py\n10040 40 py::spin:/elsewhere.py\n"  # no process's JIT memory
DRIVER = """
import os, runpy, sys
print("ready", os.getpid(), flush=True)
sys.stdin.readline()            # the recorder is attached
sys.argv = [sys.argv[1], "0.2"]
runpy.run_path(sys.argv[0], run_name="__main__")
print("done", flush=True)
sys.stdin.readline()            # stays until released
"""


def contained(py, flag, driver):
    """A Python in new pid and mount namespaces with a private /tmp: (its
    unshare Popen, its host pid, its pid inside)."""
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount", "--mount-proc", "sh", "-c",
                          f"mount -t tmpfs tmpfs /tmp && exec {py} {flag} {driver} {WORKLOAD}"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = p.stdout.readline().split()
    kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    return p, int(kids[0]), int(ready[1])


def record(p, host_pid, data):
    """perf record -p of the contained Python while it runs the workload."""
    rec = subprocess.Popen(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "sched:sched_switch/call-graph=dwarf/",
                            "-e", "sched:sched_waking", "-e", "sched:sched_wakeup", "-e", "sched:sched_process_fork",
                            "-p", str(host_pid), "-o", data], stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # perf has no "attached" signal; it opens the events in well under a second here
    p.stdin.write("go\n")
    p.stdin.flush()
    finished = p.stdout.readline().strip()
    rec.send_signal(signal.SIGINT)
    err = rec.communicate()[1]
    # perf record ends by re-raising the SIGINT once the file is written.
    return finished == "done" and rec.returncode in (0, -signal.SIGINT), f"{finished!r}, perf status {rec.returncode}: {err}"


def gil_functions(data, *extra):
    """gilscan --gil-functions on data: (exit status, rows, stderr)."""
    out = data + ".gf.json"
    r = subprocess.run([GILSCAN, data, "-q", "--gil-functions", "--summary-json", out, *extra],
                       capture_output=True, text=True)
    rows = json.load(open(out))["gil_functions"] if r.returncode == 0 else None
    return r.returncode, rows, r.stderr


def spin_waits(rows):
    return sum(r["sleep_count"] for r in rows or [] if r["function"] == "py::spin:" + WORKLOAD)


# /var/tmp, not /tmp: the contained process's /tmp hides the host's.
work = tempfile.mkdtemp(prefix="gilscan-ns-", dir="/var/tmp")
try:
    WORKLOAD = os.path.join(work, "workload.py")
    shutil.copy(SOURCE, WORKLOAD)
    driver = os.path.join(work, "driver.py")
    open(driver, "w").write(DRIVER)
    data = os.path.join(work, "ns.data")
    for py, flag, kind, ext in (("/root/.pyenv/versions/3.12.1/bin/python3", "-X perf", "perf", "map"),
                                ("/root/.pyenv/versions/3.13.0/bin/python3", "-X perf_jit", "jit", "dump")):
        if not os.path.exists(py):
            check(False, f"{py} missing on this machine")
            continue
        p, host_pid, ns_pid = contained(py, flag, driver)
        # The host's /tmp gets a perf map by the process's host pid, as an
        # earlier process of that pid leaves one (pids wrap at pid_max, and
        # CPython never removes its map): its JIT code elsewhere. gilscan
        # must pass it over. (One there already is such a map; it stays.)
        stale = f"/tmp/perf-{host_pid}.map"
        planted = False
        try:
            fd = os.open(stale, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, STALE_MAP)
            os.close(fd)
            planted = True
        except FileExistsError:
            pass
        try:
            ok, err = record(p, host_pid, data)
            check(ok and ns_pid != host_pid, f"{flag}: recorded pid {host_pid} (pid {ns_pid} inside) ({err[-300:]})")
            inside = f"/proc/{host_pid}/root/tmp/{kind}-{ns_pid}.{ext}"
            host_file = f"/tmp/{kind}-{host_pid}.{ext}"
            untouched = (open(host_file, "rb").read() == STALE_MAP) if planted and host_file == stale \
                else not os.path.exists(host_file)
            check(os.path.exists(inside) and not os.path.exists(f"/tmp/{kind}-{ns_pid}.{ext}") and untouched,
                  f"{flag}: its {kind}-{ns_pid}.{ext} only in its own /tmp")
            # The reference: a copy of its map, named by the host pid.
            ref_dir = os.path.join(work, "ref")
            os.makedirs(ref_dir, exist_ok=True)
            shutil.copy(inside, os.path.join(ref_dir, f"{kind}-{host_pid}.{ext}"))
            copied = os.path.join(work, "copied")  # a copy under the name it has inside
            os.makedirs(copied, exist_ok=True)
            shutil.copy(inside, copied)
            rc, ref, e = gil_functions(data, "--perf-maps", ref_dir)
            check(rc == 0 and spin_waits(ref) > 5, f"{flag}: the reference names GIL waits in spin ({ref}; {e[-300:]})")
            rc, live, e = gil_functions(data)
            check(rc == 0 and live == ref and "no perf map" not in e,
                  f"{flag}: while it runs, its own /tmp read as pid {ns_pid}: the reference's functions "
                  f"({live} against {ref}; {e[-300:]})")
            check(f"{stale}: none of its " in e and "not used" in e,
                  f"{flag}: the host's map by its pid, another process's, is passed over and said ({e[-300:]})")
        finally:
            p.stdin.write("exit\n")
            p.stdin.flush()
            p.wait()
            if planted:
                os.unlink(stale)
        rc, gone, e = gil_functions(data)
        check(rc == 0 and spin_waits(gone) == 0 and f"no perf map /tmp/perf-{host_pid}.map" in e,
              f"{flag}: exited, its map is missing and said ({e[-400:]})")
        rc, later, e = gil_functions(data, "--perf-maps", copied)
        if kind == "jit":
            check(rc == 0 and later == ref and "no perf map" not in e,
                  f"{flag}: exited, its jitdump found in a copy by the name it mapped ({later} against {ref}; {e[-300:]})")
        else:
            # A perf map is not mapped: nothing in the recording says pid 1.
            check(rc == 0 and spin_waits(later) == 0 and f"perf-{host_pid}.map" in e,
                  f"{flag}: exited, a copy named by its own pid is not taken for it ({e[-300:]})")
        shutil.rmtree(copied)
        shutil.rmtree(ref_dir)
finally:
    shutil.rmtree(work, ignore_errors=True)

done("container e2e")
