"""testdata/workload.py for Python 2 (no time.monotonic, str is bytes).

Threads: two pure-Python spinners (fight for the GIL), one thread that
releases the GIL in C (zlib on a big buffer), one that sleeps, a pair
contending for a threading.Lock (sleeps in PyThread_acquire_lock that are
not GIL waits: the lock is held across a sleep), and the main thread
joining them. Runs for about DURATION seconds (argv[1], default 0.3).
"""
import sys
import threading
import time
import zlib

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3
deadline = time.time() + DURATION
lock = threading.Lock()


def spin():
    n = 0
    while time.time() < deadline:
        for i in range(2000):
            n += i * i
    return n


def compress():
    data = "".join(chr(i) for i in range(256)) * 4096
    while time.time() < deadline:
        zlib.compress(data, 6)


def sleeper():
    while time.time() < deadline:
        time.sleep(0.005)


def holder():
    while time.time() < deadline:
        with lock:
            time.sleep(0.003)
        time.sleep(0.001)


def waiter():
    while time.time() < deadline:
        with lock:
            pass


threads = [threading.Thread(target=f, name=f.__name__ + str(i))
           for i, f in enumerate([spin, spin, compress, sleeper, holder, waiter])]
for t in threads:
    t.start()
for t in threads:
    t.join()
