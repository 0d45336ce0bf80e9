#!/usr/bin/python3
"""gilscan -o x.pftrace on real recordings, read back the way Perfetto reads it.

Usage: pftrace_e2e.py GILSCAN TESTDATA PERFETTO_TRACE_PROTO

Each trace is decoded by protoc against Perfetto's schema (no field unknown to
it), then parsed with the Python module protoc generates from that schema
(python3-protobuf, hence Debian's /usr/bin/python3), and its meaning checked
against two other readers of the same recording:
- the scheduler: every sched_switch (CPU, ns, prev_pid, prev_state, next_pid)
  and every wake-up (CPU, ns, kind, pid, target_cpu) that `perf script` prints
  is in the trace exactly once, compact switches taking their previous task
  from the CPU's last next_pid as Perfetto does, and nothing else is;
- gilscan's tracks: the GIL waits and holds per thread, the holder slices
  with their culprits, the waiter counters and the labelled sleeps equal the
  same run's Chrome JSON trace, event for event, to the nanosecond;
- every track's slices nest (no end without a begin, no partial overlap),
  the names the process tree gives are the summary's, SystemInfo holds the
  kernel release perf recorded, and --time keeps exactly the window's events.
"""
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

gilscan, testdata, proto = sys.argv[1], sys.argv[2], sys.argv[3]
tmp = tempfile.mkdtemp(prefix="gilscan-pftrace-")
subprocess.run(["protoc", "-I", os.path.dirname(proto), "--python_out", tmp, os.path.basename(proto)], check=True)
sys.path.insert(0, tmp)
import perfetto_trace_pb2 as pb  # noqa: E402

# prev_state letters as perf prints them (kernel >= 4.14 masks), as numbers.
STATE = {"R": 0, "S": 1, "D": 2, "T": 4, "t": 8, "X": 16, "Z": 32, "P": 64, "I": 128, "R+": 256}
GIL_ROW_BASE = 0x20000000


def read_trace(path):
    data = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    t = pb.Trace()
    t.ParseFromString(data)
    return t, data


def perf_sched(data, window=None):
    """The recording's switches and wake-ups as perf script prints them.

    A switch-in record (perf record --switch-events) whose thread is not the
    CPU's task by the switches before it counts as a switch from that task
    (the idle task, 0, when none is known yet) in state R, at its time."""
    # Fields for tracepoints only: a CPU sample has no trace field.
    out = subprocess.run(["perf", "script", "-i", data, "--ns", "--show-switch-events", "-F",
                          "trace:tid,cpu,time,event,trace"],
                         capture_output=True, text=True).stdout
    switches, wakes = collections.Counter(), collections.Counter()
    saw_waking = False
    current = {}  # cpu -> its task, by the switches so far
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+PERF_RECORD_SWITCH(_CPU_WIDE)? IN\b", line)
        if m:
            tid, cpu, ns = int(m.group(1)), int(m.group(2)), int(m.group(3)) * 10**9 + int(m.group(4))
            if current.get(cpu) != tid and (not window or window[0] <= ns < window[1]):
                switches[(cpu, ns, current.get(cpu, 0), 0, tid)] += 1
                current[cpu] = tid
            continue
        m = re.match(r"\s*-?\d+\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+sched:(\w+):\s+(.*)", line)
        if not m:
            continue
        cpu, ns, kind, text = int(m.group(1)), int(m.group(2)) * 10**9 + int(m.group(3)), m.group(4), m.group(5)
        if window and not (window[0] <= ns < window[1]):
            continue
        if kind == "sched_switch":
            f = re.search(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)", text)
            switches[(cpu, ns, int(f.group(1)), STATE[f.group(2)], int(f.group(3)))] += 1
            current[cpu] = int(f.group(3))
        elif kind in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
            # A sched_wakeup after the recording's first sched_waking is left
            # out: Perfetto's runnable time starts at the waking.
            saw_waking = saw_waking or kind == "sched_waking"
            if kind == "sched_wakeup" and saw_waking:
                continue
            f = re.search(r"pid=(\d+) prio=\d+ target_cpu=(\d+)", text)
            wakes[(cpu, ns, kind, int(f.group(1)), int(f.group(2)))] += 1
    return switches, wakes


def trace_sched(trace):
    """Switches and wake-ups from the bundles, compact ones resolved as Perfetto does."""
    per_cpu = collections.defaultdict(list)  # cpu -> [(ts, order, kind, fields)]
    wakes = collections.Counter()
    order = 0
    for p in trace.packet:
        if not p.HasField("ftrace_events"):
            continue
        b = p.ftrace_events
        for e in b.event:
            order += 1
            if e.HasField("sched_switch"):
                s = e.sched_switch
                per_cpu[b.cpu].append((e.timestamp, order, "full", (s.prev_pid, s.prev_state, s.next_pid)))
            for kind in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
                if e.HasField(kind):
                    w = getattr(e, kind)
                    wakes[(b.cpu, e.timestamp, kind, w.pid, w.target_cpu)] += 1
        c = b.compact_sched
        ts = 0
        for i, d in enumerate(c.switch_timestamp):
            ts = d if i == 0 else ts + d
            order += 1
            per_cpu[b.cpu].append((ts, order, "compact", (c.switch_prev_state[i], c.switch_next_pid[i],
                                                          c.intern_table[c.switch_next_comm_index[i]])))
        ts = 0
        for i, d in enumerate(c.waking_timestamp):
            ts = d if i == 0 else ts + d
            wakes[(b.cpu, ts, "sched_waking", c.waking_pid[i], c.waking_target_cpu[i])] += 1
    switches, unresolved, mismatched = collections.Counter(), 0, 0
    for cpu, events in per_cpu.items():
        last_next = None
        for ts, _, kind, f in sorted(events):
            if kind == "full":
                # Perfetto's mismatched_sched_switch_tids (an import error):
                # a previous task other than the CPU's last next_pid.
                mismatched += last_next is not None and f[0] != last_next
                switches[(cpu, ts, f[0], f[1], f[2])] += 1
                last_next = f[2]
            elif last_next is None:
                unresolved += 1
            else:
                switches[(cpu, ts, last_next, f[0], f[1])] += 1
                last_next = f[1]
    trace_sched.mismatched = mismatched
    return switches, wakes, unresolved


def running_ns(switches, ends):
    """Each thread's time on a CPU as Perfetto's thread states draw it: from
    a switch naming it next to the switch naming it previous, up to its end
    in ends (the summary's last_ns: its exit; its last switch-out, state X,
    comes after it, and the main thread's is not recorded)."""
    since, total = {}, collections.Counter()
    for cpu, ts, prev, _, nxt in sorted(switches, key=lambda k: (k[1], k[0])):
        if prev in since:
            start = since.pop(prev)
            total[prev] += max(0, min(ts, ends.get(prev, ts)) - start)
        since[nxt] = ts
    for tid, start in since.items():
        if tid in ends:
            total[tid] += max(0, ends[tid] - start)
    return total


def annotation(q, a):
    """(name, value) of a debug annotation; a stack (the JSON trace's args.stack text) as its frames."""
    name = q["annotations"][a.name_iid]
    value = q["strings"][a.string_value_iid] if a.HasField("string_value_iid") else a.int_value
    return (name, tuple(json.loads(value))) if name == "stack" else (name, value)


def trace_tracks(trace):
    """gilscan's tracks: slices and counter values by track, and nesting problems.

    Resolved as Perfetto does: each sequence's defaults (its track), its clock
    (incremental from its clock snapshot, unless a packet names BOOTTIME) and
    its interned names and strings, cleared by its first packet."""
    tracks, processes, seqs = {}, {}, {}
    slices, counters, problems = collections.Counter(), collections.Counter(), []
    open_slices = collections.defaultdict(list)
    events = []
    for i, p in enumerate(trace.packet):
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("process"):
                processes[d.uuid] = d.process.pid
            tracks[d.uuid] = d
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & 1:
            q = seqs[seq] = {"names": {}, "annotations": {}, "strings": {}, "clock": None, "incremental": None,
                             "track": p.trace_packet_defaults.track_event_defaults.track_uuid,
                             "clock_id": p.trace_packet_defaults.timestamp_clock_id}
            for c in p.clock_snapshot.clocks:
                if c.is_incremental:
                    q["incremental"], q["clock"] = c.clock_id, c.timestamp
        if p.HasField("interned_data"):
            q = seqs[seq]
            q["names"].update({n.iid: n.name for n in p.interned_data.event_names})
            q["annotations"].update({n.iid: n.name for n in p.interned_data.debug_annotation_names})
            q["strings"].update({n.iid: n.str.decode() for n in p.interned_data.debug_annotation_string_values})
        if p.HasField("track_event"):
            q, e = seqs[seq], p.track_event
            clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else q["clock_id"]
            if clock == q["incremental"]:
                q["clock"] += p.timestamp
                ts = q["clock"]
            else:
                ts = p.timestamp
            args = tuple(sorted(annotation(q, a) for a in e.debug_annotations))
            name = q["names"][e.name_iid] if e.HasField("name_iid") else None
            track = e.track_uuid if e.HasField("track_uuid") else q["track"]
            # As Perfetto sorts: by timestamp, the file's order between equal ones.
            events.append((ts, i, track, e.type, name, args, e.counter_value))
    for ts, _, uuid, typ, name, args, value in sorted(events, key=lambda x: (x[0], x[1])):
        d = tracks[uuid]
        if d.HasField("thread"):
            key = ("gil" if d.name == "GIL" else "thread", d.thread.pid, d.thread.tid)
        else:
            key = ("holder" if d.name.startswith("GIL holder") else "waiters", processes[d.parent_uuid], d.name)
        if typ == pb.TrackEvent.TYPE_COUNTER:
            counters[(key, ts, value)] += 1
        elif typ == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_slices[uuid].append((ts, name, args))
        elif typ == pb.TrackEvent.TYPE_SLICE_END:
            if not open_slices[uuid]:
                problems.append(f"end without begin at {ts} on {key}")
                continue
            start, name, args = open_slices[uuid].pop()
            if ts <= start:
                problems.append(f"{name} at {start} on {key}: length {ts - start}")
            slices[(key, name, start, ts, args)] += 1
    problems += [f"open at the end on track {u}" for u, s in open_slices.items() if s]
    return slices, counters, problems


def json_tracks(path):
    """The same from the JSON trace of the same run."""
    events = json.load(open(path))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices, counters = collections.Counter(), collections.Counter()
    ns = lambda x: round(x * 1000)  # noqa: E731
    for e in events:
        a = e.get("args", {})
        if e["ph"] == "C" and e["name"].startswith("GIL waiters"):
            counters[(("waiters", e["pid"], e["name"]), ns(e["ts"]), a["waiting"])] += 1
        if e["ph"] != "X":
            continue
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        cut = (("cut_at_end", 1),) if a.get("cut_at_end") else ()
        if e.get("cat") == "GIL state":
            gil = (("gil", a["gil"]),) if "gil" in a else ()
            key = ("gil", e["pid"], e["tid"] - GIL_ROW_BASE)
            slices[(key, e["name"], start, end, tuple(sorted(gil + cut)))] += 1
        elif e.get("cat") == "GIL holder":
            args = (("holder", a["holder"]),) + ((("culprit", a["culprit"]),) if "culprit" in a else ())
            key = ("holder", e["pid"], names[(e["pid"], e["tid"])])
            slices[(key, e["name"], start, end, tuple(sorted(args)))] += 1
        elif e["name"].startswith("S(GIL") or "stack" in a:
            # Labelled sleeps, and with --sleep-stacks every sleep with a stack.
            args = [("state", a["state"])] + ([("evidence", a["evidence"])] if e["name"].startswith("S(GIL") else [])
            args += [("stack", tuple(a["stack"]))] if "stack" in a else []
            args += [("function", a["function"])] if "function" in a else []
            args += [("waker", a["waker"])] if a.get("waker", 0) > 0 else []
            slices[(("thread", e["pid"], e["tid"]), e["name"], start, end, tuple(sorted(args + list(cut))))] += 1
    return slices, counters


def decoded_cleanly(path):
    """protoc's text of the file: it decodes, and no field is unknown to the schema."""
    data = open(path, "rb").read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    r = subprocess.run(["protoc", "-I", os.path.dirname(proto), "--decode=perfetto.protos.Trace",
                        os.path.basename(proto)], input=data, capture_output=True)
    unknown = [l for l in r.stdout.decode(errors="replace").splitlines() if re.match(r"\s*\d+\s*[:{]", l)]
    return r.returncode == 0 and not unknown, r.stderr.decode()[:200] + " ".join(unknown[:3])


def os_release(data):
    out = subprocess.run(["perf", "report", "--header-only", "-i", data], capture_output=True, text=True).stdout
    m = re.search(r"# os release : (\S+)", out)
    return m.group(1) if m else ""


def check_recording(name, extra=(), suffix=".pftrace"):
    data = os.path.join(testdata, name + ".data")
    pf, js, summary = (os.path.join(tmp, name + s) for s in (suffix, ".json", ".summary.json"))
    r1 = subprocess.run([gilscan, data, "-o", pf, "--summary-json", summary, *extra], capture_output=True, text=True)
    r2 = subprocess.run([gilscan, data, "-o", js, *extra], capture_output=True, text=True)
    check(r1.returncode == 0 and r2.returncode == 0, f"{name}: gilscan writes both traces ({r1.stderr[-300:]})")
    if r1.returncode or r2.returncode:
        return
    # -j 1 encodes on the stages' thread, -j 2 and up on the relay's own
    # (trace_relay.h): the same bytes.
    if suffix == ".pftrace":
        for jobs in ("1", "3"):
            pj = os.path.join(tmp, f"{name}.j{jobs}.pftrace")
            rj = subprocess.run([gilscan, data, "-o", pj, "-j", jobs, *extra], capture_output=True, text=True)
            check(rj.returncode == 0 and open(pj, "rb").read() == open(pf, "rb").read(),
                  f"{name}: -j {jobs} writes the same .pftrace as the default -j ({rj.stderr[-200:]})")
    ok, why = decoded_cleanly(pf)
    check(ok, f"{name}: protoc decodes the trace with Perfetto's schema, no unknown field ({why})")
    trace, raw = read_trace(pf)

    switches, wakes, unresolved = trace_sched(trace)
    mismatched = trace_sched.mismatched
    want_switches, want_wakes = perf_sched(data)
    check(unresolved == 0, f"{name}: every compact switch has a previous task on its CPU ({unresolved} not)")
    check(switches == want_switches, f"{name}: the switches are perf script's ({sum(switches.values())} against "
          f"{sum(want_switches.values())}; {list((switches - want_switches).items())[:2]} "
          f"{list((want_switches - switches).items())[:2]})")
    check(wakes == want_wakes, f"{name}: the wake-ups are perf script's ({sum(wakes.values())} against "
          f"{sum(want_wakes.values())}; {list((wakes - want_wakes).items())[:2]} {list((want_wakes - wakes).items())[:2]})")

    slices, counters, problems = trace_tracks(trace)
    check(not problems, f"{name}: every track's slices begin, end and nest ({problems[:3]})")
    want_slices, want_counters = json_tracks(js)
    check(slices == want_slices, f"{name}: GIL waits, holds, holders and labelled sleeps are the JSON trace's "
          f"({sum(slices.values())} against {sum(want_slices.values())}; {list((slices - want_slices).items())[:2]} "
          f"{list((want_slices - slices).items())[:2]})")
    check(counters == want_counters, f"{name}: the GIL waiter counts are the JSON trace's "
          f"({sum(counters.values())} against {sum(want_counters.values())})")

    threads = {t.tid: t.name for p in trace.packet if p.HasField("process_tree") for t in p.process_tree.threads}
    want = {t["tid"]: t["comm"] for t in json.load(open(summary))["threads"]}
    check(all(threads.get(tid) == comm for tid, comm in want.items()),
          f"{name}: the process tree names every thread as the summary does")
    info = [p.system_info for p in trace.packet if p.HasField("system_info")]
    # (A pipe-mode recording's comes as a record: SystemInfo is then written last.)
    check(len(info) == 1 and info[0].utsname.release == os_release(data) != "",
          f"{name}: SystemInfo holds the recording's kernel release")
    check(os.path.getsize(pf) < os.path.getsize(js), f"{name}: the .pftrace ({os.path.getsize(pf)} bytes) is smaller "
          f"than the JSON trace ({os.path.getsize(js)})")
    return {"switches": switches, "wakes": wakes, "slices": slices, "mismatched": mismatched,
            "threads": json.load(open(summary))["threads"], "compact": sum(
        len(p.ftrace_events.compact_sched.switch_timestamp) for p in trace.packet if p.HasField("ftrace_events"))}


# Uprobes and scheduler events; scheduler-only system-wide; DWARF stacks (S(GIL)
# from stacks); GIL blame on 3.12 -X perf and on Debian's stripped 3.11
# (culprits); subinterpreters with their own GILs; a pipe-mode recording; a
# per-process recording with switch records.
results = {}
for rec in ("gil_combined", "system_wide", "gil_stacks", "blame_py312", "blame_debian", "gil_subinterp", "pipe",
            "stacks_py312_xperf", "switch_events"):
    results[rec] = check_recording(rec)

# --sleep-stacks: each sleep's stack on its slice, plain sleeps' too.
stacks = check_recording("gil_stacks", extra=("--sleep-stacks", "8"))
if stacks:
    with_stack = [s for s in stacks["slices"] if any(a[0] == "stack" for a in s[4])]
    check(any(s[1] == "S" for s in with_stack) and any(s[1] == "S(GIL)" for s in with_stack),
          f"gil_stacks --sleep-stacks 8: plain and GIL sleeps carry their stacks ({len(with_stack)} slices)")
    # (An inlined function is a line of its own in its caller's frame.)
    user = [[f for f in dict(s[4])["stack"] if not f.endswith("([kernel])") and not f.startswith("[inlined]")]
            for s in with_stack]
    check(all(0 < len(u) <= 8 for u in user), "gil_stacks --sleep-stacks 8: the kernel's frames and up to 8 of the "
          f"program's ({sorted({len(u) for u in user})})")

# A per-process recording with switch records (gilscan record): each
# switch-in a switch record shows is a switch in the trace, so Perfetto's own
# thread states run each thread as long as gilscan's summary says, and no
# switch-out names a task other than the CPU's.
se = results.get("switch_events")
if se:
    check(se["mismatched"] == 0 and sum(se["switches"].values()) > 0,
          f"switch_events: no switch names a previous task other than its CPU's ({se['mismatched']})")
    ran = running_ns(se["switches"], {t["tid"]: t["last_ns"] for t in se["threads"]})
    for t in se["threads"]:
        got, want = ran[t["tid"]] / 1000, t["running_us"]
        check(abs(got - want) <= 1, f"switch_events: thread {t['tid']} runs {got:.3f} us in Perfetto's thread "
              f"states, {want:.3f} us in the summary")
sw = results.get("system_wide")
if sw:
    check(sw["compact"] > sum(sw["switches"].values()) / 2,
          f"system-wide: most switches are compact ({sw['compact']} of {sum(sw['switches'].values())})")
blame = results.get("blame_py312")
if blame:
    culprits = [s for s in blame["slices"] if s[0][0] == "holder" and any(a[0] == "culprit" for a in s[4])]
    check(len(culprits) > 10, f"blame_py312: holder slices carry their culprit ({len(culprits)})")
gil = results.get("gil_combined")
if gil:
    check(any(s[0][0] == "gil" and s[1] == "GIL wait" for s in gil["slices"]), "gil_combined: GIL waits are drawn")

# gzip'd, by its name: the same packets.
gz = check_recording("gil_combined", suffix=".pftrace.gz")
if gz and gil:
    check(gz["slices"] == gil["slices"] and gz["switches"] == gil["switches"], ".pftrace.gz holds the same trace")

# --time: exactly the window's scheduler events, and no slice outside it.
data = os.path.join(testdata, "system_wide.data")
full = os.path.join(tmp, "full.pftrace")
part = os.path.join(tmp, "part.pftrace")
subprocess.run([gilscan, data, "-o", full], check=True, capture_output=True)
subprocess.run([gilscan, data, "-o", part, "--time", "0.05,0.1"], check=True, capture_output=True)
all_sw, _, _ = trace_sched(read_trace(full)[0])
part_sw, part_wakes, _ = trace_sched(read_trace(part)[0])
# The window is in seconds from the recording's first sample: perf script's first line.
first_line = subprocess.run(["perf", "script", "-i", data, "--ns", "-F", "time"], capture_output=True,
                            text=True).stdout.split()[0].rstrip(":")
first = int(first_line.split(".")[0]) * 10**9 + int(first_line.split(".")[1])
window = (first + 50_000_000, first + 100_000_000)
want_sw, want_wakes = perf_sched(data, window)
check(part_sw == want_sw and 0 < len(part_sw) < len(all_sw),
      f"--time 0.05,0.1: exactly the window's switches ({sum(part_sw.values())} against {sum(want_sw.values())}, "
      f"of {sum(all_sw.values())})")
check(part_wakes == want_wakes, f"--time 0.05,0.1: exactly the window's wake-ups ({sum(part_wakes.values())} "
      f"against {sum(want_wakes.values())})")

done("pftrace end to end")
