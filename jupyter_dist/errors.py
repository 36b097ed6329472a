"""Errors that reach the user as one clear line, never as a traceback."""

from __future__ import annotations


class DistrunError(Exception):
    """A problem the user can fix; its message is one line saying what and how."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through jupyter-dist's internals.
        return [f"{type(self).__name__}: {self}"]


class SpecError(DistrunError):
    """The job spec (YAML, magic options, form fields) is invalid."""


class NodeError(DistrunError):
    """A node cannot be used: unknown name, unreachable, bad inventory."""


class ExportError(DistrunError):
    """A job cannot be written in the format asked for (a setting the format has no way to
    express), or not where it was asked to go."""


class DamagedJob(DistrunError):
    """A job's files in the store cannot be read as what they should be (a crash, an edit)."""
