"""The Jupyter magics: %load_ext gilscan, then

    %%gilscan [record options]      record the cell's run in this kernel (gilscan record -p <kernel pid>),
                                    then show the per-thread table, GIL load and blame as HTML
    %gilscan FILE [options]         analyse a recording, as the gilscan command does

The recording needs what gilscan record needs (root, or the permissions its
message names: the kernel usually does not run as root); the message is
shown as it is. The cell's output and exceptions are the cell's own.
"""
import html
import shlex
import subprocess

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

from . import GilscanError, Recording, analyse, executable


def _pct(part, whole):
    return f"{100.0 * part / whole:.1f}" if part is not None and whole else ""


def summary_html(summary, title):
    """The summary as an HTML table: one row per thread, then the GIL load
    and the blame rows (the same figures as gilscan's table)."""
    rows = []
    for t in summary["threads"]:
        span = t["span_us"]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            t["pid"], t["tid"], t["comm"], f"{span / 1000:.1f}", _pct(t["running_us"], span),
            _pct(t["sleep_us"], span), _pct(t.get("gil_wait_us"), span), _pct(t.get("gil_hold_us"), span))) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("pid", "tid", "thread", "ms", "run %", "sleep %", "GIL wait %", "GIL held %"))
    parts = [f"<h4>{html.escape(title)}</h4>",
             f'<table class="gilscan-summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>']
    for p in summary.get("gil", {}).get("processes", []):
        held = p.get("held_us", 0)
        parts.append(f"<p>GIL of process {p['pid']}: held {_pct(held, p.get('span_us'))}% of the time, "
                     f"up to {p.get('max_waiters', 0)} threads waiting</p>")
    blame = summary.get("gil_blame", [])[:10]
    if blame:
        bhead = "".join(f"<th>{h}</th>" for h in ("function", "native culprit", "contended ms", "held while blocked"))
        brows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            b["function"], b["native"], f"{b['contended_us'] / 1000:.1f}", "yes" if b.get("held_while_blocked") else ""))
            + "</tr>" for b in blame)
        parts.append(f'<table class="gilscan-blame"><thead><tr>{bhead}</tr></thead><tbody>{brows}</tbody></table>')
    for w in summary.get("warnings", []):
        parts.append(f"<p><b>warning:</b> {html.escape(w)}</p>")
    return "\n".join(parts)


@magics_class
class GilscanMagics(Magics):
    @line_cell_magic
    def gilscan(self, line, cell=None):
        options = shlex.split(line)
        if cell is None:
            r = subprocess.run([executable(), *options], stdin=subprocess.DEVNULL, capture_output=True, text=True)
            print(r.stdout, end="")
            if r.stderr:
                print(r.stderr, end="")
            return None
        try:
            with Recording(options=options) as rec:
                result = self.shell.run_cell(cell)
        except GilscanError as e:
            display(HTML(f'<pre class="gilscan-error">gilscan: {html.escape(str(e))}</pre>'))
            return None
        display(HTML(summary_html(rec.summary, f"gilscan: this cell, recorded in {rec.directory}")))
        if not result.success:
            result.raise_error()
        return None
