"""WatchRuns on the read side: the runs submitted after a time that a listing shows the caller, as they are
submitted and whenever they change, the newest few at most, ended at once when the caller hangs up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from simrun_core.errors import InvalidArgument
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, RunRecord, RunState
from simrun_tracker import reads
from simrun_tracker.executor import TaskOrdering
from simrun_tracker.reads import Hangup, RunReader
from simrun_tracker.runstore import RunStore

ALICE = Identity(name="alice", kind="owner", priority="owner")
AGENT = Identity(name="bob-agent", kind="agent", on_behalf_of="bob", priority="agent")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    runs = RunStore(StoreLayout(tmp_path / "store"))
    runs.load()
    yield runs
    runs.close()


def reader_of(runs: RunStore) -> RunReader:
    return RunReader(runs, executor=type("NoExecutor", (), {"ordering": TaskOrdering.DRIVER})())  # type: ignore[arg-type]


def submit(runs: RunStore, run_id: str, group: str = "g", identity: Identity = ALICE) -> RunRecord:
    record = RunRecord(run_id=run_id, group=group, identity=identity)
    runs.create(record, lambda staging: staging.tasks.mkdir(parents=True))
    return record


def move(runs: RunStore, run_id: str, state: RunState) -> None:
    record = runs.get(run_id)
    record.state = state
    runs.save(record)


class Follower:
    """A thread reading a WatchRuns stream into `seen`: (run id, state) as each arrives."""

    def __init__(self, stream: Callable[[Hangup], Iterator[tuple[RunRecord, list[reads.TaskProgress]]]]) -> None:
        self.hangup = Hangup()
        self.seen: list[tuple[str, RunState]] = []
        self.thread = threading.Thread(
            target=lambda: self.seen.extend((r.run_id, r.state) for r, _ in stream(self.hangup)), daemon=True
        )
        self.thread.start()

    def until(self, count: int) -> list[tuple[str, RunState]]:
        deadline = time.monotonic() + 5
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.seen)

    def end(self) -> None:
        self.hangup()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()


def test_new_runs_that_match_and_may_be_read_arrive_as_submitted_and_as_they_change(store: RunStore) -> None:
    reader = reader_of(store)
    submit(store, "old")
    time.sleep(0.01)
    since = datetime.now(UTC)
    submit(store, "early")  # after `since`, before the call: sent first
    follower = Follower(
        lambda hangup: reader.watch_runs("g", "", "", since, lambda r: r.identity.name != "bob-agent", hangup=hangup)
    )
    assert follower.until(1) == [("early", RunState.SUBMITTING)]
    submit(store, "other", group="elsewhere")
    submit(store, "hidden", identity=AGENT)
    submit(store, "new")
    move(store, "new", RunState.RUNNING)
    move(store, "other", RunState.RUNNING)
    deadline = time.monotonic() + 5
    while follower.seen[-1:] != [("new", RunState.RUNNING)] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # nothing more: not the other group's, not the hidden one's, not the old one's
    assert follower.seen[1:] in (
        [("new", RunState.SUBMITTING), ("new", RunState.RUNNING)],
        [("new", RunState.RUNNING)],  # both saves read at once: the run as it is now
    ), follower.seen
    follower.end()
    assert reader.watching() == 0 and not reader._runs_listeners


def test_with_a_state_a_new_run_arrives_once_it_is_in_it(store: RunStore) -> None:
    reader = reader_of(store)
    follower = Follower(lambda hangup: reader.watch_runs("", "running", "bob", None, lambda r: True, hangup=hangup))
    submit(store, "r1", identity=AGENT)  # the agent's person is bob: a listing by owner bob shows it
    time.sleep(0.2)
    assert follower.seen == []
    move(store, "r1", RunState.RUNNING)
    assert follower.until(1) == [("r1", RunState.RUNNING)]
    move(store, "r1", RunState.SUCCEEDED)  # followed from then on, in any state
    assert follower.until(2) == [("r1", RunState.RUNNING), ("r1", RunState.SUCCEEDED)]
    follower.end()


def test_a_stream_follows_the_newest_runs_only_and_ends_at_once_when_hung_up(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "NEW_RUNS_FOLLOWED", 2)
    reader = reader_of(store)
    asked: list[float] = []
    follower = Follower(
        lambda hangup: reader.watch_runs(
            "", "", "", None, lambda r: True, alive=lambda: bool(asked.append(1)) or True, hangup=hangup
        )
    )
    for run_id in ("a", "b", "c"):
        submit(store, run_id)
        follower.until(len(follower.seen) + 1)
    move(store, "a", RunState.RUNNING)  # dropped when c came: not sent
    move(store, "c", RunState.RUNNING)
    assert follower.until(4)[-1] == ("c", RunState.RUNNING)
    time.sleep(0.2)
    assert [run_id for run_id, _ in follower.seen] == ["a", "b", "c", "c"]
    started = time.monotonic()
    follower.end()
    assert time.monotonic() - started < 0.5 and asked == []  # woken by the hang-up, never polled its caller


def test_an_unknown_state_is_refused(store: RunStore) -> None:
    with pytest.raises(InvalidArgument, match="unknown state"):
        next(reader_of(store).watch_runs("", "sleeping", "", None, lambda r: True))
