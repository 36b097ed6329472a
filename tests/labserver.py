"""A real JupyterLab server for browser tests, and the system's headless Chromium.

The server runs with its own settings, workspaces and job store, and with the news toast
off; Chromium is Debian's binary driven by Playwright (no browser download)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@dataclass
class LabServer:
    url: str
    token: str
    root: Path
    home: Path
    process: subprocess.Popen

    def page_url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.url}{path}{sep}token={self.token}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(base: Path, app: str = "jupyterlab") -> LabServer:
    """JupyterLab (`app="jupyterlab"`) or Notebook 7 (`app="notebook"`) on a free port."""
    root, home, settings = base / "notebooks", base / "distrun", base / "settings"
    for folder in (root, home, settings / "@jupyterlab" / "apputils-extension"):
        folder.mkdir(parents=True, exist_ok=True)
    (
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    ).write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "DISTRUN_HOME": str(home)}
    env.pop("DISTRUN_NODES_FILE", None)
    log = open(base / "lab.log", "w")  # noqa: SIM115 (closed with the server)
    process = subprocess.Popen(
        [sys.executable, "-m", app, "--no-browser", "--allow-root",
         "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
         f"--LabApp.workspaces_dir={base / 'workspaces'}",
         f"--JupyterNotebookApp.user_settings_dir={settings}",
         f"--JupyterNotebookApp.workspaces_dir={base / 'workspaces'}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = LabServer(f"http://127.0.0.1:{port}", token, root, home, process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{app} exited: {(base / 'lab.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(server.page_url("/api/status"), timeout=2).read()
            return server
        except OSError:
            time.sleep(0.3)
    stop(server)
    raise RuntimeError(f"{app} did not answer within 60 s")


def stop(server: LabServer) -> None:
    """Stop the server and its kernels (they run in its session)."""
    import signal

    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


def chromium_path() -> str:
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if not found:
        raise RuntimeError("no Chromium: install Debian's chromium (scripts/setup.sh --test does)")
    return found


def write_notebook(server: LabServer, name: str, sources: list[str]) -> None:
    """A notebook of code cells in the server's root, with its kernel named (no dialog)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, server.root / name)


@contextlib.contextmanager
def open_page(server: LabServer, path: str) -> Iterator:
    """Headless Chromium on one of the server's pages, once its notebook cells are there."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(server.page_url(path))
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            yield page
        finally:
            browser.close()
