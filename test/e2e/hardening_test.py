#!/usr/bin/env python3
"""gilscan as root on other people's files: damaged recordings, hostile
file-system states, signals, write errors (run by meson test).

usage: hardening_test.py GILSCAN PERFGEN TESTDATA_DIR
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import ctypes
import glob
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done, runner  # noqa: E402

GILSCAN, PERFGEN, DATA = (os.path.abspath(a) for a in sys.argv[1:4])

run = runner(GILSCAN)


def analysing_process(batch, recording, sig=None):
    """The pid of the process batch started to analyse `recording` (sent `sig` at once), or None
    once batch has ended or a minute has passed."""
    deadline = time.time() + 60
    while time.time() < deadline and batch.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"__batch-one" in cmd and recording.encode() in cmd:
                if sig is not None:
                    os.kill(int(pid), sig)
                return int(pid)
        time.sleep(0.005)
    return None


def gone_within(pid, seconds):
    """Whether process `pid` has ended (or is a zombie) within `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def ptrace_stop(pid):
    """Holds every thread of process `pid` in a ptrace stop: no signal but
    SIGKILL ends it while this process lives. Returns the threads held."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    held, tried = [], set()
    while True:  # again until no thread is new: one not yet held may have started another
        try:
            new = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - tried
        except OSError:
            return held
        if not new:
            return held
        for tid in new:
            tried.add(tid)
            if libc.ptrace(16, tid, None, None) == 0:  # PTRACE_ATTACH: the thread stops, never resumed
                held.append(tid)


def kill_quietly(pid):
    """SIGKILL to pid when there is one and it has not ended."""
    try:
        if pid:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def reap_traced(held):
    """Collects what the held threads report (their deaths above all:
    batch, their parent, can wait for them only once their tracer has)."""
    for tid in list(held):
        try:
            if os.waitpid(tid, os.WNOHANG | 0x40000000)[0] == tid and not os.path.exists(f"/proc/{tid}"):
                held.remove(tid)
        except ChildProcessError:
            held.remove(tid)


def pipe_records(b):
    """(offset, type) of each record of a pipe-mode file."""
    pos, out = 16, []
    while pos + 8 <= len(b):
        t, _, size = struct.unpack_from("<IHH", b, pos)
        out.append((pos, t))
        nxt = pos + size
        if t == 66:  # HEADER_TRACING_DATA: its payload follows the record
            nxt += struct.unpack_from("<I", b, pos + 8)[0]
        if size < 8:
            break
        pos = nxt
    return out


def with_format_offset(path, field, offset):
    """A real pipe-mode recording whose sched_switch format puts `field` at `offset`."""
    b = bytearray(open(path, "rb").read())
    i = b.find(field.encode() + b";\toffset:")
    assert i > 0
    j = b.find(b";", i + len(field) + 2)
    old = b[i:j]
    new = field.encode() + b";\toffset:" + str(offset).encode()
    start = b.rfind(b"name: ", 0, i)
    (n,) = struct.unpack_from("<Q", b, start - 8)
    struct.pack_into("<Q", b, start - 8, n + len(new) - len(old))
    for pos, t in pipe_records(b):
        if t == 66:
            (size,) = struct.unpack_from("<I", b, pos + 8)
            struct.pack_into("<I", b, pos + 8, size + len(new) - len(old))
    b[i:j] = new
    return bytes(b)


with tempfile.TemporaryDirectory() as tmp:
    os.environ["GILSCAN_CACHE_DIR"] = os.path.join(tmp, "cache")
    plain = os.path.join(DATA, "plain.data")

    # --- Damaged recordings -------------------------------------------------
    # A field at offset + size past 2^32 (it wrapped to a small end): SIGSEGV
    # in the decoder, and a whole batch with it.
    arch = os.path.join(tmp, "arch")
    os.makedirs(arch)
    wrapped = os.path.join(arch, "wrapped.data")
    open(wrapped, "wb").write(with_format_offset(os.path.join(DATA, "pipe.data"), "pid_t next_pid", 4294967292))
    shutil.copy(plain, os.path.join(arch, "plain.data"))
    r = run(wrapped, "-q", "-o", os.path.join(tmp, "w.json"))
    check(r.returncode == 0 and "too short for their format" in r.stderr,
          f"a format field past 2^32: analysed, its field errors said ({r.returncode}, {r.stderr[-300:]})")
    r = run("batch", "--summary", os.path.join(tmp, "rows.jsonl"), arch)
    rows = [json.loads(ln) for ln in open(os.path.join(tmp, "rows.jsonl"))] if r.returncode == 0 else []
    check(r.returncode == 0 and {os.path.basename(x["recording"]) for x in rows} == {"wrapped.data", "plain.data"},
          f"batch with it: both recordings have rows ({r.returncode}, {r.stderr[-300:]})")

    # A recording whose analysis crashes takes only its own process down:
    # the analysing process of a long recording is killed with SIGSEGV.
    # Under AddressSanitizer the signal must meet the kernel's default action:
    # ASan's handler turns it into "exit status 1", and one that arrives
    # while ASan initialises spins for ever on a lock the interrupted
    # initialisation holds (handle_segv=0 leaves SIGSEGV to the kernel).
    big = os.path.join(arch, "big.data")
    subprocess.run([PERFGEN, "--cpus", "4", "--threads", "64", "--events", "3000000", "-o", big], check=True,
                   capture_output=True)
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":handle_segv=0")
    p = subprocess.Popen([GILSCAN, "batch", "-j", "1", "--summary", os.path.join(tmp, "rows2.jsonl"), arch],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    child = analysing_process(p, big)
    killed = child is not None
    if killed:
        os.kill(child, signal.SIGSEGV)
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        kill_quietly(child)
        out, err = p.communicate()
        err += f"\n(batch still running after 300 s; its analysing process {child} was sent SIGSEGV)"
    rows = [json.loads(ln) for ln in open(os.path.join(tmp, "rows2.jsonl"))] if p.returncode == 0 else []
    crashed = [x for x in rows if x["recording"] == big]
    check(killed and p.returncode == 0 and len(crashed) == 1 and "crashed" in (crashed[0]["error"] or "")
          and "Segmentation fault" in crashed[0]["error"],
          f"batch: a crashed analysis is that recording's error row ({killed}, {p.returncode}, {crashed}, {err[-300:]})")
    check(any(x["recording"].endswith("plain.data") and x["tid"] for x in rows), "batch: the others analysed")

    # batch killed outright (kill -9, a cluster's time limit) takes its
    # analysing process with it: stopped before it could finish, then
    # continued once batch is gone, it dies of the SIGTERM its parent's death
    # sent (its handler removes its temporaries) and writes no trace.
    traces = os.path.join(tmp, "killed-traces")
    p = subprocess.Popen([GILSCAN, "batch", "-j", "1", "--traces", traces, "--summary", os.path.join(tmp, "rows3.jsonl"),
                          big], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = analysing_process(p, big, signal.SIGSTOP)
    p.kill()
    p.wait()
    gone = None
    if child is not None:
        os.kill(child, signal.SIGCONT)
        gone = gone_within(child, 30)
    left = sorted(os.listdir(traces)) if os.path.isdir(traces) else []
    check(child is not None and gone and not left,
          f"batch killed: its analysis ends with it, no trace or temporary left ({child}, {gone}, {left})")

    # --timeout: an analysis still running is stopped, its row says so, and
    # the batch goes on. A stopped process gets SIGTERM with SIGCONT (its
    # handler removes its temporaries); one held so that SIGTERM cannot act
    # (a ptrace stop here, a deadlock in the wild) gets SIGKILL 5 s later.
    for hold in ("SIGSTOP", "ptrace"):
        traces = os.path.join(tmp, f"timeout-{hold}")
        start = time.time()
        p = subprocess.Popen([GILSCAN, "batch", "-j", "1", "--timeout", "1", "--traces", traces, "--summary",
                              os.path.join(tmp, "rows4.jsonl"), arch], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        child = analysing_process(p, big, signal.SIGSTOP if hold == "SIGSTOP" else None)
        held = ptrace_stop(child) if hold == "ptrace" and child else []
        n_held = len(held)
        while p.poll() is None and time.time() - start < 60:
            reap_traced(held)
            time.sleep(0.01)
        took = time.time() - start
        if p.poll() is None:  # batch did not stop it: the check below fails
            p.kill()
            kill_quietly(child)
            reap_traced(held)
        out, err = p.communicate(timeout=60)
        rows = [json.loads(ln) for ln in open(os.path.join(tmp, "rows4.jsonl"))] if p.returncode == 0 else []
        big_error = "".join(x["error"] or "" for x in rows if x["recording"] == big)
        killed = hold == "ptrace"
        check(child and (n_held or not killed) and "ran past --timeout 1 s and was stopped" in big_error
              and ("(SIGKILL)" in big_error) == killed and (5.5 < took < 30 if killed else took < 5),
              f"batch --timeout, analysis held by {hold}: stopped, its row says how ({child}, {n_held}, {took:.1f} s, "
              f"{big_error!r}, {err[-300:]})")
        check(any(x["recording"].endswith("plain.data") and x["tid"] for x in rows),
              f"batch --timeout, {hold}: the others analysed")
        left = [n for n in os.listdir(traces) if "big" in n or n.startswith(".")]
        check(not left, f"batch --timeout, {hold}: no trace or temporary of the stopped analysis ({left})")
    os.remove(big)

    # A FIFO named as a recording is refused at once; open() would wait for
    # a writer for ever.
    fifo = os.path.join(tmp, "fifo.data")
    os.mkfifo(fifo)
    try:
        r = run(fifo, timeout=60)
        check(r.returncode != 0 and "not a regular file" in r.stderr, f"a FIFO: refused ({r.returncode}, {r.stderr[-300:]})")
        r = run("batch", fifo, timeout=60)
        check("not a regular file" in r.stderr, f"batch, a FIFO: its row's error ({r.returncode}, {r.stderr[-300:]})")
        fifo_zst = os.path.join(tmp, "fifo.data.zst")
        os.mkfifo(fifo_zst)
        r = run("batch", fifo_zst, timeout=60)
        check("not a regular file" in r.stderr, f"batch, a FIFO to unpack: its row's error ({r.returncode}, {r.stderr[-300:]})")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO: gilscan waited for a writer")

    # A decompression bomb: 2 GiB of zeros in a few kB. --max-unpacked
    # refuses it before it fills the disk, and no unpacked copy is left.
    bomb = os.path.join(tmp, "bomb", "bomb.data.zst")
    os.makedirs(os.path.dirname(bomb))
    subprocess.run(f"head -c 2G /dev/zero | zstd -q -19 -o {bomb}", shell=True, check=True)
    unpack_dir = os.path.join(tmp, "unpack")
    os.makedirs(unpack_dir)
    r = run("batch", "--max-unpacked", "64", os.path.dirname(bomb), env={**os.environ, "TMPDIR": unpack_dir})
    check(r.returncode == 1 and "unpacks to more than 64 MiB" in r.stderr,
          f"a zstd bomb: refused by --max-unpacked ({r.returncode}, {r.stderr[-300:]})")
    check(os.listdir(unpack_dir) == [], f"nothing left under $TMPDIR ({os.listdir(unpack_dir)})")
    # A copy cut short is an error, never analysed as if whole.
    cut = os.path.join(tmp, "cut", "cut.data.zst")
    os.makedirs(os.path.dirname(cut))
    full = subprocess.run(["zstd", "-q", "-c", plain], capture_output=True, check=True).stdout
    open(cut, "wb").write(full[: len(full) // 2])
    r = run("batch", os.path.dirname(cut))
    check(r.returncode == 1 and "cut short" in r.stderr, f"a cut archive is an error ({r.stderr[-200:]})")
    # Unpacked where $TMPDIR says, and the analysis reads it whole.
    good = os.path.join(tmp, "good", "plain.data.zst")
    os.makedirs(os.path.dirname(good))
    open(good, "wb").write(full)
    r = run("batch", os.path.dirname(good), env={**os.environ, "TMPDIR": unpack_dir})
    check(r.returncode == 0 and '"recording":"' + good in r.stdout, f"an archive analysed ({r.stderr[-200:]})")

    # --- Never over an input --------------------------------------------------
    rec = os.path.join(tmp, "x.data")
    shutil.copy(plain, rec)
    os.symlink(rec, os.path.join(tmp, "link.json"))
    before = open(rec, "rb").read()
    for opt, path in (("-o", rec), ("--summary-json", rec), ("-o", os.path.join(tmp, ".", "x.data")),
                      ("-o", os.path.join(tmp, "link.json"))):
        r = run(rec, opt, path)
        check(r.returncode != 0 and "refusing to write over a recording" in r.stderr, f"{opt} {path}: refused")
    r = run("batch", "--summary", rec, rec)
    check(r.returncode != 0 and "refusing" in r.stderr, "batch --summary over an input: refused")
    r = run(rec, "-o", os.path.join(tmp, "t.json"), "--summary-json", os.path.join(tmp, "t.json"))
    check(r.returncode != 0 and "name the same file" in r.stderr, "-o X --summary-json X: refused")
    check(open(rec, "rb").read() == before and not os.path.exists(os.path.join(tmp, "t.json")),
          "the recording intact, nothing written")

    # --- Write errors ---------------------------------------------------------
    for args, what in (((rec, "-o", "/dev/full"), "-o /dev/full"),
                       ((rec, "--summary-json", "/dev/full", "-q"), "--summary-json /dev/full")):
        r = run(*args)
        check(r.returncode != 0 and "No space left" in r.stderr, f"{what}: an error")
    r = run(rec, "-o", os.path.join(tmp, "t2.json"), "--summary-json", "/dev/full", "-q")
    check(r.returncode != 0 and "was written" in r.stderr and os.path.exists(os.path.join(tmp, "t2.json")),
          f"the summary failing after the trace: said so ({r.stderr[-200:]})")
    for cmd, what in ((f"'{GILSCAN}' '{rec}' > /dev/full", "the table to a full stdout"),
                      (f"'{GILSCAN}' '{rec}' >&-", "the table to a closed stdout"),
                      (f"'{GILSCAN}' batch '{rec}' > /dev/full", "batch's table to a full stdout")):
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        check(r.returncode != 0 and "write failed" in r.stderr, f"{what}: an error ({r.returncode}, {r.stderr[-200:]})")
    # A trace directory on a full disk: the batch says a trace was not written.
    full_fs = os.path.join(tmp, "fullfs")
    os.makedirs(full_fs)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", full_fs]).returncode == 0:
        try:
            r = run("batch", "--traces", full_fs, rec)
            check(r.returncode == 1 and "not written" in r.stderr and "No space left" in r.stderr,
                  f"batch: a trace that cannot be written fails the batch ({r.returncode}, {r.stderr[-300:]})")
        finally:
            subprocess.run(["umount", full_fs])

    # --- Signals: no temporary left -------------------------------------------
    sched = os.path.join(tmp, "sched.data")
    subprocess.run([PERFGEN, "--cpus", "8", "--threads", "200", "--events", "4000000", "-o", sched], check=True,
                   capture_output=True)
    outdir = os.path.join(tmp, "sig")
    os.makedirs(outdir)
    for sig in (signal.SIGINT, signal.SIGTERM):
        p = subprocess.Popen([GILSCAN, sched, "-q", "-j", "1", "--running", "-o", os.path.join(outdir, "t.json"),
                              "--summary-json", os.path.join(outdir, "s.json")], stderr=subprocess.PIPE)
        time.sleep(0.4)
        p.send_signal(sig)
        p.communicate()
        check(p.returncode == -sig, f"{sig.name}: gilscan dies of it ({p.returncode})")
        check(os.listdir(outdir) in ([], ["t.json", "s.json"], ["s.json", "t.json"]),
              f"{sig.name}: no temporary, no half-written output ({os.listdir(outdir)})")
        for f in os.listdir(outdir):
            os.remove(f"{outdir}/{f}")
    os.remove(sched)

    # --- Never touch what gilscan does not own ----------------------------------
    # (A name planted where the old temporary went is tested in temp_files_test.cc.)
    # --cache-dir ~ must not prune the home directory: the cache lives in
    # its own subdirectory, and only gilscan's entries are ever removed.
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    for name in ("0123abcd.debug", ".0123abcd.debug.AbCdEf", "names-0123", "notes.txt", ".bashrc"):
        open(os.path.join(home, name), "w").write("x" * 4096)
        os.utime(os.path.join(home, name), (time.time() - 9 * 86400, time.time() - 9 * 86400))
    r = subprocess.run([GILSCAN, os.path.join(DATA, "stacks_py311.data"), "-q", "--sleep-stacks", "8", "--cache-dir",
                        home], capture_output=True, text=True, env={**os.environ, "GILSCAN_CACHE_MAX_MB": "1"})
    check(r.returncode == 0 and sorted(os.listdir(home)) == sorted(
        ["0123abcd.debug", ".0123abcd.debug.AbCdEf", "names-0123", "notes.txt", ".bashrc", "gilscan-cache"]),
          f"--cache-dir ~: nothing of the home directory removed ({sorted(os.listdir(home))})")
    check(glob.glob(os.path.join(home, "gilscan-cache", "names-*")), "the entries in DIR/gilscan-cache")
    r = run("batch", "--no-cache", "--summary", os.path.join(tmp, "nc.jsonl"), os.path.join(DATA, "stacks_py311.data"),
            env={**os.environ, "GILSCAN_CACHE_DIR": os.path.join(tmp, "batch-cache")})
    check(r.returncode == 0 and not os.path.exists(os.path.join(tmp, "batch-cache")), "batch --no-cache writes no cache")

    # No shell: an interpreter path with a quote is a path.
    weird = os.path.join(tmp, "a'b; touch PWNED")
    os.makedirs(weird)
    py = shutil.which("python3") or "/usr/bin/python3"
    py = os.path.realpath(py)
    os.symlink(py, os.path.join(weird, "python3"))
    script = os.path.join(tmp, "shebang.py")
    open(script, "w").write(f"#!{weird}/python3\nprint(1)\n")
    os.chmod(script, 0o755)
    for target in (os.path.join(weird, "python3"), script):
        r = subprocess.run([GILSCAN, "probe", "--print", target], capture_output=True, text=True, cwd=tmp)
        check(not os.path.exists(os.path.join(tmp, "PWNED")) and not os.path.exists(os.path.join(weird, "PWNED")),
              f"probe --print {target!r}: no command run ({r.returncode})")
    # perf maps: a FIFO, /dev/zero by a symlink, another user's file.
    maps = os.path.join(tmp, "maps")
    os.makedirs(maps)
    xperf = os.path.join(DATA, "stacks_py312_perfmap.data")
    pids = {t["pid"] for t in json.loads(run(xperf, "-q", "--summary-json", "-").stdout)["threads"]}
    for pid in pids:
        os.mkfifo(os.path.join(maps, f"perf-{pid}.map"))
    r = run(xperf, "-q", "--gil-functions", "--perf-maps", maps, timeout=120)
    check(r.returncode == 0 and "not a regular file" in r.stderr, f"a FIFO perf map: skipped, said ({r.stderr[-300:]})")
    for pid in pids:
        os.remove(os.path.join(maps, f"perf-{pid}.map"))
        os.symlink("/dev/zero", os.path.join(maps, f"perf-{pid}.map"))
    r = run(xperf, "-q", "--gil-functions", "--perf-maps", maps, timeout=120)
    check(r.returncode == 0 and "symbolic link" in r.stderr, f"a symlink to /dev/zero: skipped ({r.stderr[-300:]})")
    src_maps = glob.glob(os.path.join(DATA, "perf-maps", "perf-*.map"))
    for pid in pids:
        os.remove(os.path.join(maps, f"perf-{pid}.map"))
    for m in src_maps:
        dst = os.path.join(maps, os.path.basename(m))
        shutil.copy(m, dst)
        os.chown(dst, 12345, 12345)
    r = run(xperf, "-q", "--gil-functions", "--perf-maps", maps, timeout=120)
    check(not src_maps or (r.returncode == 0 and "owned by uid 12345" in r.stderr),
          f"another user's perf map: not trusted ({r.stderr[-300:]})")

    # --- Numbers, checked whole --------------------------------------------------
    for args in (("--pid", "4294967297"), ("--pid", "2147483648"), ("--pid", "99999999999999999999"),
                 ("-j", "2x"), ("-j", ""), ("--sleep-stacks", "8k")):
        r = run(rec, *args)
        check(r.returncode == 2 and "takes a whole number" in r.stderr, f"{' '.join(args)}: a usage error")
    for args in (("-j", "2x"), ("-j", "-1"), ("--max-unpacked", "1e9")):
        r = run("batch", *args, rec)
        check(r.returncode == 2 and "takes a whole number" in r.stderr, f"batch {' '.join(args)}: a usage error")

done("hardening")
