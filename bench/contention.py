"""A GIL-contended Python workload for bench/run's real --call-graph dwarf recording.

Three pure-Python spinners, two threads compressing with zlib (which
releases the GIL) and two that sleep, with a short switch interval: many
GIL hand-offs and sleeps per second, each sched_switch carrying perf's
default 8 KiB DWARF user stack. Runs for argv[1] seconds (default 1).
"""
import sys
import threading
import time
import zlib

sys.setswitchinterval(0.0002)
deadline = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)


def spin():
    n = 0
    while time.monotonic() < deadline:
        for i in range(200):
            n += i * i


def compress():
    data = bytes(range(256)) * 256
    while time.monotonic() < deadline:
        zlib.compress(data, 6)


def sleeper():
    while time.monotonic() < deadline:
        time.sleep(0.001)


threads = [threading.Thread(target=f) for f in (spin, spin, spin, compress, compress, sleeper, sleeper)]
for t in threads:
    t.start()
for t in threads:
    t.join()
