// gilscan's HTML report: draws the data gilscan put in <script id="data">.
// Self-contained (no network, no library). Sections: facts, #summary (the
// per-thread table, sortable), #timeline (GIL load and one lane per thread,
// zoom with the wheel, pan by dragging, double-click to reset),
// #flamegraph-wait and #flamegraph-blame (click a frame to zoom, search).
// The address's fragment can say what to show, so that a view can be
// linked: #search=TEXT (both flame graphs), #zoom=FRAME (each flame graph
// zoomed to its first frame of that name), #t=A,B (the timeline from A to B
// ms), joined by '&'. When done, <body> gets data-rendered="1"; tests read
// that and the elements' data- attributes.
"use strict";

const D = JSON.parse(document.getElementById("data").textContent);
const ASK = Object.fromEntries(location.hash.slice(1).split("&").filter((p) => p.includes("="))
  .map((p) => [p.slice(0, p.indexOf("=")), decodeURIComponent(p.slice(p.indexOf("=") + 1))]));

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function fmtMs(us) {
  if (us === 0) return "0";
  const ms = us / 1000;
  return ms >= 100 ? ms.toFixed(0) + " ms" : ms >= 1 ? ms.toFixed(1) + " ms" : us.toFixed(1) + " µs";
}

// ---- facts -----------------------------------------------------------------
function renderFacts() {
  const dl = document.getElementById("facts-list");
  for (const [k, v] of D.facts) dl.append(el("dt", {text: k}), el("dd", {text: v}));
  const w = document.getElementById("warnings");
  if (!D.warnings.length) w.append(el("li", {text: "none"}));
  for (const t of D.warnings) w.append(el("li", {text: t}));
}

// ---- the per-thread table --------------------------------------------------
function renderTable() {
  const table = document.getElementById("summary-table");
  const head = el("tr");
  D.columns.forEach((c, i) => {
    const th = el("th", {text: c.label, title: c.title || c.label, "data-col": String(i)});
    th.addEventListener("click", () => sortBy(i));
    head.append(th);
  });
  table.tHead.append(head);
  let order = {col: -1, dir: 1};
  function fill() {
    const body = table.tBodies[0];
    body.textContent = "";
    for (const row of D.rows) {
      const tr = el("tr", {"data-tid": String(row[1])});
      row.forEach((v, i) => {
        const c = D.columns[i];
        const text = v === null ? "–" : c.num ? (c.digits === 0 ? String(v) : v.toFixed(c.digits ?? 1)) : String(v);
        tr.append(el("td", {text, class: c.num ? "num" : ""}));
      });
      body.append(tr);
    }
  }
  function sortBy(i) {
    order = {col: i, dir: order.col === i ? -order.dir : D.columns[i].num ? -1 : 1};
    const k = (r) => (r[i] === null ? -Infinity : r[i]);
    D.rows.sort((a, b) => (k(a) < k(b) ? -1 : k(a) > k(b) ? 1 : 0) * order.dir);
    for (const th of head.children)
      th.setAttribute("aria-sort", Number(th.dataset.col) === i ? (order.dir > 0 ? "ascending" : "descending") : "none");
    fill();
  }
  fill();
  if (D.rows_left_out)
    table.parentElement.after(el("p", {class: "help", text: `${D.rows_left_out} more threads are in --summary-json.`}));
}

// ---- the timeline: GIL load and thread lanes ----------------------------------
const LANE = 16, LABEL = 190, GIL_H = 44;

function renderTimeline() {
  const wrap = document.getElementById("timeline-canvas-wrap");
  const canvas = document.getElementById("timeline-canvas");
  const tip = document.getElementById("timeline-tip");
  const legend = document.getElementById("timeline-legend");
  D.states.forEach((s) => legend.append(el("span", {class: "key"}, el("i", {style: "background:" + s.color}), s.name)));
  const rows = [];
  for (const g of D.gil) rows.push({kind: "gil", g, h: GIL_H});
  for (const l of D.lanes) rows.push({kind: "lane", l, h: LANE});
  const height = rows.reduce((a, r) => a + r.h + 2, 24);
  const view = {a: 0, b: Math.max(D.span_us, 1)};
  if (ASK.t) {
    const [a, b] = ASK.t.split(",").map((v) => Number(v) * 1000);
    if (a >= 0 && b > a) {
      view.a = a;
      view.b = Math.min(b, Math.max(D.span_us, 1));
    }
  }
  let drawn = 0;

  function size() {
    const ratio = window.devicePixelRatio || 1;
    const w = Math.max(wrap.clientWidth, 400);
    canvas.width = w * ratio;
    canvas.height = height * ratio;
    canvas.style.width = w + "px";
    canvas.style.height = height + "px";
    return ratio;
  }
  function x(t, w) {
    return LABEL + ((t - view.a) / (view.b - view.a)) * (w - LABEL);
  }
  function draw() {
    const ratio = size();
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const w = canvas.width / ratio;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, height);
    ctx.font = "11px sans-serif";
    drawn = 0;
    let y = 22;
    axis(ctx, w);
    for (const r of rows) {
      ctx.fillStyle = "#333";
      ctx.textBaseline = "middle";
      ctx.fillText(r.kind === "gil" ? r.g.label : r.l.label, 4, y + r.h / 2, LABEL - 8);
      ctx.save();
      ctx.beginPath();
      ctx.rect(LABEL, y, w - LABEL, r.h);
      ctx.clip();
      if (r.kind === "gil") drawGil(ctx, r.g, y, w);
      else drawLane(ctx, r.l, y, w);
      ctx.restore();
      y += r.h + 2;
    }
    canvas.dataset.drawnSegments = String(drawn);
    canvas.dataset.view = view.a.toFixed(0) + "," + view.b.toFixed(0);
  }
  function axis(ctx, w) {
    const span = view.b - view.a;
    const step = Math.pow(10, Math.floor(Math.log10(span / 6)));
    const tick = [1, 2, 5, 10].map((m) => m * step).find((s) => span / s <= 10) || step * 10;
    ctx.fillStyle = "#666";
    ctx.textBaseline = "top";
    for (let t = Math.ceil(view.a / tick) * tick; t <= view.b; t += tick) {
      const px = x(t, w);
      ctx.fillRect(px, 14, 1, 6);
      ctx.fillText(fmtMs(t), px + 2, 2);
    }
  }
  function drawLane(ctx, l, y, w) {
    const s = l.segs;
    let lastPx = -1, lastKind = -1;
    for (let i = 0; i < s.length; i += 3) {
      const a = s[i], b = a + s[i + 1];
      if (b < view.a || a > view.b) continue;
      const x0 = x(a, w), x1 = Math.max(x(b, w), x0 + 0.5);
      // Many spans in one pixel: one rectangle for them (the first kind).
      if (Math.floor(x0) === lastPx && s[i + 2] === lastKind && x1 - x0 < 1) continue;
      lastPx = Math.floor(x0);
      lastKind = s[i + 2];
      ctx.fillStyle = D.states[s[i + 2]].color;
      ctx.fillRect(x0, y, x1 - x0, LANE);
      drawn++;
    }
  }
  function drawGil(ctx, g, y, w) {
    // Held share as a green area, the mean number of waiters as a red line.
    const n = g.held.length;
    for (let i = 0; i < n; i++) {
      const a = i * g.bin_us, b = a + g.bin_us;
      if (b < view.a || a > view.b) continue;
      const x0 = x(a, w), x1 = Math.max(x(b, w), x0 + 0.5);
      const hh = (g.held[i] / 1000) * (GIL_H - 2);
      ctx.fillStyle = "rgb(150,200,150)";
      ctx.fillRect(x0, y + GIL_H - hh, x1 - x0, hh);
      const wy = y + GIL_H - Math.min(g.waiters[i] / 100 / Math.max(g.max_waiters, 1), 1) * (GIL_H - 2);
      ctx.fillStyle = "rgb(180,0,0)";
      ctx.fillRect(x0, wy, x1 - x0, 1.5);
      drawn++;
    }
  }
  function at(ev) {
    const r = canvas.getBoundingClientRect();
    return {px: ev.clientX - r.left, py: ev.clientY - r.top, w: r.width};
  }
  function timeAt(px, w) {
    return view.a + ((px - LABEL) / (w - LABEL)) * (view.b - view.a);
  }
  canvas.addEventListener("wheel", (ev) => {
    const {px, w} = at(ev);
    if (px < LABEL) return;
    ev.preventDefault();
    const t = timeAt(px, w), k = ev.deltaY < 0 ? 0.8 : 1.25;
    const a = t - (t - view.a) * k, b = t + (view.b - t) * k;
    view.a = Math.max(0, a);
    view.b = Math.min(Math.max(D.span_us, 1), Math.max(b, view.a + 1));
    draw();
  }, {passive: false});
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => (drag = {px: at(ev).px, a: view.a, b: view.b}));
  window.addEventListener("mouseup", () => (drag = null));
  canvas.addEventListener("mousemove", (ev) => {
    const {px, py, w} = at(ev);
    if (drag) {
      const dt = ((px - drag.px) / (w - LABEL)) * (drag.b - drag.a);
      const len = drag.b - drag.a;
      view.a = Math.min(Math.max(0, drag.a - dt), Math.max(D.span_us, 1) - len);
      view.b = view.a + len;
      draw();
      return;
    }
    tip.textContent = describe(px, py, w);
  });
  canvas.addEventListener("dblclick", () => {
    view.a = 0;
    view.b = Math.max(D.span_us, 1);
    draw();
  });
  function describe(px, py, w) {
    if (px < LABEL) return "";
    const t = timeAt(px, w);
    let y = 22;
    for (const r of rows) {
      if (py >= y && py < y + r.h) {
        if (r.kind === "gil") {
          const i = Math.floor(t / r.g.bin_us);
          if (i < 0 || i >= r.g.held.length) return "";
          return `${r.g.label} at ${fmtMs(t)}: held ${(r.g.held[i] / 10).toFixed(1)}%, ` +
                 `${(r.g.waiters[i] / 100).toFixed(2)} waiting on average`;
        }
        const s = r.l.segs;
        for (let i = 0; i < s.length; i += 3)
          if (s[i] <= t && t < s[i] + s[i + 1])
            return `${r.l.label}: ${D.states[s[i + 2]].name} for ${fmtMs(s[i + 1])} from ${fmtMs(s[i])}`;
        return r.l.label;
      }
      y += r.h + 2;
    }
    return "";
  }
  window.addEventListener("resize", draw);
  if (D.lanes_left_out)
    wrap.after(el("p", {class: "help", text: `${D.lanes_left_out} more threads have no lane here (the trace has them).`}));
  draw();
}

// ---- flame graphs ------------------------------------------------------------
const FRAME = 17;

function renderFlame(id, tree, unit) {
  const box = document.getElementById(id);
  const svgWrap = box.querySelector(".flame");
  const search = box.querySelector("input");
  const info = box.querySelector(".flame-info");
  if (!tree || !tree.v) {
    svgWrap.append(el("p", {class: "empty", text: box.dataset.empty}));
    box.dataset.frames = "0";
    return;
  }
  let root = tree;
  const parents = new Map();
  (function link(n) {
    for (const c of n.c || []) {
      parents.set(c, n);
      link(c);
    }
  })(tree);
  if (ASK.search) search.value = ASK.search;
  if (ASK.zoom) {  // the first frame of that name, breadth first
    for (let level = [tree]; level.length && root === tree; level = level.flatMap((n) => n.c || []))
      root = level.find((n) => n.n === ASK.zoom) || tree;
  }
  function depth(n) {
    let d = 0;
    for (const c of n.c || []) d = Math.max(d, depth(c));
    return d + 1;
  }
  function hue(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return name.startsWith("py::") || name.includes(".py") ? `hsl(${200 + (h % 40)},60%,${62 + (h % 15)}%)`
                                                         : `hsl(${10 + (h % 40)},75%,${58 + (h % 15)}%)`;
  }
  function draw() {
    svgWrap.textContent = "";
    const width = Math.max(svgWrap.clientWidth, 400);
    const levels = depth(root) + 1;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", levels * FRAME);
    const term = search.value.trim().toLowerCase();
    let frames = 0;
    // The time in matching frames, each stretch once (not again in a matching callee).
    const matched = (function sum(n) {
      if (!term) return 0;
      if (n.n.toLowerCase().includes(term)) return n.v;
      return (n.c || []).reduce((a, c) => a + sum(c), 0);
    })(tree);
    // Flame graph: the root at the bottom, callees above their callers.
    function place(n, x0, w, level) {
      if (w < 0.5) return;
      const y = (levels - 1 - level) * FRAME;
      const g = document.createElementNS(ns, "g");
      const r = document.createElementNS(ns, "rect");
      const hit = term && n.n.toLowerCase().includes(term);
      r.setAttribute("x", x0);
      r.setAttribute("y", y);
      r.setAttribute("width", Math.max(w - 1, 0.5));
      r.setAttribute("height", FRAME - 1);
      r.setAttribute("fill", hit ? "rgb(230,0,230)" : hue(n.n));
      const title = document.createElementNS(ns, "title");
      title.textContent = `${n.n}\n${fmtMs(n.v)} ${unit} (${((100 * n.v) / tree.v).toFixed(1)}% of all)`;
      g.append(title, r);
      if (w > 30) {
        const t = document.createElementNS(ns, "text");
        t.setAttribute("x", x0 + 3);
        t.setAttribute("y", y + FRAME - 5);
        t.textContent = n.n.length * 6.2 > w - 6 ? n.n.slice(0, Math.max(0, Math.floor((w - 6) / 6.2) - 1)) + "…" : n.n;
        g.append(t);
      }
      g.addEventListener("click", () => {
        root = n === root && parents.has(n) ? parents.get(n) : n;
        draw();
      });
      g.dataset.name = n.n;
      svg.append(g);
      frames++;
      let cx = x0;
      for (const c of n.c || []) {
        const cw = (c.v / n.v) * w;
        place(c, cx, cw, level + 1);
        cx += cw;
      }
    }
    // The path from the whole graph's root to the zoomed one, full width.
    const path = [];
    for (let n = root; n; n = parents.get(n)) path.unshift(n);
    path.forEach((n, i) => {
      if (i < path.length - 1) {
        const y = (levels - 1 - i) * FRAME;
        const r = document.createElementNS(ns, "rect");
        r.setAttribute("x", 0);
        r.setAttribute("y", y);
        r.setAttribute("width", width);
        r.setAttribute("height", FRAME - 1);
        r.setAttribute("fill", "#ddd");
        r.addEventListener("click", () => {
          root = n;
          draw();
        });
        svg.append(r);
      }
    });
    place(root, 0, width, path.length - 1);
    svgWrap.append(svg);
    box.dataset.frames = String(frames);
    box.dataset.matched = term ? ((100 * matched) / tree.v).toFixed(1) : "";
    box.dataset.root = root.n;
    info.textContent = (root === tree ? "" : `zoomed to ${root.n} (click the grey bars below to zoom out); `) +
      (term ? `"${search.value}": ${((100 * matched) / tree.v).toFixed(1)}% of all` : `${fmtMs(tree.v)} ${unit} in all`);
  }
  search.addEventListener("input", draw);
  window.addEventListener("resize", draw);
  draw();
}

window.addEventListener("error", (e) => {
  document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
  const p = document.getElementById("report-error");
  p.hidden = false;
  p.textContent = "The report could not be drawn: " + e.message;
});

renderFacts();
renderTable();
renderTimeline();
renderFlame("flamegraph-wait", D.flame_wait, "of GIL wait");
renderFlame("flamegraph-blame", D.flame_blame, "of contended hold");
document.body.dataset.rendered = "1";
