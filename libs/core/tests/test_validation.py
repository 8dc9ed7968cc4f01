"""One line out of a pydantic validation error."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from simrun_core.validation import first_error


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=1)


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    items: list[Inner] = []


def _error(data: object) -> str:
    with pytest.raises(ValidationError) as info:
        Outer.model_validate(data)
    return first_error(info.value)


def test_unknown_field_is_called_misspelled() -> None:
    assert _error({"name": "a", "itmes": []}) == "itmes: unknown field (misspelled?)"


def test_missing_field_is_called_missing() -> None:
    assert _error({}) == "name: required field is missing"


def test_other_errors_have_a_dotted_location_and_pydantic_message() -> None:
    assert _error({"name": "a", "items": [{"size": 1}, {"size": 0}]}) == (
        "items.1.size: Input should be greater than or equal to 1"
    )


def test_an_error_at_the_top_level_says_so() -> None:
    assert _error("text").startswith("(top level): ")
