#!/bin/bash
# Records the stack-classification test data: each recording has DWARF user
# stacks on sched_switch, and beside it a system-wide uprobe recording of
# take_gil entry/return is the ground truth (test/e2e/stack_truth.py turns it
# into <name>.truth.json). Run as root; needs perf, tracefs and the Pythons.
# ONLY=name records that one alone.
set -euo pipefail
cd "$(dirname "$0")"
GILSCAN=${GILSCAN:-../build/gilscan}
DUR=${DUR:-0.2}

one() {  # name python mode [python args...]
    local name=$1 py=$2 mode=$3; shift 3
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    local EV=(-e 'sched:sched_switch/call-graph=dwarf,stack-size=2048/' -e sched:sched_waking -e sched:sched_wakeup)
    local bin group
    bin=$("$GILSCAN" probe "$py" | sed -n 's/^# \([^ ]*\) .*/\1/p' | head -1)
    group=$("$GILSCAN" probe "$py" | sed -n "s/.* in group \([^ ]*\) .*/\1/p")
    perf record -q -a -k CLOCK_MONOTONIC -e "$group:take_gil*" -o "/tmp/$name.truth.data" 2>/dev/null &
    local truth=$!
    sleep 1
    case $mode in
        file) perf record -q -k CLOCK_MONOTONIC "${EV[@]}" -o "stacks_$name.data" -- "$py" "$@" workload.py "$DUR" ;;
        pipe) perf record -q -k CLOCK_MONOTONIC "${EV[@]}" -o - -- "$py" "$@" workload.py "$DUR" > "stacks_$name.data" ;;
        zstd) perf record -q -z -k CLOCK_MONOTONIC "${EV[@]}" -o "stacks_$name.data" -- "$py" "$@" workload.py "$DUR" ;;
    esac 2>/dev/null
    sleep 0.5
    kill -INT $truth; wait $truth || true
    python3 ../test/e2e/stack_truth.py "stacks_$name.data" "/tmp/$name.truth.data" > "stacks_$name.truth.json"
    chmod 644 "stacks_$name.data"
    echo "$name ($bin): $(python3 -c "import json,sys; d=json.load(open('stacks_$name.truth.json')); print(len(d['sleeps']), 'sleeps,', d['gil_waits'], 'GIL waits, perf script shows take_gil in', d['perf_script_take_gil_frames'])")"
}

# A -X perf recording with its perf map kept in perf-maps/, and no uprobes
# beside it: take_gil's return uprobe puts the kernel's uretprobe trampoline
# ([uprobes], 0x7fffffffe000) in place of take_gil's return address, so the
# GIL waits' stacks of the recordings above end there (perf script's
# "7fffffffdfff [unknown]"). Without it, with perf's default stack size,
# they reach the trampoline of the Python function that waits.
# stack_truth.py --jit keeps the JIT frames perf script names, per sleep;
# --gil-functions the first one past take_gil of each sleep in take_gil.
jit() {  # name python [python args...]
    local name=$1 py=$2; shift 2
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    perf record -q -k CLOCK_MONOTONIC -e 'sched:sched_switch/call-graph=dwarf/' -e sched:sched_waking \
        -e sched:sched_wakeup -o "stacks_$name.data" -- "$py" "$@" workload.py 0.1 2>/dev/null
    local map
    map=$(ls -t /tmp/perf-*.map | head -1)  # the workload's: the newest
    mkdir -p perf-maps && rm -f perf-maps/perf-*.map && cp "$map" perf-maps/ && chmod 644 perf-maps/* "stacks_$name.data"
    python3 ../test/e2e/stack_truth.py --jit "stacks_$name.data" > "stacks_$name.jit.json"
    python3 ../test/e2e/stack_truth.py --gil-functions "stacks_$name.data" > "stacks_$name.gilfn.json"
    echo "$name: $(python3 -c "import json; print(len(json.load(open('stacks_$name.jit.json'))), 'sleeps with JIT frames')")"
}

# A -X perf_jit recording (CPython 3.13+): the JIT writes /tmp/jit-PID.dump
# (names and CFI of its trampolines), kept in perf-maps/. perf names and
# unwinds through those frames only once `perf inject --jit` has made an ELF
# file of each (jitted-PID-N.so beside the dump) and a new recording: the
# truth is perf script's on that injected copy (gilscan reads the original
# and the dump).
jitdump() {  # name python [python args...]
    local name=$1 py=$2; shift 2
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    perf record -q -k CLOCK_MONOTONIC -e 'sched:sched_switch/call-graph=dwarf/' -e sched:sched_waking \
        -e sched:sched_wakeup -o "stacks_$name.data" -- "$py" "$@" workload.py 0.1 2>/dev/null
    local dump pid
    dump=$(ls -t /tmp/jit-*.dump | head -1)  # the workload's: the newest
    pid=$(basename "$dump" .dump); pid=${pid#jit-}
    mkdir -p perf-maps && rm -f perf-maps/jit-*.dump && cp "$dump" perf-maps/ && chmod 644 perf-maps/* "stacks_$name.data"
    perf inject --jit -i "stacks_$name.data" -o "/tmp/$name.injected.data"
    python3 ../test/e2e/stack_truth.py --jit "/tmp/$name.injected.data" > "stacks_$name.jit.json"
    python3 ../test/e2e/stack_truth.py --gil-functions "/tmp/$name.injected.data" > "stacks_$name.gilfn.json"
    rm -f "/tmp/$name.injected.data" /tmp/jitted-"$pid"-*.so
    echo "$name: $(python3 -c "import json; print(len(json.load(open('stacks_$name.jit.json'))), 'sleeps with JIT frames')")"
}

# Python 2 has no take_gil: its GIL is interpreter_lock, taken by
# PyThread_acquire_lock as every threading.Lock is. The truth there is a
# uprobe on each call of PyThread_acquire_lock in ceval.c's GIL takers and
# one on the instruction after it (where the call returns), found with
# objdump: named take_gil_N / take_gil_N__return so that stack_truth.py
# reads them as it reads take_gil's entry and return.
py2() {  # name python
    local name=$1 py=$2
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    local EV=(-e 'sched:sched_switch/call-graph=dwarf,stack-size=2048/' -e sched:sched_waking -e sched:sched_wakeup)
    local lib tracefs=/sys/kernel/tracing group=gil_py2_truth n=0 call ret
    lib=$(readlink -f "$(dirname "$py")/../lib/libpython2.7.so.1.0")
    [ -d $tracefs/events ] || tracefs=/sys/kernel/debug/tracing
    # File offsets: the text segment's p_vaddr - p_offset, from readelf.
    local off vaddr delta
    read -r off vaddr < <(readelf -lW "$lib" | awk '$1 == "LOAD" && / E +0x/ {print $2, $3; exit}')
    delta=$((vaddr - off))
    unprobe() {  # the group's probes, one by one (uprobe_events takes no wildcard)
        local e
        for e in $(sed -n "s|^p:$group/\([^ ]*\) .*|\1|p" $tracefs/uprobe_events); do
            echo "-:$group/$e" >> $tracefs/uprobe_events
        done
    }
    unprobe
    while read -r call ret; do
        printf 'p:%s/take_gil_%d %s:0x%x\n' $group $n "$lib" $((0x$call - delta)) >> $tracefs/uprobe_events
        printf 'p:%s/take_gil_%d__return %s:0x%x\n' $group $n "$lib" $((0x$ret - delta)) >> $tracefs/uprobe_events
        n=$((n + 1))
    done < <(for f in PyEval_EvalFrameEx PyEval_RestoreThread PyEval_AcquireThread PyEval_InitThreads PyEval_ReInitThreads; do
                 objdump -d --no-show-raw-insn --disassemble=$f "$lib" | grep -A1 'call.*<PyThread_acquire_lock@plt>' |
                     awk '{sub(":", "", $1); printf "%s ", $1} END {print ""}'
             done | xargs -n2)
    echo "$name: $n call sites of PyThread_acquire_lock in the GIL takers"
    perf record -q -a -k CLOCK_MONOTONIC -e "$group:*" -o "/tmp/$name.truth.data" 2>/dev/null &
    local truth=$!
    sleep 1
    # Python 2's threads switch every 100 bytecodes: a fifth of the others'
    # duration makes a file of about their size.
    perf record -q -k CLOCK_MONOTONIC "${EV[@]}" -o "stacks_$name.data" -- "$py" workload2.py \
        "$(python3 -c "print($DUR / 5)")" 2>/dev/null
    sleep 0.5
    kill -INT $truth; wait $truth || true
    unprobe
    python3 ../test/e2e/stack_truth.py "stacks_$name.data" "/tmp/$name.truth.data" > "stacks_$name.truth.json"
    chmod 644 "stacks_$name.data"
    echo "$name: $(python3 -c "import json; d=json.load(open('stacks_$name.truth.json')); print(len(d['sleeps']), 'sleeps,', d['gil_waits'], 'GIL waits')")"
}

P=/root/.pyenv/versions
one py39 $P/3.9.18/bin/python3 file
one py311 $P/3.11.7/bin/python3 file
one py312 $P/3.12.1/bin/python3 file
one py312_xperf $P/3.12.1/bin/python3 file -X perf
one py313 $P/3.13.0/bin/python3 file
one shim /root/.pyenv/shims/python3 file
one pipe $P/3.11.7/bin/python3 pipe
one zstd $P/3.11.7/bin/python3 zstd
one debian /usr/bin/python3.11 file
jit py312_perfmap $P/3.12.1/bin/python3 -X perf
jitdump py313_perfjit $P/3.13.0/bin/python3 -X perf_jit
py2 py27 $P/2.7.18/bin/python2.7
