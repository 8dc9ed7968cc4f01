"""Page sizes and opaque page tokens of every List method."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simrun_core.errors import InvalidArgument
from simrun_core.paging import MAX_PAGE_SIZE, decode_token, encode_token, page, page_size


def test_page_size_zero_gives_the_default() -> None:
    assert page_size(0, 50) == 50


def test_page_size_is_capped() -> None:
    assert page_size(7, 50) == 7
    assert page_size(MAX_PAGE_SIZE, 50) == MAX_PAGE_SIZE
    assert page_size(MAX_PAGE_SIZE + 1, 50) == MAX_PAGE_SIZE


def test_negative_page_size_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="page_size must not be negative, got -1"):
        page_size(-1, 50)


@given(offset=st.integers(min_value=0, max_value=10**9), scope=st.text())
def test_token_round_trip(offset: int, scope: str) -> None:
    token = encode_token(offset, scope)
    assert "=" not in token
    assert decode_token(token, scope) == offset


def test_empty_token_is_the_first_page() -> None:
    assert decode_token("", "runs") == 0


def test_token_of_another_listing_is_refused() -> None:
    token = encode_token(10, "group=a")
    with pytest.raises(InvalidArgument, match="page_token belongs to another listing"):
        decode_token(token, "group=b")


def _b64(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "!!!",
        "not-a-token",
        "a",
        _b64([1, 2]),
        _b64({"o": 1}),
        _b64({"s": "runs"}),
        _b64({"o": "x", "s": "runs"}),
        _b64(3),
    ],
)
def test_garbage_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument, match="bad page_token"):
        decode_token(token, "runs")


def test_negative_offset_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        decode_token(_b64({"o": -3, "s": "runs"}), "runs")


@given(token=st.text())
def test_any_token_is_an_offset_or_invalid_argument(token: str) -> None:
    with contextlib.suppress(InvalidArgument):
        assert decode_token(token, "runs") >= 0


def test_paging_through_a_listing_visits_every_item_once() -> None:
    items = list(range(23))
    seen: list[int] = []
    token = ""
    pages = 0
    while True:
        chunk, token = page(items, 10, token, "runs", default=5)
        seen.extend(chunk)
        pages += 1
        if not token:
            break
    assert (seen, pages) == (items, 3)


def test_page_uses_the_default_size_and_ends_without_a_token() -> None:
    assert page(list(range(5)), 0, "", "runs", default=5) == ([0, 1, 2, 3, 4], "")
    assert page([], 0, "", "runs", default=5) == ([], "")
