"""Errors that reach the user as one clear line, never as a traceback."""

from __future__ import annotations


class DistrunError(Exception):
    """A problem the user can fix; its message is one line saying what and how."""


class SpecError(DistrunError):
    """The job spec (YAML, magic options, form fields) is invalid."""


class NodeError(DistrunError):
    """A node cannot be used: unknown name, unreachable, bad inventory."""
