"""The Jupyter server extension: a REST API under /distrun/ for the JupyterLab sidebar.

Enabled on install by `jupyter-config/server-config/jupyter_dist.json`."""

from __future__ import annotations

from typing import Any


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_dist.server.handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("jupyter-dist: REST API at %sdistrun/", serverapp.base_url)
