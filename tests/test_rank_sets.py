"""A set of ranks as a user writes it (`--ranks`, the debugger's `cast`): one reading."""

import pytest

from jupyter_dist.errors import SpecError
from jupyter_dist.rank_sets import parse_rank_set


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("3", [3]), ("0,2-3", [0, 2, 3]), (" 5 , 1-2,2", [1, 2, 5]), ("all", None), ("ALL", None),
     ("7-7", [7])],
)  # fmt: skip
def test_a_rank_set_reads_as_written(text, ranks):
    assert parse_rank_set(text) == ranks


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "3-1", "1,,2", "0-99999999999", "all,1"])
def test_anything_else_is_one_line_naming_what_would_do(text):
    with pytest.raises(SpecError) as raised:
        parse_rank_set(text, "cast")
    assert str(raised.value) == f"cast: {text!r} is not a set of ranks (e.g. 3, 0,2-3 or all)"
