"""Whether a notebook cell (a job's `script`, a session's cell) is Python the ranks can run,
checked where the notebook is, before anything starts: a syntax error would otherwise fail
on every rank once nodes were taken, and IPython's own syntax (`!cmd`, `%magic`) is not
Python at all (the ranks run the cell as a plain Python script)."""

from __future__ import annotations

import ast
import platform

_SHOWN = 60  # the most of the offending line a message quotes


def syntax_problem(source: str) -> str | None:
    """None if `source` parses as Python here; else one line saying where and why."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        line = exc.lineno or 0
        text = _line(source, line)
        quoted = repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
        if text.lstrip().startswith(("!", "%")) or "= !" in text or "= %" in text:
            return (
                f"line {line}, {quoted}, is IPython syntax, not Python: the ranks run the "
                "cell as a Python script (run a shell command with subprocess.run, and a "
                "magic in a cell of its own)"
            )
        where = f"line {line}, {quoted}" if line else "the cell"
        return (
            f"{where}: {exc.msg} (the ranks run it as Python; checked with Python "
            f"{platform.python_version()} here)"
        )
    except ValueError as exc:  # a NUL byte (Python < 3.12 says so with a ValueError)
        return f"the cell cannot be Python source: {exc}"
    except (RecursionError, MemoryError):
        return "the cell is nested too deeply for Python to parse"
    return None


def _line(source: str, number: int) -> str:
    lines = source.splitlines()
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""
