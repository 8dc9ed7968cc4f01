"""One line out of a pydantic validation error: where it is and what to fix."""

from __future__ import annotations

from pydantic import ValidationError


def first_error(exc: ValidationError) -> str:
    """`<dotted location>: <message>` of the first error, with unknown fields called what they are."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown field (misspelled?)"
    if err["type"] == "missing":
        return f"{where}: required field is missing"
    return f"{where}: {err['msg']}"
