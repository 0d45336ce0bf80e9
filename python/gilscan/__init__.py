"""gilscan from Python.

    import gilscan
    summary = gilscan.analyse("perf.data")          # the --summary-json of a recording, as a dict
    with gilscan.Recording() as rec:                 # this process, recorded with gilscan record -p
        work()
    rec.summary, rec.table                           # its summary, and the table gilscan prints

The Jupyter magic (%load_ext gilscan, then %%gilscan over a cell) is built on
both (gilscan.magic). Each runs the `gilscan` command installed beside this
module (docs/python.md).
"""
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time

__all__ = ["GilscanError", "Recording", "analyse", "executable", "name_threads"]


class GilscanError(RuntimeError):
    """gilscan could not do what was asked; the message is gilscan's own."""


def executable():
    """The gilscan command installed with this module, else the one on PATH."""
    beside = os.path.join(sysconfig.get_path("scripts"), "gilscan")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("gilscan")
    if found:
        return found
    raise GilscanError("the gilscan command is not installed (pip install ., or put it on PATH)")


def analyse(path, *options, trace=None):
    """The summary of the recording at path, as `gilscan PATH --summary-json
    FILE` writes it (docs/usage.md): a dict with "threads", "gil", "warnings",
    ... options are further command-line options ("--gil-evidence",
    "stacks"); trace, a path, also writes the Chrome trace there."""
    with tempfile.TemporaryDirectory(prefix="gilscan-") as tmp:
        out = os.path.join(tmp, "summary.json")
        args = [executable(), os.fspath(path), "-q", "--summary-json", out, *options]
        if trace is not None:
            args += ["-o", os.fspath(trace)]
        r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if r.returncode != 0:
            raise GilscanError(r.stderr.strip() or f"gilscan exited with status {r.returncode}")
        with open(out) as f:
            return json.load(f)


def _set_os_name(native_id, name):
    """The OS name of a thread of this process (the first 15 bytes, whole
    UTF-8 characters), as gilscan record's startup hook sets it."""
    data = name.encode("utf-8", "replace")[:15].decode("utf-8", "ignore").encode("utf-8")
    try:
        with open(f"/proc/self/task/{native_id}/comm", "wb") as f:
            f.write(data)
    except OSError:
        pass


_patched = False


def name_threads():
    """Names this process's threads' OS threads after their threading names,
    now and as new ones start (CPython before 3.14 leaves them all named
    after the process), so that a recording of it shows them: what gilscan
    record's startup hook does for a program it starts, for a process that
    is already running (a Jupyter kernel). The main thread keeps its name."""
    global _patched
    import sys
    import threading

    if sys.version_info >= (3, 14):
        return
    for t in threading.enumerate():
        if t is not threading.main_thread() and getattr(t, "native_id", None):
            _set_os_name(t.native_id, t.name)
    if _patched:
        return
    started = threading.Thread._bootstrap_inner

    def bootstrap_inner(self):
        _set_os_name(threading.get_native_id(), self.name)
        return started(self)

    threading.Thread._bootstrap_inner = bootstrap_inner
    _patched = True


class Recording:
    """Records a running process (this one by default) with `gilscan record
    -p PID` while a with-block runs, then analyses it: .summary (the dict
    analyse() returns), .table (gilscan's table as text), .trace (the Chrome
    trace's path, in .directory, which is kept). options are gilscan
    record's (["--stacks"], ["--blame"]); timeout bounds the wait for perf
    to start. Recording this process, its threads are named first
    (name_threads; thread_names=False leaves them as they are)."""

    def __init__(self, pid=None, options=(), directory=None, timeout=60.0, thread_names=True):
        self.pid = os.getpid() if pid is None else pid
        if thread_names and self.pid == os.getpid():
            name_threads()
        self.options = list(options)
        self.directory = directory or tempfile.mkdtemp(prefix="gilscan-record-")
        self.timeout = timeout
        self.data = os.path.join(self.directory, "perf.data")
        self.trace = os.path.join(self.directory, "trace.json")
        self.summary = self.table = None
        self.messages = ""
        self._proc = None

    def __enter__(self):
        summary, table = (os.path.join(self.directory, n) for n in ("summary.json", "table.txt"))
        args = [executable(), "record", "-p", str(self.pid), "-o", self.data, "--trace", self.trace,
                "--summary-json", summary, "--summary", table, *self.options]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        # gilscan record says "gilscan: recording ..." once perf records.
        end, seen = time.monotonic() + self.timeout, []
        for line in self._proc.stderr:
            seen.append(line)
            if line.startswith("gilscan: recording"):
                return self
            if time.monotonic() > end:
                break
        self._proc.kill()
        self._proc.wait()
        raise GilscanError("".join(seen).strip() or "gilscan record did not start")

    def __exit__(self, *exc):
        self._proc.send_signal(signal.SIGINT)  # as Ctrl-C: stop recording, analyse
        rest = self._proc.stderr.read()
        status = self._proc.wait()
        self.messages = rest
        if status != 0:
            raise GilscanError(rest.strip() or f"gilscan record exited with status {status}")
        with open(os.path.join(self.directory, "summary.json")) as f:
            self.summary = json.load(f)
        with open(os.path.join(self.directory, "table.txt")) as f:
            self.table = f.read()
        return False


def load_ipython_extension(ipython):
    """%load_ext gilscan: the %gilscan and %%gilscan magics (gilscan.magic)."""
    from .magic import GilscanMagics

    ipython.register_magics(GilscanMagics)
