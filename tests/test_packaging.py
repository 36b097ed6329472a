"""What `pip install jupyter-dist` gets: the prebuilt lab extension and the server
extension's config inside the wheel and the sdist, and both enabled in this environment."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from helpers import ROOT

BIN = Path(sys.executable).parent


def test_wheel_and_sdist_carry_the_built_lab_extension(tmp_path: Path):
    # The extension is already built in this tree (setup built it), so no node runs here.
    for kind in ("wheel", "sdist"):
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "-w", str(tmp_path), str(ROOT)] if kind == "wheel" else
            [sys.executable, "-c", "from hatchling.ouroboros import build_sdist; "
             f"print(build_sdist({str(tmp_path)!r}))"],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("jupyter_dist-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    data = "jupyter_dist-0.1.0.data/data/"
    lab = data + "share/jupyter/labextensions/jupyter-dist/"
    assert lab + "package.json" in names and lab + "install.json" in names
    assert any(n.startswith(lab + "static/remoteEntry.") for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/jupyter_dist.json" in names
    assert "jupyter_dist/server/handlers.py" in names
    assert not any("node_modules" in n or n.startswith("jupyter_dist/labextension") for n in names)
    (sdist,) = tmp_path.glob("jupyter_dist-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    assert any(m.endswith("jupyter_dist/labextension/package.json") for m in members)
    assert any(m.endswith("package-lock.json") for m in members)
    assert not any("/node_modules/" in m for m in members)


def test_both_extensions_are_enabled_in_the_environment():
    lab = subprocess.run(
        [str(BIN / "jupyter"), "labextension", "list"], capture_output=True, text=True
    )
    line = next(ln for ln in (lab.stdout + lab.stderr).splitlines() if "jupyter-dist v" in ln)
    assert "enabled" in line and "OK" in line, line
    server = subprocess.run(
        [str(BIN / "jupyter"), "server", "extension", "list"], capture_output=True, text=True
    )
    text = server.stdout + server.stderr
    assert "jupyter_dist enabled" in text.replace("\x1b[32m", "").replace("\x1b[0m", "")
    assert "jupyter_dist 0.1.0 OK" in text.replace("\x1b[32m", "").replace("\x1b[0m", "")
