"""A threaded workload that traces its own function calls into a file laid
out as VizTracer writes one (VizTracer itself is not in Debian's archive:
this stands in for `viztracer -o FILE workload.py`).

    python3 viztracer_like.py OUT.json

The layout, as VizTracer's snaptrace module writes it: one "process_name"
metadata event on (pid, pid) named after the script, one "thread_name" per
thread on (pid, native tid) named after its `threading` name, and one
complete event ("ph":"X", "cat":"FEE") per function call on the thread's
row (pid, native tid), its ts and dur in microseconds of CLOCK_MONOTONIC
(VizTracer calibrates its TSC readings to that clock), then
"viztracer_metadata". Python calls are named "f (file:line)", calls into C
"module.name", as VizTracer names them. Calls still open at the end are
left out, as VizTracer leaves them.

The workload: three threads named worker-1..3, each spinning on the CPU
(a few ms, the GIL contended) and sleeping 20 ms in time.sleep, ten times over.
"""
import json
import os
import sys
import threading
import time

OUT = sys.argv[1]
events = []          # complete events, appended under the GIL (list.append is atomic)
names = {}           # native tid -> threading name
PID = os.getpid()


def tracer():
    stack = []
    tid = threading.get_native_id()
    names[tid] = threading.current_thread().name

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            stack.append(time.monotonic_ns())
            return
        if event not in ("return", "c_return", "c_exception") or not stack:
            return
        start = stack.pop()
        end = time.monotonic_ns()
        if event == "return":
            code = frame.f_code
            name = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        else:
            module = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__name__
            name = f"{module}.{arg.__name__}"
        events.append({"ph": "X", "cat": "FEE", "name": name, "pid": PID, "tid": tid,
                       "ts": start / 1000, "dur": (end - start) / 1000})
    return profile


def bootstrap(frame, event, arg):
    """A new thread's first event (threading.setprofile): its own profiler from here on."""
    profile = tracer()
    sys.setprofile(profile)
    profile(frame, event, arg)


def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x


def work():
    for _ in range(10):
        spin(200_000)
        time.sleep(0.02)


def main():
    threading.setprofile(bootstrap)
    sys.setprofile(tracer())
    threads = [threading.Thread(target=work, name=f"worker-{i}") for i in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


main()
sys.setprofile(None)
meta = [{"ph": "M", "pid": PID, "tid": PID, "name": "process_name", "args": {"name": sys.argv[0]}}]
meta += [{"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": name}}
         for tid, name in names.items()]
with open(OUT, "w") as f:
    json.dump({"traceEvents": meta + events,
               "viztracer_metadata": {"version": "1.0.0", "overflow": False}}, f)
