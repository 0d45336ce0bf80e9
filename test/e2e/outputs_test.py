#!/usr/bin/env python3
"""End-to-end checks of what gilscan FILE writes (run by meson test): write
errors, compressed traces, outputs that are devices or FIFOs, a cut
recording's partial results, names cut inside a UTF-8 character.

usage: outputs_test.py GILSCAN TESTDATA_DIR
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import glob
import gzip
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done, runner  # noqa: E402

GILSCAN, DATA = sys.argv[1], sys.argv[2]

run = runner(GILSCAN)


with tempfile.TemporaryDirectory() as tmp:
    trace, summ = os.path.join(tmp, "trace.json"), os.path.join(tmp, "s.json")
    # The debuginfo cache of every run here: not the user's ~/.cache.
    os.environ["GILSCAN_CACHE_DIR"] = os.path.join(tmp, "cache")

    # A write error in the background writer is an error of the run, not a short trace
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([GILSCAN, os.path.join(DATA, "plain.data"), "-q", "-o", "-"], stdout=full,
                               stderr=subprocess.PIPE, text=True)
        check(r.returncode != 0 and "write failed" in r.stderr, f"-o - into a full device fails loudly ({r.stderr[:200]})")

    # Compressed traces by file name, identical once decompressed
    for ext in ("json.gz", "json.zst"):
        out = os.path.join(tmp, "trace." + ext)
        r = run(os.path.join(DATA, "plain.data"), "-o", out, "-q")
        check(r.returncode == 0 and os.path.getsize(out) > 0, f"-o trace.{ext}")
    plain_trace = os.path.join(tmp, "trace.json")
    run(os.path.join(DATA, "plain.data"), "-o", plain_trace, "-q")
    check(gzip.open(os.path.join(tmp, "trace.json.gz")).read() == open(plain_trace, "rb").read(), ".json.gz content")
    unz = subprocess.run(["zstd", "-dc", os.path.join(tmp, "trace.json.zst")], capture_output=True).stdout
    check(unz == open(plain_trace, "rb").read(), ".json.zst content")

    # Targets that are not regular files are written as they are: a
    # temporary renamed over /dev/null replaced the device node with a file
    # (as root). A private node equal to /dev/null, so that a regression
    # costs this test's node, not the machine's; and a FIFO, read as it is written.
    dev = os.path.join(tmp, "null")
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.close(os.open(dev, os.O_WRONLY))  # a nodev mount makes the node but refuses it
    except OSError:
        print("note: no usable device node here (not root, or a nodev mount): -o /dev/null not checked")
        dev = None
    if dev:
        for j in ("1", "2"):
            r = run(os.path.join(DATA, "plain.data"), "-q", "-j", j, "-o", dev, "--summary-json", dev)
            check(r.returncode == 0 and stat.S_ISCHR(os.lstat(dev).st_mode),
                  f"-o /dev/null (-j {j}) writes to the device and leaves it one ({r.stderr[:200]})")
        check(not glob.glob(os.path.join(tmp, ".null.gilscan-*")), "no temporary beside the device")
    fifo = os.path.join(tmp, "trace.fifo")
    os.mkfifo(fifo)
    for j in ("1", "2"):
        got = []
        reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
        reader.start()
        # A write end of the test's own, held until gilscan is done: the reader
        # then ends whether gilscan wrote into the FIFO or (wrongly) elsewhere.
        ours = os.open(fifo, os.O_WRONLY)
        r = run(os.path.join(DATA, "plain.data"), "-q", "-j", j, "-o", fifo)
        os.close(ours)
        reader.join()
        check(r.returncode == 0 and got == [open(plain_trace, "rb").read()] and stat.S_ISFIFO(os.lstat(fifo).st_mode),
              f"-o FIFO (-j {j}): the whole trace through it, the FIFO left as it was")

    # Truncated: partial results, warning with the byte offset, exit 0
    r = run(os.path.join(DATA, "truncated.data"), "-o", trace)
    check(r.returncode == 0, "truncated file exits 0")
    check("at byte" in r.stderr and "warning" in r.stderr, "truncation warning names the offset")
    check(len(json.load(open(trace))["traceEvents"]) > 10, "truncated file still yields a trace")

    # Names are bytes in a recording, and the kernel cuts a comm at 15 bytes,
    # inside a character if it must: every "python3" of a real recording
    # (comm, paths, cmdline) made the first two bytes of a three-byte
    # character. Each output is valid UTF-8 JSON and shows U+FFFD there (the
    # summary JSON and batch rows used to end the run with a json exception).
    cut = os.path.join(tmp, "cut_comm.data")
    open(cut, "wb").write(open(os.path.join(DATA, "plain.data"), "rb").read().replace(b"python3", b"pytho\xe6\x95"))
    rows_jsonl2, rows_csv2 = os.path.join(tmp, "cut.jsonl"), os.path.join(tmp, "cut.csv")
    r = subprocess.run([GILSCAN, cut, "-o", trace, "--summary-json", summ], capture_output=True)
    check(r.returncode == 0, f"a comm cut inside a character: exits 0 ({r.stderr[-300:]!r})")
    r2 = subprocess.run([GILSCAN, "batch", "--summary", rows_jsonl2, cut], capture_output=True)
    r3 = subprocess.run([GILSCAN, "batch", "--summary", rows_csv2, cut], capture_output=True)
    check(r2.returncode == 0 and r3.returncode == 0, f"batch of it exits 0 ({r2.stderr[-300:]!r})")
    if r.returncode == 0 and r2.returncode == 0 and r3.returncode == 0:
        def utf8(path):
            return open(path, "rb").read().decode("utf-8")  # strict: ill-formed UTF-8 raises
        comms = {e["args"]["name"] for e in json.loads(utf8(trace))["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        check(any(c.startswith("pytho\ufffd ") for c in comms), f"trace: the cut character is U+FFFD ({sorted(comms)[:4]})")
        check("pytho\ufffd" in {t["comm"] for t in json.loads(utf8(summ))["threads"]}, "summary JSON: the same name")
        try:
            table = r.stdout.decode("utf-8")
        except UnicodeDecodeError:
            table = ""
        check("pytho\ufffd " in table, "the table on stdout: UTF-8, the same name")
        rows = [json.loads(line) for line in utf8(rows_jsonl2).splitlines()]
        check(rows and "pytho\ufffd" in {row["comm"] for row in rows}, "batch JSON lines: the same name")
        check("pytho\ufffd" in utf8(rows_csv2), "batch CSV: the same name")

done("outputs")
