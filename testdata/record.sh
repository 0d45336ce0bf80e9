#!/bin/bash
# Re-records gilscan's real test recordings (run as root on a machine with
# perf, tracefs and the pyenv Pythons). The golden expectations are then
# regenerated from `perf script` with test/e2e/golden_expect.py.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-/root/.pyenv/versions/3.11.7/bin/python3}
DUR=${DUR:-0.25}
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
SCHED=(-e sched:sched_switch -e sched:sched_wakeup -e sched:sched_waking -e sched:sched_process_fork)
rec() { perf record -q -k CLOCK_MONOTONIC "$@" 2>/dev/null; }

rec -o plain.data "${SCHED[@]}" -- "$PY" workload.py "$DUR"
rec -o - "${SCHED[@]}" -- "$PY" workload.py "$DUR" > pipe.data
rec -z -o zstd.data "${SCHED[@]}" -- "$PY" workload.py "$DUR"
rec -z -o - "${SCHED[@]}" -- "$PY" workload.py "$DUR" > pipe_zstd.data
rec -o mixed_callgraph.data -e 'sched:sched_switch/call-graph=dwarf/' -e sched:sched_wakeup \
    -e sched:sched_waking -- "$PY" workload.py 0.1
rec -a -o system_wide.data "${SCHED[@]}" -- "$PY" workload.py 0.1
# perf record -g: frame-pointer call chains, which end in glibc's wait short
# of take_gil (cli_test: the warning that says what to record instead).
rec -g -o callchain_fp.data -e sched:sched_switch -e sched:sched_waking -e sched:sched_wakeup -- "$PY" workload.py 0.1
# GIL uprobes and DWARF stacks together (probes placed by gilscan record):
# golden_test's -j check with sleeps labelled from stacks beside the GIL spans.
../build/gilscan record -q --stacks --no-analyse -o gil_stacks.data -- "$PY" workload.py 0.02
# Subinterpreters that own their GIL (3.13): the take_gil probe's gil= argument
# tells the process's three GILs apart (golden_test, cli_test).
../build/gilscan record -q --no-analyse -o gil_subinterp.data -- /root/.pyenv/versions/3.13.0/bin/python3 subinterp.py
# gilscan record's per-process recording with switch records (--switch-events):
# switch-ins by other processes' tasks (golden_test).
../build/gilscan record -q --gil --state --no-analyse -o switch_events.data -- "$PY" workload.py 0.1
# A copy cut in the middle of a record, 60% of the way into the data.
size=$(stat -c %s plain.data)
head -c $((size * 6 / 10 + 3)) plain.data > truncated.data
chmod 644 ./*.data
