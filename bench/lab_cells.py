"""Warm cells as the page draws them: a real JupyterLab in headless Chromium, in one run.

    .venv/bin/python bench/lab_cells.py [--rounds 30] [--ranks 4]

`bench/kernel_cells.py` times a cell from the execute request to the kernel's reply; this
times what the user sees: from the Ctrl+Enter (the keydown, as the page gets it) until the
cell has its execution count and, for a `%%distrun` cell, its view is drawn settled
(`distrun-final`, with its state). Both ends are read in the page (`performance.now()`),
so the browser driver's own latency is not in the figure. One notebook and one kernel,
with a session of `--ranks` ranks on 2 local nodes; each round runs, in turn:

1. `%%distrun` `print(1)`: one line a rank, so its view (the kernel's first view sent the
   view's code, LiveCode): timed to its execution count and its settled view.
2. `x = 1; x` in the kernel itself, no rank involved: the floor.

Prints each median and the view's distance above the floor. A `%%distrun` cell that says
nothing (`x = 1`) shows nothing: the page has no view to draw for it, and its figure
through the kernel is bench/kernel_cells.py's. (Stop 58 compared, here, the view's code
sent once per kernel against in each view: 67.3 against 66.0 ms; docs/sessions.md.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import labserver  # tests/labserver.py: the server and Chromium the lab tests use

VIEW_CELL = "%%distrun\nprint(1)"
BARE_CELL = "x = 1\nx"

# In the page: a watch of cell `index` that puts in `window.__benchMs` the ms from the next
# keydown to the moment the cell shows a new execution count (and, with `view`, a new
# settled view that says it succeeded).
WATCH = """\
([index, view]) => {
  window.__benchMs = null;
  const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[index];
  const prompt = () => cell.querySelector('.jp-InputPrompt').textContent;
  const before = prompt();
  for (const old of cell.querySelectorAll('.distrun-final')) old.dataset.benchOld = '1';
  let started = null;
  const done = () => {
    if (started === null || prompt() === before || /\\*/.test(prompt())) return false;
    if (!view) return true;
    const drawn = [...cell.querySelectorAll('.distrun-final')].find(v => !v.dataset.benchOld);
    return !!drawn && /succeeded/.test(drawn.querySelector('.distrun-job-state')?.textContent);
  };
  const observer = new MutationObserver(() => {
    if (done()) {
      observer.disconnect();
      window.__benchMs = performance.now() - started;
    }
  });
  window.addEventListener('keydown', () => { started = performance.now(); },
                          { capture: true, once: true });
  observer.observe(cell, { subtree: true, childList: true, characterData: true,
                           attributes: true });
}"""


def run_cell(page, index: int) -> None:
    """Run cell `index` and wait for its execution count (not timed)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    before = cell.locator(".jp-InputPrompt").inner_text()
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    page.wait_for_function(
        "([i, b]) => { const p = document.querySelectorAll('.jp-Notebook .jp-Cell')[i]"
        ".querySelector('.jp-InputPrompt').textContent; return p !== b && !/\\*/.test(p); }",
        arg=[index, before], timeout=180_000,
    )  # fmt: skip


def timed_cell(page, index: int, view: bool) -> float:
    """Ms from the keydown of Ctrl+Enter on cell `index` to its end, read in the page."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.evaluate(WATCH, [index, view])
    page.keyboard.press("Control+Enter")
    page.wait_for_function("window.__benchMs !== null", timeout=60_000)
    return float(page.evaluate("window.__benchMs"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    cells = [
        "%load_ext jupyter_dist",
        f"%distrun session start --nodes 2 --procs-per-node {args.ranks // 2}",
        VIEW_CELL,  # 2
        BARE_CELL,  # 3: the floor
        "%distrun session stop",
    ]
    with tempfile.TemporaryDirectory(prefix="lab-cells-") as folder:
        server = labserver.start(Path(folder))
        try:
            labserver.write_notebook(server, "bench.ipynb", cells)
            url = "/lab/workspaces/bench/tree/bench.ipynb?reset"
            with labserver.open_page(server, url) as page:
                page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for()
                for index in (0, 1):
                    run_cell(page, index)
                figures: dict[str, list[float]] = {"view": [], "bare": []}
                for round_ in range(args.rounds + 2):  # two rounds to warm up
                    view = timed_cell(page, 2, view=True)
                    bare = timed_cell(page, 3, view=False)
                    if round_ >= 2:
                        figures["view"].append(view)
                        figures["bare"].append(bare)
                run_cell(page, 4)
        finally:
            labserver.stop(server)
    medians = {name: round(statistics.median(values), 2) for name, values in figures.items()}
    print(json.dumps({"rounds": args.rounds, "ranks": args.ranks, "ms": medians}))
    print(f"the kernel alone, x = 1: {medians['bare']:.1f} ms")
    print(f"%%distrun print(1), its view drawn settled: {medians['view']:.1f} ms "
          f"({medians['view'] - medians['bare']:.1f} ms above the kernel alone)")  # fmt: skip


if __name__ == "__main__":
    main()
