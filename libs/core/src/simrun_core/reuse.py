"""Reuse of earlier results: the task key, who may reuse whose results, and putting earlier results in a new run.

A task key is right by construction: the SHA-256 of the task's type, its settings as the type's Settings model
dumps them with defaults filled in (canonical JSON), the content id of every snapshot of the run, the environment,
the keys of the upstream tasks per input port (with the port they read), and whether it is split. Pods and split
mode stay out: results do not depend on them. Every key is known at submission.

A reused task hard-links the earlier outputs into the new run, read-only (they survive the deletion of the earlier
run); a split task whose earlier run failed or was cancelled seeds its new ledger with the earlier done units, so
only the missing ones are computed. Seeded units' files are copied, not linked: the new run's pods may write their
task's folder (Landlock allows it, and a pod may chmod what it can name), so a link there would let them change the
earlier run's results. A source that is missing or not merged is a miss, never an error.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import stat
import sys
import time
import uuid
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from simrun_runtime.layout import TaskLayout
from simrun_runtime.ledger import Ledger, LedgerError, create_ledger
from simrun_runtime.record import Identity as RecordIdentity
from simrun_runtime.reports import ProgressLog

from simrun_core.access import Submitter, may_read
from simrun_core.config import ReadPolicy
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Identity, IdentityKind
from simrun_core.workflow import parse_workflow

KEY_VERSION = 1
"""Part of every key: a change of what a key covers gives every task a new key, never a wrong hit."""

SEED_WORKER = "seed"
"""The worker name under which seeded units are claimed and marked done in a new ledger."""

_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class ReusePolicy(StrEnum):
    """Where a submission may take earlier results from (`simrun submit --reuse`)."""

    NEVER = "never"
    SAME_RUN = "same-run"
    """Only from the run it resumes (`--resume-from`, `simrun resume`)."""
    ANY = "any"
    """From any run the submitter may read (the default)."""

    @classmethod
    def parse(cls, value: str | None) -> ReusePolicy:
        if not value:
            return cls.ANY
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise InvalidArgument(f"unknown reuse {value!r}: use never, same-run or any") from None


@dataclass(frozen=True)
class KeyInputs:
    """What a task key is made of, for one task."""

    type: str
    settings: Mapping[str, Any]
    """The settings as the type's Settings model dumps them, defaults filled in (`TypeDescription.settings`)."""
    inputs: Mapping[str, str]
    """input port -> `<upstream task>.<port>`."""
    split: bool


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no whitespace and no NaN: one text for one value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


WORKFLOW_SUFFIXES = (".yaml", ".yml", ".json")
"""Names a workflow file of a snapshot may have to be found as one: a workflow kept under another name counts in
its snapshot's key unless it is the submitted one."""
WORKFLOW_BYTES = 1 << 20
"""Files larger than a workflow may be (the service's default limit) are not read to find workflows."""


def workflow_files(listing: Mapping[str, Any], folder: Path) -> frozenset[str]:
    """The paths of a snapshot's workflow files: regular files named `*.yaml`, `*.yml` or `*.json` of at most
    `WORKFLOW_BYTES` that `parse_workflow` accepts, read from the snapshot's `folder`. A file that cannot be read
    is not one (it then counts in the key, which loses reuse and never gives a wrong one)."""
    symlinks = dict(listing.get("symlinks", {}))
    found = set()
    for path in dict(listing.get("files", {})):
        if path in symlinks or not path.endswith(WORKFLOW_SUFFIXES):
            continue
        try:
            with (folder / path).open("rb") as file:
                data = file.read(WORKFLOW_BYTES + 1)
        except OSError:
            continue
        if len(data) > WORKFLOW_BYTES or b"tasks" not in data:
            continue
        try:
            parse_workflow(data.decode())
        except (InvalidArgument, UnicodeDecodeError, ValueError, RecursionError):
            continue
        found.add(path)
    return frozenset(found)


def snapshot_key(
    listing: Mapping[str, Any], workflow_text: str | None = None, workflows: frozenset[str] = frozenset()
) -> str:
    """The content id of a snapshot for task keys, from its listing (`<snapshot_id>.files.json`), without its
    workflow files: a workflow's settings and wiring are in every key already, so changing one task's setting in
    a workflow kept in the model's tree must not change the keys of the others, and neither must adding a second
    study's workflow beside the first.

    Left out: the files at `workflows` (`workflow_files`) and any regular file whose content is the submitted
    workflow text; everything else counts: path, content, executable bit, symlink target.
    """
    skip = hashlib.sha256(workflow_text.encode()).hexdigest() if workflow_text is not None else None
    executable = set(listing.get("executable", ()))
    symlinks = dict(listing.get("symlinks", {}))
    digest = hashlib.sha256(f"snapshot-key {KEY_VERSION}\n".encode())
    for path, sha256 in sorted(dict(listing.get("files", {})).items()):
        if (sha256 == skip or path in workflows) and path not in symlinks:
            continue
        kind = "l" if path in symlinks else ("x" if path in executable else "f")
        digest.update(f"{path}\0{kind}\0{sha256}\0{symlinks.get(path, '')}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class SnapshotContent:
    """What task keys need of a snapshot's listing, kept small: the key with every file but its workflow files
    counted, the workflow files' paths, and a hash of each other regular file's digest (8 bytes a file). A snapshot
    never changes, so a submission need not read and hash its whole listing again (a cost that grew with the
    model's files: 4.8 ms a submission at 5,000 files)."""

    whole_key: str
    digests: array[int]
    """`hash()` of the SHA-256 of every regular file but the workflow files, sorted: a text no such file holds
    leaves every file in its key."""
    workflows: frozenset[str] = frozenset()

    @classmethod
    def of(cls, listing: Mapping[str, Any], workflows: frozenset[str] = frozenset()) -> SnapshotContent:
        symlinks = dict(listing.get("symlinks", {}))
        files = dict(listing.get("files", {}))
        digests = array(
            "q", sorted({hash(sha) for path, sha in files.items() if path not in symlinks and path not in workflows})
        )
        return cls(snapshot_key(listing, None, workflows), digests, workflows)

    @property
    def files(self) -> int:
        """How many distinct digests it keeps (what it costs in memory)."""
        return len(self.digests) + len(self.workflows)

    def key(self, workflow_text: str | None) -> str | None:
        """`snapshot_key(listing, workflow_text, workflows)` when no file but a workflow file may hold
        `workflow_text`; None when one may (then only the listing can say which files count)."""
        if workflow_text is None:
            return self.whole_key
        wanted = hash(hashlib.sha256(workflow_text.encode()).hexdigest())
        place = bisect.bisect_left(self.digests, wanted)
        if place < len(self.digests) and self.digests[place] == wanted:
            return None
        return self.whole_key


SERVER_ENVIRONMENT = "default"
"""The environment id of a model run in the server's own Python (no `pyproject.toml`, or `environments.kind:
server`): the same id whatever is installed there, so its keys take the installation's content instead."""


@functools.cache
def server_environment_digest() -> str:
    """What the server's own Python is, for task keys: its version and every installed distribution's name and
    version (read once per process: upgrading a package there restarts the server)."""
    installed = sorted(
        {f"{dist.metadata['Name'] or ''}=={dist.version}" for dist in importlib.metadata.distributions()}
    )
    material = {"python": sys.version, "executable": sys.executable, "distributions": installed}
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def environment_key(environment: str | None) -> str:
    """The environment as task keys see it: its id, which names its locked content, except for the server's own
    Python, whose id says nothing of what is installed (`server_environment_digest`)."""
    if environment == SERVER_ENVIRONMENT:
        return f"{SERVER_ENVIRONMENT}:{server_environment_digest()}"
    return environment or ""


def task_key(
    task: KeyInputs, snapshot_ids: Iterable[str], environment: str | None, upstream_keys: Mapping[str, str]
) -> str:
    """The key of one task, given the keys of the tasks it reads (`upstream_keys`: task id -> key).

    Raises:
        KeyError: an input reads a task whose key is not in `upstream_keys`.
    """
    inputs = {}
    for port, ref in task.inputs.items():
        upstream, _, upstream_port = ref.partition(".")
        inputs[port] = {"key": upstream_keys[upstream], "port": upstream_port}
    material = {
        "version": KEY_VERSION,
        "type": task.type,
        "settings": task.settings,
        "snapshots": list(snapshot_ids),
        "environment": environment_key(environment),
        "inputs": inputs,
        "split": task.split,
    }
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def task_keys(
    order: Iterable[str], tasks: Mapping[str, KeyInputs], snapshot_ids: Iterable[str], environment: str | None
) -> dict[str, str]:
    """The key of every task, in `order` (upstream tasks first, as the workflow's order is)."""
    snapshots = list(snapshot_ids)
    keys: dict[str, str] = {}
    for task_id in order:
        keys[task_id] = task_key(tasks[task_id], snapshots, environment, keys)
    return keys


@dataclass(frozen=True)
class UnitDescription:
    """What a split task's type says of its units for unit keys: each unit's `unit_key` digest, and the upstream
    units each reads per input port (None: not declared, so each may read them all)."""

    digests: list[str]
    reads: list[dict[str, list[int]]] | None = None


@dataclass(frozen=True)
class UnitKeys:
    """A split task's unit keys: its scope (everything a unit key holds but the unit's own part: type, snapshots,
    environment, upstream) and one key per unit. Equal unit keys give equal unit results."""

    scope: str
    keys: list[str]


def unit_keys(
    order: Iterable[str],
    tasks: Mapping[str, KeyInputs],
    units: Mapping[str, UnitDescription],
    snapshot_ids: Iterable[str],
    environment: str | None,
    keys: Mapping[str, str | None],
) -> dict[str, UnitKeys]:
    """The unit keys of every split task whose type gives them (`units`), in `order` (upstream first).

    A unit key is the SHA-256 of the task's scope and the unit's `unit_key` digest, and for each input port whose
    reads the type declares, the keys of the upstream units it reads (when the upstream task has unit keys; else
    the upstream task's key is in the scope). The task's own settings are not in it: the type's `unit_key` says
    which of them a unit depends on. A task reading an uncacheable task (key None) has no unit keys.

    Raises:
        InvalidArgument: a unit declares an upstream unit the upstream task does not have.
    """
    snapshots = list(snapshot_ids)
    result: dict[str, UnitKeys] = {}
    for task_id in order:
        described = units.get(task_id)
        task = tasks[task_id]
        if described is None or not task.split or keys.get(task_id) is None:
            continue
        inputs: dict[str, Any] = {}
        by_unit: dict[str, tuple[str, list[str]]] = {}
        for port, ref in task.inputs.items():
            upstream, _, upstream_port = ref.partition(".")
            if keys.get(upstream) is None:
                break
            if described.reads is not None and upstream in result:
                inputs[port] = {"scope": result[upstream].scope, "port": upstream_port}
                by_unit[port] = (upstream, result[upstream].keys)
            else:
                inputs[port] = {"key": keys[upstream], "port": upstream_port}
        else:
            material = {
                "version": KEY_VERSION,
                "units-of": task.type,
                "snapshots": snapshots,
                "environment": environment_key(environment),
                "inputs": inputs,
            }
            scope = hashlib.sha256(canonical_json(material).encode()).hexdigest()
            result[task_id] = UnitKeys(scope, _unit_keys_in(task_id, scope, described, by_unit))
    return result


def _unit_keys_in(
    task_id: str, scope: str, described: UnitDescription, by_unit: Mapping[str, tuple[str, list[str]]]
) -> list[str]:
    keys = []
    for index, digest in enumerate(described.digests):
        reads: dict[str, list[str]] = {}
        declared = described.reads[index] if described.reads is not None else {}
        for port, (upstream, upstream_keys) in by_unit.items():
            wanted = declared.get(port, [])
            if any(j >= len(upstream_keys) for j in wanted):
                raise InvalidArgument(
                    f"task {task_id}: unit {index} reads unit {max(wanted)} of task {upstream}, which has "
                    f"{len(upstream_keys)} units: fix the type's unit_inputs"
                )
            reads[port] = [upstream_keys[j] for j in wanted]
        material = canonical_json({"scope": scope, "unit": digest, "reads": reads})
        keys.append(hashlib.sha256(material.encode()).hexdigest())
    return keys


def principal(identity: Identity | RecordIdentity) -> str:
    """The person an identity stands for: the person themselves, or the one an agent acts for."""
    return identity.on_behalf_of or identity.name


def may_reuse(caller: Identity, source: RecordIdentity, policy: ReadPolicy | None = None) -> bool:
    """Whether `caller` may reuse the results of a run `source` submitted: exactly when it may read that run
    (`simrun_core.access.may_read` under the server's read policy), since a reused task's outputs, summaries and
    logs become readable in the caller's own run. By default the owner reuses every run, a person their own and
    their agents', an agent its own; never another person's."""
    return may_read(caller, Submitter(source.name, source.on_behalf_of), policy or ReadPolicy())


def reusable_principal(caller: Identity, policy: ReadPolicy | None = None) -> str | None:
    """The person whose runs are the only ones `caller` may reuse, or None where it may read anyone's (the owner,
    a service, a person when every person sees every run): a filter the key index applies before `may_reuse`."""
    policy = policy or ReadPolicy()
    if caller.is_owner or caller.kind is IdentityKind.SERVICE:
        return None
    if caller.kind is IdentityKind.PERSON and policy.people_see_all:
        return None
    return principal(caller)


def reuse_message(run_id: str, task_id: str, units: int | None = None) -> str:
    """What `simrun status` shows of a reused task (or one whose ledger was seeded)."""
    if units is None:
        return f"reused from run {run_id} task {task_id}"
    return f"{units} units reused from run {run_id} task {task_id}"


def outputs_complete(task: TaskLayout) -> bool:
    """The task's outputs are whole: its merge marker (written last by a merge or an unsplit task) is there."""
    return task.merge_marker.is_file()


def link_outputs(source: TaskLayout, dest: TaskLayout) -> bool:
    """Hard-links the complete outputs of `source` into `dest` (`out/`, built aside and renamed into place), and
    makes them read-only. Returns False (a miss) when `source` has no complete outputs or `dest` has some already.

    Raises:
        OSError: the store cannot hard-link (another file system), or another failure of the store.
    """
    if not outputs_complete(source) or dest.out.exists():
        return False
    dest.root.mkdir(parents=True, exist_ok=True)
    building = dest.out_building(uuid.uuid4().hex[:12])
    try:
        _link_tree(source.out, building)
        os.rename(building, dest.out)
    except FileNotFoundError:
        # The source went away while it was linked (a deleted run): a miss.
        shutil.rmtree(building, ignore_errors=True)
        return False
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return True


def _link_tree(source: Path, dest: Path) -> None:
    """`dest` as a tree of hard links to the files of `source`, each made read-only (as snapshots are)."""
    dest.mkdir()
    for root, dirs, files in os.walk(source):
        relative = Path(root).relative_to(source)
        for name in dirs:
            if (Path(root) / name).is_symlink():  # os.walk lists it as a folder and does not descend: a link again
                os.symlink(os.readlink(Path(root) / name), dest / relative / name)
            else:
                (dest / relative / name).mkdir()
        for name in files:
            origin = Path(root) / name
            if origin.is_symlink():
                os.symlink(os.readlink(origin), dest / relative / name)
                continue
            mode = origin.stat().st_mode
            if mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
                os.chmod(origin, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) | _READ_ONLY)
            os.link(origin, dest / relative / name)


def done_units(source: TaskLayout) -> list[int]:
    """The units of `source`'s ledger that are done (their results are in place before the done rename); none
    without a ledger."""
    ledger = Ledger.of(source)
    if not ledger.exists():
        return []
    try:
        return [index for first, last in ledger.done().ranges() for index in range(first, last + 1)]
    except (FileNotFoundError, LedgerError):
        return []


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as maximal runs of consecutive ones, (first, last) both included."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


def seed_ledger(source: TaskLayout, dest: TaskLayout, count: int, indices: Mapping[int, int] | None = None) -> int:
    """Creates `dest`'s ledger of `count` units with the units done in `source` already done: their values
    copied into a log of the new ledger and their files copied (never linked: the new run's pods may write their
    task's folder); only the others stay pending. `indices` maps a new unit's index to the earlier unit whose
    result it takes (equal unit keys); without it each unit takes the earlier one of its own index. Returns how
    many units were seeded (0: a miss, nothing created).

    Safe because a unit's result depends on the settings, its index, the code and the environment only, which is
    the task key (or on what its unit key holds); the caller checks the keys are equal. Goes through the runtime's
    own ledger (create, claim, split, append values, place results, mark done, release), so the ledger stays in
    the runtime's layout.
    """
    done = done_units(source)
    if indices is None:
        indices = {index: index for index in done if index < count}
    else:
        done_set = set(done)
        indices = {new: old for new, old in indices.items() if new < count and old in done_set}
    units = sorted(indices)
    if not units or Ledger.of(dest).exists():
        return 0
    source_ledger = Ledger.of(source)
    values, covered = source_ledger.values()
    dest.root.mkdir(parents=True, exist_ok=True)
    create_ledger(dest, count)
    ledger = Ledger.of(dest)
    log = ledger.layout.values_log(SEED_WORKER, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    seeded_runs = _runs(units)
    seeded = 0
    progress = ProgressLog(dest.progress)
    earlier = _Earlier(source_ledger, values, covered, indices)
    try:
        for pending in ledger.pending_ranges():
            if not ledger.claim(pending, SEED_WORKER):
                continue
            # Cut the claim at every edge of a seeded run inside it; seeded pieces are done, the rest given back.
            edges = sorted(
                {
                    edge
                    for first, last in seeded_runs
                    for edge in (first, last + 1)
                    if pending.first < edge <= pending.last
                }
            )
            pieces = []
            rest = pending
            for at in edges:
                split = ledger.split(rest, SEED_WORKER, at)
                if split is None:
                    break
                pieces.append(split[0])
                rest = split[1]
            pieces.append(rest)
            for piece in pieces:
                if any(first <= piece.first and piece.last <= last for first, last in seeded_runs):
                    seeded += _seed_piece(ledger, earlier, piece, log, progress)
                else:
                    ledger.release(piece, SEED_WORKER)
    finally:
        progress.close()
    return seeded


@dataclass(frozen=True)
class _Earlier:
    """The earlier ledger seeded from: its values, which of them it has, and the earlier unit of each new one."""

    ledger: Ledger
    values: list[Any]
    covered: Any
    indices: Mapping[int, int]


def _seed_piece(ledger: Ledger, earlier: _Earlier, piece: Any, log: Path, progress: ProgressLog) -> int:
    """Puts one claimed piece's earlier results in place and marks it done; the number of units it holds.

    Its progress line (no seconds: computed by an earlier run) goes before the done rename, as a worker's does, so
    the run's units done count the seeded units too.
    """
    olds = [earlier.indices[index] for index in piece.indices()]
    if all(old in earlier.covered for old in olds):
        ledger.append_values(log, piece, [earlier.values[old] for old in olds])
    for index, old in zip(piece.indices(), olds, strict=True):
        if earlier.ledger.has_result(old):
            tmp = ledger.layout.result_tmp(index, SEED_WORKER, os.getpid())
            try:
                shutil.copytree(earlier.ledger.layout.result(old), tmp, symlinks=True)
            except FileNotFoundError:
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            ledger.place_result(tmp, index)
    progress.append(piece, SEED_WORKER, None, time.time())
    return piece.last - piece.first + 1 if ledger.mark_done(piece, SEED_WORKER) else 0


def seeded_count(dest: TaskLayout) -> int:
    """Units of `dest`'s ledger that are done (after seeding: the ones a new run need not compute)."""
    try:
        return Ledger.of(dest).done_count()
    except (FileNotFoundError, LedgerError):
        return 0
