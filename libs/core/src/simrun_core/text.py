"""Text a task or a submitter wrote, made safe to show on another identity's terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, limit: int | None = None) -> str:
    """`text` with its control characters (but newline and tab) written as `\\xNN`, at most `limit` characters.

    A task's failure message or a file name it made is shown by `simrun status` or `simrun outputs` to whoever
    reads the run, often the owner: an escape sequence in it would drive their terminal (write its clipboard,
    rewrite the screen).
    """
    safe = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if limit is not None and len(safe) > limit:
        return safe[: limit - 1] + "…"
    return safe
