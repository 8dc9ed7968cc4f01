"""StreamLogs messages stay bounded: log lines go out in pieces that end at a line's end where one is in reach."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st
from simrun_tracker.servicer import _pieces


@given(st.text(alphabet="ab\n", max_size=300), st.integers(min_value=1, max_value=40))
def test_pieces_are_bounded_whole_and_cut_at_lines(text: str, size: int) -> None:
    pieces = list(_pieces(text, size))
    assert "".join(pieces) == text
    assert all(0 < len(piece) <= size for piece in pieces)
    for piece, rest in pairwise(pieces):
        # A piece ends a line, or no line ended within its reach.
        assert piece.endswith("\n") or "\n" not in (piece + rest)[:size]
