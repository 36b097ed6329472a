// The live view of a jupyter-dist job: status per process, an all-ranks view and one tab
// per rank, the root cause when the job fails. Lines arrive as deltas (custom messages);
// at most `max_lines` per tab stay in the browser, the full log stays on disk.
//
// Lines are kept by the model, not the view: the model exists from the moment the kernel
// creates the widget, while a view may render later (the first widget of a page loads
// its code first) or again (an output re-attached). Either way it draws what came before.
// A page loaded again (reload, another browser) starts with none: the model's lines_total
// says how many the job printed, so it asks the kernel once for the last lines of every
// tab, which the kernel reads from the job's store.

const COLOURS = ["#0aa", "#b80", "#a3a", "#2a2", "#36c", "#c33", "#088", "#870"];
const SGR = { 30: "#555", 31: "#c33", 32: "#2a2", 33: "#b80", 34: "#36c", 35: "#a3a",
  36: "#0aa", 37: "#999", 90: "#777", 91: "#e55", 92: "#4c4", 93: "#db2", 94: "#58e",
  95: "#c5c", 96: "#2cc", 97: "#ccc" };

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

// Keyed by job id: anywidget hands initialize and render different proxies of one model.
// job id -> { buffers: key -> [line], total: lines seen, views: Set<{append, redraw}> }
const LINES = new Map();

function linesOf(model) {
  const id = model.get("job_id");
  if (!LINES.has(id)) LINES.set(id, { buffers: { all: [] }, total: 0, views: new Set() });
  return LINES.get(id);
}

function initialize({ model }) {
  const held = linesOf(model);
  const toLines = (msg) => msg.lines.map(([key, label, stream, text]) =>
    ({ key, label, stream, text }));
  function keep(lines) {
    const max = model.get("max_lines");
    for (const line of lines) {
      if (!(line.key in held.buffers)) held.buffers[line.key] = [];
      for (const target of [held.buffers.all, held.buffers[line.key]]) {
        target.push(line);
        if (target.length > max) target.splice(0, target.length - max);
      }
    }
  }
  model.on("msg:custom", (msg) => {
    if (msg.type === "lines") {
      const lines = toLines(msg);
      keep(lines);
      held.total = msg.total;
      for (const view of held.views) view.append(lines);
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
  if (model.get("lines_total") > held.total) model.send({ type: "history" });
}

function render({ model, el }) {
  const maxLines = () => model.get("max_lines");
  const held = linesOf(model);
  const buffers = held.buffers;          // key -> [{key, label, stream, text}], shared
  const colourOf = {};
  let active = "all";

  const root = document.createElement("div");
  root.className = "distrun-live";
  root.style.cssText = "font-family: var(--jp-code-font-family, monospace); font-size: 12px;";
  const header = document.createElement("div");
  const headerText = document.createElement("span");
  header.appendChild(headerText);
  // In JupyterLab with our extension, the full log opens in its log viewer (the extension
  // marks the page and listens for this event); elsewhere the log folder path is shown.
  if (document.body.dataset.jupyterDistLogs === "1") {
    const open = document.createElement("button");
    open.className = "distrun-open-log";
    open.textContent = "open full log";
    open.style.marginLeft = "8px";
    open.onclick = () => el.dispatchEvent(new CustomEvent("jupyter-dist:open-logs", {
      bubbles: true, detail: { jobId: model.get("job_id") },
    }));
    header.appendChild(open);
  }
  const statusTable = document.createElement("table");
  statusTable.className = "distrun-status";
  const tabs = document.createElement("div");
  tabs.className = "distrun-tabs";
  const pane = document.createElement("pre");
  pane.className = "distrun-lines";
  pane.style.cssText = "max-height: 24em; overflow: auto; margin: 4px 0; padding: 4px;" +
    "background: var(--jp-layout-color2, #f5f5f5);";
  const cause = document.createElement("pre");
  cause.className = "distrun-root-cause";
  cause.style.cssText = "color: #c33; white-space: pre-wrap;";
  root.append(header, statusTable, tabs, pane, cause);
  el.appendChild(root);

  function colour(key) {
    if (!(key in colourOf)) colourOf[key] = COLOURS[Object.keys(colourOf).length % COLOURS.length];
    return colourOf[key];
  }

  function lineNode(line, withPrefix) {
    const div = document.createElement("div");
    if (line.stream === "stderr") div.className = "distrun-stderr";
    if (withPrefix) {
      const prefix = document.createElement("span");
      prefix.textContent = `[${line.label}] `;
      prefix.style.color = colour(line.key);
      div.appendChild(prefix);
    }
    div.append(...ansiToNodes(line.text));
    return div;
  }

  function drawPane() {
    pane.replaceChildren(...buffers[active].map((l) => lineNode(l, active === "all")));
    pane.scrollTop = pane.scrollHeight;
  }

  function drawTabs() {
    const keys = ["all", ...Object.keys(buffers).filter((k) => k !== "all").sort(
      (a, b) => a.localeCompare(b, undefined, { numeric: true }))];
    tabs.replaceChildren(...keys.map((key) => {
      const button = document.createElement("button");
      button.textContent = key === "all" ? "all ranks" : key;
      button.className = "distrun-tab" + (key === active ? " active" : "");
      button.style.fontWeight = key === active ? "bold" : "normal";
      button.onclick = () => { active = key; drawTabs(); drawPane(); };
      return button;
    }));
  }

  // The inspector: who is who (ranks, master, role) and how each process is doing.
  const COLUMNS = [
    ["process", "label"], ["role", "role"], ["host", "host"], ["node rank", "node_rank"],
    ["local rank", "local_rank"], ["rank", "rank"], ["world size", "world_size"],
    ["master", "master"], ["status", "state"], ["exit", "exit"],
  ];

  function cell(tag, text) {
    const td = document.createElement(tag);
    td.textContent = text === null || text === undefined ? "" : String(text);
    td.style.cssText = "padding: 0 8px; text-align: left;";
    return td;
  }

  function tfConfigCell(text) {
    const td = cell("td", "");
    if (!text) return td;
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = "TF_CONFIG";
    const pre = document.createElement("pre");
    pre.className = "distrun-tf-config";
    pre.style.margin = "0";
    pre.textContent = JSON.stringify(JSON.parse(text), null, 2);
    details.append(summary, pre);
    td.appendChild(details);
    return td;
  }

  function drawStatus() {
    const state = model.get("state");
    headerText.textContent = `job ${model.get("job_id")}: ${state}` +
      (model.get("log_dir") ? ` — full logs: ${model.get("log_dir")}` : "");
    const processes = model.get("processes");
    const withTf = processes.some((p) => p.tf_config);
    const head = document.createElement("tr");
    for (const [title] of COLUMNS) head.appendChild(cell("th", title));
    if (withTf) head.appendChild(cell("th", "TF_CONFIG"));
    const rows = processes.map((p) => {
      const tr = document.createElement("tr");
      for (const [, field] of COLUMNS) tr.appendChild(cell("td", p[field]));
      if (withTf) tr.appendChild(tfConfigCell(p.tf_config));
      tr.className = `distrun-process distrun-${p.state}`;
      tr.dataset.process = p.name;
      return tr;
    });
    statusTable.replaceChildren(head, ...rows);
    cause.textContent = model.get("root_cause");
  }

  function append(lines) {  // already in the model's buffers: draw them
    const known = Object.keys(buffers).length;  // tabs: "all" and one per key
    for (const line of lines) {
      if (active === "all" || active === line.key) {
        pane.appendChild(lineNode(line, active === "all"));
      }
    }
    while (pane.childNodes.length > maxLines()) pane.removeChild(pane.firstChild);
    pane.scrollTop = pane.scrollHeight;
    if (known !== tabs.childElementCount) drawTabs();
  }

  function redraw() {  // the buffers were replaced (lines this page had missed)
    if (!(active in buffers)) active = "all";
    drawTabs();
    drawPane();
  }

  const view = { append, redraw };
  held.views.add(view);
  model.on("change:processes", drawStatus);
  model.on("change:state", drawStatus);
  model.on("change:root_cause", drawStatus);
  drawStatus();
  drawTabs();
  drawPane();
  return () => held.views.delete(view);
}

export default { initialize, render };
