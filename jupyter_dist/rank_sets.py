"""A set of ranks as a user writes it: `3`, `0,2-3`, `all`.

One reading for every place that takes one (a session cell's `--ranks`, the debugger's
`--ranks` and its console's `cast`), so the same words mean the same ranks everywhere.
"""

from __future__ import annotations

from jupyter_dist.errors import SpecError

ALL = "all"
MOST_RANKS = 1 << 20  # far above any job's ranks: a typo's `0-99999999999` is refused, not built


def is_rank(value: object) -> bool:
    """Whether `value`, read from a file or a request, is a rank: a whole number, 0 or more
    (JSON's true is not one, though Python counts it an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_rank_set(text: str, what: str = "--ranks") -> list[int] | None:
    """The ranks `text` names, ascending and once each; None for `all`. SpecError in one
    line, `what` first, for anything else (an empty set, a word, a reversed range)."""
    words = [word.strip() for word in text.split(",")]
    if [w.lower() for w in words] == [ALL]:
        return None
    ranks: set[int] = set()
    for word in words:
        first, dash, last = word.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise _bad(text, what) from None
        if low < 0 or high < low or high >= MOST_RANKS:
            raise _bad(text, what)
        ranks.update(range(low, high + 1))
    return sorted(ranks)


def _bad(text: str, what: str) -> SpecError:
    return SpecError(f"{what}: {text!r} is not a set of ranks (e.g. 3, 0,2-3 or all)")
