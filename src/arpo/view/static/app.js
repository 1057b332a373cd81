/* arpo view — the page. Hand-written, dependency-free JavaScript; every figure is inline SVG.
 *
 * Data: ARPO.get(path) answers the viewer's data paths (arpo/view/data.py, Catalog.get): from the
 * server (GET api/<path>) or, in an exported site, from data/<path with / as _>.js scripts that call
 * ARPO.put(path, data) (browsers block fetch() of file:// URLs, not <script src>).
 * Pages (hash routes): #/run · #/step?run&step&page · #/tree?run&step&tree&sel · #/entropy?run&step
 */
"use strict";

const ARPO = (() => {
  const cache = new Map();
  const waiting = new Map();
  const exported = !!window.ARPO_EXPORT;
  const KEEP = 40; // answers kept in memory (trees are large)

  function remember(path, data) {
    cache.set(path, data);
    if (cache.size > KEEP) cache.delete(cache.keys().next().value);
  }
  function put(path, data) {
    remember(path, data);
    const w = waiting.get(path);
    if (w) { waiting.delete(path); w.forEach(p => p.resolve(data)); }
  }
  function get(path) {
    if (cache.has(path)) return Promise.resolve(cache.get(path));
    if (!exported) {
      return fetch("api/" + path).then(r => r.json().then(d => {
        if (!r.ok) throw new Error(d.detail || r.statusText);
        remember(path, d);
        return d;
      }));
    }
    return new Promise((resolve, reject) => {
      if (!waiting.has(path)) {
        waiting.set(path, []);
        const s = document.createElement("script");
        s.src = "data/" + path.replace(/\//g, "_") + ".js";
        s.onerror = () => {
          const w = waiting.get(path) || [];
          waiting.delete(path);
          w.forEach(p => p.reject(new Error("not in this export: " + path)));
        };
        document.head.appendChild(s);
      }
      waiting.get(path).push({resolve, reject});
    });
  }
  return {get, put, exported};
})();

// ---- small helpers --------------------------------------------------------------------------------
const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fd6", "#e07b00", "#2a9d4b", "#c2385a", "#7b55c7", "#0f9fb0", "#8c6d31", "#5b6470"];
const DASHES = ["", "6 4", "2 3", "10 3 2 3", "1 4"];

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of kids.flat()) if (c != null) e.append(c.nodeType ? c : String(c));
  return e;
}
function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of kids.flat()) if (c != null) e.append(c.nodeType ? c : document.createTextNode(String(c)));
  return e;
}
const title = text => s("title", {}, text);
function fmt(v, digits = 4) {
  if (v == null || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a >= 1000) return v.toFixed(0);
  if (a !== 0 && a < 1e-3) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}
const signed = v => (v > 0 ? "+" : "") + fmt(v, 3);
function extent(xs) {
  let lo = Infinity, hi = -Infinity;
  for (const x of xs) { if (x < lo) lo = x; if (x > hi) hi = x; }
  return [lo, hi];
}
function niceTicks(lo, hi, n) {
  const span = hi - lo || 1;
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(k => k * mag).find(st => span / st <= n) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}
function lerpColor(a, b, t) {
  return "rgb(" + a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",") + ")";
}
const RED = [215, 48, 39], MID = [254, 224, 139], GREEN = [26, 152, 80];
function rewardColor(r) {
  if (r == null) return "#bbb";
  const t = Math.max(-1, Math.min(1, r));
  return t < 0 ? lerpColor(MID, RED, -t) : lerpColor(MID, GREEN, t);
}
function query() {
  const [page, qs] = location.hash.replace(/^#\/?/, "").split("?");
  return {page: page || "run", q: Object.fromEntries(new URLSearchParams(qs || ""))};
}
const link = (page, q) => "#/" + page + "?" + new URLSearchParams(q).toString();
const tip = document.getElementById("tip");
function showTip(ev, text) {
  tip.textContent = text;
  tip.hidden = false;
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = x + "px";
  tip.style.top = (ev.clientY + 14) + "px";
}
const hideTip = () => { tip.hidden = true; };

let RUNS = null;
async function runs() {
  if (!RUNS) RUNS = (await ARPO.get("runs")).runs;
  return RUNS;
}
const runColor = i => PALETTE[i % PALETTE.length];

// ---- a line chart with hover ------------------------------------------------------------------------
/* series: [{label, color, dash, pts: [[x, y], ...]}] -> a .panel element, or null without points */
function lineChart({name, series, xLabel = "step", width = 460, height = 220, onPick, note}) {
  series = series.filter(se => se.pts.length);
  if (!series.length) return null;
  const m = {l: 52, r: 14, t: 10, b: 32};
  const all = series.flatMap(se => se.pts);
  let [x0, x1] = extent(all.map(p => p[0]));
  let [y0, y1] = extent(all.map(p => p[1]));
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const yt = niceTicks(y0, y1, 5);
  y0 = Math.min(y0, yt[0]); y1 = Math.max(y1, yt[yt.length - 1]);
  const intX = all.every(p => Number.isInteger(p[0]));
  const xt = niceTicks(x0, x1, 6).filter(v => v >= x0 && v <= x1 && (!intX || Number.isInteger(v)));
  const X = x => m.l + (x - x0) / (x1 - x0) * (width - m.l - m.r);
  const Y = y => height - m.b - (y - y0) / (y1 - y0) * (height - m.t - m.b);
  const svg = s("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart", "data-name": name});
  for (const v of yt) {
    svg.append(s("line", {class: "gridline", x1: m.l, x2: width - m.r, y1: Y(v), y2: Y(v)}));
    svg.append(s("text", {x: m.l - 6, y: Y(v) + 4, "text-anchor": "end"}, fmt(v, 3)));
  }
  for (const v of xt) svg.append(s("text", {x: X(v), y: height - m.b + 16, "text-anchor": "middle"}, fmt(v)));
  svg.append(s("line", {class: "axis", x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b, stroke: "#c4cad3"}));
  svg.append(s("text", {x: width - m.r, y: height - 4, "text-anchor": "end"}, xLabel));
  series.forEach((se, k) => {
    const pts = se.pts.slice().sort((a, b) => a[0] - b[0]);
    const d = pts.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    svg.append(s("path", {class: "series", d, stroke: se.color, "stroke-dasharray": se.dash || null, "data-series": se.label}));
    if (pts.length <= 40) for (const p of pts) svg.append(s("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: se.color}));
  });
  const xs = [...new Set(all.map(p => p[0]))].sort((a, b) => a - b);
  const hover = s("line", {class: "hoverline", y1: m.t, y2: height - m.b, visibility: "hidden"});
  svg.append(hover);
  const nearest = ev => {
    const box = svg.getBoundingClientRect();
    const px = (ev.clientX - box.left) / box.width * width;
    const xv = x0 + (px - m.l) / (width - m.l - m.r) * (x1 - x0);
    let best = xs[0];
    for (const x of xs) if (Math.abs(x - xv) < Math.abs(best - xv)) best = x;
    return best;
  };
  const overlay = s("rect", {x: m.l, y: m.t, width: width - m.l - m.r, height: height - m.t - m.b, fill: "transparent",
    style: onPick ? "cursor:pointer" : null});
  overlay.addEventListener("mousemove", ev => {
    const x = nearest(ev);
    hover.setAttribute("x1", X(x)); hover.setAttribute("x2", X(x)); hover.setAttribute("visibility", "visible");
    const lines = series.map(se => {
      const p = se.pts.find(q => q[0] === x);
      return p ? `${se.label}: ${fmt(p[1])}` : null;
    }).filter(Boolean);
    showTip(ev, `${xLabel} ${fmt(x)}\n` + lines.join("\n") + (onPick ? "\n(click: this step's trees)" : ""));
  });
  overlay.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); hideTip(); });
  if (onPick) overlay.addEventListener("click", ev => { hideTip(); onPick(nearest(ev)); });
  svg.append(overlay);
  const legend = h("div", {class: "legend"}, series.map(se => h("span", {},
    s("svg", {width: 22, height: 8, style: "vertical-align:middle;margin-right:4px"},
      s("line", {x1: 0, x2: 22, y1: 4, y2: 4, stroke: se.color, "stroke-width": 2, "stroke-dasharray": se.dash || null})),
    se.label)));
  return h("div", {class: "panel", "data-panel": name}, h("h3", {text: name}), svg, legend,
    note ? h("div", {class: "meta", text: note}) : null);
}

// ---- Run: the training curves ------------------------------------------------------------------------
const PANELS = [
  ["reward", ["reward_mean", "val/reward", "val/score"]],
  ["accuracy and format", ["accuracy", "val/pass@1", "format_error_rate", "tool_format_rate"]],
  ["tool calls per trajectory, by tool", ["tool_calls_per_traj", /^tool_calls_per_traj\//, "tool_failures"]],
  ["entropy: response start vs after tool results", ["initial_entropy", "post_tool_entropy"]],
  ["branch rate (branched / all trajectories)", ["branch_rate"]],
  ["response length (generated tokens)", ["response_length"]],
  ["KL", ["approx_kl", "kl"]],
  ["clip fraction", ["clip_frac", "clip_frac_high", "clip_frac_low"]],
  ["step time split (s)", ["time_generation", "time_training", "step_seconds"]],
  ["loss and gradient norm", ["loss", "pg_loss", "grad_norm"]],
  ["groups with one reward; share of trajectories by tool calls", ["constant_groups", /^calls_frac\//]],
];

// the collapse warnings of a run (training/health.py writes warn/<name> = 1 on the step where a rule fired)
function collapseWarnings(rows) {
  return rows.map(row => [row.step, Object.keys(row).filter(k => k.startsWith("warn/")).map(k => k.slice(5))])
    .filter(([, names]) => names.length);
}

async function pageRun(main) {
  const rs = await runs();
  const mets = await Promise.all(rs.map(r => ARPO.get(`runs/${r.id}/metrics`)));
  main.append(h("h2", {text: rs.length > 1 ? `${rs.length} runs` : `Run ${rs[0].name}`}));
  const info = h("div", {class: "cards", style: "margin-bottom:14px"});
  rs.forEach((r, i) => {
    const c = r.config || {};
    const bits = [c.preset && `algo ${c.preset}`, c.attribution && `attribution ${c.attribution}`,
      c.group_size && `M=${c.group_size} N=${c.initial_rollouts}`, c.model && `model ${c.model}`].filter(Boolean);
    info.append(h("a", {class: "card", href: link("step", {run: i})},
      h("b", {style: `color:${runColor(i)}`, text: r.name}), h("div", {class: "meta", text: r.path}),
      h("div", {class: "meta", text: `${mets[i].rows.length} logged steps · ${r.saved_steps} with saved trees` +
        (bits.length ? " · " + bits.join(" · ") : "")})));
  });
  main.append(info);
  mets.forEach(m => m.skipped.length && main.append(h("div", {class: "warn", text: m.skipped.join("\n")})));
  mets.forEach((m, i) => {
    const w = collapseWarnings(m.rows);
    if (w.length) main.append(h("div", {class: "warn collapse-warnings", text: `${rs[i].name}: collapse warnings ` +
      "(docs/training_health.md): " + w.map(([st, names]) => `step ${st}: ${names.join(", ")}`).join("; ")}));
  });
  if (mets.every(m => !m.rows.length)) {
    main.append(h("p", {class: "muted", text: "No metrics.jsonl here (a rollouts file): see the Trees page."}));
    return;
  }
  const grid = h("div", {class: "grid"});
  const multi = rs.length > 1;
  for (const [name, keys] of PANELS) {
    const series = [];
    const present = [];
    for (const k of keys) {
      const names = new Set();
      mets.forEach(m => m.rows.forEach(row => Object.keys(row).forEach(key => {
        if ((k instanceof RegExp ? k.test(key) : key === k) && typeof row[key] === "number") names.add(key);
      })));
      present.push(...[...names].sort());
    }
    present.forEach((key, ki) => rs.forEach((r, ri) => {
      const pts = mets[ri].rows.filter(row => typeof row[key] === "number").map(row => [row.step, row[key]]);
      series.push({label: multi ? `${r.name} · ${key}` : key, pts,
        color: multi ? runColor(ri) : PALETTE[ki % PALETTE.length], dash: multi ? DASHES[ki % DASHES.length] : ""});
    }));
    const chart = lineChart({name, series, onPick: x => pickStep(x)});
    if (chart) grid.append(chart);
  }
  main.append(grid);
}

async function pickStep(x) {
  const rs = await runs();
  for (const r of rs) {
    const steps = (await ARPO.get(`runs/${r.id}/steps`)).steps.map(st => st.step);
    if (!steps.length) continue;
    const best = steps.reduce((a, b) => Math.abs(b - x) < Math.abs(a - x) ? b : a);
    location.hash = link("step", {run: r.id, step: best});
    return;
  }
}

// ---- Trees of a step -----------------------------------------------------------------------------
function runSelect(rs, r, onChange) {
  return h("label", {}, "run ", h("select", {onchange: ev => onChange(+ev.target.value)},
    rs.map(x => h("option", {value: x.id, selected: x.id === r, text: x.name}))));
}

async function pageStep(main, q) {
  const rs = await runs();
  const r = +(q.run || 0);
  const steps = (await ARPO.get(`runs/${r}/steps`)).steps;
  const bar = h("div", {class: "toolbar"}, runSelect(rs, r, v => { location.hash = link("step", {run: v}); }));
  main.append(h("h2", {text: "Rollout trees"}), bar);
  if (!steps.length) {
    main.append(h("p", {class: "muted", text: `${rs[r].name} has no saved trees (training keeps them when ` +
      "run.save_rollouts > 0; older runs have none)."}));
    return;
  }
  const ids = steps.map(x => x.step);
  const step = q.step != null && ids.includes(+q.step) ? +q.step : ids[ids.length - 1];
  const page = +(q.page || 0);
  const at = ids.indexOf(step);
  const go = (st, p = 0) => { location.hash = link("step", {run: r, step: st, page: p}); };
  bar.append(
    h("button", {disabled: at <= 0, onclick: () => go(ids[at - 1]), text: "◀"}),
    h("label", {}, "step ", h("select", {id: "step-select", onchange: ev => go(+ev.target.value)},
      ids.map(x => h("option", {value: x, selected: x === step, text: x})))),
    h("button", {disabled: at >= ids.length - 1, onclick: () => go(ids[at + 1]), text: "▶"}),
    h("a", {href: link("entropy", {run: r, step}), text: "entropy after tool results for this step"}));
  const data = await ARPO.get(`runs/${r}/steps/${step}/page/${page}`);
  if (data.skipped.length) main.append(h("div", {class: "warn", text: `${data.skipped.length} problem(s) reading this ` +
    "step (lines skipped):\n" + data.skipped.join("\n")}));
  main.append(h("p", {class: "meta", text: `step ${step}: ${data.total} trees · page ${page + 1} of ${data.pages}` +
    " · squares: the trajectories, coloured by reward"}));
  const cards = h("div", {class: "cards"});
  for (const t of data.trees) {
    const mean = t.rewards.filter(x => x != null);
    cards.append(h("a", {class: "card tree-card", href: link("tree", {run: r, step, tree: t.index}), "data-tree": t.index},
      h("b", {text: `#${t.index} ${t.prompt_id ?? ""}`}),
      h("div", {class: "q", text: t.question || "(question not stored)"}),
      h("div", {class: "chips"}, t.rewards.map((x, i) => h("span", {class: "chip", title: `reward ${fmt(x)}`,
        style: `background:${rewardColor(x)}`}))),
      h("div", {class: "meta", text: `${t.trajectories} trajectories · ${t.branches} branched · ${t.correct} correct · ` +
        `mean reward ${mean.length ? fmt(mean.reduce((a, b) => a + b, 0) / mean.length, 3) : "–"} · ${t.tool_calls} tool calls`})));
  }
  main.append(cards);
  if (data.pages > 1) {
    main.append(h("div", {class: "toolbar", style: "margin-top:12px"},
      h("button", {disabled: page <= 0, onclick: () => go(step, page - 1), text: "previous page"}),
      h("span", {text: `page ${page + 1} / ${data.pages}`}),
      h("button", {disabled: page >= data.pages - 1, onclick: () => go(step, page + 1), text: "next page"})));
  }
}

// ---- One tree --------------------------------------------------------------------------------------
/* A trajectory's whole response: its ancestors' tokens up to its branch point, then its own. */
function fullPaths(T) {
  const memo = {};
  const get = i => {
    if (memo[i]) return memo[i];
    const t = T[i];
    const own = n => (t[n] || []);
    let base = {tokens: [], mask: [], entropy: [], logp: [], owner: []};
    if (t.parent != null) {
      const p = get(t.parent);
      const b = t.start;
      base = {tokens: p.tokens.slice(0, b), mask: p.mask.slice(0, b), entropy: p.entropy.slice(0, b),
        logp: p.logp.slice(0, b), owner: p.owner.slice(0, b)};
    }
    const n = own("mask").length;
    memo[i] = {tokens: base.tokens.concat(t.tokens || Array(n).fill("")), mask: base.mask.concat(own("mask")),
      entropy: base.entropy.concat(own("entropy")), logp: base.logp.concat(own("logp")),
      owner: base.owner.concat(Array(n).fill(i))};
    return memo[i];
  };
  return T.map((_, i) => get(i));
}
function resultRuns(mask) {
  const out = [];
  let a = -1;
  mask.forEach((m, i) => {
    if (!m && a < 0) a = i;
    if (m && a >= 0) { out.push([a, i]); a = -1; }
  });
  if (a >= 0) out.push([a, mask.length]);
  return out;
}
/* Deep-search metrics of a path (arpo/eval/deep_search.py): searches, pages read, supporting pages
   opened, the page its answer was read on. */
function deepText(d) {
  const sup = d.supporting.length ? ` · supporting pages opened ${d.supporting_opened}/${d.supporting.length}` : "";
  return `${d.searches} searches · ${d.pages_read} pages read${sup} · answer's page: ` +
    (d.answer_page || (d.answered ? "none read shows it" : "no answer"));
}

/* The tool calls answered by each result block: a pause may hold several calls (json tool format);
   the last call of a pause carries the block's result_span. Dumps without spans: one call a block. */
function callGroups(calls) {
  calls = calls || [];
  if (!calls.some(c => c.result_span)) return calls.map(c => [c]);
  const out = [];
  let cur = [];
  for (const c of calls) {
    cur.push(c);
    if (c.result_span && c.result_span[1] > 0) { out.push(cur); cur = []; }
  }
  if (cur.length) out.push(cur);
  return out;
}
const groupName = g => (g && g.length ? [...new Set(g.map(c => c.tool))].join(" + ") : "tool");
const chainOf = (T, i) => { const c = []; for (let k = i; k != null; k = T[k].parent) c.unshift(k); return c; };
function decisionAt(T, full, i, k) {
  const runs_ = resultRuns(full[i].mask);
  if (k >= runs_.length) return null;
  const e = runs_[k][1];
  const owner = full[i].owner[e - 1];
  const d = (T[owner].decisions || []).find(x => x.tool_call_index === k);
  return d ? {...d, owner, end: e} : {owner, end: e};
}

function drawTree(tr, full, sel, onSelect) {
  const T = tr.trajectories;
  const kids = T.map(() => []), roots = [];
  T.forEach(t => (t.parent == null ? roots : kids[t.parent]).push(t.id));
  const order = [];
  const dfs = i => { order.push(i); kids[i].slice().sort((a, b) => (T[b].start - T[a].start) || a - b).forEach(dfs); };
  roots.forEach(dfs);
  const row = {};
  order.forEach((id, k) => { row[id] = k; });
  const maxN = Math.max(1, ...T.map(t => t.n_tokens));
  const W = 1000, rowH = 26, top = 40, H = top + order.length * rowH + 16;
  const x0 = 150, x1 = W - 120;
  const X = p => x0 + p / maxN * (x1 - x0);
  const Y = i => top + row[i] * rowH + rowH / 2;
  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "tree-svg", id: "tree-svg"});
  const rootY = roots.length ? (Y(roots[0]) + Y(roots[roots.length - 1])) / 2 : top;
  const rootX = 76;
  for (const v of niceTicks(0, maxN, 8).filter(v => v <= maxN)) {
    svg.append(s("line", {x1: X(v), x2: X(v), y1: top - 6, y2: H - 10, stroke: "#f0f2f5"}));
    svg.append(s("text", {x: X(v), y: top - 10, "text-anchor": "middle"}, fmt(v)));
  }
  svg.append(s("text", {x: x0, y: 13}, "response token position →"));
  const chain = sel != null ? chainOf(T, sel) : [];
  const edges = s("g"), marks = s("g"), hits = s("g");
  for (const t of T) {
    const y = Y(t.id), xe = X(t.n_tokens);
    let d;
    if (t.parent == null) d = `M${rootX} ${rootY} C${rootX + 45} ${rootY} ${x0 - 45} ${y} ${x0} ${y} L${xe} ${y}`;
    else {
      const xb = X(t.start), yp = Y(t.parent);
      d = `M${xb} ${yp} L${xb} ${y - 7} Q${xb} ${y} ${xb + 7} ${y} L${Math.max(xe, xb + 7)} ${y}`;
    }
    edges.append(s("path", {class: "edge", d, "data-traj": t.id}));
    hits.append(s("path", {class: "hit", d: `M${X(t.start)} ${y} L${xe} ${y}`, "data-traj": t.id,
      onclick: () => onSelect(t.id)}, title(`path #${t.id}: click to read it`)));
    // tool results in this trajectory's own tokens
    const groups = callGroups(t.tool_calls);
    resultRuns(full[t.id].mask).forEach(([a, b], k) => {
      if (b <= t.start) return;
      const g = groups[k] || [];
      marks.append(s("rect", {class: "result", x: X(a), y: y - 5, width: Math.max(3, X(b) - X(a)), height: 10, rx: 2,
        "data-traj": t.id, "data-result": k}, title(`${groupName(g)} result ${k + 1}` +
        g.map(c => (c.output != null ? `\n${String(c.output).slice(0, 160)}` : "")).join(""))));
    });
    // the ARPO branch decisions this trajectory took (one per tool result, while the group had room)
    for (const dcs of t.decisions || []) {
      const rr = resultRuns(full[t.id].mask)[dcs.tool_call_index];
      if (!rr) continue;
      const xd = X(rr[1]), r = 7;
      marks.append(s("path", {class: "decision" + (dcs.branched ? " branched" : ""),
        d: `M${xd} ${y - r} L${xd + r} ${y} L${xd} ${y + r} L${xd - r} ${y} Z`, "data-traj": t.id,
        "data-result": dcs.tool_call_index, "data-branched": dcs.branched ? 1 : 0},
      title(`decision after tool result ${dcs.tool_call_index + 1}: ΔH = ${signed(dcs.delta_entropy)}, ` +
        `P(branch) = ${fmt(dcs.probability, 3)} → ${dcs.branched ? "branched" : "not branched"}`)));
    }
  }
  // fork points: where a branch leaves its parent (right after one of the parent's tool results)
  for (const t of T) {
    if (t.parent == null) continue;
    const k = resultRuns(full[t.parent].mask).findIndex(([, b]) => b === t.start);
    marks.append(s("circle", {class: "fork", cx: X(t.start), cy: Y(t.parent), r: 2.4, "data-traj": t.id,
      "data-parent": t.parent, "data-pos": t.start, "data-after-result": k},
    title(`branch point: path #${t.id} forks from #${t.parent} at token ${t.start}` +
      (k >= 0 ? `, right after tool result ${k + 1}` : ""))));
  }
  // the selected path, root to leaf
  chain.forEach((c, j) => {
    const t = T[c], y = Y(c);
    const end = j + 1 < chain.length ? T[chain[j + 1]].start : t.n_tokens;
    const from = t.parent == null ? `M${rootX} ${rootY} C${rootX + 45} ${rootY} ${x0 - 45} ${y} ${x0} ${y}` :
      `M${X(t.start)} ${Y(t.parent)} L${X(t.start)} ${y - 7} Q${X(t.start)} ${y} ${X(t.start) + 7} ${y}`;
    edges.append(s("path", {class: "edge on-path", d: `${from} L${Math.max(X(end), X(t.start) + 7)} ${y}`}));
  });
  svg.append(edges, hits, marks);
  svg.append(s("circle", {class: "root", cx: rootX, cy: rootY, r: 7}, title("the prompt")));
  svg.append(s("text", {x: rootX - 12, y: rootY + 4, "text-anchor": "end"}, "prompt"));
  for (const t of T) {
    const y = Y(t.id), xe = X(t.n_tokens);
    svg.append(s("circle", {class: "leaf" + (chain.includes(t.id) && t.id === sel ? " on-path" : ""), cx: xe, cy: y, r: 6,
      fill: rewardColor(t.reward), "data-traj": t.id, "data-reward": t.reward, onclick: () => onSelect(t.id)},
    title(`path #${t.id}: reward ${fmt(t.reward)}${t.correct ? " (correct)" : ""} · ${t.finish_reason || ""}`)));
    svg.append(s("text", {class: "label", x: xe + 10, y: y + 4, "data-traj": t.id, onclick: () => onSelect(t.id)},
      `#${t.id}  ${fmt(t.reward, 3)}${t.correct ? " ✓" : ""}`));
  }
  return svg;
}

function treeKey() {
  const icon = (...kids) => s("svg", {width: 16, height: 12, viewBox: "-8 -6 16 12"}, ...kids);
  return h("div", {class: "keyrow"},
    h("span", {}, icon(s("rect", {x: -7, y: -4, width: 14, height: 8, fill: "#e8f0fb", stroke: "#9bb8e6"})), " tool result"),
    h("span", {}, icon(s("path", {d: "M0 -5 L5 0 L0 5 L-5 0 Z", fill: "#e07b00", stroke: "#e07b00"})), " branch decision: branched"),
    h("span", {}, icon(s("path", {d: "M0 -5 L5 0 L0 5 L-5 0 Z", fill: "#fff", stroke: "#e07b00"})), " not branched (hover: ΔH, P)"),
    h("span", {}, icon(s("circle", {r: 3.5, fill: "#2f6fd6"})), " branch point"),
    h("span", {}, "leaf reward ", h("span", {class: "grad", style: `background:linear-gradient(90deg,${rewardColor(-1)},${rewardColor(0)},${rewardColor(1)})`}), " −1 … 0 … 1"));
}

function quantile(xs, q) {
  if (!xs.length) return 0;
  const v = xs.slice().sort((a, b) => a - b);
  return v[Math.min(v.length - 1, Math.floor(q * (v.length - 1)))];
}

function pathPanel(tr, full, i, mode) {
  const T = tr.trajectories, t = T[i], f = full[i];
  const adv = t.advantage;
  const gen = f.entropy.filter((_, p) => f.mask[p]);
  const hScale = Math.max(1e-6, quantile(gen, 0.98));
  const advAbs = adv ? Math.max(1e-6, ...adv.map(Math.abs)) : 1;
  const box = h("div", {class: "path", id: "path", "data-traj": i});
  const chain = chainOf(T, i);
  const advVals = adv ? [...new Set(adv.filter((_, p) => f.mask[p]).map(v => fmt(v, 3)))] : [];
  const advText = !adv ? "no advantage stored (not trained)" : advVals.length === 1 ?
    `${signed(adv.find((_, p) => f.mask[p]) ?? 0)} on every generated token (${tr.attribution || "soft"} attribution)` :
    `per token, from ${signed(Math.min(...adv))} to ${signed(Math.max(...adv))} (${tr.attribution || "hard"} attribution; hover a token)`;
  box.append(h("h3", {text: `Path #${i}` + (chain.length > 1 ? ` (${chain.map(c => "#" + c).join(" → ")})` : "")}),
    h("table", {class: "kv"}, h("tbody", {},
      h("tr", {}, h("td", {text: "reward"}), h("td", {text: `${fmt(t.reward)}${t.correct ? " · correct" : ""}` +
        (t.answer != null ? ` · answer ${t.answer}` : "") + (t.format_error ? ` · format error: ${t.format_error}` : "")})),
      h("tr", {}, h("td", {text: "advantage"}), h("td", {text: advText})),
      t.deep_search ? h("tr", {}, h("td", {text: "deep search"}), h("td", {text: deepText(t.deep_search)})) : null,
      h("tr", {}, h("td", {text: "tokens"}), h("td", {text: `${t.n_tokens} (${gen.length} generated) · ended: ${t.finish_reason || "–"}` +
        (t.initial_entropy != null ? ` · H_initial ${fmt(t.initial_entropy, 3)}` : "")})))));
  const legend = mode === "entropy" ?
    h("span", {}, "entropy ", h("span", {class: "grad", style: "background:linear-gradient(90deg,rgba(240,110,20,0),rgba(240,110,20,.9))"}), ` 0 … ${fmt(hScale, 3)} nats`) :
    mode === "advantage" ? h("span", {}, "advantage ", h("span", {class: "grad", style: "background:linear-gradient(90deg,rgba(215,48,39,.8),rgba(215,48,39,0),rgba(26,152,80,0),rgba(26,152,80,.8))"}), ` −${fmt(advAbs, 3)} … +${fmt(advAbs, 3)}`) : null;
  box.append(h("div", {class: "keyrow"}, h("label", {}, "shade tokens by ",
    h("select", {id: "shade", onchange: ev => { SHADE = ev.target.value; renderPath(); }},
      ["entropy", "advantage", "none"].map(m => h("option", {value: m, selected: m === mode, text: m})))), legend,
  h("span", {}, "generated text (tool calls in dashed boxes) · tool results in blue · branch decisions in orange")));
  const text = h("div", {class: "text"});
  if (!t.tokens && t.text != null) {  // a dump written before token texts were kept: its plain text
    text.append(h("span", {class: "muted", text: "(this file has no per-token texts; plain text)\n"}), t.text);
    box.append(text);
    return box;
  }
  const results = resultRuns(f.mask);
  const forkAt = {};
  chain.slice(1).forEach(c => { forkAt[T[c].start] = c; });
  const groups = callGroups(t.tool_calls);
  // tokens of each pause's tool calls: from the first call's opening tag (<python>, <search>, ... or
  // <tool_call>) to the result: set apart, still shaded
  const callTok = new Set();
  let prev = 0;
  results.forEach(([a], k) => {
    const g = groups[k] || [];
    let str = "";
    const starts = [];
    for (let p = prev; p < a; p++) { starts.push(str.length); str += f.tokens[p]; }
    const opens = [];
    for (const tag of new Set(["<tool_call>", ...g.map(c => `<${c.tool}>`)])) {
      for (let i = str.indexOf(tag); i >= 0; i = str.indexOf(tag, i + 1)) opens.push(i);
    }
    opens.sort((x, y) => x - y);
    const c = g.length && opens.length ? opens[Math.max(0, opens.length - g.length)] : -1;
    if (c >= 0) for (let p = prev; p < a; p++) if (starts[p - prev] + f.tokens[p].length > c) callTok.add(p);
    prev = results[k][1];
  });
  let p = 0, callBox = null;
  const flushCall = () => { if (callBox) { text.append(callBox); callBox = null; } };
  while (p < f.mask.length) {
    if (forkAt[p] != null) {
      flushCall();
      text.append(h("span", {class: "forkmark", title: `from here on: path #${forkAt[p]} (branched here)`, text: `branch #${forkAt[p]} →`}));
    }
    if (!f.mask[p]) {  // a tool result, then the branch decision taken after it
      flushCall();
      const k = results.findIndex(([a]) => a === p);
      const [a, b] = results[k];
      const g = groups[k] || [];
      const secs = g.filter(c => c.elapsed_s != null).map(c => c.elapsed_s);
      text.append(h("span", {class: "resultblock", "data-result": k},
        h("span", {class: "lbl", text: `${groupName(g)} result ${k + 1}` + (secs.length ? ` · ${fmt(Math.max(...secs), 2)} s` : "") +
          (g.some(c => c.ok === false) ? " · failed" : "")}), f.tokens.slice(a, b).join("").replace(/^\n+|\n+$/g, "")));
      const d = decisionAt(T, full, i, k);
      if (b < f.mask.length || (d && d.branched != null)) {
        const here = forkAt[b] != null ? ` — this path is the branch #${forkAt[b]} that started here` : "";
        text.append(d && d.branched != null ?
          h("span", {class: "decisionline" + (d.branched ? " branched" : ""), "data-result": k,
            "data-branched": d.branched ? 1 : 0},
          `branch decision after result ${k + 1}: ΔH = ${signed(d.delta_entropy)} → P(branch) = ${fmt(d.probability, 3)} → ` +
            `${d.branched ? "branched" : "not branched"}${here}`) :
          h("span", {class: "decisionline", "data-result": k}, "no branch decision here (the group already had its M trajectories)" + here));
      }
      p = b;
      continue;
    }
    let bg = "transparent";
    const H = f.entropy[p], A = adv ? adv[p] : null;
    if (mode === "entropy" && H != null) bg = `rgba(240,110,20,${(Math.min(1, H / hScale) * 0.9).toFixed(3)})`;
    else if (mode === "advantage" && A != null) {
      const al = (Math.min(1, Math.abs(A) / advAbs) * 0.8).toFixed(3);
      bg = A >= 0 ? `rgba(26,152,80,${al})` : `rgba(215,48,39,${al})`;
    }
    const span = h("span", {class: "tok", style: `background:${bg}`, "data-pos": p, "data-h": H,
      title: `token ${p} · entropy ${fmt(H, 3)} nats · logp ${fmt(f.logp[p], 3)}` + (A != null ? ` · advantage ${signed(A)}` : "")},
    f.tokens[p]);
    if (callTok.has(p)) {
      if (!callBox) callBox = h("span", {class: "call", title: "tool call"});
      callBox.append(span);
    } else {
      flushCall();
      text.append(span);
    }
    p++;
  }
  flushCall();
  box.append(text);
  return box;
}

let SHADE = "entropy";
let renderPath = () => {};

async function pageTree(main, q) {
  const r = +(q.run || 0), step = +(q.step || 0), ti = +(q.tree || 0);
  const tr = await ARPO.get(`runs/${r}/steps/${step}/trees/${ti}`);
  const T = tr.trajectories;
  const full = fullPaths(T);
  let sel = q.sel != null && T[+q.sel] ? +q.sel : null;
  const back = link("step", {run: r, step, page: Math.floor(ti / ((await ARPO.get("runs")).page_size || 24))});
  main.append(h("div", {class: "toolbar"}, h("a", {href: back, text: `← step ${step}`}),
    h("a", {href: link("tree", {run: r, step, tree: ti - 1}), style: ti > 0 ? null : "visibility:hidden", text: "◀ previous tree"}),
    h("a", {href: link("tree", {run: r, step, tree: ti + 1}), style: ti + 1 < tr.trees_in_step ? null : "visibility:hidden",
      text: "next tree ▶"})));
  main.append(h("h2", {text: `Step ${step} · tree #${ti}` + (tr.prompt_id != null ? ` · ${tr.prompt_id}` : "")}));
  if (tr.skipped && tr.skipped.length) main.append(h("div", {class: "warn", text: tr.skipped.join("\n")}));
  if (tr.question) main.append(h("p", {}, h("b", {text: "Question: "}), tr.question,
    tr.gold != null ? h("span", {class: "muted", text: `   gold: ${[].concat(tr.gold).join(" | ")}`}) : null));
  const nb = T.filter(t => t.parent != null).length;
  main.append(h("p", {class: "meta", text: `${T.length} trajectories (${T.length - nb} global samples, ${nb} branch${nb === 1 ? "" : "es"})` +
    (tr.preset ? ` · algo ${tr.preset}` : "") + (tr.attribution ? ` · ${tr.attribution} attribution` : "") +
    (tr.trained === false ? " · not trained (no advantages)" : "")}));
  if (tr.prompt) main.append(h("details", {}, h("summary", {text: "prompt"}), h("div", {class: "prompt", text: tr.prompt})));
  main.append(treeKey());
  const svgBox = h("div", {id: "tree-box"});
  const pathBox = h("div", {id: "path-box"});
  main.append(svgBox, pathBox);
  const select = i => {
    sel = i;
    history.replaceState(null, "", link("tree", {run: r, step, tree: ti, sel: i}));
    svgBox.replaceChildren(drawTree(tr, full, sel, select));
    renderPath();
  };
  renderPath = () => pathBox.replaceChildren(sel == null ?
    h("p", {class: "muted", text: "Click a path (its line, leaf or label) to read its tokens."}) : pathPanel(tr, full, sel, SHADE));
  svgBox.append(drawTree(tr, full, sel, select));
  renderPath();
}

// ---- Entropy after tool results (paper Fig. 1) ----------------------------------------------------
async function pageEntropy(main, q) {
  const rs = await runs();
  const r = +(q.run || 0);
  const steps = (await ARPO.get(`runs/${r}/steps`)).steps.map(x => x.step);
  const scope = q.step != null && q.step !== "" ? +q.step : null;
  main.append(h("h2", {text: "Entropy after tool results"}));
  main.append(h("div", {class: "toolbar"},
    runSelect(rs, r, v => { location.hash = link("entropy", {run: v}); }),
    h("label", {}, "over ", h("select", {id: "entropy-scope", onchange: ev => {
      location.hash = link("entropy", ev.target.value === "" ? {run: r} : {run: r, step: ev.target.value});
    }}, h("option", {value: "", text: "the whole run", selected: scope == null}),
    steps.map(x => h("option", {value: x, selected: x === scope, text: `step ${x}`}))))));
  if (!steps.length) {
    main.append(h("p", {class: "muted", text: "No saved rollouts in this run."}));
    return;
  }
  const e = await ARPO.get(scope == null ? `runs/${r}/entropy` : `runs/${r}/steps/${scope}/entropy`);
  const curve = (label, ys, color, dash) => ({label, color, dash,
    pts: (ys || []).map((y, x) => [x, y]).filter(pt => pt[1] != null)});
  const series = [curve("response start (initial)", e.initial, PALETTE[0], ""),
    curve("after any tool result", e.after_tool, PALETTE[1], "")];
  Object.entries(e.after_tool_by_call || {}).forEach(([j, c], k) =>
    series.push(curve(`after tool result ${j}`, c, PALETTE[2 + k], "2 3")));
  main.append(h("p", {class: "meta", text: `Mean per-token entropy (nats) at each position of a generated segment: ` +
    `segment 0 starts the response, the others follow a tool result. ${e.trajectories} global trajectories, ` +
    `${e.tool_results} tool results` + (e.steps != null ? `, ${e.steps} saved steps` : "") +
    ". ARPO's premise (paper Fig. 1): the curve after tool results starts higher."}));
  const grid = h("div", {class: "grid wide"});
  const c1 = lineChart({name: "entropy by position in the segment", series, xLabel: "token position", width: 620, height: 280});
  grid.append(c1 || h("p", {class: "muted", text: "No entropies recorded."}));
  if (e.per_step && e.per_step.length) {
    const ps = e.per_step;
    grid.append(lineChart({name: "first 20 tokens, per step", xLabel: "step", width: 620, height: 280,
      series: [{label: "response start", color: PALETTE[0], pts: ps.filter(x => x.initial != null).map(x => [x.step, x.initial])},
        {label: "after tool results", color: PALETTE[1], pts: ps.filter(x => x.after_tool != null).map(x => [x.step, x.after_tool])}],
      onPick: st => { location.hash = link("entropy", {run: r, step: st}); }}));
  }
  main.append(grid);
}

// ---- routing -----------------------------------------------------------------------------------------
async function render() {
  const {page, q} = query();
  const main = document.getElementById("main");
  document.querySelectorAll("header nav a").forEach(a =>
    a.classList.toggle("active", a.dataset.page === page || (page === "tree" && a.dataset.page === "step")));
  hideTip();
  const next = h("main", {id: "main"});
  try {
    const rs = await runs();
    document.getElementById("runs-legend").replaceChildren(...rs.map((r, i) =>
      h("span", {}, h("span", {class: "sw", style: `background:${runColor(i)}`}), r.name)));
    await ({run: pageRun, step: pageStep, tree: pageTree, entropy: pageEntropy}[page] || pageRun)(next, q);
    next.dataset.ready = page;
  } catch (err) {
    next.append(h("div", {class: "err", text: "Could not show this page: " + err.message}));
    next.dataset.ready = "error";
  }
  main.replaceWith(next);
}
window.addEventListener("hashchange", render);
render();
