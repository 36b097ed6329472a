"""JupyterLab in the system's headless Chromium: a %%distrun cell with every rank's output
and the inspector, the jobs sidebar, the log viewer, and cancelling a job from the sidebar.

Screenshots of each step are kept in test-artifacts/lab/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import labserver
import pytest
from helpers import ROOT, job_processes
from playwright.sync_api import TimeoutError as PlaywrightTimeout

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts" / "lab"

DDP_CELL = """\
%%distrun --type pytorch --nodes 2 --procs-per-node 2 --name lab-ddp
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} says the sum of ranks is {total.item():g}")
dist.barrier()
dist.destroy_process_group()"""

# Rank 2 waits in load_batch, the others at the end: what the Stacks buttons show.
LONG_CELL = """\
%%distrun --nodes 2 --procs-per-node 2 --name lab-long
import os, time
def load_batch():
    time.sleep(300)
print("started", flush=True)
if os.environ["RANK"] == "2":
    load_batch()
time.sleep(300)"""

# 64 ranks on 2 local nodes; rank 41 fails, the others are stopped.
RANKS_64_CELL = """\
%%distrun --nodes 2 --procs-per-node 32 --name lab-64
import os, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank}", flush=True)
if rank == 41:
    time.sleep(3)
    raise SystemExit("rank 41 gives up")
time.sleep(120)"""

# A detached job, in a notebook of its own: the cell returns while it runs.
DETACHED_CELL = """\
%%distrun --detach --nodes 2 --procs-per-node 2 --name lab-detached
import os, time
for i in range(1, 31):
    print(f"line {i} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.2)"""

# A detached job that fails once, then starts again: rank 1 gives up on its first attempt.
RESTARTING_CELL = """\
%%distrun --detach --nodes 2 --max-restarts 2 --restart-delay 2 --name lab-restarts
import os, sys, time
attempt = int(os.environ["DISTRUN_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} on attempt {attempt}", flush=True)
time.sleep(3)
if os.environ["RANK"] == "1" and attempt == 0:
    sys.exit("rank 1 gives up")
time.sleep(6)"""

# Metrics, in a notebook of their own: 4 ranks report a loss and draw a tqdm bar; then 64
# ranks report theirs (a mean and a min-max band).
METRICS_CELLS = [
    """\
%%distrun --nodes 2 --procs-per-node 2 --name lab-metrics
import os, time
from distrun import report
from tqdm import tqdm
rank = int(os.environ["RANK"])
for step in tqdm(range(200), mininterval=0):
    report(step=step, loss=2.0 / (step + 1) + 0.1 * rank, lr=0.1 * 0.99 ** step)
    time.sleep(0.02)""",
    """\
%%distrun --nodes 2 --procs-per-node 32 --name lab-metrics-64
import os, math, time
from distrun import report
rank = int(os.environ["RANK"])
for step in range(10_000):  # the scale the live view is built for: 64 x 10,000
    report(step=step, loss=math.exp(-step / 3000) * (1 + rank / 64))
    if step % 500 == 0:
        time.sleep(0.2)  # a few seconds: the records reach the page in several messages""",
    """\
%%distrun --nodes 1 --procs-per-node 3 --name lab-slow-rank
import os, time
from distrun import report
rank = int(os.environ["RANK"])
end, step = time.monotonic() + 45, 0
while time.monotonic() < end:  # not in lock step: rank 2 takes twice as long a step
    report(step=step, loss=1.0)
    time.sleep(0.2 if rank == 2 else 0.1)
    step += 1""",
]

# A warm session, in a notebook of its own: each cell run in it has a view of its own.
SESSION_CELLS = [
    "%distrun session start --nodes 2 --name lab-session",
    "%%distrun\nimport os\nrank = int(os.environ['RANK'])\nprint('first cell on rank', rank)",
    "%%distrun\nprint('second cell on rank', rank)",
    "%distrun session stop",
]


# Rank 1 stops at breakpoint(); the live view's console steps it (issue 43).
DEBUG_CELL = """\
%%distrun --nodes 2 --name lab-debug
import os
rank = int(os.environ["RANK"])
x = 40 + rank
if rank == 1:
    breakpoint()
print(f"rank {rank} ends with x = {x}", flush=True)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = labserver.start(tmp_path_factory.mktemp("lab"))
    labserver.write_notebook(
        server, "distrun.ipynb", ["%load_ext jupyter_dist", DDP_CELL, LONG_CELL, RANKS_64_CELL]
    )
    labserver.write_notebook(server, "session.ipynb", ["%load_ext jupyter_dist", *SESSION_CELLS])
    labserver.write_notebook(server, "detached.ipynb", ["%load_ext jupyter_dist", DETACHED_CELL])
    labserver.write_notebook(server, "restarts.ipynb", ["%load_ext jupyter_dist", RESTARTING_CELL])
    labserver.write_notebook(server, "metrics.ipynb", ["%load_ext jupyter_dist", *METRICS_CELLS])
    labserver.write_notebook(server, "debug.ipynb", ["%load_ext jupyter_dist", DEBUG_CELL])
    yield server
    labserver.stop(server)


@pytest.fixture(scope="module")
def lab_page(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with labserver.open_page(lab, "/lab/workspaces/distrun-test/tree/distrun.ipynb?reset") as page:
        # The page's own errors, for when a view stops drawing.
        console = open(ARTIFACTS / "console.log", "w")  # noqa: SIM115 (closed below)
        page.on("console", lambda m: console.write(f"{m.type}: {m.text}\n"))
        page.on("pageerror", lambda e: console.write(f"pageerror: {e}\n"))
        # The kernel must really be ready before the first Shift+Enter: the status bar says
        # so once the session is connected; the first cell is run until it really ran.
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for()
        dialog = page.locator(".jp-Dialog")
        if dialog.count():
            _shot(page, "0-unexpected-dialog")
            pytest.fail(f"JupyterLab opened a dialog: {dialog.inner_text()}")
        yield page
        console.close()


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _run_cell(page, index: int, wait: bool = False) -> None:
    """Run one cell; with `wait`, until it has its execution count (asking up to three
    times: a Shift+Enter in the moment the kernel connects can be lost)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    ran = cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]"))
    for _ in range(3 if wait else 1):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        if not wait:
            return
        try:
            ran.wait_for(timeout=15_000)
            return
        except PlaywrightTimeout:
            continue  # ask again
    pytest.fail(f"cell {index} did not run after three Shift+Enter")


def _final_view(cell, state: str, timeout: float):
    """`cell`'s final view of its job once it shows `state`: the one that replaces the live
    view at the job's end (`distrun-final`, LiveView.settled). Waiting on the live view's
    state alone races that replacement: a check right after can find the live view gone
    and the final one not drawn yet (0 of 64 rank buttons, once, beside a second worker)."""
    view = cell.locator(".distrun-live.distrun-final")
    view.locator(".distrun-job-state", has_text=state).wait_for(timeout=timeout)
    return view


@contextmanager
def _notebook(lab_page, lab, name: str, height: int = 1000) -> Iterator[tuple[object, list[str]]]:
    """A page of its own with notebook `name` open (in a workspace of that name), its kernel
    ready and its first cell (`%load_ext jupyter_dist`) run; yields it with what the page
    logged (for when a view does not draw); closed after."""
    page = lab_page.context.browser.new_page(viewport={"width": 1400, "height": height})
    said: list[str] = []
    page.on("console", lambda m: said.append(f"{m.type}: {m.text}"))
    try:
        stem = name.removesuffix(".ipynb")
        page.goto(lab.page_url(f"/lab/workspaces/distrun-{stem}/tree/{name}?reset"))
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for()
        _run_cell(page, 0, wait=True)
        yield page, said
    finally:
        page.close()


def _open_sidebar(page):
    tab = page.locator(".lm-TabBar-tab[data-id='jupyter-dist-sidebar']")
    if tab.get_attribute("aria-selected") != "true":
        tab.click()
    return page.locator("#jupyter-dist-sidebar")


def test_a_cell_shows_every_rank_and_the_inspector(lab_page):
    page = lab_page
    _run_cell(page, 0, wait=True)
    _run_cell(page, 1)
    view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 120_000)
    _shot(page, "1-ddp-cell")
    lines = view.locator(".distrun-lines").inner_text()
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} says the sum of ranks is 6" in lines
    assert view.locator(".distrun-title").inner_text() == "lab-ddp"
    assert re.fullmatch(r"\d+:\d\d", view.locator(".distrun-elapsed").inner_text())
    assert view.locator(".distrun-counts").inner_text() == "all succeeded"
    chips = view.locator(".distrun-rankbar button.distrun-rank")
    assert chips.all_inner_texts() == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert all("distrun-state-succeeded" in c for c in chips.evaluate_all(
        "els => els.map(e => e.className)"))  # fmt: skip
    # The inspector is folded under its one-line summary, and opens.
    summary = view.locator(".distrun-inspector-summary")
    assert re.fullmatch(
        r"4 ranks on 2 nodes \(local\) · master 127\.0\.0\.1:\d+ · all succeeded",
        summary.inner_text(),
    )
    rows = view.locator("tr.distrun-process")
    assert not rows.first.is_visible()
    summary.click()
    rows.first.wait_for()
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(4)]
    assert [c[5] for c in cells] == ["0", "1", "2", "3"]  # the rank column
    assert [(c[3], c[4]) for c in cells] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {c[6] for c in cells} == {"4"} and {c[8] for c in cells} == {"succeeded"}
    assert re.fullmatch(r"127\.0\.0\.1:\d+", cells[0][7])
    # A short job's CPU and memory lines span their cells (they were a few pixels wide).
    widths = view.locator("td.distrun-meter svg polyline").evaluate_all(
        "lines => lines.map(l => l.getBBox().width)"
    )
    assert len(widths) == 8 and min(widths) >= 60, widths
    _shot(page, "1-ddp-cell-inspector")
    view.screenshot(path=str(ARTIFACTS / "live-view.png"))
    # A rank's chip shows that rank's output alone.
    chips.nth(2).click()
    assert "rank 2 says" in view.locator(".distrun-lines").inner_text()
    assert "rank 0 says" not in view.locator(".distrun-lines").inner_text()
    view.locator(".distrun-rankbar .distrun-all").click()
    # "Open full log" opens the lab log viewer on this job.
    job_id = view.get_attribute("data-job-id")
    view.get_by_role("button", name="Open full log").click()
    viewer = page.locator(f"#jupyter-dist-logs-panel-{job_id}")
    viewer.locator(
        ".jp-distrun-log-output", has_text="rank 0 says the sum of ranks is 6"
    ).wait_for()
    page.locator(".lm-TabBar-tab", has_text="distrun.ipynb").click()


def _use_theme(page, theme: str) -> None:
    """Switch JupyterLab's theme through the command palette, as a user would."""
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type(f"Use Theme: {theme}")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "light => document.body.dataset.jpThemeLight === light",
        arg="false" if "Dark" in theme else "true",
    )
    page.wait_for_timeout(500)  # the theme's stylesheet applies


@contextmanager
def _dark_theme(page) -> Iterator[None]:
    """JupyterLab's dark theme for the block, its light theme again after it."""
    _use_theme(page, "JupyterLab Dark")
    try:
        yield
    finally:
        _use_theme(page, "JupyterLab Light")


def test_the_live_view_reads_well_in_the_dark_theme(lab_page):
    """The view uses JupyterLab's variables: in the dark theme its text is light on dark,
    and the state chips (the job's and each rank's) stay readable in both themes."""
    page = lab_page
    page.locator(".lm-TabBar-tab", has_text="distrun.ipynb").click()
    view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
    with _dark_theme(page):
        view.scroll_into_view_if_needed()
        _shot(page, "1-ddp-cell-dark")
        view.screenshot(path=str(ARTIFACTS / "live-view-dark.png"))
        text, background = _colours(view.locator(".distrun-lines"))
        assert _brightness(text) > 0.5 > _brightness(background), (text, background)
        _assert_readable(view.locator(".distrun-job-state"))
        _assert_readable(view.locator(".distrun-rankbar .distrun-chip").last)
    text, background = _colours(view.locator(".distrun-lines"))
    assert _brightness(text) < 0.5 < _brightness(background), (text, background)
    _assert_readable(view.locator(".distrun-job-state"))
    _assert_readable(view.locator(".distrun-rankbar .distrun-chip").last)


# The text colour, and the background of the nearest element that paints one.
_COLOURS_JS = """el => {
  const painted = (e) => !/rgba\\(.*, 0\\)$|transparent/.test(getComputedStyle(e).backgroundColor);
  let at = el;
  while (at && !painted(at)) at = at.parentElement;
  return [getComputedStyle(el).color,
          at ? getComputedStyle(at).backgroundColor : "rgb(255, 255, 255)"];
}"""


def _colours(element) -> tuple[str, str]:
    """An element's text and background colours, as the browser computed them (a table
    cell's background is what shows through it)."""
    return tuple(element.evaluate(_COLOURS_JS))


def _rgb(css_colour: str) -> tuple[float, float, float]:
    """0-1 channels of rgb()/rgba() or color(srgb ...) (what a color-mix() computes to)."""
    numbers = [float(v) for v in re.findall(r"[\d.]+", css_colour.split("srgb")[-1])[:3]]
    return tuple(numbers) if "srgb" in css_colour else tuple(v / 255 for v in numbers)


def _brightness(css_colour: str) -> float:
    """0 (black) to 1 (white): the channels weighted as they are encoded."""
    red, green, blue = _rgb(css_colour)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _luminance(css_colour: str) -> float:
    """WCAG's relative luminance: 0 (black) to 1 (white)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in _rgb(css_colour)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _assert_readable(element) -> None:
    """WCAG's contrast ratio of the element's text on its background is at least 4.5."""
    text, background = sorted((_luminance(c) for c in _colours(element)), reverse=True)
    ratio = (text + 0.05) / (background + 0.05)
    assert ratio >= 4.5, (element.inner_text(), _colours(element), round(ratio, 2))


def test_the_sidebar_lists_the_job_and_opens_its_logs(lab_page, lab):
    page = lab_page
    sidebar = _open_sidebar(page)
    job = sidebar.locator(".jp-distrun-job", has_text="lab-ddp")
    job.and_(page.locator("[data-state='succeeded']")).wait_for()
    assert "No node inventory" in sidebar.locator(".jp-distrun-nodes").inner_text()
    _shot(page, "2-sidebar")
    badge = job.locator(".jp-distrun-state")
    _assert_readable(badge)
    with _dark_theme(page):
        _shot(page, "2-sidebar-dark")
        _assert_readable(badge)
    job.get_by_role("button", name="Logs").click()
    viewer = page.locator(".jp-distrun-logviewer").last
    viewer.locator(".jp-distrun-log-tab").nth(3).wait_for()
    assert viewer.locator(".jp-distrun-log-tab").all_inner_texts() == [
        "rank 0", "rank 1", "rank 2", "rank 3",
    ]  # fmt: skip
    output = viewer.locator(".jp-distrun-log-output")
    output.filter(has_text="rank 0 says the sum of ranks is 6").wait_for()
    viewer.locator(".jp-distrun-log-tab").nth(2).click()
    output.filter(has_text="rank 2 says the sum of ranks is 6").wait_for()
    assert "rank 0 says" not in output.inner_text()
    _shot(page, "3-log-viewer")


def test_cancel_from_the_sidebar_stops_every_rank(lab_page, lab):
    page = lab_page
    notebook_tab = page.locator(".lm-TabBar-tab", has_text="distrun.ipynb")
    notebook_tab.click()
    _run_cell(page, 2)
    view = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".distrun-lines")
    page.wait_for_function(
        "el => (el.innerText.match(/started/g) || []).length >= 4", arg=view.element_handle()
    )
    sidebar = _open_sidebar(page)
    job = sidebar.locator(".jp-distrun-job[data-state='running']", has_text="lab-long")
    job.wait_for()
    job_id = job.get_attribute("data-job-id")
    assert len(job_processes(job_id)) >= 4
    _shot(page, "4-running")
    # Stacks, from the cell's live view (its kernel is busy with the cell: the server asks
    # the job's owner) and from the sidebar: rank 2 stands out, in load_batch.
    cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
    cell.locator(".distrun-stacks-button").click()
    odd = cell.locator(".distrun-stacks li.distrun-stacks-odd")
    odd.wait_for(timeout=60_000)
    assert odd.inner_text() == (
        "rank 2 (local1): script.py:3 in load_batch ← script.py:6 in <module>"
    )
    assert cell.locator(".distrun-stacks li").nth(1).inner_text() == (
        "ranks 0-1, 3 (local0, local1): script.py:7 in <module>"
    )
    cell.locator(".distrun-stacks").scroll_into_view_if_needed()
    _shot(page, "4a-stacks-in-the-live-view")
    job.get_by_role("button", name="Stacks").click()
    in_sidebar = job.locator(".jp-distrun-stacks li.jp-distrun-stacks-odd")
    in_sidebar.wait_for(timeout=60_000)
    assert "rank 2 (local1): script.py:3 in load_batch" in in_sidebar.inner_text()
    _shot(page, "4b-stacks-in-the-sidebar")
    # While it runs, the local nodes are listed with their CPU line (the agents' reports are
    # stored every 5 s: two make a share); its ranks sleep, so the share is near 0%.
    meters = sidebar.locator(".jp-distrun-nodes tr .jp-distrun-meter:has(svg)")
    meters.nth(1).wait_for(timeout=30_000)
    rows = sidebar.locator(".jp-distrun-nodes tr")
    assert [rows.nth(i).get_attribute("data-node") for i in range(2)] == ["local0", "local1"]
    for i in range(2):
        assert re.fullmatch(r"\d+%", meters.nth(i).inner_text()), meters.nth(i).inner_text()
        assert meters.nth(i).get_attribute("title").startswith("CPU ")
    _shot(page, "4c-node-meters")
    job.get_by_role("button", name="Cancel").click()
    sidebar.locator(f".jp-distrun-job[data-job-id='{job_id}'][data-state='cancelled']").wait_for()
    _shot(page, "5-cancelled")
    assert job_processes(job_id) == []
    cell_output = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea")
    cell_output.filter(has_text="cancelled from JupyterLab").wait_for()
    assert (lab.home / "jobs" / job_id / "status.json").is_file()


def test_64_ranks_stay_usable_and_the_failed_one_comes_first(lab_page):
    page = lab_page
    page.locator(".lm-TabBar-tab", has_text="distrun.ipynb").click()
    _run_cell(page, 3)
    try:
        view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(3), "failed", 180_000)
    except PlaywrightTimeout:
        _shot(page, "8-64-ranks-timed-out")  # what the page showed instead
        raise
    bar = view.locator(".distrun-rankbar.distrun-compact")
    assert bar.locator(".distrun-grid button").count() == 64
    failed = bar.locator(".distrun-failed-group button")
    assert failed.all_inner_texts() == ["rank 41"]
    counts = view.locator(".distrun-counts").inner_text()
    assert counts.startswith("1 failed") and "stopped" in counts, counts
    assert "rank 41 on local" in view.locator(".distrun-root-cause").inner_text()
    view.scroll_into_view_if_needed()
    _shot(page, "8-64-ranks")
    failed.click()
    lines = view.locator(".distrun-lines").inner_text()
    assert "hello from rank 41" in lines and "hello from rank 40" not in lines
    assert bar.locator(".distrun-showing").inner_text() == "rank 41"
    _shot(page, "8-64-ranks-rank-41")
    view.screenshot(path=str(ARTIFACTS / "live-view-64-ranks.png"))


def test_toolbar_and_palette_commands(lab_page):
    page = lab_page
    page.locator(".lm-TabBar-tab", has_text="distrun.ipynb").click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    editors = page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor")
    before = editors.all_inner_texts()
    page.locator(".jp-distrun-toolbar-button").click()  # the notebook toolbar's %%distrun
    page.wait_for_function(
        f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === {len(before) + 1}"
    )  # %load_ext is already in the notebook: only the template is added
    after = editors.all_inner_texts()
    at = next(i for i, text in enumerate(after) if i >= len(before) or text != before[i])
    assert after[at].startswith("%%distrun --type pytorch --nodes 2 --procs-per-node 2")
    assert after[:at] + after[at + 1 :] == before  # below the active cell, nothing else moved

    page.keyboard.press("Control+Shift+C")  # the command palette
    page.keyboard.type("Open Submission Form")
    page.keyboard.press("Enter")
    form = cells.nth(at + 1).locator(".jp-Cell-outputArea")
    form.get_by_role("button", name="Submit").wait_for()
    form.scroll_into_view_if_needed()
    _shot(page, "6-form")
    # Export: the form's job as a batch script, shown below the form; nothing runs.
    form.locator("textarea").last.fill("print('hello')")
    form.locator(".widget-dropdown select").last.select_option("sbatch")
    export = form.get_by_role("button", name="Export")
    page.wait_for_function(
        "b => !b.disabled", arg=export.element_handle(), timeout=10_000
    )  # the preview is valid
    export.click()
    written = form.locator(".distrun-form-preview", has_text="#SBATCH --nodes=")
    written.wait_for(timeout=20_000)
    assert "run it with: sbatch --wait distrun_job.sbatch" in form.inner_text()
    written.scroll_into_view_if_needed()
    _shot(page, "6b-form-export")


def test_a_page_loaded_again_draws_the_lines_it_missed(lab_page, lab):
    """A second tab on the saved notebook (as after a reload) restores the live view from
    the kernel: the inspector from the widget's state, the lines by asking the kernel."""
    lab_page.locator(".lm-TabBar-tab", has_text="distrun.ipynb").click()
    lab_page.keyboard.press("Control+s")
    lab_page.locator(".jp-mod-dirty").first.wait_for(state="detached")
    page = lab_page.context.browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(lab.page_url("/lab/workspaces/distrun-again/tree/distrun.ipynb?reset"))
        view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
        view.locator("tr.distrun-process").nth(3).wait_for(state="attached")
        lines = view.locator(".distrun-lines")
        lines.filter(has_text="rank 3 says the sum of ranks is 6").wait_for(timeout=30_000)
        _shot(page, "7-page-loaded-again")
        text = lines.inner_text()
        assert all(f"[rank {r}] rank {r} says the sum of ranks is 6" in text for r in range(4))
        view.locator(".distrun-rankbar [data-key='rank-2']").click()
        rank_2 = lines.inner_text()
        assert "rank 2 says the sum of ranks is 6" in rank_2 and "rank 0" not in rank_2
    finally:
        page.close()


def test_each_cell_of_a_session_has_a_view_of_its_own(lab_page, lab):
    """Two cells run in one session (one job) keep their own lines, chips and clocks."""
    with _notebook(lab_page, lab, "session.ipynb") as (page, _):
        _run_cell(page, 1)
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.nth(1).locator(".jp-OutputArea", has_text="Session lab-session ready").wait_for(
            timeout=120_000
        )
        views = []
        for index in (2, 3):
            _run_cell(page, index)
            views.append(_final_view(cells.nth(index), "succeeded", 60_000))
        first, second = (view.locator(".distrun-lines").inner_text() for view in views)
        assert "first cell on rank 0" in first and "first cell on rank 1" in first
        assert "second cell" not in first
        assert "second cell on rank 1" in second and "first cell" not in second
        assert views[1].locator(".distrun-title").inner_text() == "lab-session · cell 2"
        assert views[0].get_attribute("data-job-id") == views[1].get_attribute("data-job-id")
        chips = views[1].locator(".distrun-rankbar button.distrun-rank")
        assert chips.all_inner_texts() == ["rank 0", "rank 1"]
        _shot(page, "9-session-cells")
        views[1].screenshot(path=str(ARTIFACTS / "live-view-session-cell.png"))
        _run_cell(page, 4)
        cells.nth(4).locator(".jp-OutputArea", has_text="Session lab-session stopped").wait_for(
            timeout=60_000
        )


def test_the_live_views_console_steps_a_paused_rank_and_lets_it_go_on(lab_page, lab):
    """Rank 1 at breakpoint(): its chip and the console under the output say where it
    waits; a pdb command typed there answers in rank 1's output, with pdb's prompt; a
    set that is not one is refused in one line; Continue all lets the job end."""
    with _notebook(lab_page, lab, "debug.ipynb") as (page, said):
        _run_cell(page, 1)
        view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
        console = view.locator(".distrun-debug")
        console.locator(".distrun-debug-head", has_text="Debugger: 1 rank paused").wait_for(
            timeout=90_000
        )
        where = console.locator(".distrun-debug-where li")
        assert (
            where.inner_text() == "rank 1 (local1): paused at cell line 6 in <module> (breakpoint)"
        )
        chip = view.locator(".distrun-rankbar button.distrun-rank.distrun-paused")
        assert chip.all_inner_texts() == ["rank 1"]
        chip.click()  # its tab: the console's commands now go to rank 1
        ranks = console.locator(".distrun-debug-ranks")
        assert ranks.input_value() == "1"
        command = console.locator(".distrun-debug-command")
        command.fill("p x * 2")
        command.press("Enter")
        lines = view.locator(".distrun-lines")
        try:
            lines.locator(".distrun-debug-line", has_text="82").wait_for(timeout=60_000)
        except PlaywrightTimeout:
            _shot(page, "11-debug-console-no-answer")
            raise AssertionError(f"no answer; the page said: {said}") from None
        assert lines.locator(".distrun-debug-line").all_inner_texts() == ["(Pdb) p x * 2", "82"]
        command.fill("x = 100")
        command.press("Enter")
        lines.locator(".distrun-debug-line", has_text="(Pdb) x = 100").wait_for(timeout=60_000)
        ranks.fill("0-x")
        command.fill("p x")
        command.press("Enter")
        status = console.locator(".distrun-debug-status.distrun-debug-error")
        status.wait_for(timeout=60_000)
        assert status.inner_text() == "ranks: '0-x' is not a set of ranks (e.g. 3, 0,2-3 or all)"
        console.scroll_into_view_if_needed()
        _shot(page, "11-debug-console")
        view.screenshot(path=str(ARTIFACTS / "live-view-debug.png"))
        _assert_readable(console.locator(".distrun-debug-head"))
        _assert_readable(lines.locator(".distrun-debug-line").first)
        command.evaluate("input => input.blur()")  # JupyterLab's shortcuts are not the console's
        with _dark_theme(page):
            view.screenshot(path=str(ARTIFACTS / "live-view-debug-dark.png"))
            _assert_readable(console.locator(".distrun-debug-head"))
            _assert_readable(lines.locator(".distrun-debug-line").first)
        console.get_by_role("button", name="Continue all").click()
        view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 60_000)
        assert view.locator(".distrun-debug").is_hidden()
        assert "rank 1 ends with x = 100" in view.locator(".distrun-lines").inner_text()


def test_a_detached_cell_frees_the_kernel_and_its_view_follows_the_job(lab_page, lab):
    """The cell returns once every rank runs: the kernel is idle while its view, fed from
    the store by a thread of the kernel's, follows the job to its end."""
    with _notebook(lab_page, lab, "detached.ipynb") as (page, _):
        _run_cell(page, 1, wait=True)  # it has its execution count: the cell has returned
        view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
        view.locator(".distrun-job-state", has_text="running").wait_for(timeout=60_000)
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for()
        assert "line" in view.locator(".distrun-lines").inner_text()
        _shot(page, "10-detached-running")
        view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 60_000)
        lines = view.locator(".distrun-lines").inner_text()
        for rank in range(4):
            assert f"[rank {rank}] line 30 of rank {rank}" in lines
        assert view.locator(".distrun-counts").inner_text() == "all succeeded"
        _shot(page, "10-detached-done")


def test_a_restarting_job_shows_its_attempt_and_the_earlier_cause_in_view_and_sidebar(
    lab_page, lab
):
    """A detached job (its view follows the store) fails once and starts again: the view's
    chip says "attempt 2 of 3" and lists the first attempt's cause, readable in both
    themes; the sidebar says the attempt too."""
    with _notebook(lab_page, lab, "restarts.ipynb") as (page, _):
        _run_cell(page, 1, wait=True)
        view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
        chip = view.locator(".distrun-attempt", has_text="attempt 2 of 3")
        chip.wait_for(timeout=60_000)
        earlier = view.locator(".distrun-attempts li")
        assert earlier.count() == 1
        assert "rank 1 on local1 (127.0.0.1) exited with code 1: rank 1 gives up" in (
            earlier.inner_text()
        )
        view.locator(".distrun-job-state", has_text="running").wait_for(timeout=30_000)
        sidebar = _open_sidebar(page)
        row = sidebar.locator(".jp-distrun-job", has_text="lab-restarts")
        row.locator(".jp-distrun-attempt", has_text="attempt 2 of 3").wait_for(timeout=15_000)
        assert "rank 1 gives up" in row.locator(".jp-distrun-earlier-attempt").inner_text()
        _assert_readable(chip)
        view.screenshot(path=str(ARTIFACTS / "live-view-restarted.png"))
        _shot(page, "11-restarted-running")
        with _dark_theme(page):
            _assert_readable(chip)
            _assert_readable(earlier.first)
            view.screenshot(path=str(ARTIFACTS / "live-view-restarted-dark.png"))
        view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 60_000)
        lines = view.locator(".distrun-lines").inner_text()
        assert "rank 1 on attempt 0" in lines and "rank 1 on attempt 1" in lines
        assert "attempt 2 of 3" in view.locator(".distrun-attempt").inner_text()
        _shot(page, "11-restarted-done")


def test_charts_and_progress_show_what_the_ranks_report(lab_page, lab):
    """4 ranks: a chart per metric with a line per rank, hover naming each rank's value, and
    the slowest rank's progress bar in the header. 64 ranks: the mean and its band. Both
    themes; the charts stay after the job ends (the settled view)."""
    with _notebook(lab_page, lab, "metrics.ipynb", height=1100) as (page, _):
        _run_cell(page, 1)
        view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
        loss = view.locator(".distrun-chart[data-metric='loss']")
        loss.wait_for(timeout=60_000)
        progress = view.locator(".distrun-progress-text")
        progress.wait_for(timeout=30_000)
        assert re.match(r"\d+/200", progress.inner_text()), progress.inner_text()
        view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 60_000)
        loss = view.locator(".distrun-chart[data-metric='loss']")
        assert loss.locator(".distrun-chart-line").count() == 4
        assert view.locator(".distrun-chart[data-metric='lr']").count() == 1
        assert view.locator(".distrun-progress-text").inner_text().startswith("200/200")
        box = loss.locator("svg").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        said = loss.locator(".distrun-chart-value").inner_text()
        assert said.startswith("step ") and "rank 0 " in said and "rank 3 " in said, said
        # Axes: round values along x (steps) and y; the loss, spanning over ten times, on a
        # log scale (powers of ten), which its button turns linear, and back.
        assert loss.locator(".distrun-chart-xtick").all_inner_texts() == ["0", "50", "100", "150"]
        assert loss.locator(".distrun-chart-ytick").all_inner_texts() == ["0.01", "0.1", "1"]
        scale = loss.locator(".distrun-chart-scale")
        assert scale.inner_text() == "log" and scale.get_attribute("aria-pressed") == "true"
        scale.click()
        linear = loss.locator(".distrun-chart-ytick").all_inner_texts()
        assert linear == ["0.5", "1", "1.5", "2"], linear
        assert loss.locator(".distrun-chart-scale").inner_text() == "linear"
        loss.locator(".distrun-chart-scale").click()
        _assert_readable(loss)  # its text on its own background
        _assert_readable(loss.locator(".distrun-chart-ytick").first)
        _assert_readable(view.locator(".distrun-progress"))
        view.screenshot(path=str(ARTIFACTS / "live-view-metrics.png"))
        with _dark_theme(page):
            _assert_readable(loss)
            _assert_readable(loss.locator(".distrun-chart-ytick").first)
            _assert_readable(view.locator(".distrun-progress"))
            view.screenshot(path=str(ARTIFACTS / "live-view-metrics-dark.png"))
        _run_cell(page, 2)
        wide = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(2), "succeeded", 120_000)
        band = wide.locator(".distrun-chart[data-metric='loss']")
        band.locator(".distrun-chart-band").wait_for(timeout=30_000)
        assert band.locator(".distrun-chart-mean").count() == 1
        assert band.locator(".distrun-chart-line").count() == 0
        assert "of 64 ranks" in band.locator(".distrun-chart-value").inner_text()
        # Every step reached the chart (its x axis ends at the last), thinned: the page
        # holds at most CHART_POINTS of each rank's series.
        box = band.locator("svg").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
        said = band.locator(".distrun-chart-value").inner_text()
        assert re.match(r"step 99\d\d: mean ", said), said
        page.mouse.move(0, 0)
        held = page.evaluate(
            "() => [...globalThis.__jupyterDistLines.values()].map((h) =>"
            " Object.values(h.metrics.loss || {}).map((s) => s.length))"
        )
        wide_held = [sizes for sizes in held if len(sizes) == 64]
        assert wide_held and 0 < max(wide_held[0]) <= 2000, held
        wide.screenshot(path=str(ARTIFACTS / "live-view-metrics-64.png"))
        with _dark_theme(page):
            wide.screenshot(path=str(ARTIFACTS / "live-view-metrics-64-dark.png"))
        # Ranks not in lock step: the one well below the others' rate is named, once it
        # has been so for 30 s; each chip's tooltip has its step and rate.
        _run_cell(page, 3)
        slow = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".distrun-live")
        named = slow.locator(".distrun-slow", has_text="rank 2 runs")
        named.wait_for(timeout=90_000)
        assert "below the median rate" in named.inner_text() and "for 30 s" in named.inner_text()
        chip = slow.locator(".distrun-rank[data-key='rank-0']")
        assert re.search(r"step \d+ · [\d.]+ steps/s", chip.get_attribute("title") or "")
        _assert_readable(named)
        slow.screenshot(path=str(ARTIFACTS / "live-view-slow-rank.png"))
        # The inspector's progress column says each rank's step and rate as text.
        slow.locator(".distrun-inspector-summary").click()
        cells = slow.locator("td.distrun-rank-progress")
        assert cells.count() == 3
        said = [cells.nth(i).inner_text() for i in range(3)]
        assert all(re.fullmatch(r"step \d+ · [\d.]+/s", text) for text in said), said
        _assert_readable(cells.nth(2))
        slow.screenshot(path=str(ARTIFACTS / "live-view-progress-column.png"))
        with _dark_theme(page):
            _assert_readable(cells.nth(2))
            slow.screenshot(path=str(ARTIFACTS / "live-view-progress-column-dark.png"))
        _final_view(page.locator(".jp-Notebook .jp-Cell").nth(3), "succeeded", 60_000)


def test_a_detached_job_outlives_the_jupyter_server_and_the_new_ones_sidebar_shows_it(
    lab_page, tmp_path
):
    """A detached cell's job, then the Jupyter server stopped (its kernels with it) and
    started again on the same store: the new server's sidebar shows the job running, then
    succeeded, with every line stored."""
    from jupyter_dist.run.requests import wait_until_ended
    from jupyter_dist.store import JobStore

    # The ranks print half their lines, then wait for the test to say go once the second
    # server's sidebar has shown them running: on a slow machine a job timed to outlast the
    # restart could end before the second server was up.
    go = tmp_path / "go"
    cell = (
        "%%distrun --detach --nodes 2 --procs-per-node 2 --name lab-outlives\n"
        "import os, pathlib, time\n"
        "deadline = time.monotonic() + 300\n"
        "for i in range(1, 101):\n"
        "    print(f\"line {i} of rank {os.environ['RANK']}\", flush=True)\n"
        "    time.sleep(0.05)\n"
        f"    while i == 50 and not pathlib.Path({str(go)!r}).exists():\n"
        "        assert time.monotonic() < deadline, 'no go from the test'\n"
        "        time.sleep(0.1)"
    )
    first = labserver.start(tmp_path)
    labserver.write_notebook(first, "outlives.ipynb", ["%load_ext jupyter_dist", cell])
    browser = lab_page.context.browser
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(first.page_url("/lab/workspaces/outlives/tree/outlives.ipynb?reset"))
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for()
        _run_cell(page, 0, wait=True)
        _run_cell(page, 1, wait=True)
        page.locator(".distrun-job-state", has_text="running").wait_for(timeout=60_000)
    finally:
        page.close()
        labserver.stop(first)  # the server and its kernel go
    (record,) = JobStore(first.home / "jobs").jobs()
    second = labserver.start(tmp_path)  # the same store
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(second.page_url("/lab/workspaces/outlives/tree/outlives.ipynb?reset"))
        sidebar = _open_sidebar(page)
        job = sidebar.locator(".jp-distrun-job", has_text="lab-outlives")
        job.and_(page.locator("[data-state='running']")).wait_for(timeout=60_000)
        _shot(page, "11-detached-after-a-server-restart")
        go.touch()
        job.and_(page.locator("[data-state='succeeded']")).wait_for(timeout=60_000)
    finally:
        go.touch()  # a failed wait above must not leave the ranks waiting
        page.close()
        labserver.stop(second)
    assert wait_until_ended(record, 10) == "succeeded"
    for rank in range(4):  # no line lost across the restart
        said = [line.text for line in record.iter_log(f"rank-{rank}", "stdout")]
        assert said == [f"line {i} of rank {rank}" for i in range(1, 101)]
