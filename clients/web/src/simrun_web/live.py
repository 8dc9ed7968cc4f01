"""Server-sent events fed by the gateway's streams, each bounded, each ended when its page closes.

A page's event stream reads one or more gateway streams (WatchRun, StreamLogs) on the view's event loop, through
one asyncio channel (`simrun_client.streams`): an idle page holds a pending read and no thread, and wakes nothing.
The events reach the page through a bounded queue, so a slow browser slows the read instead of filling memory.
When the page closes, its reads are cancelled, which cancels the gateway's streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from simrun_core.errors import ResourceExhausted, SimrunError

MAX_STREAMS = 64
"""Live pages the web server follows at once, for everybody."""
MAX_STREAMS_PER_IDENTITY = 16
"""Live pages one identity may have open at once."""
_QUEUE = 64
_KEEPALIVE_S = 20.0
"""A comment line this often keeps proxies from closing a quiet stream (and finds a page gone)."""


class StreamBounds:
    """Counts the open event streams, in all and per identity, and refuses one over either bound."""

    def __init__(self, total: int = MAX_STREAMS, per_identity: int = MAX_STREAMS_PER_IDENTITY) -> None:
        self.total, self.per_identity = total, per_identity
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def acquire(self, identity: str) -> None:
        """Takes a place for a stream of `identity`.

        Raises:
            ResourceExhausted: the bound in all or the identity's is reached.
        """
        with self._lock:
            if sum(self._open.values()) >= self.total:
                raise ResourceExhausted(f"the web view follows {self.total} live pages already: close some")
            if self._open.get(identity, 0) >= self.per_identity:
                raise ResourceExhausted(f"{identity} has {self.per_identity} live pages open: close some")
            self._open[identity] = self._open.get(identity, 0) + 1

    def release(self, identity: str) -> None:
        with self._lock:
            left = self._open.get(identity, 0) - 1
            if left > 0:
                self._open[identity] = left
            else:
                self._open.pop(identity, None)

    def open(self) -> int:
        """Streams open now, in all."""
        with self._lock:
            return sum(self._open.values())


@dataclass
class Feed:
    """One gateway stream and how each of its messages becomes an event: (name, data) or None to skip it."""

    stream: AsyncIterator[Any]
    event: Callable[[Any], tuple[str, Any] | None]


def sse(name: str, data: Any) -> str:
    """One server-sent event; the data is JSON on one line (JSON escapes every newline)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def events(feeds: Iterable[Feed], *, release: Callable[[], None]) -> AsyncIterator[str]:
    """The events of every feed as they come, then `end` once all of them ended; an `error` event for a refusal.

    Cancelled (the page closed), it cancels every read, which cancels the gateway's streams; `release` runs once
    either way.
    """
    feeds = list(feeds)
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(_QUEUE)

    async def pump(feed: Feed) -> None:
        try:
            async for message in feed.stream:
                event = feed.event(message)
                if event is not None:
                    await queue.put(event)
        except SimrunError as exc:
            await queue.put(("error", {"message": str(exc)}))
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await queue.put(("", None))  # this feed ended

    tasks = [asyncio.create_task(pump(feed)) for feed in feeds]
    try:
        ended = 0
        while ended < len(feeds):
            try:
                name, data = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if not name:
                ended += 1
                continue
            yield sse(name, data)
        yield sse("end", {})
    finally:
        for task in tasks:
            task.cancel()
        for feed, task in zip(feeds, tasks, strict=True):
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(BaseException):
                await feed.stream.aclose()  # type: ignore[attr-defined]
        release()
