"""A line of output as a terminal would leave it: what a progress bar's redraws left
(`last_state`), and the line without what a terminal acts on rather than shows (`plain`:
colours, cursor moves, a retitled window, backspaces and the other control characters but
tab). The CLI's text and the metrics read from trainers' lines (run/metrics.py) both need
it: Keras writes its progress line in bold, redrawn with "\\r" and "\\b"."""

from __future__ import annotations

import re

# Escape sequences (CSI, OSC, and the two-byte ones) and the other C0 controls but tab.
_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]+[0-~]|\x1b[ -~]?"
    r"|[\x00-\x08\x0a-\x1a\x1c-\x1f\x7f]"
)


def last_state(text: str) -> str:
    """A stored line as a terminal shows it: a progress bar's "\\r" updates leave only the
    last state ("10%\\r50%\\r" is "50%")."""
    return text.rstrip("\r").rsplit("\r", 1)[-1]


def plain(text: str) -> str:
    """`text` without escape sequences or control characters (tab kept)."""
    return _CONTROLS.sub("", text)
