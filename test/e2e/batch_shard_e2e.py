#!/usr/bin/env python3
"""gilscan batch --shard K/N run by GNU parallel over the recordings in
testdata/, as a cluster's N jobs would: the shares' JSONL rows concatenated
are the rows of one run (as sets of lines: each share keeps its own order),
each recording in exactly one share, the traces of all shares those of one
run, and the shares the same when the archive is reached by another path.

usage: batch_shard_e2e.py GILSCAN TESTDATA
Prints "N passed, N failed".
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
N = 3


def lines(path):
    return open(path).read().splitlines()


with tempfile.TemporaryDirectory() as tmp:
    one = os.path.join(tmp, "one.jsonl")
    r = subprocess.run([GILSCAN, "batch", "-j", "2", "--summary", one, "--traces", os.path.join(tmp, "t-one"), DATA],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"one run: exit 0 ({r.stderr[-300:]})")
    # N jobs at once, as `parallel` runs a cluster's array locally.
    r = subprocess.run(["parallel", "--halt", "now,fail=1", GILSCAN, "batch", "-j", "1", "--shard", "{}/" + str(N),
                        "--summary", os.path.join(tmp, "share{}.jsonl"), "--traces", os.path.join(tmp, "t-{}"), DATA,
                        ":::"] + [str(k) for k in range(1, N + 1)], capture_output=True, text=True)
    check(r.returncode == 0, f"parallel: {N} shares, exit 0 ({r.stderr[-300:]})")
    shares = [lines(os.path.join(tmp, f"share{k}.jsonl")) for k in range(1, N + 1)]
    joined = [l for s in shares for l in s]
    check(sorted(joined) == sorted(lines(one)) and len(joined) > 100,
          f"the shares' rows are one run's rows ({len(joined)} and {len(lines(one))})")
    per_share = [{json.loads(l)["recording"] for l in s} for s in shares]
    everyone = collections.Counter(rec for s in per_share for rec in s)
    check(all(n == 1 for n in everyone.values()) and len(everyone) == len({json.loads(l)["recording"] for l in lines(one)}),
          "each recording in exactly one share")
    check(all(s for s in per_share), f"no share empty here ({[len(s) for s in per_share]})")
    traces = sorted(f for k in range(1, N + 1) for f in os.listdir(os.path.join(tmp, f"t-{k}")))
    check(traces == sorted(os.listdir(os.path.join(tmp, "t-one"))),
          f"the shares' traces are one run's, by the same names ({len(traces)})")
    # The same archive reached by another path: the same shares.
    link = os.path.join(tmp, "mounted-elsewhere")
    os.symlink(DATA, link)
    for k in range(1, N + 1):
        out = os.path.join(tmp, f"moved{k}.jsonl")
        subprocess.run([GILSCAN, "batch", "--shard", f"{k}/{N}", "--summary", out, link], capture_output=True)
        moved = {os.path.relpath(json.loads(l)["recording"], link) for l in lines(out)}
        check(moved == {os.path.relpath(rec, DATA) for rec in per_share[k - 1]}, f"share {k}: the same through another path")
    # Many more shares than recordings: some are empty, and that is no error.
    empty = 0
    for k in range(1, 41):
        out = os.path.join(tmp, "many.jsonl")
        r = subprocess.run([GILSCAN, "batch", "--shard", f"{k}/40", "--summary", out, DATA], capture_output=True, text=True)
        empty += r.returncode == 0 and os.path.getsize(out) == 0
        check(r.returncode == 0, f"share {k}/40: exit 0 ({r.stderr[-200:]})")
    check(empty > 0, f"an empty share writes an empty table ({empty} of 40)")
    for bad in ("0/3", "4/3", "x"):
        r = subprocess.run([GILSCAN, "batch", "--shard", bad, DATA], capture_output=True, text=True)
        check(r.returncode == 2 and "--shard" in r.stderr, f"--shard {bad}: a usage error ({r.stderr!r})")

done("batch shards")
