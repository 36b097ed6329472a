"""The live view in Notebook 7 (the same front end packages as JupyterLab, another shell),
driven in the system's headless Chromium."""

from __future__ import annotations

import re

import labserver
import nbformat
import pytest
from test_lab import ARTIFACTS, DDP_CELL, _run_cell

pytestmark = pytest.mark.browser


def test_a_cell_shows_every_rank_and_the_inspector_in_notebook7(tmp_path):
    from playwright.sync_api import sync_playwright

    server = labserver.start(tmp_path, app="notebook")
    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(s) for s in ("%load_ext jupyter_dist", DDP_CELL)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nbformat.write(nb, server.root / "nb7.ipynb")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=labserver.chromium_path(), args=labserver.CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(server.page_url("/notebooks/nb7.ipynb"))
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            _run_cell(page, 0, wait=True)  # asks again if the kernel was not ready yet
            _run_cell(page, 1)
            view = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".distrun-live")
            view.locator("div").first.filter(has_text="succeeded").wait_for(timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / "notebook7.png"))
            lines = view.locator(".distrun-lines").inner_text()
            for rank in range(4):
                assert f"[rank {rank}] rank {rank} says the sum of ranks is 6" in lines
            rows = view.locator("tr.distrun-process")
            ranks = [rows.nth(i).locator("td").all_inner_texts()[5] for i in range(4)]
            assert ranks == ["0", "1", "2", "3"]
            assert re.search(r"job \S+: succeeded", view.inner_text())
            browser.close()
    finally:
        labserver.stop(server)
