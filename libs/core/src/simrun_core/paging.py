"""Page sizes and opaque page tokens of every List method."""

from __future__ import annotations

import base64
import binascii
import json
from typing import TypeVar

from simrun_core.errors import InvalidArgument

T = TypeVar("T")

MAX_PAGE_SIZE = 1000


def page_size(requested: int, default: int) -> int:
    """0 gives the default, larger sizes are capped, a negative one is refused."""
    if requested < 0:
        raise InvalidArgument(f"page_size must not be negative, got {requested}")
    if requested == 0:
        return default
    return min(requested, MAX_PAGE_SIZE)


def encode_token(offset: int, scope: str) -> str:
    """A token for the page starting at `offset` of a listing with the filters `scope`."""
    raw = json.dumps({"o": offset, "s": scope}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, scope: str) -> int:
    """The offset a token stands for; 0 for an empty token; `InvalidArgument` for a foreign or bad one."""
    if not token:
        return 0
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, token_scope = int(data["o"]), data["s"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidArgument("bad page_token: pass the next_page_token of the previous page") from exc
    if token_scope != scope or offset < 0:
        raise InvalidArgument("page_token belongs to another listing: keep the filters of the first page")
    return offset


def page(items: list[T], requested_size: int, token: str, scope: str, default: int) -> tuple[list[T], str]:
    """One page of `items` and the token of the next page (empty at the end)."""
    size = page_size(requested_size, default)
    start = decode_token(token, scope)
    chunk = items[start : start + size]
    end = start + len(chunk)
    return chunk, encode_token(end, scope) if end < len(items) else ""


def encode_key_token(key: list[str], scope: str) -> str:
    """A token for the page after the row whose sort key is `key`, in a listing with the filters `scope`.

    Keyset paging: the next page starts after that row however many rows came before it, so reading every page
    costs as much as reading the listing once.
    """
    raw = json.dumps({"k": key, "s": scope}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_key_token(token: str, scope: str) -> list[str] | None:
    """The sort key a token names; None for an empty token; `InvalidArgument` for a foreign or bad one."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        key, token_scope = data["k"], data["s"]
        if not isinstance(key, list) or not all(isinstance(k, str) for k in key):
            raise ValueError(key)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidArgument("bad page_token: pass the next_page_token of the previous page") from exc
    if token_scope != scope:
        raise InvalidArgument("page_token belongs to another listing: keep the filters of the first page")
    return key
