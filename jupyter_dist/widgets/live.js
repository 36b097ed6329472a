// The live view of a jupyter-dist job: a header (job state, elapsed time, counts per
// state), a rank bar (one chip per rank or task, coloured by its state; at scale a compact
// grid with the failed ones first), the output of all ranks or of the chosen one, the root
// cause when the job fails, and the inspector folded under a one-line summary. While the
// job runs, "Stacks" asks the Jupyter server for every rank's Python stack, grouped
// (the job's owner reads them even while its cell keeps the kernel busy).
//
// Lines arrive as deltas (custom messages); at most `max_lines` per tab stay in the
// browser, the full log stays on disk. Lines are kept by the model, not the view: the model
// exists from the moment the kernel creates the widget, while a view may render later (the
// first widget of a page loads its code first) or again (an output re-attached). Either way
// it draws what came before. A page loaded again (reload, another browser) starts with
// none: the model's lines_total says how many the job printed, so it asks the kernel once
// for the last lines of every tab, which the kernel reads from the job's store.
//
// Looks: JupyterLab's own CSS variables (light and dark themes), with fallbacks where
// they are missing (VS Code); see live.css.

// Line prefixes in the all-ranks view: JupyterLab's palette where it exists, the five hues
// that differ in its themes (green, red, blue, purple, light blue) first.
const COLOURS = ["--jp-mirror-editor-keyword-color", "--jp-mirror-editor-string-color",
  "--jp-mirror-editor-def-color", "--jp-mirror-editor-meta-color",
  "--jp-mirror-editor-atom-color", "--jp-mirror-editor-number-color",
  "--jp-mirror-editor-variable-2-color", "--jp-mirror-editor-builtin-color"];
const FALLBACK = ["#008000", "#ba2121", "#00f", "#a2f", "#88f", "#080", "#05a", "#a0f"];
const SGR = { 30: "#555", 31: "#c33", 32: "#2a2", 33: "#b80", 34: "#36c", 35: "#a3a",
  36: "#0aa", 37: "#999", 90: "#777", 91: "#e55", 92: "#4c4", 93: "#db2", 94: "#58e",
  95: "#c5c", 96: "#2cc", 97: "#ccc" };

// Up to this many ranks, every chip carries its label; beyond, a compact numbered grid.
const COMPACT_AFTER = 16;
// Meters: the last minute of each rank's CPU share and memory (one reading a second).
const METER_POINTS = 60;
// Charts: about the most points kept per rank and metric (older ones thinned by half when
// more come), and above how many ranks a chart draws their mean and min-max band instead.
export const CHART_POINTS = 2000;
const BAND_AFTER = 8;
// The most charts a view draws (the first by name): a rank that reports a metric per layer
// or per sample would otherwise have the page redraw thousands at every update.
export const MOST_CHARTS = 48;
const BUCKETS = 200;  // x intervals of a band
const RATE_WINDOW_S = 30;  // a rank's steps per second, over its last points this recent
export const SLOW_BELOW = 0.8;  // a rank this far under the median rate...
export const SLOW_FOR_S = 30;  // ...for this long is named

// "1.2 GiB", "312 MiB": resident memory as people read it.
export function bytes(size) {
  const mib = size / 2 ** 20;
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${Math.round(mib)} MiB`;
}

// A sparkline of `values` (oldest first, the last METER_POINTS) as an SVG: a line scaled to
// `top` (or the highest value), drawn in the text colour of its cell, across the whole
// width however few the readings (one reading: a level line), so a short job's reads too.
export function sparkline(values, top, width = 64, height = 14) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "distrun-spark");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const shown = values.slice(-METER_POINTS);
  const drawn = shown.length === 1 ? [shown[0], shown[0]] : shown;
  const high = Math.max(top || 0, ...drawn, 1e-9);
  const step = width / Math.max(drawn.length - 1, 1);
  const points = drawn.map((v, i) =>
    `${(i * step).toFixed(1)},${(height - 1 - (v / high) * (height - 2)).toFixed(1)}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  return svg;
}

// How a state reads in counts and which ones surface first.
const ORDER = ["failed", "running", "starting", "pending", "stopped", "succeeded"];

// Text with ANSI colour codes -> DOM nodes (colours and bold; other codes dropped).
export function ansiToNodes(text) {
  const nodes = [];
  let colour = null, bold = false;
  const parts = text.split(/\x1b\[([0-9;]*)m/);
  for (let i = 0; i < parts.length; i++) {
    if (i % 2 === 1) {
      for (const code of (parts[i] || "0").split(";").map(Number)) {
        if (code === 0) { colour = null; bold = false; }
        else if (code === 1) bold = true;
        else if (code === 22) bold = false;
        else if (code === 39) colour = null;
        else if (SGR[code]) colour = SGR[code];
      }
    } else if (parts[i]) {
      const span = document.createElement("span");
      span.textContent = parts[i].replace(/\x1b\[[0-9;?]*[A-Za-z]/g, "");
      if (colour) span.style.color = colour;
      if (bold) span.style.fontWeight = "bold";
      nodes.push(span);
    }
  }
  return nodes;
}

// What a terminal shows of a line holding carriage returns (a progress bar that redraws
// itself): the text after the last one. The store keeps the whole line.
export function lastState(text) {
  const trimmed = text.replace(/\r+$/, "");
  return trimmed.slice(trimmed.lastIndexOf("\r") + 1);
}

// "0:07", "12:03", "1:02:03": elapsed seconds as a clock.
export function clock(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const [h, m, r] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(r)}` : `${m}:${pad(r)}`;
}

// Every output tab (log key) and the state of the process it belongs to: a process's own
// name, and the ranks that a launcher (torchrun, mpirun) carries.
export function keyStates(processes) {
  const states = {};
  for (const p of processes) {
    for (const key of p.keys || [p.name]) states[key] = { state: p.state, process: p };
  }
  return states;
}

// "3 running · 1 failed" (failed first); "all succeeded" when every process agrees.
export function stateCounts(processes) {
  const counts = {};
  for (const p of processes) counts[p.state] = (counts[p.state] || 0) + 1;
  const states = Object.keys(counts);
  const paused = processes.filter((p) => p.paused?.length).length;
  const said = paused ? ` · ${paused} paused in the debugger` : "";
  if (states.length === 1 && processes.length > 1) return `all ${states[0]}${said}`;
  return states.sort((a, b) => rankOf(a) - rankOf(b)).map((s) => `${counts[s]} ${s}`).join(" · ") +
    said;
}

function rankOf(state) {
  const i = ORDER.indexOf(state);
  return i < 0 ? ORDER.length : i;
}

const byNumber = (a, b) => a.localeCompare(b, undefined, { numeric: true });

// Keyed by job id and session cell: anywidget hands initialize and render different
// proxies of one model, and each cell of a session has its own lines.
// "job/cell" -> { buffers: key -> [line], labels: key -> label, total, meters, views: Set<view>,
//   ui: { active, inspector, scales: metric -> "log" | "linear" }, colours: key -> CSS colour }  (what the user picked, and
//   each rank's colour, kept when the settled view replaces the live one at the job's end)
// Held on the page, not in this module: anywidget may load the module once per model, and
// a job's settled view (a new model, see LiveView.settled) must find the lines its live
// view received.
const LINES = globalThis.__jupyterDistLines ??= new Map();

function linesOf(model) {
  const id = `${model.get("job_id")}/${model.get("cell") || 0}`;
  if (!LINES.has(id)) {
    LINES.set(id, { buffers: { all: [] }, labels: {}, total: 0, meters: {}, views: new Set(),
      ui: { active: "all", inspector: false, scales: {} }, colours: {},
      metrics: {}, progress: {}, metricsTotal: 0 });
  }
  return LINES.get(id);
}

// Lines into a job's buffers: each in its own tab and in "all", at most `max` per tab.
function keepLines(held, lines, max) {
  for (const line of lines) {
    if (!(line.key in held.buffers)) held.buffers[line.key] = [];
    held.labels[line.key] = line.label;
    for (const target of [held.buffers.all, held.buffers[line.key]]) {
      target.push(line);
      if (target.length > max) target.splice(0, target.length - max);
    }
  }
}

function initialize({ model }) {
  const held = linesOf(model);
  const toLines = (msg) => msg.lines.map(([key, label, stream, text]) =>
    ({ key, label, stream, text }));
  const keep = (lines) => keepLines(held, lines, model.get("max_lines"));
  model.on("msg:custom", (msg) => {
    if (msg.type === "lines") {
      const lines = toLines(msg);
      keep(lines);
      held.total = msg.total;
      for (const view of held.views) view.append(lines);
    } else if (msg.type === "meters") {
      for (const [key, reading] of Object.entries(msg.readings)) {
        const series = (held.meters[key] ??= []);
        series.push(reading);
        if (series.length > METER_POINTS) series.splice(0, series.length - METER_POINTS);
      }
      for (const view of held.views) view.meters?.();
    } else if (msg.type === "metrics") {
      if (msg.history) {  // what a page that lost its charts would hold: it replaces them
        if (msg.total <= held.metricsTotal) return;
        held.metrics = {};
        held.progress = {};
      }
      keepMetrics(held, msg.records);
      held.metricsTotal = msg.total;
      for (const view of held.views) view.charts?.();
    } else if (msg.type === "history" && msg.total > held.total) {
      // The store's last lines of every tab are what this page would hold: they replace
      // the buffers.
      for (const key of Object.keys(held.buffers)) delete held.buffers[key];
      held.buffers.all = [];
      keep(toLines(msg));
      held.total = msg.total;
      for (const view of held.views) view.redraw();
    }
  });
  if (model.get("lines_total") > held.total ||
      (model.get("metrics_total") || 0) > held.metricsTotal) {
    model.send({ type: "history" });
  }
}

// Records as the kernel sends them ([key, step, time, {name: value}], or a progress one:
// [key, null, time, null, [n, total], rate]) into `held.metrics` (name -> key -> [[step,
// time, value]]) and `held.progress` (key -> [n, total, rate]). A series past `most`
// points keeps every other one (and its last).
export function keepMetrics(held, records, most = CHART_POINTS) {
  for (const [key, step, time, values, progress, rate] of records) {
    if (progress) {
      held.progress[key] = [progress[0], progress[1], rate];
      continue;
    }
    for (const [name, value] of Object.entries(values || {})) {
      const series = ((held.metrics[name] ??= {})[key] ??= []);
      series.push([step, time, value]);
      if (series.length > most) {
        const kept = series.filter((_, i) => i % 2 === 0 || i === series.length - 1);
        series.splice(0, series.length, ...kept);
      }
    }
  }
}

// One chart's drawing: its x axis ("step" where every point has one, else "time": seconds
// since the first point), and per rank its points, or above `bandAfter` ranks the mean
// and the min-max band over BUCKETS intervals of x; with the bounds of both axes.
export function chartOf(byKey, bandAfter = BAND_AFTER) {
  // Loops, not Math.min(...points): 64 ranks of CHART_POINTS overflow the call stack.
  const keys = Object.keys(byKey).sort(byNumber);
  let stepped = true, t0 = Infinity;
  for (const key of keys) {
    for (const p of byKey[key]) {
      if (p[0] === null || p[0] === undefined) stepped = false;
      t0 = Math.min(t0, p[1] ?? 0);
    }
  }
  const axis = stepped ? "step" : "time";
  const xOf = (p) => (axis === "step" ? p[0] : (p[1] ?? t0) - t0);
  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  const lines = keys.map((key) => ({ key,
    points: byKey[key].map((p) => [xOf(p), p[2]]).filter(([x, v]) => finite(x) && finite(v)) }));
  const bounds = { xmin: Infinity, xmax: -Infinity, ymin: Infinity, ymax: -Infinity };
  for (const line of lines) {
    for (const [x, v] of line.points) {
      if (x < bounds.xmin) bounds.xmin = x;
      if (x > bounds.xmax) bounds.xmax = x;
      if (v < bounds.ymin) bounds.ymin = v;
      if (v > bounds.ymax) bounds.ymax = v;
    }
  }
  if (keys.length <= bandAfter) return { axis, lines, ...bounds };
  const width = (bounds.xmax - bounds.xmin) / BUCKETS || 1;
  const buckets = new Map();
  for (const line of lines) {
    for (const [x, v] of line.points) {
      const i = Math.min(BUCKETS - 1, Math.floor((x - bounds.xmin) / width));
      const b = buckets.get(i) ?? { x: 0, n: 0, sum: 0, low: Infinity, high: -Infinity };
      b.x += x; b.n += 1; b.sum += v; b.low = Math.min(b.low, v); b.high = Math.max(b.high, v);
      buckets.set(i, b);
    }
  }
  const band = [...buckets.keys()].sort((a, b) => a - b).map((i) => {
    const b = buckets.get(i);
    return { x: b.x / b.n, mean: b.sum / b.n, low: b.low, high: b.high };
  });
  return { axis, band, ranks: keys.length, ...bounds };
}

// Each rank's last step and its steps per second over its last RATE_WINDOW_S seconds of
// points (null with fewer than two), from the metric it reported most: key -> {step, rate,
// time}.
export function stepRates(metrics) {
  const best = {};
  for (const byKey of Object.values(metrics)) {
    for (const [key, points] of Object.entries(byKey)) {
      const stepped = points.filter((p) => p[0] !== null && p[0] !== undefined && p[1] != null);
      if (stepped.length > (best[key]?.length ?? 0)) best[key] = stepped;
    }
  }
  const found = {};
  for (const [key, points] of Object.entries(best)) {
    const last = points[points.length - 1];
    const window = points.filter((p) => p[1] >= last[1] - RATE_WINDOW_S);
    const first = window[0];
    const rate = window.length > 1 && last[1] > first[1]
      ? (last[0] - first[0]) / (last[1] - first[1]) : null;
    found[key] = { step: last[0], rate, time: last[1] };
  }
  return found;
}

// A process's last step and steps per second, for its row in the inspector: "step 340 ·
// 2.1/s", or "" where none of its keys reported a step.
export function rankProgress(rates, keys) {
  const found = keys.map((key) => rates[key]).find(Boolean);
  if (!found) return "";
  return `step ${found.step}` + (found.rate !== null ? ` · ${found.rate.toFixed(1)}/s` : "");
}

// Ranks whose rate has stayed SLOW_BELOW under the median of all ranks' rates for at least
// SLOW_FOR_S seconds (`since`, key -> when it was first seen slow, is kept between calls):
// [{key, rate, median}]. Ranks in lock step (DDP) never are: they wait for each other.
export function slowRanks(rates, since, now) {
  const known = Object.entries(rates).filter(([, r]) => r.rate !== null && r.rate > 0);
  if (known.length < 2) return [];
  const sorted = known.map(([, r]) => r.rate).sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  const median = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  const slow = [];
  for (const [key, r] of known) {
    if (r.rate < SLOW_BELOW * median) {
      since[key] ??= now;
      if (now - since[key] >= SLOW_FOR_S) slow.push({ key, rate: r.rate, median });
    } else {
      delete since[key];
    }
  }
  return slow;
}

// The job's progress from each rank's last progress bar: the slowest rank's count, its
// rate and the time left at that rate. null where no rank drew one.
export function progressOf(progress) {
  const rows = Object.values(progress).filter(([, total]) => total > 0);
  if (!rows.length) return null;
  const [n, total, rate] = rows.reduce((a, b) => (b[0] / b[1] < a[0] / a[1] ? b : a));
  const left = rate > 0 ? (total - n) / rate : null;
  const speed = rate >= 1 ? `${rate.toFixed(1)} it/s` : rate > 0 ? `${(1 / rate).toFixed(1)} s/it` : "";
  return { n, total, rate, left,
    text: [`${n}/${total}`, speed, left !== null && n < total ? `ETA ${clock(left)}` : ""]
      .filter(Boolean).join(" · ") };
}

// About `count` round values from lo to hi, for an axis's ticks: a step of 1, 2 or 5 times
// a power of ten, the nearest to (hi - lo) / count (d3's tickStep), at least 1 where
// `integers` (steps); the first at or above lo.
export function ticksOf(lo, hi, count = 4, integers = false) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const error = raw / power;
  let step = power * (error >= Math.sqrt(50) ? 10 : error >= Math.sqrt(10) ? 5
    : error >= Math.SQRT2 ? 2 : 1);
  if (integers) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) {
    ticks.push(Number((i * step).toPrecision(12)));
  }
  return ticks;
}

// A y axis for a chart's values: "log" (the values' log10 drawn; ticks at powers of ten,
// or round values where the values span less than one) or "linear". A log axis needs
// every value above 0.
export function yAxisOf(chart, scale) {
  const log = scale === "log" && chart.ymin > 0;
  if (!log) {
    return { log, lo: chart.ymin, hi: chart.ymax, of: (v) => v, ticks: ticksOf(chart.ymin, chart.ymax) };
  }
  const lo = Math.log10(chart.ymin), hi = Math.log10(chart.ymax);
  let ticks = ticksOf(Math.ceil(lo - 1e-9), Math.floor(hi + 1e-9), 4, true).map((e) => 10 ** e);
  if (ticks.length < 2) ticks = ticksOf(chart.ymin, chart.ymax).filter((v) => v > 0);
  return { log, lo, hi, of: Math.log10, ticks };
}

// A metric's y axis unless the user picked one: log for a loss whose positive values span
// ten times or more (as TensorBoard users read a loss), else linear.
export function defaultScale(name, chart) {
  return /loss/i.test(name) && chart.ymin > 0 && chart.ymax >= 10 * chart.ymin ? "log" : "linear";
}

// A number as a chart's caption shows it.
export function short(value) {
  if (!Number.isFinite(value)) return String(value);
  const size = Math.abs(value);
  return size !== 0 && (size < 1e-3 || size >= 1e5) ? value.toExponential(2)
    : String(Number(value.toPrecision(4)));
}

// The Jupyter server this page talks to ({ baseUrl, token }), from the page's config; null
// where there is none (VS Code), and there the view offers no Stacks button.
export function jupyterServer(doc = document) {
  const config = doc.getElementById("jupyter-config-data");
  if (!config) return null;
  try {
    const data = JSON.parse(config.textContent);
    return data.baseUrl ? { baseUrl: data.baseUrl, token: data.token || "" } : null;
  } catch {
    return null;
  }
}

// A POST to the Jupyter server's /distrun API (`path` under it), with the page's token and
// XSRF cookie: the reply's JSON, or { error } in one line.
async function postToServer(server, path, body, fetcher) {
  const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1];
  const headers = {};
  if (xsrf) headers["X-XSRFToken"] = decodeURIComponent(xsrf);
  if (server.token) headers.Authorization = `token ${server.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const url = `${server.baseUrl.replace(/\/?$/, "/")}distrun/${path}`;
  try {
    const reply = await fetcher(url, { method: "POST", headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body) });
    const answer = await reply.json().catch(() => ({}));
    if (!reply.ok) return { error: answer.message || `the server answered ${reply.status}` };
    return answer;
  } catch (error) {
    return { error: `the server could not be reached (${error.message || error})` };
  }
}

// Every rank's stack, read now by the job's owner (the server's /distrun/jobs/ID/stacks):
// { heading, summary: [line per group, odd ones first], text } or { error }.
export async function fetchStacks(server, jobId, fetcher = fetch) {
  return postToServer(server, `jobs/${encodeURIComponent(jobId)}/stacks`, undefined, fetcher);
}

// One pdb command to a set of paused ranks ("3", "0,2-3", "all"), through the server's
// /distrun/jobs/ID/debug (the job's owner reaches each rank's pdb, as `jupyter distrun
// debug` does): { answers: [{ rank, answer, paused } or { rank, error }] } or { error }.
export async function sendDebug(server, jobId, ranks, command, fetcher = fetch) {
  return postToServer(server, `jobs/${encodeURIComponent(jobId)}/debug`, { ranks, command },
    fetcher);
}

// The rank a log key belongs to ("rank-3" -> 3), or null.
export function rankOfKey(key) {
  const found = /^rank-(\d+)$/.exec(key || "");
  return found ? Number(found[1]) : null;
}

// What a pdb command adds to each rank's output, as pdb's own console shows it: the prompt
// and the command, then the answer; a rank that ran on after it says so. Lines of stream
// "debug", in each rank's tab ("rank-R").
export function debugLines(command, answers, labelOf = (key) => key) {
  const lines = [];
  for (const found of answers) {
    const key = `rank-${found.rank}`;
    const line = (text, stream = "debug") => ({ key, label: labelOf(key), stream, text });
    lines.push(line(`(Pdb) ${command}`));
    if (found.error) {
      lines.push(line(`error: ${found.error}`, "stderr"));
      continue;
    }
    const text = String(found.answer || "").replace(/\n$/, "");
    if (text) lines.push(...text.split("\n").map((t) => line(t)));
    // What the rank did when it did not wait for the next command (node_side/debugger.py).
    if (found.state === "busy") lines.push(line("(still runs the command; it pauses again once it ends)"));
    else if (found.state === "ended") {
      const how = found.exit || "ended";
      lines.push(line(`(${how} during the command${found.job ? `; the job ${found.job}` : ""})`));
    } else if (!found.paused) lines.push(line("(runs on)"));
  }
  return lines;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function render({ model, el }) {
  const maxLines = () => model.get("max_lines");
  const held = linesOf(model);
  const buffers = held.buffers;          // key -> [{key, label, stream, text}], shared
  const colourOf = held.colours;
  let active = held.ui.active;
  let drawnKeys = new Set();  // the keys the rank bar has a chip for

  const root = element("div", "distrun-live" + (model.get("final") ? " distrun-final" : ""));
  root.dataset.jobId = model.get("job_id");

  // Header: job state, name, elapsed time, counts, actions.
  const header = element("div", "distrun-header");
  const jobState = element("span", "distrun-chip distrun-job-state");
  const attemptChip = element("span", "distrun-chip distrun-attempt");  // "attempt 2 of 4"
  const title = element("span", "distrun-title");
  const elapsed = element("span", "distrun-elapsed");
  elapsed.title = "elapsed";
  const counts = element("span", "distrun-counts");
  const progressBox = element("span", "distrun-progress");  // the slowest rank's bar
  const progressFill = element("span", "distrun-progress-fill");
  const progressText = element("span", "distrun-progress-text");
  progressBox.append(progressFill, progressText);
  progressBox.style.display = "none";
  const actions = element("span", "distrun-actions");
  header.append(jobState, attemptChip, title, elapsed, counts, progressBox, actions);
  // In JupyterLab with our extension, the full log opens in its log viewer (the extension
  // marks the page and listens for this event); elsewhere the log folder path is shown.
  if (document.body.dataset.jupyterDistLogs === "1") {
    const open = element("button", "jp-Button jp-mod-styled jp-mod-minimal distrun-open-log",
      "Open full log");
    open.onclick = () => el.dispatchEvent(new CustomEvent("jupyter-dist:open-logs", {
      bubbles: true, detail: { jobId: model.get("job_id") },
    }));
    actions.appendChild(open);
  } else {
    const path = element("span", "distrun-muted distrun-log-dir");
    actions.appendChild(path);
  }

  // Stacks: every rank's Python stack, grouped; the odd group (the likely culprit) first.
  const server = jupyterServer();
  const stacksButton = element("button",
    "jp-Button jp-mod-styled jp-mod-minimal distrun-stacks-button", "Stacks");
  stacksButton.title = "every rank's Python stack now, grouped: which rank is stuck, and where";
  const stacks = element("div", "distrun-stacks");
  stacks.style.display = "none";
  if (server) actions.prepend(stacksButton);
  stacksButton.onclick = async () => {
    stacksButton.disabled = true;
    stacksButton.textContent = "Reading stacks…";
    drawStacks(await fetchStacks(server, model.get("job_id")));
    stacksButton.disabled = false;
    stacksButton.textContent = "Stacks";
  };

  // A stall notice (the kernel's `stall` trait) uses the same panel, marked as a warning.
  function drawStall() {
    const [notice, ...summary] = model.get("stall") || [];
    if (notice) {
      drawStacks({ heading: `The job ${notice}; every rank's stack, taken then:`, summary },
        true);
    } else if (stacks.classList.contains("distrun-stacks-stall")) {
      stacks.style.display = "none";  // it moves again
    }
  }

  function drawStacks(dump, stall = false) {
    stacks.classList.toggle("distrun-stacks-stall", stall);
    const close = element("button", "jp-Button jp-mod-minimal distrun-stacks-close", "×");
    close.title = "close";
    close.onclick = () => { stacks.style.display = "none"; };
    const head = element("div", "distrun-stacks-head");
    head.append(element("span", "", dump.error ? "Stacks could not be read" : dump.heading),
      close);
    const children = [head];
    if (dump.error) {
      children.push(element("div", "distrun-stacks-error", dump.error));
    } else {
      const list = element("ul", "distrun-stacks-groups");
      const groups = dump.summary || [];
      list.append(...groups.map((line, i) => element("li",
        i === 0 && groups.length > 1 ? "distrun-stacks-odd" : "", line)));
      children.push(list);
      if (dump.text) {
        const all = element("details", "distrun-stacks-all");
        all.append(element("summary", "", "Every frame, with its source line"),
          element("pre", "", dump.text));
        children.push(all);
      }
    }
    stacks.replaceChildren(...children);
    stacks.style.display = "";
  }

  // The debugger's console, under the output while a rank is paused: which ranks and where,
  // a set of ranks and a pdb command; each answer goes into its rank's output. Without a
  // Jupyter server to ask (VS Code), a line says where to debug them instead.
  function debugConsole() {
    const box = element("div", "distrun-debug");
    box.style.display = "none";
    // Keys typed here are the console's: JupyterLab's shortcuts (Enter edits the cell,
    // the arrows move between cells) leave them alone.
    box.setAttribute("data-lm-suppress-shortcuts", "true");
    const head = element("div", "distrun-debug-head");
    const where = element("ul", "distrun-debug-where");
    const form = element("form", "distrun-debug-form");
    const ranks = element("input", "jp-mod-styled distrun-debug-ranks");
    ranks.value = "all";
    ranks.setAttribute("aria-label", "ranks");
    ranks.title = "the ranks the command goes to: 3, 0,2-3 or all (every paused one)";
    const command = element("input", "jp-mod-styled distrun-debug-command");
    command.placeholder = "pdb command: p x, where, n, c";
    command.setAttribute("aria-label", "pdb command");
    command.spellcheck = false;
    const send = element("button", "jp-Button jp-mod-styled jp-mod-accept distrun-debug-send",
      "Send");
    send.type = "submit";
    const resume = element("button",
      "jp-Button jp-mod-styled jp-mod-minimal distrun-debug-continue", "Continue all");
    resume.type = "button";
    resume.title = "let every paused rank run on (pdb's c)";
    const status = element("span", "distrun-debug-status");
    form.append(element("span", "distrun-muted", "ranks"), ranks, command, send, resume,
      status);
    box.append(head, where, server ? form : element("div", "distrun-muted",
      `To step them: jupyter distrun debug ${model.get("job_id")} in a terminal.`));
    const history = (held.ui.debugHistory ??= []);
    let back = history.length;  // where the arrow keys are in the history
    let busy = false;

    async function run(text, to) {
      if (!text.trim() || busy) return;
      busy = true;
      for (const control of [ranks, command, send, resume]) control.disabled = true;
      status.textContent = `sending to ${to === "all" ? "every paused rank" : `ranks ${to}`}…`;
      status.classList.remove("distrun-debug-error");
      const reply = await sendDebug(server, model.get("job_id"), to, text);
      busy = false;
      for (const control of [ranks, command, send, resume]) control.disabled = false;
      if (reply.error) {
        status.textContent = reply.error;
        status.classList.add("distrun-debug-error");
      } else {
        status.textContent = "";
        const lines = debugLines(text.trim(), reply.answers || [], labelOf);
        keepLines(held, lines, maxLines());
        for (const view of held.views) view.append(lines);
      }
      command.focus();
    }
    function submit() {
      const text = command.value;
      if (text.trim() && history[history.length - 1] !== text) history.push(text);
      back = history.length;
      command.value = "";
      run(text, ranks.value.trim() || "all");
    }
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      submit();
    });
    resume.onclick = () => run("c", "all");
    // Enter sends (not left to the form: a notebook's own key handling may take it), the
    // arrows walk what was sent.
    for (const input of [ranks, command]) {
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") {
          event.preventDefault();
          submit();
        }
      });
    }
    command.addEventListener("keydown", (event) => {
      if (event.key !== "ArrowUp" && event.key !== "ArrowDown") return;
      back = Math.max(0, Math.min(history.length, back + (event.key === "ArrowUp" ? -1 : 1)));
      command.value = history[back] ?? "";
      event.preventDefault();
    });

    // The paused ranks, from the processes' states: "rank 1 (local0): paused at bp.py:7 ...".
    function draw() {
      const paused = [];
      for (const p of model.get("processes") || []) {
        (p.paused || []).forEach((text, i) => {
          const rank = (p.paused_ranks || [])[i] ?? p.rank;
          paused.push({ rank, text: `${rank === null || rank === undefined ? p.label
            : `rank ${rank}`} (${p.node}): ${text}` });
        });
      }
      const shown = paused.length > 0 && model.get("state") === "running";
      box.style.display = shown ? "" : "none";
      if (!shown) return;
      paused.sort((a, b) => (a.rank ?? 1e9) - (b.rank ?? 1e9));
      head.textContent = paused.length === 1 ? "Debugger: 1 rank paused"
        : `Debugger: ${paused.length} ranks paused`;
      const most = 4;  // at 64 ranks, a few lines and a count
      where.replaceChildren(...paused.slice(0, most).map((p) => element("li", "", p.text)),
        ...(paused.length > most ? [element("li", "distrun-muted",
          `and ${paused.length - most} more`)] : []));
    }

    // A rank's tab picked: the command goes to that rank; "All ranks": to every paused one.
    function follow(key) {
      const rank = rankOfKey(key);
      ranks.value = rank === null ? "all" : String(rank);
    }
    return { box, draw, follow };
  }

  const rankBar = element("div", "distrun-rankbar");
  rankBar.setAttribute("role", "tablist");
  const pane = element("pre", "distrun-lines");
  const charts = element("div", "distrun-charts");  // one per metric the ranks report
  const slowLine = element("div", "distrun-slow");  // a rank well below the others' rate
  slowLine.style.display = "none";
  const cause = element("pre", "distrun-root-cause");
  const attempts = element("ul", "distrun-attempts");  // each earlier attempt's cause
  const checks = element("ul", "distrun-checks");  // what stands out in the plan
  const inspector = element("details", "distrun-inspector");
  const inspectorSummary = element("summary", "distrun-inspector-summary");
  const statusTable = element("table", "distrun-status");
  const tableBox = element("div", "distrun-table-box");
  tableBox.appendChild(statusTable);
  inspector.append(inspectorSummary, tableBox);
  inspector.open = held.ui.inspector;
  inspector.addEventListener("toggle", () => { held.ui.inspector = inspector.open; });
  const debug = debugConsole();
  debug.follow(active);
  root.append(header, rankBar, pane, debug.box, charts, slowLine, cause, attempts, stacks, checks,
    inspector);
  el.appendChild(root);

  function colour(key) {
    if (!(key in colourOf)) {
      const i = Object.keys(colourOf).length % COLOURS.length;
      colourOf[key] = `var(${COLOURS[i]}, ${FALLBACK[i]})`;
    }
    return colourOf[key];
  }

  function lineNode(line, withPrefix) {
    const div = element("div", line.stream === "stderr" ? "distrun-stderr"
      : line.stream === "debug" ? "distrun-debug-line" : "");
    if (withPrefix) {
      const prefix = element("span", "distrun-prefix", `[${line.label}] `);
      prefix.style.color = colour(line.key);
      div.appendChild(prefix);
    }
    div.append(...ansiToNodes(lastState(line.text)));
    return div;
  }

  function drawPane() {
    pane.replaceChildren(...(buffers[active] || []).map((l) => lineNode(l, active === "all")));
    if (!pane.childElementCount) pane.appendChild(element("span", "distrun-placeholder",
      active === "all" ? "(no output yet)" : "(no output from this rank yet)"));
    pane.scrollTop = pane.scrollHeight;
  }

  function select(key) {
    active = held.ui.active = key;
    debug.follow(key);
    drawRankBar();
    drawPane();
  }

  // The rank bar: "All ranks", then one chip per output key, coloured by its process's
  // state. Compact (numbers only, failed ones first with their labels) at scale.
  function drawRankBar() {
    const states = keyStates(model.get("processes"));
    const keys = [...new Set([...Object.keys(buffers).filter((k) => k !== "all"),
      ...Object.keys(states)])].sort(byNumber);
    const compact = keys.length > COMPACT_AFTER;
    const label = (key) => held.labels[key] || states[key]?.process?.label || key;
    const chip = (key, text) => {
      const state = states[key]?.state || "pending";
      const paused = states[key]?.process?.paused || [];  // where its debugger waits
      const button = element("button", `distrun-chip distrun-rank distrun-state-${state}` +
        (key === active ? " distrun-active" : "") + (paused.length ? " distrun-paused" : ""), text);
      button.setAttribute("role", "tab");
      button.setAttribute("aria-selected", key === active ? "true" : "false");
      button.dataset.key = key;
      button.dataset.state = state;
      button.dataset.base = `${label(key)}: ${state}` + (key in buffers ? "" : " (no output yet)") +
        paused.map((p) => `; ${p}`).join("");
      button.title = button.dataset.base;
      button.onclick = () => select(key);
      button.appendChild(element("span", "distrun-cpu-bar"));
      drawChipMeter(button);
      return button;
    };
    const all = element("button", "distrun-chip distrun-all" +
      (active === "all" ? " distrun-active" : ""), "All ranks");
    all.setAttribute("role", "tab");
    all.setAttribute("aria-selected", active === "all" ? "true" : "false");
    all.onclick = () => select("all");
    const children = [all];
    if (compact) {
      const failed = keys.filter((k) => states[k]?.state === "failed");
      if (failed.length) {
        const group = element("span", "distrun-failed-group");
        group.append(element("span", "distrun-muted", "failed:"),
          ...failed.map((k) => chip(k, label(k))));
        children.push(group);
      }
      const grid = element("span", "distrun-grid");
      grid.append(...keys.map((k) => chip(k, (k.match(/(\d+)$/) || [null, label(k)])[1])));
      children.push(grid);
      if (active !== "all") children.push(element("span", "distrun-showing", label(active)));
    } else {
      children.push(...keys.map((k) => chip(k, label(k))));
    }
    drawnKeys = new Set(keys);
    rankBar.classList.toggle("distrun-compact", compact);
    rankBar.replaceChildren(...children);
  }

  // Meters: a bar under each rank chip (its CPU share now: an idle rank among busy ones
  // shows at a glance), and CPU and memory sparklines in the inspector's rows.
  function latest(key) {
    const series = held.meters[key];
    return series && series.length ? series[series.length - 1] : null;
  }

  function drawChipMeter(chip) {
    const reading = latest(chip.dataset.key);
    const bar = chip.querySelector(".distrun-cpu-bar");
    if (!bar) return;
    // A rank that ended uses nothing now: its last reading stays in the tooltip only.
    const now = ["pending", "starting", "running"].includes(chip.dataset.state) ? reading : null;
    bar.style.width = now ? `${Math.min(100, now[0])}%` : "0";
    chip.dataset.cpu = now ? String(Math.round(now[0])) : "";
    const base = (chip.dataset.base || "") + (chip.dataset.steps || "");
    const gpu = reading && reading.length > 2
      ? ` · GPU ${reading[2] === null ? "" : `${Math.round(reading[2])}% · `}${bytes(reading[3])}` : "";
    chip.title = reading ? `${base} · CPU ${Math.round(reading[0])}% · ${bytes(reading[1])}${gpu}` : base;
  }

  // A GPU column once any reading has one (where the nodes have nvidia-smi): a reading is
  // [cpu, rss] or [cpu, rss, gpu percent or null, gpu bytes].
  const withGpu = () => Object.values(held.meters).some((s) => s.some((r) => r.length > 2));

  function meterCells(name) {
    const series = held.meters[name] || [];
    const cpu = cell("td", "");
    const memory = cell("td", "");
    cpu.className = "distrun-meter distrun-meter-cpu";
    memory.className = "distrun-meter distrun-meter-memory";
    if (series.length) {
      const [share, rss] = series[series.length - 1];
      cpu.append(sparkline(series.map((r) => r[0]), 100), element("span", "", `${Math.round(share)}%`));
      memory.append(sparkline(series.map((r) => r[1])), element("span", "", bytes(rss)));
    }
    if (!withGpu()) return [cpu, memory];
    const gpu = cell("td", "");
    gpu.className = "distrun-meter distrun-meter-gpu";
    const last = series.length ? series[series.length - 1] : [];
    if (last.length > 2) {  // utilisation's line; its share (where known) and memory held
      const share = last[2] === null ? "" : `${Math.round(last[2])}% · `;
      gpu.append(sparkline(series.map((r) => r[2] ?? 0), 100),
        element("span", "", `${share}${bytes(last[3])}`));
      gpu.title = "utilisation of the GPUs it uses, and the memory it holds on them";
    }
    return [cpu, memory, gpu];
  }

  let gpuShown = false;
  let stepsShown = false;  // the inspector's progress column (once a rank reports a step)
  function drawMeters() {
    if (withGpu() !== gpuShown) return drawStatus();  // the GPU column comes in
    for (const chip of rankBar.querySelectorAll(".distrun-rank")) drawChipMeter(chip);
    for (const row of statusTable.querySelectorAll("tr.distrun-process")) {
      const cells = row.querySelectorAll("td.distrun-meter");
      const fresh = meterCells(row.dataset.process);
      cells.forEach((old, i) => old.replaceWith(fresh[i]));
    }
  }

  // The inspector: who is who (ranks, master, role) and how each process is doing.
  const COLUMNS = [
    ["process", "label"], ["role", "role"], ["host", "host"], ["node rank", "node_rank"],
    ["local rank", "local_rank"], ["rank", "rank"], ["world size", "world_size"],
    ["master", "master"], ["status", "state"], ["exit", "exit"],
  ];

  function cell(tag, text) {
    return element(tag, "", text === null || text === undefined ? "" : text);
  }

  function tfConfigCell(text) {
    const td = cell("td", "");
    if (!text) return td;
    const details = element("details");
    const pre = element("pre", "distrun-tf-config", JSON.stringify(JSON.parse(text), null, 2));
    details.append(element("summary", "", "TF_CONFIG"), pre);
    td.appendChild(details);
    return td;
  }

  function drawStatus() {
    const state = model.get("state");
    const processes = model.get("processes");
    jobState.textContent = state;
    stacksButton.style.display = running() ? "" : "none";  // a job that ended has none
    jobState.className = `distrun-chip distrun-job-state distrun-state-${state.replace(" ", "_")}`;
    title.textContent = model.get("name") || model.get("job_id");
    title.title = `job ${model.get("job_id")}`;
    counts.textContent = processes.length ? stateCounts(processes) : "";
    debug.draw();
    const logDir = actions.querySelector(".distrun-log-dir");
    if (logDir) logDir.textContent = model.get("log_dir") ? `logs: ${model.get("log_dir")}` : "";
    const master = processes.find((p) => p.master)?.master;
    inspectorSummary.textContent = [model.get("summary"), master && `master ${master}`,
      stateCounts(processes)].filter(Boolean).join(" · ");
    const withTf = processes.some((p) => p.tf_config);
    const head = element("tr");
    for (const [name] of COLUMNS) head.appendChild(cell("th", name));
    gpuShown = withGpu();
    head.append(cell("th", "cpu"), cell("th", "memory"));
    if (gpuShown) head.appendChild(cell("th", "gpu"));
    const rates = stepRates(held.metrics);
    stepsShown = Object.keys(rates).length > 0;
    if (stepsShown) head.appendChild(cell("th", "progress"));
    if (withTf) head.appendChild(cell("th", "TF_CONFIG"));
    const rows = processes.map((p) => {
      const tr = element("tr", `distrun-process distrun-${p.state}`);
      for (const [, field] of COLUMNS) {
        const td = cell("td", p[field]);
        if (field === "state") {
          td.replaceChildren(element("span", `distrun-chip distrun-state-${p.state}`, p.state));
        }
        tr.appendChild(td);
      }
      tr.append(...meterCells(p.name));
      if (stepsShown) {
        const td = cell("td", rankProgress(rates, p.keys || [p.name]));
        td.className = "distrun-rank-progress";
        tr.appendChild(td);
      }
      if (withTf) tr.appendChild(tfConfigCell(p.tf_config));
      tr.dataset.process = p.name;
      return tr;
    });
    statusTable.replaceChildren(head, ...rows);
    cause.textContent = model.get("root_cause");
    cause.style.display = model.get("root_cause") ? "" : "none";
    const attempt = model.get("attempt");
    attemptChip.textContent = attempt;
    attemptChip.style.display = attempt ? "" : "none";
    const earlier = model.get("attempts") || [];
    attemptChip.title = earlier.length ? `earlier:\n${earlier.join("\n")}` : "";
    attempts.replaceChildren(...earlier.map((line) => element("li", "", line)));
    attempts.style.display = earlier.length ? "" : "none";
    const notes = model.get("checks") || [];
    checks.replaceChildren(...notes.map((note) => element("li", "", note)));
    checks.style.display = notes.length ? "" : "none";
    drawRankBar();
    tickClock();
  }

  // Elapsed time: the kernel's figure, counted on in the browser while the job runs (no
  // clock of the browser's is compared with the kernel's).
  let since = { value: model.get("elapsed"), at: performance.now() };
  const running = () => ["starting", "running", "restarting"].includes(model.get("state"));
  function tickClock() {
    const extra = running() ? (performance.now() - since.at) / 1000 : 0;
    elapsed.textContent = clock(since.value + extra);
  }
  model.on("change:elapsed", () => {
    since = { value: model.get("elapsed"), at: performance.now() };
    tickClock();
  });
  const timer = setInterval(() => { if (running()) tickClock(); }, 1000);

  function append(lines) {  // already in the model's buffers: draw them
    pane.querySelector(".distrun-placeholder")?.remove();
    let newKey = false;
    for (const line of lines) {
      if (active === "all" || active === line.key) {
        pane.appendChild(lineNode(line, active === "all"));
      }
      if (!drawnKeys.has(line.key)) newKey = true;
    }
    while (pane.childNodes.length > maxLines()) pane.removeChild(pane.firstChild);
    pane.scrollTop = pane.scrollHeight;
    if (newKey) drawRankBar();
  }

  function redraw() {  // the buffers were replaced (lines this page had missed)
    if (!(active in buffers)) active = held.ui.active = "all";
    drawRankBar();
    drawPane();
  }

  // Charts: one per metric, x the step (or the time), a line per rank in its colour, or the
  // ranks' mean with their min-max band; hovering names the values at that x.
  // A key's label as the chips say it: from its lines, else its process's ("rank 2").
  const labelOf = (key) => held.labels[key] ||
    keyStates(model.get("processes"))[key]?.process?.label || key;
  const SVG = "http://www.w3.org/2000/svg";
  const W = 320, H = 90, PAD = 4;
  let chartsDrawn = [];
  function drawCharts() {
    const names = Object.keys(held.metrics).sort();
    charts.style.display = names.length ? "" : "none";
    const drawn = names.slice(0, MOST_CHARTS);
    const more = names.length > drawn.length ? [element("div", "distrun-muted distrun-charts-more",
      `${drawn.length} of ${names.length} metrics drawn (the first by name); ` +
      `\`jupyter distrun metrics ${model.get("job_id")}\` lists every one`)] : [];
    charts.replaceChildren(...drawn.map((name) => chartNode(name, chartOf(held.metrics[name]))),
      ...more);
    chartsDrawn = drawn;
    // Each rank's last step and rate, in its chip's tooltip and its row of the inspector; a
    // rank well below the others' rate for a while (ranks not in lock step), named under
    // the charts.
    const rates = stepRates(held.metrics);
    if ((Object.keys(rates).length > 0) !== stepsShown) {
      drawStatus();  // the progress column comes in (drawStatus fills it)
    } else if (stepsShown) {
      const keysOf = Object.fromEntries(model.get("processes").map((p) => [p.name, p.keys || [p.name]]));
      for (const row of statusTable.querySelectorAll("tr.distrun-process")) {
        const td = row.querySelector("td.distrun-rank-progress");
        if (td) td.textContent = rankProgress(rates, keysOf[row.dataset.process] || []);
      }
    }
    for (const chip of rankBar.querySelectorAll(".distrun-rank")) {
      const found = rates[chip.dataset.key];
      chip.dataset.steps = found ? ` · step ${found.step}` +
        (found.rate !== null ? ` · ${found.rate.toFixed(1)} steps/s` : "") : "";
      drawChipMeter(chip);
    }
    const slow = slowRanks(rates, held.slowSince ??= {}, Date.now() / 1000);
    slowLine.textContent = slow.map((s) => `${labelOf(s.key)} runs ` +
      `${Math.round(100 * (1 - s.rate / s.median))}% below the median rate (` +
      `${s.rate.toFixed(1)} against ${s.median.toFixed(1)} steps/s) for ${SLOW_FOR_S} s or more`)
      .join("; ");
    slowLine.style.display = slow.length ? "" : "none";
    const shown = progressOf(held.progress);
    progressBox.style.display = shown ? "" : "none";
    if (shown) {
      progressFill.style.width = `${Math.round((100 * shown.n) / shown.total)}%`;
      progressText.textContent = shown.text;
      progressBox.title = "the slowest rank's progress bar";
    }
  }

  function chartNode(name, chart) {
    const box = element("div", "distrun-chart");
    box.dataset.metric = name;
    const caption = element("div", "distrun-chart-caption");
    const value = element("span", "distrun-chart-value");
    // The y axis: log or linear, as the user picked for this metric, else its default.
    const scale = held.ui.scales[name] ?? defaultScale(name, chart);
    const y = yAxisOf(chart, scale);
    const toggle = element("button", "jp-Button jp-mod-minimal distrun-chart-scale",
      y.log ? "log" : "linear");
    toggle.setAttribute("aria-pressed", String(y.log));
    toggle.disabled = !(chart.ymin > 0);
    toggle.title = toggle.disabled ? "a log scale needs every value above 0"
      : `y axis: ${y.log ? "log" : "linear"} scale (click for ${y.log ? "linear" : "log"})`;
    toggle.addEventListener("click", () => {
      held.ui.scales[name] = y.log ? "linear" : "log";
      const at = chartsDrawn.indexOf(name);
      if (at >= 0) charts.children[at].replaceWith(chartNode(name, chartOf(held.metrics[name])));
    });
    caption.append(element("span", "distrun-chart-name", name), value, toggle);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("class", "distrun-chart-plot");
    const sx = (x) => PAD + ((x - chart.xmin) / ((chart.xmax - chart.xmin) || 1)) * (W - 2 * PAD);
    const sy = (v) => H - PAD - ((y.of(v) - y.lo) / ((y.hi - y.lo) || 1)) * (H - 2 * PAD);
    const path = (points) => points.map(([x, v]) => `${sx(x).toFixed(1)},${sy(v).toFixed(1)}`).join(" ");
    // Ticks: a faint line across at each y tick, its value beside the plot; x ticks below.
    const yLabels = element("div", "distrun-chart-yticks");
    for (const v of y.ticks) {
      const grid = document.createElementNS(SVG, "line");
      grid.setAttribute("class", "distrun-chart-grid");
      grid.setAttribute("x1", "0");
      grid.setAttribute("x2", String(W));
      grid.setAttribute("y1", sy(v).toFixed(1));
      grid.setAttribute("y2", sy(v).toFixed(1));
      svg.appendChild(grid);
      const label = element("span", "distrun-chart-ytick", short(v));
      label.style.top = `${((100 * sy(v)) / H).toFixed(2)}%`;
      yLabels.append(label);
    }
    const xLabels = element("div", "distrun-chart-xticks");
    for (const x of ticksOf(chart.xmin, chart.xmax, 4, chart.axis === "step")) {
      const label = element("span", "distrun-chart-xtick",
        chart.axis === "step" ? short(x) : `${short(x)} s`);
      label.style.left = `${((100 * sx(x)) / W).toFixed(2)}%`;
      xLabels.append(label);
    }
    const polyline = (points, cls, stroke) => {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", path(points));
      line.setAttribute("class", cls);
      if (stroke) line.style.stroke = stroke;
      svg.appendChild(line);
    };
    let latest;
    if (chart.band) {
      const area = document.createElementNS(SVG, "polygon");
      area.setAttribute("points", path([...chart.band.map((b) => [b.x, b.high]),
        ...chart.band.map((b) => [b.x, b.low]).reverse()]));
      area.setAttribute("class", "distrun-chart-band");
      svg.appendChild(area);
      polyline(chart.band.map((b) => [b.x, b.mean]), "distrun-chart-mean");
      const last = chart.band[chart.band.length - 1];
      latest = last ? `mean ${short(last.mean)} of ${chart.ranks} ranks` : "";
    } else {
      for (const line of chart.lines) polyline(line.points, "distrun-chart-line", colour(line.key));
      latest = chart.lines.map((l) => l.points.length &&
        `${labelOf(l.key)} ${short(l.points[l.points.length - 1][1])}`)
        .filter(Boolean).slice(0, 4).join(" · ");
    }
    value.textContent = value.title = latest;
    const guide = document.createElementNS(SVG, "line");
    guide.setAttribute("class", "distrun-chart-guide");
    guide.setAttribute("y1", "0");
    guide.setAttribute("y2", String(H));
    guide.style.display = "none";
    svg.appendChild(guide);
    svg.addEventListener("mousemove", (event) => {
      const rect = svg.getBoundingClientRect();
      const x = chart.xmin + ((event.clientX - rect.left) / (rect.width || 1)) *
        (chart.xmax - chart.xmin);
      guide.setAttribute("x1", String(sx(x)));
      guide.setAttribute("x2", String(sx(x)));
      guide.style.display = "";
      const at = chart.axis === "step" ? `step ${Math.round(x)}` : `${x.toFixed(1)} s`;
      value.textContent = value.title = `${at}: ` + hoverText(chart, x);
    });
    svg.addEventListener("mouseleave", () => {
      guide.style.display = "none";
      value.textContent = value.title = latest;
    });
    const plot = element("div", "distrun-chart-area");
    plot.append(yLabels, svg, element("span"), xLabels);
    plot.title = chart.axis === "step" ? "x: step" : "x: seconds since the first value";
    box.append(caption, plot);
    return box;
  }

  function hoverText(chart, x) {
    const nearest = (points) => points.reduce((a, b) =>
      (Math.abs(b[0] - x) < Math.abs(a[0] - x) ? b : a), points[0]);
    if (chart.band) {
      const b = chart.band.reduce((a, c) => (Math.abs(c.x - x) < Math.abs(a.x - x) ? c : a));
      return `mean ${short(b.mean)} (min ${short(b.low)}, max ${short(b.high)})`;
    }
    return chart.lines.filter((l) => l.points.length).map((l) =>
      `${labelOf(l.key)} ${short(nearest(l.points)[1])}`).join(" · ");
  }

  const view = { append, redraw, meters: drawMeters, charts: drawCharts };
  held.views.add(view);
  for (const name of ["processes", "state", "root_cause", "summary", "name", "checks", "attempt",
    "attempts"]) {
    model.on(`change:${name}`, drawStatus);
  }
  model.on("change:stall", drawStall);
  drawStatus();
  drawStall();
  drawPane();
  drawCharts();
  return () => {
    clearInterval(timer);
    held.views.delete(view);
  };
}

export default { initialize, render };
