"""A job's `code` folder as the files that leave this machine with it: what an SSH node's
copy holds, what a Kubernetes export puts in its ConfigMap.

    folder = read_code_folder(Path("src"), ignore_files=True)
    folder.files     # {"train.py": 1234, "lib/model.py": 5678}: relative path -> size
    folder.ignored   # ("data/", "weights.ckpt"): left out by an .amlignore or .gitignore
    folder.left_out()  # those, and why, in one line ("" when everything travels)
    folder.special   # ("pipe (a FIFO)",): never read, since reading one can block for ever

Only regular files travel (a symbolic link to one travels as its content). Caches
(`__pycache__`, `.git`, `.ipynb_checkpoints`) never do. With `ignore_files`, each folder's
`.amlignore`, or else its `.gitignore`, leaves out what its patterns match below it, as
Azure ML does when it uploads a code folder (gitignore's rules: a later or deeper pattern
wins, and `!` takes a file back unless its folder was left out).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

CACHES = frozenset({"__pycache__", ".git", ".ipynb_checkpoints"})
# In each folder the first of these that exists is the one followed (Azure ML's order).
IGNORE_FILES = (".amlignore", ".gitignore")
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True)
class CodeFolder:
    """What of `root` travels (`files`), and what does not and why."""

    root: Path
    files: dict[str, int] = field(default_factory=dict)  # posix path below root -> bytes
    folders: tuple[str, ...] = ()  # every folder below root that travels, empty ones too
    executable: frozenset[str] = frozenset()  # those of `files` with an execute bit
    ignored: tuple[str, ...] = ()  # matched by an ignore file ("data/" for a whole folder)
    special: tuple[str, ...] = ()  # "path (a FIFO)": not regular files, never opened
    followed: tuple[str, ...] = ()  # the ignore files whose patterns were applied

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def left_out(self) -> str:
        """One line naming what stays behind ("" when everything travels)."""
        parts = []
        if self.ignored:
            by = " and ".join(self.followed)
            parts.append(f"{_listed(self.ignored)} (left out by {by})")
        if self.special:
            parts.append(f"{_listed(self.special)}, since only regular files travel")
        return "; ".join(parts)


def read_code_folder(root: Path, *, ignore_files: bool) -> CodeFolder:
    """The files below `root` that travel, in a stable order. Never opens a file."""
    files: dict[str, int] = {}
    folders: list[str] = []
    executable: set[str] = set()
    ignored: list[str] = []
    special: list[str] = []
    followed: list[str] = []
    # (folder below root, its patterns), outermost first: the last decisive match wins.
    rules: list[tuple[str, pathspec.PathSpec]] = []
    for folder, dirs, names in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        rules = [(base, spec) for base, spec in rules if _below(rel, base)]
        if ignore_files:
            found = _ignore_file(Path(folder), names)
            if found is not None:
                patterns = found.read_text(errors="replace").splitlines()
                rules.append((rel, pathspec.GitIgnoreSpec.from_lines(patterns)))
                followed.append(_joined(rel, found.name))
        kept_dirs = []
        for name in sorted(dirs):
            path = _joined(rel, name)
            if name in CACHES:
                continue
            if _matches(rules, path + "/"):
                ignored.append(path + "/")
            elif os.path.islink(os.path.join(folder, name)):  # os.walk does not enter it
                special.append(f"{path} (a link to a folder)")
            else:
                kept_dirs.append(name)
                folders.append(path)
        dirs[:] = kept_dirs
        for name in sorted(names):
            path = _joined(rel, name)
            try:
                info = os.stat(os.path.join(folder, name))  # follows a link: its target's kind
            except OSError:
                special.append(f"{path} (a broken link)")
                continue
            if stat.S_ISDIR(info.st_mode):  # a link to a folder os.walk listed as a file
                special.append(f"{path} (a link to a folder)")
            elif not stat.S_ISREG(info.st_mode):
                kind = next((what for test, what in _KINDS if test(info.st_mode)), "special")
                special.append(f"{path} ({kind})")
            elif _matches(rules, path):
                ignored.append(path)
            else:
                files[path] = info.st_size
                if info.st_mode & 0o111:
                    executable.add(path)
    return CodeFolder(
        root,
        files,
        tuple(folders),
        frozenset(executable),
        tuple(ignored),
        tuple(special),
        tuple(followed),
    )


def _ignore_file(folder: Path, names: list[str]) -> Path | None:
    for candidate in IGNORE_FILES:
        if candidate in names and (folder / candidate).is_file():  # never a FIFO's read
            return folder / candidate
    return None


def _matches(rules: list[tuple[str, pathspec.PathSpec]], path: str) -> bool:
    """Whether the ignore rules leave `path` out: the deepest folder's decisive match wins."""
    left_out = False
    for base, spec in rules:
        below = path[len(base) + 1 :] if base else path
        decided = spec.check_file(below).include
        if decided is not None:
            left_out = decided
    return left_out


def _below(path: str, base: str) -> bool:
    return not base or path == base or path.startswith(base + "/")


def _joined(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _listed(paths: tuple[str, ...], most: int = 8) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")
