"""The backend registry: the built-in backends by name, a third-party backend added through
the `jupyter_dist.backends` entry-point group (a real installed distribution on sys.path),
and a clear error for an unknown name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_dist.backends import Backend, available, backend_class, choose_backend
from jupyter_dist.backends.local import LocalBackend
from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Inventory, Node


def test_builtin_backends_by_name_and_the_default_choice():
    assert {"local", "ssh", "slurm"} <= set(available())
    assert backend_class("local") is LocalBackend
    assert all(issubclass(backend_class(name), Backend) for name in ("ssh", "slurm"))
    inventory = Inventory(nodes=(Node(name="gpu1", host="10.0.0.5", backend="ssh"),))
    assert choose_backend(Inventory(), environ={}).name == "local"  # no inventory
    assert choose_backend(inventory, environ={}).name == "ssh"
    assert choose_backend(inventory, environ={"SLURM_JOB_ID": "7"}).name == "slurm"  # inside
    assert choose_backend(inventory, "local", environ={"SLURM_JOB_ID": "7"}).name == "local"


def test_an_unknown_backend_is_one_line_naming_the_valid_ones():
    with pytest.raises(DistrunError, match=r"^unknown backend 'slurmm'; valid backends: .*local"):
        backend_class("slurmm")


def test_a_package_adds_a_backend_through_an_entry_point(tmp_path: Path):
    (tmp_path / "my_backend.py").write_text(
        textwrap.dedent("""\
            from jupyter_dist.backends.local import LocalBackend

            class MyBackend(LocalBackend):
                name = "mine"
        """)
    )
    info = tmp_path / "my_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[jupyter_dist.backends]\nmine = my_backend:MyBackend\n")
    probe = (
        "from jupyter_dist.backends import available, backend_class, Backend\n"
        "cls = backend_class('mine')\n"
        "print(available()['mine'], cls.name, issubclass(cls, Backend))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["my_backend:MyBackend", "mine", "True"]


def test_the_ray_hosts_pieces_make_a_file_only_once_whole(tmp_path):
    """Below the Ray test of a large code folder: put_files' pieces, cut by the launcher's
    batches, make each file only when its last piece is written, with its mode."""
    from jupyter_dist.backends.ray import _batches
    from jupyter_dist.backends.ray_host import RayNodeHost

    host = object.__new__(RayNodeHost)  # its methods need no Ray node for files
    big, small = bytes(range(25)), b"tiny"
    batches = _batches([(str(tmp_path / "a" / "big"), big, 0o700),
                        (str(tmp_path / "small"), small, 0o600)], limit=8)  # fmt: skip
    assert [len(batch) for batch in batches] == [1, 1, 1, 2]
    for number, batch in enumerate(batches):
        host.put_files(batch)
        assert (tmp_path / "a" / "big").exists() == (number == len(batches) - 1)
    assert (tmp_path / "a" / "big").read_bytes() == big
    assert (tmp_path / "small").read_bytes() == small
    assert (tmp_path / "a" / "big").stat().st_mode & 0o777 == 0o700
    assert not list(tmp_path.rglob("*.part"))


def test_the_test_clusters_never_share_a_subnet():
    """The sshd, Slurm and Ray test clusters of one run share a tag (the pid): their subnets
    must differ for every tag (the Ray and Slurm ones once matched for 1 pid in 5, and the
    Ray cluster's traffic went to the Slurm bridge)."""
    import netns

    for tag in range(10000):
        assert len({netns.subnet(kind, tag) for kind in netns.SUBNET_RANGES}) == 3, tag


def test_a_node_name_that_is_a_path_is_one_line(tmp_path):
    """A node's name names its folder of copied outputs in the store: `../../escaped`
    wrote them outside it."""
    from jupyter_dist.errors import NodeError
    from jupyter_dist.nodes import load_inventory

    for name in ("../../../../../escaped", "..", "a/b", "x" * 65):
        path = tmp_path / "nodes.yml"
        path.write_text(f"nodes:\n- {{name: '{name}', host: 10.0.0.1}}\n")
        with pytest.raises(NodeError) as caught:
            load_inventory(path)
        message = str(caught.value)
        assert "expected a name of letters, digits" in message and "\n" not in message, message
    path.write_text("nodes:\n- {name: gpu-node_1.a, host: 10.0.0.1}\n")
    assert [n.name for n in load_inventory(path).nodes] == ["gpu-node_1.a"]
