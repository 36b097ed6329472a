"""What of a code folder travels: regular files only, caches never, ignore files followed
as git and Azure ML read them."""

from __future__ import annotations

import os
import socket

from jupyter_dist.code_folder import read_code_folder


def _tree(root, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_an_amlignore_wins_over_a_gitignore_and_deeper_patterns_win(tmp_path):
    _tree(tmp_path, {
        "train.py": "", "notes.md": "", "model.ckpt": "", "keep.ckpt": "",
        "data/big.csv": "", "lib/a.py": "", "lib/gen/out.py": "", "lib/gen/keep.py": "",
        ".gitignore": "*.py\n",  # not followed: the .amlignore beside it is
        ".amlignore": "data/\n*.ckpt\n!keep.ckpt\n*.md\n",
        "lib/.gitignore": "gen/*\n!gen/keep.py\n",
        "__pycache__/x.pyc": "", "lib/__pycache__/a.pyc": "", ".git/HEAD": "",
    })  # fmt: skip
    folder = read_code_folder(tmp_path, ignore_files=True)
    assert sorted(folder.files) == [
        ".amlignore", ".gitignore", "keep.ckpt", "lib/.gitignore", "lib/a.py",
        "lib/gen/keep.py", "train.py",
    ]  # fmt: skip
    assert sorted(folder.ignored) == ["data/", "lib/gen/out.py", "model.ckpt", "notes.md"]
    assert folder.followed == (".amlignore", "lib/.gitignore")
    assert folder.left_out() == (
        "data/, model.ckpt, notes.md, lib/gen/out.py (left out by .amlignore and lib/.gitignore)"
    )
    # Without ignore files (an SSH node's copy), only the caches stay behind.
    everything = read_code_folder(tmp_path, ignore_files=False)
    assert len(everything.files) == 11 and everything.left_out() == ""


def test_only_regular_files_travel_and_the_others_are_named_unopened(tmp_path):
    _tree(tmp_path, {"train.py": "print(1)\n", "sub/real.txt": "x"})
    os.mkfifo(tmp_path / "pipe")  # opening it to read would block for ever
    os.mkfifo(tmp_path / ".gitignore")  # even as an ignore file
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        (tmp_path / "link.txt").symlink_to("sub/real.txt")  # travels as its content
        (tmp_path / "dangling").symlink_to("nowhere")
        (tmp_path / "sublink").symlink_to("sub")
        (tmp_path / "run.sh").write_text("#!/bin/sh\n")
        (tmp_path / "run.sh").chmod(0o755)
        folder = read_code_folder(tmp_path, ignore_files=True)
    assert folder.files == {"link.txt": 1, "run.sh": 10, "sub/real.txt": 1, "train.py": 9}
    assert folder.executable == {"run.sh"} and folder.folders == ("sub",)
    assert folder.special == (
        "sublink (a link to a folder)", ".gitignore (a FIFO)", "dangling (a broken link)",
        "pipe (a FIFO)", "sock (a socket)",
    )  # fmt: skip
    assert folder.left_out().endswith("since only regular files travel")
