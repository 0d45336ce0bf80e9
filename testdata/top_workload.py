"""A program to watch live (gilscan top's tests): two named pure-Python
spinners that fight for the GIL, a named thread that sleeps in short steps
and sums a little in between, and a main thread that waits for them. On
SIGINT (Ctrl-C, gilscan top's q or --duration) it stops them, says so and
exits 3. Runs for about DURATION seconds (argv[1], default 30).
"""
import sys
import threading
import time

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
deadline = time.monotonic() + DURATION
stop = threading.Event()


def spin():
    n = 0
    while time.monotonic() < deadline and not stop.is_set():
        for i in range(2000):
            n += i * i
    return n


def nap():
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.01)
        sum(range(20000))


threads = [threading.Thread(target=spin, name=f"spinner-{i}") for i in range(2)]
threads.append(threading.Thread(target=nap, name="napper"))
for t in threads:
    t.start()
try:
    while any(t.is_alive() for t in threads):
        time.sleep(0.05)
except KeyboardInterrupt:
    stop.set()
    for t in threads:
        t.join()
    print("interrupted", flush=True)
    sys.exit(3)
print("done", flush=True)
