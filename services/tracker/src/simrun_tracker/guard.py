"""The tracker's checks of a request against its caller and the server's bounds, in one object it holds.

`Guard` gathers what the submission, the read side and the driver ask: may this identity read this run, may it
reserve, does this workflow fit the limits, has this task written more output than it may. Each check is a
function of `simrun_core.access` or of the store's files; the tracker calls them at the points named in
DESIGN.md ("Containment").
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from simrun_core.access import (
    Submitter,
    check_active_runs,
    check_read,
    check_reservation,
    check_units,
    check_workflow_bounds,
)
from simrun_core.config import Limits, ReadPolicy
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Identity, IdentityKind
from simrun_runtime.layout import WORKER_NAME, TaskLayout, UnsafePath, checked
from simrun_runtime.record import RunRecord

from simrun_tracker.index import Visibility


def submitter(record: RunRecord) -> Submitter:
    """The submitter of a run as the read policy sees it."""
    return Submitter(record.identity.name, record.identity.on_behalf_of)


@dataclass
class Guard:
    """The read policy and the limits of one server."""

    limits: Limits = field(default_factory=Limits)
    policy: ReadPolicy = field(default_factory=ReadPolicy)

    # Submission: before anything is described, planned or written.

    def check_submission(self, identity: Identity, workflow_text: str, task_count: int, active_runs: int) -> None:
        """The workflow's size and task count, and the identity's active runs.

        Raises:
            InvalidArgument: past a limit.
        """
        check_workflow_bounds(self.limits, workflow_text, task_count)
        check_active_runs(self.limits, identity, active_runs)

    def check_units(self, task_id: str, units: int | None) -> None:
        """A split task's unit count (from `count_units`) against `limits.units_per_task`."""
        check_units(self.limits, task_id, units)

    def check_reservation(self, identity: Identity, node: str) -> None:
        """Only the owner's priority may reserve (`simrun_core.access.check_reservation`)."""
        check_reservation(identity, node)

    # The read side: get, list, logs, compare, watch.

    def check_read(self, identity: Identity, record: RunRecord) -> None:
        """`NotFound` for a run the read policy hides from `identity`."""
        check_read(identity, submitter(record), self.policy, record.run_id)

    def visibility(self, identity: Identity) -> Visibility | None:
        """The index filter equal to `may_read` for `identity`'s listings; None where it sees every run."""
        if identity.is_owner or identity.is_service:
            return None
        if identity.kind is IdentityKind.PERSON:
            return None if self.policy.people_see_all else Visibility(person=identity.name)
        person = identity.person if self.policy.agents_see_their_person else None
        return Visibility(person=person, agent=identity.name)

    # The driver: after a task's pods end.

    def output_failure(self, task: TaskLayout) -> str | None:
        """Why a task fails for its output size, or None within `limits.output_bytes_per_task`."""
        used = output_bytes(task)
        if used <= self.limits.output_bytes_per_task:
            return None
        return (
            f"the task wrote {used} bytes of output, more than the {self.limits.output_bytes_per_task} it may "
            "(limits.output_bytes_per_task)"
        )


def checked_worker(worker: str) -> str:
    """A log's worker name from a request: `w<digits>`, `exec` or `merge`, else `InvalidArgument`."""
    try:
        return checked("worker", worker, WORKER_NAME)
    except UnsafePath as exc:
        raise InvalidArgument(f"{exc}: a pod's name is w0, w1, …, exec or merge") from None


def output_bytes(task: TaskLayout) -> int:
    """Bytes a task holds in its folder (outputs, ledger results, reports), links not followed, hard links once."""
    return _tree_bytes(task.root)


def _tree_bytes(root: Path) -> int:
    total = 0
    seen: set[tuple[int, int]] = set()
    for folder, _, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512 if st.st_blocks else st.st_size
    return total
