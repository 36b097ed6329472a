"""What users install: scripts/build-dist.sh builds a wheel and an sdist carrying the
prebuilt lab extension, the server extension's config and the license; the wheel installs
into a fresh JupyterLab environment with no node on PATH, and both extensions are enabled
there (and in this one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The README's build command; the extension is already built in this tree (setup built
    it), so it is reused and no node runs here."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-dist.sh"), "--outdir", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return out


@pytest.mark.slow
def test_wheel_and_sdist_carry_the_built_lab_extension_and_the_license(dist: Path):
    (wheel,) = dist.glob("jupyter_dist-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("jupyter_dist-0.1.0.dist-info/METADATA").decode()
    data = "jupyter_dist-0.1.0.data/data/"
    lab = data + "share/jupyter/labextensions/jupyter-dist/"
    assert lab + "package.json" in names and lab + "install.json" in names
    assert any(n.startswith(lab + "static/remoteEntry.") for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/jupyter_dist.json" in names
    assert "jupyter_dist/server/handlers.py" in names
    assert "jupyter_dist/widgets/live.css" in names
    assert "jupyter_dist/widgets/live_loader.js" in names
    assert not any("node_modules" in n or n.startswith("jupyter_dist/labextension") for n in names)
    assert "jupyter_dist-0.1.0.dist-info/licenses/LICENSE" in names
    assert "License-Expression: BSD-3-Clause" in metadata
    (sdist,) = dist.glob("jupyter_dist-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    assert any(m.endswith("jupyter_dist/labextension/package.json") for m in members)
    assert any(m.endswith("package-lock.json") for m in members)
    assert "jupyter_dist-0.1.0/LICENSE" in members
    assert not any("/node_modules/" in m for m in members)


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_jupyterlab_without_node(dist: Path, tmp_path: Path):
    (wheel,) = dist.glob("jupyter_dist-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    path = str(venv / "bin")  # nothing else: no node, no npm
    assert shutil.which("node", path=path) is None and shutil.which("npm", path=path) is None
    env = {**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)

    def run(*argv: str, timeout: float = 600) -> str:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout
        )
        assert done.returncode == 0, f"{argv}: {(done.stdout + done.stderr)[-3000:]}"
        return (done.stdout + done.stderr).replace("\x1b[32m", "").replace("\x1b[0m", "")

    run("pip", "install", "-q", "jupyterlab>=4.6,<5")  # your JupyterLab
    run("pip", "install", "-q", str(wheel))
    lab = run("jupyter", "labextension", "list")
    line = next(ln for ln in lab.splitlines() if "jupyter-dist v" in ln)
    assert "enabled" in line and "OK" in line, lab
    server = run("jupyter", "server", "extension", "list")
    assert "jupyter_dist enabled" in server and "jupyter_dist 0.1.0 OK" in server, server
    assert "usage: jupyter distrun" in run("jupyter", "distrun", "--help")
    assert (venv / "share/jupyter/labextensions/jupyter-dist/static/style.js").is_file()


@pytest.mark.slow
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
