#!/usr/bin/env python3
"""Golden expectations for gilscan, computed independently from `perf script`.

perf's own decoder turns the recording into text; this script applies the
documented timeline rules (docs/figures.md, "Thread states") to that text and writes
the decoded facts gilscan must reproduce: event counts per name, and per
monitored thread its sleep count/total and D count/total, in nanoseconds.

    test/e2e/golden_expect.py testdata/plain.data > testdata/plain.expected.json
    test/e2e/golden_expect.py testdata/plain.data --time 0.1,0.2   # a window, as gilscan --time

Rules mirrored here (the spec, restated on perf's text):
- a thread is "monitored" once it is the current task of some sample;
- a sleep (prev_state S) or D wait starts at the thread's switch-out and ends
  at the first sched_waking / sched_wakeup / sched_wakeup_new naming it or
  switch-in of it after that; still open at the last sample: cut there;
- a waking traced before the switch-out it races (the kernel's ttwu on
  another CPU / __schedule) changes nothing here: the wake-up waits for the
  switch, then enqueues the task, and its sched_wakeup ends the sleep;
- a woken or preempted thread seen as the current task of a sample is
  running from then on (its switch-in was not recorded);
- a sleeping (S, D or other) thread seen as the current task of a sample
  other than its switch-out is running from then on, its sleep ended there
  (neither its wake-up nor its switch-in was recorded);
- a thread's state ends at its exit, the first of PERF_RECORD_EXIT (perf
  script --show-task-events) and sched:sched_process_exit naming it: a sleep
  open then ends there, and nothing after it changes the thread.
GIL uprobes: per thread, wait = take_gil entry -> return, held = return ->
next drop_gil entry. Per GIL ("gils"): a process's GILs are told apart by the
take_gil entry's gil= address (subinterpreters with their own GIL, 3.12+);
the return and drop act on the GIL of the thread's last take; without
addresses a process has one GIL. Held = some thread holds it, contended =
held while another waits, waiting = some thread waits; the span is its
first to last probe event, and what is open at the end runs to the last
timestamp.
--time START,STOP (seconds from the first sample, either may be empty; or
@LO,HI, times on the recording's clock in ns):
every interval above is cut to [first + START, first + STOP); a sleep, D
wait or event outside it is not counted (an instant sleep counts where it
is); a GIL's span is cut to it, and its most waiters are those of changes
inside it and of the count it opens with.
"""
import json
import re
import subprocess
import sys

DEBUG = int(__import__('os').environ.get('GOLDEN_DEBUG_TID', '0'))
# perf record --switch-events: a switch-in, in the task's own context.
SWITCH_IN = re.compile(r"^\s*.*?\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+"
                       r"(?P<sec>\d+)\.(?P<ns>\d{9}):\s+PERF_RECORD_SWITCH(?:_CPU_WIDE)? IN\b")
LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+"
                  r"(?P<sec>\d+)\.(?P<ns>\d{9}):\s+(?P<event>\S+):\s*(?P<rest>.*)$")


def fields(rest):
    out = {}
    for m in re.finditer(r"(\w+)=(\S+)", rest):
        out[m.group(1)] = m.group(2)
    return out


def lost_stats(path):
    """LOST records and LOST_SAMPLES totals as `perf report --stats` counts them."""
    text = subprocess.run(["perf", "report", "-i", path, "--stats"], check=True, capture_output=True,
                          text=True).stdout
    lost_records, lost_samples, per_event = 0, 0, False
    for line in text.splitlines():
        m = re.match(r"\s*(LOST|LOST_SAMPLES) events:\s+(\d+)", line)
        if line.strip().endswith("stats:") and not line.startswith("Aggregated"):
            per_event = True
        if not m:
            continue
        if m.group(1) == "LOST" and not per_event:
            lost_records = int(m.group(2))
        elif m.group(1) == "LOST_SAMPLES" and per_event:
            lost_samples += int(m.group(2))  # per-event sections hold the sample totals
    # Per CPU, as perf script --show-lost-events prints the LOST records.
    per_cpu = {}
    text = subprocess.run(["perf", "script", "-i", path, "--show-lost-events", "-F", "cpu,event"], check=True,
                          capture_output=True, text=True).stdout
    for m in re.finditer(r"\[(\d+)\]\s+PERF_RECORD_LOST lost (\d+)", text):
        per_cpu[str(int(m.group(1)))] = per_cpu.get(str(int(m.group(1))), 0) + int(m.group(2))
    return {"lost_records": lost_records, "lost_samples": lost_samples, "lost_by_cpu": per_cpu}


def window(text, arg):
    """[lo, hi) in ns for --time START,STOP, from the first sample line of text."""
    if arg is None:
        return 0, float("inf")
    if arg.startswith("@"):  # @LO,HI: on the recording's clock, in ns
        lo, hi = arg[1:].split(",")
        return int(lo), int(hi)
    first = None
    for line in text.splitlines():
        m = LINE.match(line)
        if m and not m.group("event").startswith("PERF_RECORD_"):
            first = int(m.group("sec")) * 1_000_000_000 + int(m.group("ns"))
            break
    start, stop = arg.split(",")
    lo = first + round(float(start) * 1e9) if start else 0
    hi = first + round(float(stop) * 1e9) if stop else float("inf")
    return lo, hi


def main(path, time_arg=None):
    text = subprocess.run(["perf", "script", "-i", path, "--ns", "--show-task-events", "--show-switch-events",
                           "-F", "comm,pid,tid,cpu,time,event,trace"],
                          check=True, capture_output=True, text=True).stdout
    lo, hi = window(text, time_arg)

    def clip(a, b):
        """The part of [a, b] inside the window, or None."""
        if a == b:
            return (a, b) if lo <= a < hi else None
        a, b = max(a, lo), min(b, hi)
        return (a, b) if a < b else None

    def ov(a, b):
        c = clip(a, max(a, b))
        return c[1] - c[0] if c else 0
    counts = {}
    monitored = set()
    th = {}  # tid -> dict(state, since)
    res = {}  # tid -> [sleeps, sleep_ns, d, d_ns]
    last = 0

    def T(tid):
        return th.setdefault(tid, {"state": None, "since": 0})

    def R(tid):
        return res.setdefault(tid, [0, 0, 0, 0])

    def end_wait(tid, t):
        x = T(tid)
        if x["state"] in ("S", "D"):
            if DEBUG == tid:
                print("sleep", x["state"], x["since"], t, t - x["since"], file=sys.stderr)
            r = R(tid)
            c = clip(x["since"], max(x["since"], t))
            if c is None:
                return
            if x["state"] == "S":
                r[0] += 1
                r[1] += c[1] - c[0]
            else:
                r[2] += 1
                r[3] += c[1] - c[0]

    def exit_thread(tid, t):
        x = T(tid)
        if x["state"] != "exited":
            end_wait(tid, t)
            x["state"], x["since"] = "exited", t

    gil = {}  # tid -> dict(state, since, wait, hold, first, last)
    gil_sleeps = {}  # tid -> sleeps that started inside take_gil

    gils = {}  # (pid, address or None) -> counters, in order of first sight
    pid_gils = {}  # pid -> its keys, first first
    thread_gil = {}  # tid -> key of its last take
    thread_gils = {}  # tid -> indices (in its process's order) of the GILs it took or held

    def gil_of(pid, address):
        keys = pid_gils.setdefault(pid, [])
        if address is None:
            if not keys:
                keys.append((pid, None))
            return keys[0]
        if (pid, address) in gils or (pid, address) in keys:
            return (pid, address)
        if keys and keys[0][1] is None:  # made before any address was seen: the first address's
            old = keys[0]
            keys[0] = (pid, address)
            if old in gils:
                gils[(pid, address)] = gils.pop(old)
            for k, v in thread_gil.items():
                if v == old:
                    thread_gil[k] = (pid, address)
            return keys[0]
        keys.append((pid, address))
        return keys[-1]

    def gil_counters(key):
        return gils.setdefault(key, {"holders": 0, "waiters": 0, "changed": 0, "held": 0, "contended": 0,
                                     "waiting": 0, "max_waiters": 0, "first": None, "last": 0, "opens": None})

    def account(c, t):
        if t > c["changed"]:
            dt = ov(c["changed"], t)
            if c["holders"] > 0:
                c["held"] += dt
                if c["waiters"] > 0:
                    c["contended"] += dt
            if c["waiters"] > 0:
                c["waiting"] += dt
        c["changed"] = max(c["changed"], t)

    def gil_domain(pid, tid, base, ret, address, t, state):
        if tid not in thread_gil:
            thread_gil[tid] = gil_of(pid, None)
        was = gil_counters(thread_gil[tid])
        key = gil_of(pid, address) if base == "take_gil" and not ret and address is not None else thread_gil[tid]
        c = gil_counters(key)
        c["first"] = t if c["first"] is None else min(c["first"], t)
        c["last"] = max(c["last"], t)
        account(was, t)
        account(c, t)
        if base == "take_gil":
            thread_gils.setdefault(tid, set()).add(pid_gils[pid].index(key))
        if base == "take_gil" and not ret:
            if state == "wait":
                was["waiters"] -= 1
            elif state == "hold":
                was["holders"] -= 1
            thread_gil[tid] = key
            c["waiters"] += 1
            if t < lo:
                c["opens"] = c["waiters"]
            elif t < hi:
                c["max_waiters"] = max(c["max_waiters"], c["waiters"])
        elif base == "take_gil":
            if state == "wait":
                c["waiters"] -= 1
            c["holders"] += 1
        elif not ret:
            if state == "hold":
                c["holders"] -= 1
            elif state == "wait":
                c["waiters"] -= 1

    def gil_event(pid, tid, name, t, rest):
        # GIL wait = take_gil entry -> return; held = take_gil return -> next drop_gil entry.
        base = name.split(":")[-1]
        ret = base.endswith("__return")
        base = re.sub(r"(__return)+$", "", base)
        base = re.sub(r"_\d+$", "", base)
        if base not in ("take_gil", "drop_gil"):
            return
        g = gil.setdefault(tid, {"state": None, "since": 0, "wait": 0, "hold": 0, "first": t, "last": t})
        g["last"] = t
        a = re.search(r"\bgil=0x([0-9a-f]+)", rest)
        address = int(a.group(1), 16) if a and int(a.group(1), 16) else None
        gil_domain(pid, tid, base, ret, address, t, g["state"])
        if base == "take_gil" and not ret:
            if g["state"] == "wait":
                g["wait"] += ov(g["since"], t)
            elif g["state"] == "hold":
                g["hold"] += ov(g["since"], t)
            g["state"], g["since"] = "wait", t
        elif base == "take_gil":
            if g["state"] == "wait":
                g["wait"] += ov(g["since"], t)
            g["state"], g["since"] = "hold", t
        elif not ret:
            if g["state"] == "hold":
                g["hold"] += ov(g["since"], t)
            elif g["state"] == "wait":
                g["wait"] += ov(g["since"], t)
            g["state"] = "drop"
        else:
            if g["state"] == "drop":
                g["state"] = None

    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            s = SWITCH_IN.match(line)
            if s and int(s.group("tid")) > 0:
                # Switched in (by any task): running from here. A sleep whose
                # wake-up went unrecorded ends here; sched_switch ends the run.
                tid, t = int(s.group("tid")), int(s.group("sec")) * 1_000_000_000 + int(s.group("ns"))
                x = T(tid)
                if x["state"] == "exited":
                    continue
                monitored.add(tid)
                if x["state"] == "running":
                    continue
                if x["state"] in ("S", "D", "other"):
                    if t <= x["since"]:
                        continue
                    end_wait(tid, t)
                x["state"], x["since"] = "running", t
            continue
        ev = m.group("event")
        if ev.startswith("PERF_RECORD_"):  # task events: not samples, not counted
            if ev.startswith("PERF_RECORD_EXIT"):
                exit_thread(int(m.group("tid")), int(m.group("sec")) * 1_000_000_000 + int(m.group("ns")))
            elif ev.startswith("PERF_RECORD_FORK"):
                child = int(ev[ev.index(":") + 1:ev.index(")")])
                if T(child)["state"] == "exited":  # a tid used again
                    th.pop(child)
            continue
        if "gil" in ev:
            gil_event(int(m.group("pid")), int(m.group("tid")), ev,
                      int(m.group("sec")) * 1_000_000_000 + int(m.group("ns")), m.group("rest"))
        t = int(m.group("sec")) * 1_000_000_000 + int(m.group("ns"))
        if lo <= t < hi:
            counts[ev] = counts.get(ev, 0) + 1
        last = max(last, t)
        cur = int(m.group("tid"))
        f = fields(m.group("rest"))
        if ev == "sched:sched_process_exit":
            exit_thread(int(f["pid"]), t)
        if ev == "sched:sched_switch":
            prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
            st = f["prev_state"]
            if prev > 0 and T(prev)["state"] == "exited":
                monitored.add(prev)
            elif prev > 0:
                monitored.add(prev)
                x = T(prev)
                end_wait(prev, t)
                letters = st.rstrip("+")
                kind = "D" if "D" in letters else ("S" if "S" in letters else ("R" if letters == "R" else "other"))
                if kind == "S" and gil.get(prev, {}).get("state") == "wait":
                    R(prev)  # S(GIL): the thread sleeps inside take_gil
                    gil_sleeps[prev] = gil_sleeps.get(prev, 0) + 1
                x["state"], x["since"] = kind, t
            if nxt > 0:
                x = T(nxt)
                end_wait(nxt, t)
                x["state"], x["since"] = "running", t
        else:
            if cur > 0:
                if not ev.startswith("sched:sched_wak"):
                    monitored.add(cur)  # wakers reach the woken task's events from any process
                x = T(cur)
                if x["state"] == "R":  # running now: its switch-in was not recorded
                    x["state"], x["since"] = "running", t
                elif x["state"] in ("S", "D", "other") and t > x["since"]:
                    end_wait(cur, t)  # running while asleep: neither its wake-up nor its switch-in was recorded
                    x["state"], x["since"] = "running", t
            if ev in ("sched:sched_waking", "sched:sched_wakeup", "sched:sched_wakeup_new"):
                tid = int(f["pid"])
                if tid > 0:
                    x = T(tid)
                    if x["state"] in ("S", "D", "other"):
                        end_wait(tid, t)
                        x["state"], x["since"] = "R", t
                    elif x["state"] is None:
                        x["state"], x["since"] = "R", t
    for tid in list(th):
        end_wait(tid, last)
    threads = {str(tid): {"sleep_count": r[0], "sleep_ns": r[1], "disk_count": r[2], "disk_ns": r[3]}
               for tid, r in sorted(res.items()) if tid in monitored}
    for tid, g in gil.items():
        if g["state"] in ("wait", "hold"):
            g[g["state"]] += ov(g["since"], last)  # open at the end: cut at the last timestamp
    for c in gils.values():
        account(c, max(last, c["changed"]))
        if c["opens"] is not None and last >= lo:
            c["max_waiters"] = max(c["max_waiters"], c["opens"])
        if c["first"] is not None:
            c["first"], c["last"] = max(c["first"], lo), min(c["last"], hi)
    out = {"source": "perf script", "event_counts": counts, "threads": threads}
    if gil:
        out["gil"] = {str(tid): {"wait_ns": g["wait"], "hold_ns": g["hold"], "span_ns": g["last"] - g["first"],
                                 "gil_sleep_count": gil_sleeps.get(tid, 0),
                                 "gils": sorted(thread_gils.get(tid, ()))}
                      for tid, g in sorted(gil.items())}
        out["gils"] = [{"pid": pid, "address": None if address is None else "0x%x" % address,
                        "held_ns": gils[(pid, address)]["held"], "contended_ns": gils[(pid, address)]["contended"],
                        "waiting_ns": gils[(pid, address)]["waiting"],
                        "max_waiters": gils[(pid, address)]["max_waiters"],
                        "span_ns": gils[(pid, address)]["last"] - gils[(pid, address)]["first"]}
                       for pid, keys in sorted(pid_gils.items()) for (_, address) in keys
                       if (pid, address) in gils]
    out.update(lost_stats(path))
    if "--no-threads" in sys.argv:
        del out["threads"]  # states around lost events are gilscan's to mark unknown
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[args.index("--time") + 1] if "--time" in args else None)
