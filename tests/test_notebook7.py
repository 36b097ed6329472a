"""The live view in Notebook 7 (the same front end packages as JupyterLab, another shell),
driven in the system's headless Chromium."""

from __future__ import annotations

import re

import labserver
import pytest
from test_lab import ARTIFACTS, DDP_CELL, _final_view, _run_cell

pytestmark = pytest.mark.browser


def test_a_cell_shows_every_rank_and_the_inspector_in_notebook7(tmp_path):
    server = labserver.start(tmp_path, app="notebook")
    try:
        labserver.write_notebook(server, "nb7.ipynb", ["%load_ext jupyter_dist", DDP_CELL])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with labserver.open_page(server, "/notebooks/nb7.ipynb") as page:
            _run_cell(page, 0, wait=True)  # asks again if the kernel was not ready yet
            _run_cell(page, 1)
            view = _final_view(page.locator(".jp-Notebook .jp-Cell").nth(1), "succeeded", 120_000)
            lines = view.locator(".distrun-lines").inner_text()
            for rank in range(4):
                assert f"[rank {rank}] rank {rank} says the sum of ranks is 6" in lines
            view.locator(".distrun-inspector-summary").click()
            rows = view.locator("tr.distrun-process")
            rows.first.wait_for()
            page.screenshot(path=str(ARTIFACTS / "notebook7.png"))
            ranks = [rows.nth(i).locator("td").all_inner_texts()[5] for i in range(4)]
            assert ranks == ["0", "1", "2", "3"]
            assert re.fullmatch(r"\d+:\d\d", view.locator(".distrun-elapsed").inner_text())
    finally:
        labserver.stop(server)
