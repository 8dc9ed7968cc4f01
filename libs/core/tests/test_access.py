"""The read policy, the reservation rule and the bounds of a submission."""

from __future__ import annotations

import pytest
from simrun_core.access import (
    Submitter,
    check_active_runs,
    check_read,
    check_reservation,
    check_units,
    check_workflow_bounds,
    may_read,
)
from simrun_core.config import Limits, ReadPolicy
from simrun_core.errors import InvalidArgument, NotFound, PermissionDenied
from simrun_core.identity import Identity, IdentityKind, Priority

ALICE = Identity("alice", IdentityKind.OWNER, Priority.OWNER)
ALICE_AGENT = Identity("alice-agent", IdentityKind.AGENT, Priority.OWNER, "alice")
BOB = Identity("bob", IdentityKind.PERSON, Priority.STANDARD)
BOB_AGENT = Identity("bob-agent", IdentityKind.AGENT, Priority.AGENT, "bob")
BOB_AGENT_2 = Identity("bob-agent-2", IdentityKind.AGENT, Priority.AGENT, "bob")
CAROL = Identity("carol", IdentityKind.PERSON, Priority.STANDARD)
TRACKER = Identity("tracker", IdentityKind.SERVICE, Priority.STANDARD)


def submitter(identity: Identity) -> Submitter:
    return Submitter(identity.name, identity.on_behalf_of)


# (viewer, submitter) -> visible with the default policy, with agents_see_their_person, with people_see_all
CASES = [
    (ALICE, BOB, True, True, True),
    (ALICE, BOB_AGENT, True, True, True),
    (TRACKER, BOB, True, True, True),
    (BOB, BOB, True, True, True),
    (BOB, BOB_AGENT, True, True, True),
    (BOB, ALICE, False, False, True),
    (BOB, CAROL, False, False, True),
    (BOB_AGENT, BOB_AGENT, True, True, True),
    (BOB_AGENT, BOB, False, True, False),
    (BOB_AGENT, BOB_AGENT_2, False, True, False),
    (BOB_AGENT, CAROL, False, False, False),
    (BOB_AGENT, ALICE, False, False, False),
    (ALICE_AGENT, ALICE, False, True, False),
    (ALICE_AGENT, BOB, False, False, False),
    (CAROL, BOB_AGENT, False, False, True),
]


@pytest.mark.parametrize(("viewer", "owner", "default", "agents", "everyone"), CASES)
def test_the_read_policy(viewer: Identity, owner: Identity, default: bool, agents: bool, everyone: bool) -> None:
    assert may_read(viewer, submitter(owner), ReadPolicy()) is default
    assert may_read(viewer, submitter(owner), ReadPolicy(agents_see_their_person=True)) is agents
    assert may_read(viewer, submitter(owner), ReadPolicy(people_see_all=True)) is everyone


def test_a_hidden_run_is_not_found_as_if_it_did_not_exist() -> None:
    with pytest.raises(NotFound, match="no run 'r1'"):
        check_read(BOB_AGENT, submitter(ALICE), ReadPolicy(), "r1")
    check_read(BOB, submitter(BOB_AGENT), ReadPolicy(), "r1")


@pytest.mark.parametrize("identity", [ALICE, ALICE_AGENT])
def test_the_owners_priority_may_reserve(identity: Identity) -> None:
    check_reservation(identity, "node-a")


@pytest.mark.parametrize("identity", [BOB, BOB_AGENT, CAROL, TRACKER])
def test_any_lower_priority_may_not_reserve(identity: Identity) -> None:
    with pytest.raises(PermissionDenied, match=f"{identity.name} may not reserve node node-a"):
        check_reservation(identity, "node-a")


def test_units_beyond_the_limit_or_below_one_are_refused() -> None:
    limits = Limits(units_per_task=1000)
    check_units(limits, "t", 1000)
    check_units(limits, "t", None)
    for units in (1001, 10**16, 2**31):
        with pytest.raises(InvalidArgument, match=f"task t: count_units returned {units} units, more than the 1000"):
            check_units(limits, "t", units)
    with pytest.raises(InvalidArgument, match="at least one unit"):
        check_units(limits, "t", 0)


def test_the_units_limit_fits_the_apis_int32_fields() -> None:
    with pytest.raises(ValueError):
        Limits(units_per_task=2**31)


def test_workflow_size_and_task_count_are_bounded() -> None:
    limits = Limits(workflow_bytes=100, tasks_per_workflow=3)
    check_workflow_bounds(limits, "x" * 100, 3)
    with pytest.raises(InvalidArgument, match="the workflow is 101 bytes, more than the 100"):
        check_workflow_bounds(limits, "x" * 101, 1)
    with pytest.raises(InvalidArgument, match="4 tasks, more than the 3"):
        check_workflow_bounds(limits, "x", 4)


def test_active_runs_per_identity_are_bounded() -> None:
    limits = Limits(active_runs_per_identity=2)
    check_active_runs(limits, BOB_AGENT, 1)
    with pytest.raises(InvalidArgument, match="bob-agent has 2 runs not yet ended"):
        check_active_runs(limits, BOB_AGENT, 2)


def test_text_from_a_task_cannot_drive_a_terminal() -> None:
    from simrun_core.text import printable

    assert printable("unit 3 failed:\n\tValueError") == "unit 3 failed:\n\tValueError"
    assert printable("a\x1b]52;c;SGVsbG8=\x07b\x9b2J") == "a\\x1b]52;c;SGVsbG8=\\x07b\\x9b2J"
    assert printable("x" * 10, limit=4) == "xxx…"
