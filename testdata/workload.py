"""Contended GIL workload used to record gilscan's test data.

Threads: two pure-Python spinners (fight for the GIL), one thread that
releases the GIL in C (zlib on a big buffer), one that sleeps, and the main
thread joining them. Runs for about DURATION seconds (argv[1], default 0.3).
"""
import sys
import threading
import time
import zlib

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3
deadline = time.monotonic() + DURATION


def spin():
    n = 0
    while time.monotonic() < deadline:
        for i in range(2000):
            n += i * i
    return n


def compress():
    data = bytes(range(256)) * 4096
    while time.monotonic() < deadline:
        zlib.compress(data, 6)


def sleeper():
    while time.monotonic() < deadline:
        time.sleep(0.005)


threads = [threading.Thread(target=f, name=f.__name__ + str(i))
           for i, f in enumerate([spin, spin, compress, sleeper])]
for t in threads:
    t.start()
for t in threads:
    t.join()
