"""jupyter-dist: run distributed training from a notebook cell."""

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """`%load_ext jupyter_dist` registers `%%distrun` and `%distrun`."""
    from jupyter_dist.magics import load

    load(ipython)
