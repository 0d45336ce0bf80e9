#!/usr/bin/env python3
"""The Python side, as a user gets it (needs root, Debian's python3-mesonpy,
python3-ipykernel, python3-nbclient): `pip install --no-build-isolation .`
into a fresh venv installs the gilscan command and module;
gilscan.analyse() returns a recording's summary; a real notebook, executed
by nbclient in a kernel of that venv, records a cell with %%gilscan and
shows its table; the kernel's own threads and the cell's are in it, the
cell's GIL contention measured; the line magic runs the command.

usage: python_e2e.py SOURCE_DIR TESTDATA
Prints "N passed, N failed".
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, done  # noqa: E402

SOURCE, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: its python3-mesonpy, ipykernel and nbclient

CELLS = [
    "%load_ext gilscan",
    "import threading, time\n"
    "def spin():\n"
    "    t = time.time()\n"
    "    while time.time() - t < 0.6: pass",
    "%%gilscan\n"
    "threads = [threading.Thread(target=spin, name=f'spinner-{i}') for i in range(2)]\n"
    "for t in threads: t.start()\n"
    "for t in threads: t.join()\n"
    "print('cell ran')",
    f"%gilscan {os.path.join(DATA, 'gil_uprobes.data')} -o ''",
]

with tempfile.TemporaryDirectory() as tmp:
    venv = os.path.join(tmp, "venv")
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    # A copy of the sources (what git tracks or would), which pip builds
    # in: nothing is left in the tree, and no build directory is copied.
    build = os.path.join(tmp, "src")
    files = subprocess.run(["git", "-C", SOURCE, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(SOURCE.encode(), f)):
            os.makedirs(os.path.dirname(os.path.join(build.encode(), f)), exist_ok=True)
            shutil.copy2(os.path.join(SOURCE.encode(), f), os.path.join(build.encode(), f))
    # (Without link-time optimisation here: the module's behaviour is the
    # test's, and a whole-program link is most of the build's time.)
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                        "--config-settings=setup-args=-Db_lto=false", build],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"pip install --no-build-isolation . ({r.stderr[-600:]})")
    exe = os.path.join(venv, "bin", "gilscan")
    check(os.access(exe, os.X_OK), "the gilscan command is installed in the venv")
    r = subprocess.run([py, "-c", "import gilscan, json, sys; s = gilscan.analyse(sys.argv[1]); "
                        "print(gilscan.executable()); print(json.dumps(s['gil']))",
                        os.path.join(DATA, "gil_uprobes.data")], capture_output=True, text=True)
    want = json.load(open(os.path.join(DATA, "gil_uprobes.expected.json")))
    out = r.stdout.splitlines()
    check(r.returncode == 0 and out and out[0] == exe, f"gilscan.executable() is the venv's ({r.stdout[:200]}{r.stderr[-300:]})")
    check(r.returncode == 0 and json.loads(out[1])["probe_events"] == sum(want["event_counts"].values()),
          "gilscan.analyse(): the recording's summary, as the command gives it")
    r = subprocess.run([py, "-c", "import gilscan; gilscan.analyse('/nonexistent.data')"], capture_output=True, text=True)
    check(r.returncode != 0 and "GilscanError" in r.stderr and "/nonexistent.data" in r.stderr,
          f"gilscan.analyse() of a missing file: GilscanError with gilscan's message ({r.stderr[-200:]})")

    # A notebook, executed by nbclient in a kernel that runs the venv's
    # Python (its kernelspec installed as a user would).
    r = subprocess.run([py, "-m", "ipykernel", "install", "--prefix", venv, "--name", "gilscan-venv"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"the venv's kernel installed ({r.stderr[-300:]})")
    nb = os.path.join(tmp, "t.ipynb")
    cells = [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None} for c in CELLS]
    json.dump({"cells": cells, "metadata": {"kernelspec": {"name": "gilscan-venv", "display_name": "gilscan venv",
                                                          "language": "python"}},
               "nbformat": 4, "nbformat_minor": 5}, open(nb, "w"))
    runner = ("import nbformat, sys\nfrom nbclient import NotebookClient\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "NotebookClient(nb, timeout=300, kernel_name='gilscan-venv', resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
              "nbformat.write(nb, sys.argv[1])\n")
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + ":" + os.environ["PATH"])
    r = subprocess.run([py, "-c", runner, nb, tmp], capture_output=True, text=True, env=env, timeout=600)
    check(r.returncode == 0, f"nbclient ran the notebook ({r.stderr[-800:]})")
    if r.returncode == 0:
        ran = json.load(open(nb))["cells"]

        def joined(v):  # nbformat keeps a multi-line text as a list of lines
            return "".join(v) if isinstance(v, list) else v
        outs = ran[2]["outputs"]
        text = "".join(joined(o.get("text", "")) for o in outs if o["output_type"] == "stream")
        page = "".join(joined(o.get("data", {}).get("text/html", "")) for o in outs if o["output_type"] == "display_data")
        check("cell ran" in text, f"%%gilscan: the cell's own output ({text!r})")
        check('<table class="gilscan-summary">' in page and "spinner-0" in page and "spinner-1" in page,
              f"%%gilscan: the table, with the cell's threads by name ({page[:400]!r})")
        rows = [r for r in page.split("<tr>") if "spinner-" in r]
        waits = [float(r.split("<td>")[7].split("<")[0] or 0) for r in rows]
        check(len(rows) == 2 and all(w > 20 for w in waits), f"%%gilscan: the spinners wait for the GIL ({waits}%)")
        line = "".join(joined(o.get("text", "")) for o in ran[3]["outputs"] if o["output_type"] == "stream")
        check("Summary of threads" in line, f"%gilscan FILE: the command's table ({line[:300]!r})")

done("python module and notebook")
