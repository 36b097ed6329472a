"""What drawing a job's curves costs the browser: 64 ranks x 10,000 steps of a loss, as the
live view (jupyter_dist/widgets/live.js) takes them, against drawing every point.

    .venv/bin/python bench/charts.py [--ranks 64] [--steps 10000] [--messages 20]

Runs in the system's headless Chromium (Playwright drives it; the page is served from
this process, nothing goes on a network). The records arrive as the kernel sends them: in
`--messages` messages, one a second of a job that reports every rank's loss at every step.
Each message is timed from its arrival to the next frame painted (the view's bookkeeping,
its drawing, the browser's layout and paint): the page is unresponsive for that long.

Baseline, in the same page and run: a chart that keeps every point and draws a line per
rank through all of them, redrawn at each message. Prints the longest and median time a
message takes for each, and the ratio. Goal: the live view's longest under 100 ms (a page
still answering a click at once), whatever the number of steps.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from playwright.sync_api import sync_playwright

WIDGETS = Path(__file__).resolve().parents[1] / "jupyter_dist" / "widgets"
ORIGIN = "http://distrun.bench"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

PAGE = """<!doctype html><html><head><style>{css}</style></head>
<body><div id="ours" style="width: 1200px"></div><div id="naive"></div></body></html>"""

# The page's side: a model as anywidget gives one, the records as the kernel sends them,
# each message timed to the next painted frame.
DRIVER = """
async ([ranks, steps, messages]) => {
  const live = await import("%s/live.js");
  class Model {
    constructor(traits) { this.traits = traits; this.handlers = {}; }
    get(name) { return this.traits[name]; }
    set(name, value) { this.traits[name] = value; }
    send() {}
    on(event, handler) { (this.handlers[event] ??= []).push(handler); }
    emit(event, ...args) { for (const h of this.handlers[event] ?? []) h(...args); }
  }
  const processes = Array.from({ length: ranks }, (_, r) => ({ name: `rank-${r}`,
    label: `rank ${r}`, keys: [`rank-${r}`], state: "running", node: `local${r %% 2}` }));
  const model = new Model({ job_id: "bench", name: "bench", summary: "", elapsed: 0,
    state: "running", processes, root_cause: "", log_dir: "/tmp", max_lines: 500,
    lines_total: 0, metrics_total: 0, checks: [], attempt: 1, attempts: [], stall: [] });
  live.default.initialize({ model });
  live.default.render({ model, el: document.getElementById("ours") });
  const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r)));
  const per = steps / messages;
  const batch = (m) => {
    const records = [];
    for (let step = m * per; step < (m + 1) * per; step++) {
      for (let r = 0; r < ranks; r++) {
        const loss = Math.exp(-step / 3000) * (1 + r / ranks);
        records.push([`rank-${r}`, step, 1000 + step / 100, { loss }]);
      }
    }
    return records;
  };
  // Every point, a polyline per rank, redrawn at each message.
  const naiveHeld = {};
  const naive = document.getElementById("naive");
  function drawNaive(records) {
    for (const [key, step, , values] of records) (naiveHeld[key] ??= []).push([step, values.loss]);
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 320 90");
    svg.setAttribute("width", "320");
    svg.setAttribute("height", "90");
    for (const points of Object.values(naiveHeld)) {
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("points", points.map(([s, v]) =>
        `${(4 + (s / steps) * 312).toFixed(1)},${(86 - v * 40).toFixed(1)}`).join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", "#36c");
      svg.appendChild(line);
    }
    naive.replaceChildren(svg);
  }
  const oursTimes = [], naiveTimes = [];
  let total = 0;
  for (let m = 0; m < messages; m++) {
    const records = batch(m);
    total += records.length;
    await frame();
    let start = performance.now();
    model.emit("msg:custom", { type: "metrics", records, total });
    await frame();
    oursTimes.push(performance.now() - start);
    await frame();
    start = performance.now();
    drawNaive(records);
    await frame();
    naiveTimes.push(performance.now() - start);
  }
  const drawn = document.querySelectorAll(
    "#ours .distrun-chart[data-metric='loss'] .distrun-chart-band").length;
  return { oursTimes, naiveTimes, total, drawn };
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    files = {
        "/": ("text/html", PAGE.format(css=(WIDGETS / "live.css").read_text())),
        "/live.js": ("text/javascript", (WIDGETS / "live.js").read_text()),
    }

    def serve(route) -> None:
        path = route.request.url[len(ORIGIN) :] or "/"
        kind, body = files.get(path, ("text/plain", ""))
        route.fulfill(status=200 if path in files else 404, content_type=kind, body=body)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.route(f"{ORIGIN}/**", serve)
            page.goto(f"{ORIGIN}/")
            found = page.evaluate(DRIVER % ORIGIN, [args.ranks, args.steps, args.messages])
        finally:
            browser.close()
    if args.ranks > 8 and not found["drawn"]:
        raise SystemExit(f"the live view drew no band: {json.dumps(found)[:300]}")
    ours, naive = found["oursTimes"], found["naiveTimes"]
    print(
        f"{args.ranks} ranks x {args.steps} steps ({found['total']} records in "
        f"{args.messages} messages):\n"
        f"  live view:    longest {max(ours):.1f} ms, median {statistics.median(ours):.1f} ms "
        f"a message (goal: longest <= 100 ms)\n"
        f"  every point:  longest {max(naive):.1f} ms, median {statistics.median(naive):.1f} ms\n"
        f"  ratio live view / every point (longest): {max(ours) / max(naive):.2f}"
    )


if __name__ == "__main__":
    main()
