"""Run a notebook in a real Jupyter kernel, cell by cell, printing every output as it comes.

    .venv/bin/python scripts/demo.py [NOTEBOOK]     (default: examples/pytorch_ddp.ipynb)

This is what scripts/demo.sh runs: the same `%%distrun` path a user runs in JupyterLab, with
the plain-text view (each line prefixed by its rank) instead of the live widget. The
notebook file is not changed. Exits 1 when a cell fails.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "examples" / "pytorch_ddp.ipynb"
RULE = "─" * 78


class PrintingClient(NotebookClient):
    """An nbclient that prints each cell's source head and its outputs while it runs."""

    code_cells = 0

    async def async_execute_cell(self, cell, cell_index, execution_count=None, **kwargs):
        if cell.cell_type == "code":
            self.code_cells += 1
            first, *rest = cell.source.splitlines() or [""]
            more = f"   (+{len(rest)} lines)" if rest else ""
            print(f"\n{RULE}\nIn [{self.code_cells}]: {first}{more}", flush=True)
        return await super().async_execute_cell(cell, cell_index, execution_count, **kwargs)

    def output(self, outs, msg, display_id, cell_index):
        out = super().output(outs, msg, display_id, cell_index)
        if out is not None:
            _print(out)
        return out


def _print(out) -> None:
    if out.output_type == "stream":
        target = sys.stderr if out.name == "stderr" else sys.stdout
        target.write(out.text)
        target.flush()
    elif out.output_type in ("display_data", "execute_result"):
        text = out.get("data", {}).get("text/plain")
        if text:
            print(text, flush=True)
    # errors are reported once, by the CellExecutionError below


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    notebook = nbformat.read(path, as_version=4)
    print(f"Running {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} in a "
          "Jupyter kernel: each %%distrun cell is a distributed job on local nodes.")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="distrun-demo-") as sockets:
        # The kernel talks over local sockets (IPC), not TCP on localhost: nothing to warn
        # about, and nothing another user of the machine can connect to.
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "k")}})
        client = PrintingClient(
            notebook, config=ipc, timeout=600, kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )  # fmt: skip
        try:
            client.execute()
        except CellExecutionError as exc:
            print(f"\n{RULE}\nThe notebook failed:\n{exc}", file=sys.stderr)
            return 1
    print(f"\n{RULE}\nThe notebook ran: every cell succeeded.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
