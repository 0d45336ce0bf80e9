"""Readers and spinners: file I/O on Debian's python3.11 releases the GIL
from copies of drop_gil inlined into _Py_read and others, where no probe is.

usage: python3 io_readers.py [SECONDS]

Two threads read a file in 4 KiB os.read calls (each releases and takes
the GIL), two spin in Python; the run lasts SECONDS (default 0.3).
"""
import os
import sys
import tempfile
import threading
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3
deadline = time.monotonic() + SECONDS
with tempfile.NamedTemporaryFile(delete=False) as f:
    f.write(os.urandom(1 << 20))
    path = f.name


def reader():
    fd = os.open(path, os.O_RDONLY)
    while time.monotonic() < deadline:
        if not os.read(fd, 4096):
            os.lseek(fd, 0, os.SEEK_SET)
    os.close(fd)


def spinner():
    n = 0
    while time.monotonic() < deadline:
        for i in range(1000):
            n += i
    return n


threads = [threading.Thread(target=f) for f in (reader, reader, spinner, spinner)]
for t in threads:
    t.start()
for t in threads:
    t.join()
os.unlink(path)
