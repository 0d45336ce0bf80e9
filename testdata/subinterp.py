# Two threads in subinterpreters that own their GIL (3.12+: PEP 684) and two
# threads in the main interpreter: the sub GILs are each uncontended, the
# main GIL is fought over.
import threading, time
try:
    import _interpreters as interpreters          # 3.13
    def make(): return interpreters.create('isolated')
    def run_in(i, code): interpreters.exec(i, code)
except ImportError:
    import _xxsubinterpreters as interpreters     # 3.12
    def make(): return interpreters.create(isolated=True)
    def run_in(i, code): interpreters.run_string(i, code)
SPIN = "import time\nt = time.monotonic()\nn = 0\nwhile time.monotonic() - t < 0.4:\n    n += 1\n"
def sub():
    i = make()
    run_in(i, SPIN)
    interpreters.destroy(i)
def main_spin():
    exec(SPIN, {})
ts = [threading.Thread(target=sub) for _ in range(2)] + [threading.Thread(target=main_spin) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
