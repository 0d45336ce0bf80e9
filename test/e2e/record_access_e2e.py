#!/usr/bin/env python3
"""gilscan record as an unprivileged user, created here (needs root): each
missing permission gets one line naming it and its fix, before perf starts
(nothing is written); with the fixes the lines give applied (the sysctl,
tracefs opened up, the GIL probes placed once with `gilscan probe` as
root) the same user records a Python program and sees its GIL. Every
setting changed here is put back, and the user removed.

usage: record_access_e2e.py GILSCAN WORKLOAD
Prints "N passed, N failed".
"""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, WORKLOAD = (os.path.abspath(a) for a in sys.argv[1:3])
USER = "gilscan-test"
PY = "/usr/bin/python3.11"  # the pyenv Pythons live under /root, which the user cannot enter
TRACEFS = "/sys/kernel/tracing"
PARANOID = "/proc/sys/kernel/perf_event_paranoid"


def as_user(*args, cwd):
    return subprocess.run(["runuser", "-u", USER, "--", *args], capture_output=True, text=True, cwd=cwd)


def tracefs_modes():
    """Every path under tracefs with its mode (to put back)."""
    modes = {}
    for root, dirs, files in os.walk(TRACEFS):
        for n in [root] + [os.path.join(root, f) for f in files]:
            try:
                modes[n] = os.lstat(n).st_mode & 0o7777
            except OSError:
                pass
    return modes


created_user = False
try:
    pwd.getpwnam(USER)
except KeyError:
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    created_user = True
paranoid = open(PARANOID).read().strip()
modes = None
group = "gilscan_python3_11"
with tempfile.TemporaryDirectory() as tmp:
    os.chmod(tmp, 0o755)
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    shutil.chown(work, USER)
    gilscan = os.path.join(tmp, "gilscan")  # where the user can run it
    shutil.copy(GILSCAN, gilscan)
    os.chmod(gilscan, 0o755)
    workload = os.path.join(tmp, "workload.py")
    shutil.copy(WORKLOAD, workload)
    os.chmod(workload, 0o644)
    try:
        open(PARANOID, "w").write("2")
        r = as_user(gilscan, "record", "--gil", "-o", "x.data", "--", PY, workload, "0.1", cwd=work)
        lines = [l for l in r.stderr.splitlines() if l.startswith("  - ")]
        check(r.returncode == 1 and "3 permission(s) missing" in r.stderr and len(lines) == 3,
              f"unprivileged: three lines, one per missing permission ({r.stderr!r})")
        check(any("perf_event_paranoid is 2" in l and "sysctl -w kernel.perf_event_paranoid=-1" in l for l in lines),
              "the paranoid level, with the sysctl that fixes it")
        check(any(f"tracefs ({TRACEFS})" in l and f"chmod -R go+rX {TRACEFS}" in l for l in lines),
              "tracefs, with the chmod that fixes it")
        check(any("uprobe_events" in l and f"sudo gilscan probe {PY}" in l for l in lines),
              "the uprobes, with the gilscan probe that places them")
        check(not os.listdir(work), f"nothing written before perf would start ({os.listdir(work)})")
        r = as_user(gilscan, "record", "-p", "1", "-o", "x.data", cwd=work)
        check(r.returncode == 1 and "process 1 runs as user 0" in r.stderr and "CAP_SYS_PTRACE" in r.stderr,
              f"attach to root's process: the ptrace line ({r.stderr!r})")

        # The fixes, as the lines give them.
        open(PARANOID, "w").write("-1")
        r = subprocess.run([GILSCAN, "probe", PY], capture_output=True, text=True)
        check(r.returncode == 0, f"gilscan probe as root ({r.stderr[-300:]})")
        modes = tracefs_modes()
        subprocess.run(["chmod", "-R", "go+rX", TRACEFS], capture_output=True)
        r = as_user(gilscan, "record", "--gil", "-o", "x.data", "--trace", "t.json", "--summary-json", "s.json",
                    "--", PY, workload, "0.2", cwd=work)
        check(r.returncode == 0 and f"(group {group}, placed by gilscan probe)" in r.stderr,
              f"fixed: the user records, with the probes gilscan probe placed ({r.stderr[-600:]})")
        if r.returncode == 0:
            s = json.load(open(os.path.join(work, "s.json")))
            waiters = [t for t in s["threads"] if (t["gil_wait_us"] or 0) > 1000]
            check(s["gil"]["probe_events"] > 50 and len(waiters) >= 3,
                  f"fixed: the GIL probes fired, 3+ threads wait ({s['gil']['probe_events']}, {len(waiters)})")
        check(os.path.isdir(f"{TRACEFS}/events/{group}"), "the user's run left gilscan probe's probes in place")
    finally:
        if modes:
            for path in sorted(modes, key=len, reverse=True):
                try:
                    os.chmod(path, modes[path])
                except OSError:
                    pass
        subprocess.run([GILSCAN, "probe", "--remove", "--group", group], capture_output=True)
        open(PARANOID, "w").write(paranoid)
        if created_user:
            subprocess.run(["userdel", USER], capture_output=True)
    check(oct(os.stat(TRACEFS).st_mode & 0o777) == oct(modes[TRACEFS]) if modes else False, "tracefs's modes put back")

done("record as an unprivileged user")
