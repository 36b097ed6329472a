"""jupyter-dist: run distributed training from a notebook cell."""

from jupyter_dist.node_side.report import report  # a rank's metrics; a no-op elsewhere

__all__ = ["report"]
__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """`%load_ext jupyter_dist` registers `%%distrun` and `%distrun`."""
    from jupyter_dist.magics import load

    load(ipython)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The REST API for the JupyterLab extension (enabled on install)."""
    return [{"module": "jupyter_dist.server"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension shipped inside the package."""
    return [{"src": "labextension", "dest": "jupyter-dist"}]
