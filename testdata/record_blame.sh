#!/bin/bash
# Records the GIL blame test data (test/e2e/blame_e2e.py): blame.py, whose
# threads each do one kind of work, recorded with CPU samples and sched
# events with DWARF stacks, with or without the GIL uprobes in the same
# recording. Beside each, a system-wide recording of the GIL uprobes is the
# ground truth (test/e2e/blame_truth.py turns it into blame_NAME.truth.json).
# The 3.12 runs use -X perf: their perf maps are kept in blame-maps/.
# Run as root; needs perf, tracefs and the Pythons. ONLY=name records one.
set -euo pipefail
cd "$(dirname "$0")"
GILSCAN=${GILSCAN:-../build/gilscan}
DUR=${DUR:-0.25}
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mkdir -p blame-maps

one() {  # name python uprobes|stacks [python args...]
    local name=$1 py=$2 mode=$3; shift 3
    [ -z "${ONLY:-}" ] || [ "$ONLY" = "$name" ] || return 0
    local group
    group=$("$GILSCAN" probe "$py" | sed -n "s/.* in group \([^ ]*\) .*/\1/p")
    local EV=(-e 'sched:sched_switch/call-graph=dwarf,stack-size=4096/' -e sched:sched_waking -e sched:sched_wakeup
              -e 'cpu-clock/freq=499,call-graph=dwarf,stack-size=8192/')
    [ "$mode" = uprobes ] && EV+=(-e "$group:*")
    perf record -q -a -k CLOCK_MONOTONIC -e "$group:*" -o "/tmp/blame_$name.truth.data" 2>/dev/null &
    local truth=$!
    sleep 1
    perf record -q -k CLOCK_MONOTONIC "${EV[@]}" -o "blame_$name.data" -- "$py" "$@" blame.py "$DUR" \
        > "/tmp/blame_$name.roles" 2>/dev/null
    sleep 0.5
    kill -INT $truth; wait $truth || true
    python3 ../test/e2e/blame_truth.py "/tmp/blame_$name.truth.data" "/tmp/blame_$name.roles" > "blame_$name.truth.json"
    if [ "${1:-}" = "-X" ]; then
        local map
        map=$(ls -t /tmp/perf-*.map | head -1)  # the workload's: the newest
        cp "$map" blame-maps/
    fi
    chmod 644 "blame_$name.data" blame-maps/* 2>/dev/null || true
    echo "$name: $(python3 -c "import json; d=json.load(open('blame_$name.truth.json')); print(d['contended_us'])")"
}

rm -f blame-maps/perf-*.map
one py312 /root/.pyenv/versions/3.12.1/bin/python3 uprobes -X perf
one py312_stacks /root/.pyenv/versions/3.12.1/bin/python3 stacks -X perf
one py311 /root/.pyenv/versions/3.11.7/bin/python3 uprobes
one debian /usr/bin/python3.11 stacks
