"""GIL blame workload: each thread does one kind of work, so the truth per
function is known from a recording of the GIL uprobes beside it.

Culprits (hold the GIL while others wait):
  hog      a pure-Python loop
  blocker  ctypes.PyDLL(None).usleep: a C call that blocks with the GIL held
  sorter   sorted() of a big list: a long C call on CPU with the GIL held
Innocents (release the GIL):
  napper   time.sleep
  releaser ctypes.CDLL(None).usleep
Contenders: two threads that want the GIL often for a little Python work.

Prints "role native_tid" per thread on stdout (the tests map tids to
roles), then runs for about DURATION seconds (argv[1], default 0.4).
"""
import ctypes
import random
import sys
import threading
import time

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 0.4
deadline = time.monotonic() + DURATION
held = ctypes.PyDLL(None)      # calls keep the GIL
released = ctypes.CDLL(None)   # calls release it
big = [random.random() for _ in range(60000)]


def hog():
    n = 0
    while time.monotonic() < deadline:
        for i in range(3000):
            n += i * i
    return n


def blocker():
    while time.monotonic() < deadline:
        held.usleep(4000)
        time.sleep(0.004)


def sorter():
    while time.monotonic() < deadline:
        sorted(big)
        time.sleep(0.004)


def napper():
    while time.monotonic() < deadline:
        time.sleep(0.003)


def releaser():
    while time.monotonic() < deadline:
        released.usleep(3000)


def contender():
    n = 0
    while time.monotonic() < deadline:
        for i in range(200):
            n += i
        time.sleep(0.0005)
    return n


roles = [hog, blocker, sorter, napper, releaser, contender, contender]
ready = threading.Barrier(len(roles) + 1)


def run(f):
    sys.stdout.write("%s %d\n" % (f.__name__, threading.get_native_id()))
    sys.stdout.flush()
    ready.wait()
    f()


threads = [threading.Thread(target=run, args=(f,)) for f in roles]
for t in threads:
    t.start()
ready.wait()
for t in threads:
    t.join()
