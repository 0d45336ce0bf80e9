#!/usr/bin/env python3
"""gilscan --html: the report opened in headless Chromium (Debian's chromium).

For stored recordings made here (uprobes with CPU samples and -X perf
stacks, DWARF stacks, system-wide, lost events, uprobes alone) and a
64-CPU perfgen capture: the page renders with no console message and no
script error, its table has one row per thread of the summary JSON with the
same figures, the timeline draws, the flame graphs hold the folded stacks
gilscan writes (same totals, the blamed functions), search, zoom and the
timeline's window work from the address, the size stays bounded, and the
page asks for nothing over the network.

    html_e2e.py GILSCAN PERFGEN TESTDATA
"""
import html.parser
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

GILSCAN, PERFGEN, DATA = sys.argv[1:4]
tmp = tempfile.mkdtemp(prefix="gilscan-html-")
CHROMIUM = next((c for c in ("chromium", "chromium-browser") if subprocess.run(["which", c], capture_output=True)
                 .returncode == 0), None)


class Dom(html.parser.HTMLParser):
    """The rendered page's elements that the checks read."""

    def __init__(self):
        super().__init__()
        self.rows, self.cells, self.attrs_by_id, self.names = [], None, {}, {}
        self.section = None
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.attrs_by_id[a["id"]] = a
            if tag == "section":
                self.section = a["id"]
        if tag == "tr" and "data-tid" in a:
            self.cells = []
            self.rows.append(self.cells)
        if tag == "g" and "data-name" in a:
            self.names.setdefault(self.section, set()).add(a["data-name"])

    def handle_data(self, data):
        self.text.append(data)
        if self.cells is not None and self.lasttag == "td":
            self.cells.append(data)

    def handle_endtag(self, tag):
        if tag == "tr":
            self.cells = None


def render(page, fragment=""):
    """The DOM after the scripts ran, and the console lines Chromium logged."""
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                        "--window-size=1300,2000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                        "file://" + page + fragment], capture_output=True, text=True, timeout=180)
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    dom = Dom()
    dom.feed(r.stdout)
    return dom, console, r.stdout


def report(rec, *extra):
    page, summ = os.path.join(tmp, "r.html"), os.path.join(tmp, "s.json")
    wait, blame = os.path.join(tmp, "w.folded"), os.path.join(tmp, "b.folded")
    r = subprocess.run([GILSCAN, rec, "-q", "--html", page, "--summary-json", summ, "--wait-folded", wait,
                        "--blame-folded", blame, "-o", "", *extra], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, None, r.stderr
    folded = {k: [(ln.rsplit(" ", 1)[0], int(ln.rsplit(" ", 1)[1])) for ln in open(p) if ln.strip()]
              for k, p in (("wait", wait), ("blame", blame))}
    return page, json.load(open(summ)), folded, r.stderr


def data_of(page):
    text = open(page, encoding="utf-8").read()
    return text, json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
                            .group(1).replace("<\\/", "</"))


def check_report(name, rec, lanes=True, waits=False, blamed=False, *extra):
    page, summ, folded, err = report(rec, *extra)
    check(page is not None, f"{name}: --html runs ({err[-300:] if err else ''})")
    if page is None:
        return
    text, data = data_of(page)
    check(os.path.getsize(page) <= 20 << 20, f"{name}: the page is at most 20 MB ({os.path.getsize(page)})")
    check(not re.search(r'<(script|link|img|iframe)[^>]*(src|href)=|url\(|@import|fetch\(|XMLHttpRequest', text),
          f"{name}: the page loads nothing from elsewhere")
    dom, console, _ = render(page)
    body = dom.attrs_by_id.get("report-error", {})
    check(not console and "hidden" in body and 'data-rendered="1"' in _ and "data-errors" not in _,
          f"{name}: renders in Chromium with no console message or script error ({console[:3]})")
    tids = {str(t["tid"]) for t in summ["threads"]}
    got = {row[1] for row in dom.rows if len(row) > 1}
    check(got == tids and len(dom.rows) == len(summ["threads"]),
          f"{name}: #summary has one row per thread of the summary ({len(dom.rows)} rows, {len(tids)} threads)")
    cols = [c["label"] for c in data["columns"]]
    by_tid = {str(t["tid"]): t for t in summ["threads"]}
    same = sum(row[cols.index("sleeps")] == str(by_tid[row[1]]["sleep_count"]) for row in dom.rows if row[1] in by_tid)
    check(same == len(dom.rows), f"{name}: each row's sleeps as the summary's ({same} of {len(dom.rows)})")
    drawn = int(dom.attrs_by_id["timeline-canvas"].get("data-drawn-segments", "0"))
    check(drawn > 0 and (not lanes or data["lanes"]), f"{name}: #timeline draws ({drawn} segments, "
          f"{len(data['lanes'])} lanes)")
    for key, section, want in (("wait", "flamegraph-wait", waits), ("blame", "flamegraph-blame", blamed)):
        frames = int(dom.attrs_by_id[section].get("data-frames", "0"))
        total_us = sum(v for _, v in folded[key])
        tree = data["flame_" + key]
        check((frames > 0) == want and (tree["v"] if tree else 0) == total_us,
              f"{name}: #{section} holds the folded stacks ({frames} frames, {tree and tree['v']} of {total_us} us)")
        if want:
            heaviest = max(folded[key], key=lambda kv: kv[1])[0].split(";")
            check(heaviest[1] in dom.names.get(section, set()),
                  f"{name}: #{section} draws the heaviest stack's frames ({heaviest[:3]})")
    return page, summ, folded


if CHROMIUM is None:
    check(False, "chromium is installed (scripts/test installs it)")
    done("html e2e")

# uprobes, CPU samples and DWARF stacks of python3.12 -X perf: blame and waits.
page, summ, folded = check_report("blame_py312 (uprobes, -X perf stacks)", os.path.join(DATA, "blame_py312.data"),
                                  True, True, True)
top = summ["gil_blame"][0]
dom, console, raw = render(page, "#search=" + top["native"])
frames = dom.names.get("flamegraph-blame", set())
check(top["native"] in frames and float(dom.attrs_by_id["flamegraph-blame"].get("data-matched") or 0) > 0,
      f"#search: the blamed native frame found in #flamegraph-blame ({top['native']}, "
      f"{dom.attrs_by_id['flamegraph-blame'].get('data-matched')}%)")
dom, console, raw = render(page, "#zoom=take_gil&t=10,20")
check(dom.attrs_by_id["flamegraph-wait"].get("data-root") == "take_gil" and not console,
      f"#zoom: #flamegraph-wait zoomed to take_gil ({dom.attrs_by_id['flamegraph-wait'].get('data-root')})")
check(dom.attrs_by_id["timeline-canvas"].get("data-view") == "10000,20000",
      f"#t=10,20: the timeline shows 10 to 20 ms ({dom.attrs_by_id['timeline-canvas'].get('data-view')})")
dom, console, raw = render(page, "#search=take_gil")
check(dom.attrs_by_id["flamegraph-wait"].get("data-matched") == "100.0",
      f"#search=take_gil: every GIL wait's stack passes take_gil "
      f"({dom.attrs_by_id['flamegraph-wait'].get('data-matched')}%)")
text, data = data_of(page)
facts = dict(data["facts"])
check(facts.get("GIL evidence", "").startswith("uprobes") and facts.get("Python", "").startswith("3.12")
      and facts.get("command", "").startswith("/usr/bin/perf record") and int(facts.get("CPUs", 0)) >= 1,
      f"the facts: evidence, Python, command, CPUs ({facts})")
check(data["gil"] and max(data["gil"][0]["held"]) > 500, "the GIL load row: held most of the time somewhere")

check_report("blame_py312_stacks (DWARF stacks, no uprobes)", os.path.join(DATA, "blame_py312_stacks.data"),
             True, True, True)
check_report("system_wide (-a)", os.path.join(DATA, "system_wide.data"), True, False, False)
check_report("lost events", os.path.join(DATA, "lost.data"), True, True, True)
check_report("gil_uprobes (uprobes alone)", os.path.join(DATA, "gil_uprobes.data"), False, False, False)
check_report("stacks_py312_xperf, --time", os.path.join(DATA, "stacks_py312_xperf.data"), True, True, True,
             "--time", "0.05,0.15")

# A 64-CPU capture of 400 threads: bounded lanes, rows kept, still drawn.
big = os.path.join(tmp, "big.data")
subprocess.run([PERFGEN, "--cpus", "64", "--threads", "400", "--processes", "8", "--seconds", "1", "-o", big],
               check=True, capture_output=True)
page, summ, folded = check_report("perfgen 64 CPUs, 400 threads", big, True, False, False)
text, data = data_of(page)
segs = sum(len(lane["segs"]) // 3 for lane in data["lanes"])
check(len(data["lanes"]) == 256 and data["lanes_left_out"] == len(summ["threads"]) - 256 and segs <= 400_000,
      f"the big capture: 256 lanes, the rest said, at most 400000 stretches ({len(data['lanes'])}, {segs})")
os.remove(big)

# Never over an input.
r = subprocess.run([GILSCAN, os.path.join(DATA, "plain.data"), "--html", os.path.join(DATA, "plain.data")],
                   capture_output=True, text=True)
check(r.returncode != 0 and "--html" in r.stderr, f"--html onto the input is refused ({r.stderr[-200:]})")

done("html e2e")
