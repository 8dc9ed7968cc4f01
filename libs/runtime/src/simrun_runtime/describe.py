"""`python -m simrun_runtime.describe`: describes task types in a subprocess, JSON on stdin, JSON on stdout.

The control plane never imports user code; it runs this module with the model's environment instead.

stdin: one request or a JSON list of them, each
    {"type": "module:Class" | "<entry point>", "model_root": "/path" | null, "settings": {...} | null,
     "libraries": ["/path", ...]}
stdout: one response per request (a list for a list), each
    {"ok": true, "error": null, "description": TypeDescription}  or  {"ok": false, "error": "...", "description": null}
`ok` is false when the type cannot be loaded or counting its units fails; settings that the type refuses are
reported in `description.settings_errors` with `ok` true. Exit status 0, or 2 when stdin is not a valid request.
Whatever user code prints while it is imported goes to stderr, so stdout holds only the response.

With `--serve` it stays up and answers one JSON list of requests per line with one JSON list per line, until
stdin closes: the run tracker keeps one per model snapshot, so a submission costs a round trip, not a start.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

from simrun_runtime.loading import TypeDescription, describe_type
from simrun_runtime.tasktype import TaskTypeError


class DescribeRequest(BaseModel):
    """Which type to describe, from which model root, and optionally which settings to check."""

    type: str
    model_root: str | None = None
    settings: dict[str, Any] | None = None
    libraries: list[str] = []
    """The roots of the model's library snapshots: those that are not packages go on `sys.path` after the model."""


class DescribeResponse(BaseModel):
    """The description of one type, or why it could not be described."""

    ok: bool
    error: str | None = None
    description: TypeDescription | None = None


def as_line(items: Sequence[DescribeRequest] | Sequence[DescribeResponse]) -> str:
    """Requests or responses as `--serve` carries them: one JSON list on one line (without its newline)."""
    return json.dumps([item.model_dump(mode="json") for item in items])


def responses_of(line: str) -> list[DescribeResponse]:
    """The responses of a line that `--serve` answered (new objects each call: a caller may change its own)."""
    return [DescribeResponse.model_validate(item) for item in json.loads(line)]


def describe(request: DescribeRequest) -> DescribeResponse:
    """Describes one type; user code errors become `error`, never an exception."""
    try:
        description = describe_type(request.type, request.model_root, request.settings, request.libraries)
    except TaskTypeError as exc:
        return DescribeResponse(ok=False, error=str(exc))
    except Exception as exc:  # user code may raise anything while it is imported or described
        return DescribeResponse(ok=False, error=f"describing {request.type!r} failed: {type(exc).__name__}: {exc}")
    return DescribeResponse(ok=True, description=description)


def serve(stdin: TextIO, out: TextIO) -> int:
    """Answers one line of requests with one line of responses until `stdin` closes."""
    for line in stdin:
        try:
            requests = [DescribeRequest.model_validate(item) for item in json.loads(line)]
        except (json.JSONDecodeError, ValidationError, TypeError) as exc:
            responses = [DescribeResponse(ok=False, error=f"not a describe request: {str(exc).splitlines()[0]}")]
        else:
            with contextlib.redirect_stdout(sys.stderr):
                responses = [describe(request) for request in requests]
        out.write(as_line(responses) + "\n")
        out.flush()
    return 0


def main() -> int:
    out = sys.stdout
    if sys.argv[1:] == ["--serve"]:
        return serve(sys.stdin, out)
    try:
        payload = json.loads(sys.stdin.read())
        many = isinstance(payload, list)
        requests = [DescribeRequest.model_validate(item) for item in (payload if many else [payload])]
    except (json.JSONDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        print(f"simrun-describe: error: stdin is not a describe request: {first}", file=sys.stderr)
        return 2
    with contextlib.redirect_stdout(sys.stderr):
        responses = [describe(request).model_dump(mode="json") for request in requests]
    json.dump(responses if many else responses[0], out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
