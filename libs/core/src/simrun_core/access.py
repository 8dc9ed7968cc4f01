"""Who may do what to whose runs: the read policy, the reservation rule, and the bounds of a submission.

Plain functions over identities and numbers, so the tracker's read side, its submission and the snapshot service
apply the same rules, and each rule is tested once here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from simrun_core.config import Limits, ReadPolicy
from simrun_core.errors import InvalidArgument, NotFound, PermissionDenied
from simrun_core.identity import Identity, IdentityKind, Priority


@dataclass(frozen=True)
class Submitter:
    """Who submitted a run, as its record keeps it: a name and, for an agent, the person it acts for."""

    name: str
    on_behalf_of: str | None = None

    @property
    def person(self) -> str:
        return self.on_behalf_of or self.name


def may_read(viewer: Identity, submitter: Submitter, policy: ReadPolicy) -> bool:
    """Whether `viewer` may see a run of `submitter` (get, list, logs, compare, watch).

    The owner and services see every run. A person sees their own runs and their agents'. An agent sees its
    own; with `agents_see_their_person`, also its person's and that person's other agents'. With
    `people_see_all`, every person sees every run (agents stay as above).
    """
    if viewer.is_owner or viewer.kind is IdentityKind.SERVICE:
        return True
    if submitter.name == viewer.name:
        return True
    if viewer.kind is IdentityKind.PERSON:
        return policy.people_see_all or submitter.person == viewer.name
    return policy.agents_see_their_person and submitter.person == viewer.person


def may_read_any(viewer: Identity, readers: Iterable[tuple[str, str | None]], policy: ReadPolicy) -> bool:
    """Whether `viewer` may read one of `readers` (name, the person it acts for): the identities that made or
    named a snapshot, or that submitted the models an environment was resolved for."""
    return any(may_read(viewer, Submitter(name, person), policy) for name, person in readers)


def check_read(viewer: Identity, submitter: Submitter, policy: ReadPolicy, run_id: str) -> None:
    """`NotFound` for a run the viewer may not read, worded as for a run that does not exist.

    NOT_FOUND rather than PERMISSION_DENIED: an identity that may not read a run should not learn that it exists.
    """
    if not may_read(viewer, submitter, policy):
        raise NotFound(f"no run {run_id!r}: `simrun list` shows the runs")


def check_reservation(identity: Identity, node: str) -> None:
    """Reserving a node evicts every other run's pods from it and keeps them off it until the run ends, so only
    a priority no run can outrank may reserve: the owner's (the owner and the owner's agents).

    Raises:
        PermissionDenied: any other identity.
    """
    if identity.priority is not Priority.OWNER:
        raise PermissionDenied(
            f"{identity.name} may not reserve node {node}: a reservation evicts every other run from it, so only "
            "the cluster's owner (or the owner's agents) may reserve; submit without --reserve"
        )


def check_workflow_bounds(limits: Limits, workflow_text: str, task_count: int) -> None:
    """Refuses a workflow text or task count past the limits, before it is parsed further or written.

    Raises:
        InvalidArgument: too large a text or too many tasks.
    """
    size = len(workflow_text.encode())
    if size > limits.workflow_bytes:
        raise InvalidArgument(
            f"the workflow is {size} bytes, more than the {limits.workflow_bytes} this server takes "
            "(limits.workflow_bytes)"
        )
    if task_count > limits.tasks_per_workflow:
        raise InvalidArgument(
            f"the workflow has {task_count} tasks, more than the {limits.tasks_per_workflow} this server takes "
            "(limits.tasks_per_workflow): split it into several runs of one group"
        )


LABEL_CHARS = 128
"""Characters of a run's labels from a request or a workflow: its group, its name, the submitter's request id."""


def check_labels(**labels: str) -> None:
    """Refuses a label (group, workflow name, request id) longer than `LABEL_CHARS` or holding control characters:
    each is kept in every listing row and shown on one line.

    Raises:
        InvalidArgument: naming the label, its length and the bound.
    """
    for name, value in labels.items():
        if len(value) > LABEL_CHARS:
            raise InvalidArgument(
                f"the {name.replace('_', ' ')} is {len(value)} characters, more than the {LABEL_CHARS} a run's labels "
                "may have: shorten it"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise InvalidArgument(f"the {name.replace('_', ' ')} {value!r} holds a control character: remove it")


def check_units(limits: Limits, task_id: str, units: int | None) -> None:
    """Refuses a split task whose `count_units` gave more units than the limit (or fewer than one).

    Raises:
        InvalidArgument: the count and the limit, before any ledger is written.
    """
    if units is None:
        return
    if units < 1:
        raise InvalidArgument(f"task {task_id}: count_units returned {units}; a split task needs at least one unit")
    if units > limits.units_per_task:
        raise InvalidArgument(
            f"task {task_id}: count_units returned {units} units, more than the {limits.units_per_task} a task may "
            "have (limits.units_per_task): compute several points per unit"
        )


def check_active_runs(limits: Limits, identity: Identity, active: int) -> None:
    """Refuses a submission when the identity has `limits.active_runs_per_identity` runs not yet ended.

    Raises:
        InvalidArgument: the count and the limit.
    """
    if active >= limits.active_runs_per_identity:
        raise InvalidArgument(
            f"{identity.name} has {active} runs not yet ended, the most this server takes "
            "(limits.active_runs_per_identity): wait for some to end or cancel them"
        )
