"""Threads that start and exit at different times, contending for the GIL.

usage: python3 lifetimes.py LOG.json

Each worker spins in Python (holding the GIL, switching every 5 ms) or
sleeps, for its own stretch of the run; LOG.json gets each thread's native
id and the CLOCK_MONOTONIC nanoseconds at which its function started and
ended (perf record -k CLOCK_MONOTONIC stamps the recording with the same
clock).
"""
import json
import sys
import threading
import time

life = {}
created = {}


def worker(name, seconds, sleep_share):
    start = time.monotonic_ns()
    end_at = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end_at:
        for _ in range(2000):
            n += 1
        if sleep_share and n % 20000 == 0:
            time.sleep(0.002)
    life[name] = (threading.get_native_id(), start, time.monotonic_ns())


# (name, start after, lives for, sleeps now and then)
plan = [("early", 0.00, 0.15, False), ("short", 0.05, 0.10, True), ("middle", 0.10, 0.40, False),
        ("late", 0.30, 0.35, True), ("last", 0.20, 0.55, False)]
threads = []
t0 = time.monotonic()
for name, after, seconds, sleeps in sorted(plan, key=lambda p: p[1]):
    time.sleep(max(0.0, t0 + after - time.monotonic()))
    t = threading.Thread(target=worker, args=(name, seconds, sleeps), name=name)
    created[name] = time.monotonic_ns()  # the clone follows at once, with the GIL still held here
    t.start()
    threads.append(t)
for t in threads:
    t.join()
time.sleep(0.3)  # the process outlives its threads: their spans must end at their exits
json.dump({name: {"tid": tid, "created_ns": created[name], "start_ns": s, "end_ns": e}
           for name, (tid, s, e) in life.items()}, open(sys.argv[1], "w"))
