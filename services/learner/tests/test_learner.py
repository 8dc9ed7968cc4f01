"""The learner's facade over its SQLite store, and observations from the worker reports of a finished task."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.paging import encode_key_token
from simrun_core.resources import ResolutionRule, ResolvedResources
from simrun_learner import Observation, ObservationKey, ResourceLearner, observations_from_reports, rules
from simrun_learner.reports import MEASURED_MARGIN, MEASURED_SLACK_GB
from simrun_runtime.layout import StoreLayout
from simrun_runtime.reports import UnitSeconds, WorkerEnd, WorkerReport

KEY = ObservationKey("model.tasks:Fit", "pkmodel", "8")
OTHER = ObservationKey("model.tasks:Fit", "pkmodel", "80")
HINT = ResolvedResources(base_memory_gb=1, per_worker_gb=4)


@pytest.fixture
def learner(tmp_path: Path) -> ResourceLearner:
    with ResourceLearner(StoreLayout(tmp_path).observations) as learner:
        yield learner  # type: ignore[misc]


def test_record_fills_in_id_and_time_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "store" / "observations.sqlite"
    with ResourceLearner(path) as learner:
        recorded = learner.record(Observation(KEY, 1.5, succeeded=True, unit_seconds=(2.0, 3.5), run_id="r1"))
        assert recorded.observation_id and recorded.observed_at is not None
        assert recorded.observed_at.tzinfo is UTC
    with ResourceLearner(path) as again:
        assert again.observations(KEY) == [recorded]
        assert again.observations(OTHER) == []


def test_observations_are_oldest_first_by_time(learner: ResourceLearner) -> None:
    now = datetime.now(UTC)
    learner.record(Observation(KEY, 2.0, run_id="late", observed_at=now))
    learner.record(Observation(KEY, 1.0, run_id="early", observed_at=now - timedelta(hours=1)))
    assert [o.run_id for o in learner.observations(KEY)] == ["early", "late"]


def test_resolve_reads_only_its_key(learner: ResourceLearner) -> None:
    assert learner.resolve(KEY, HINT).rule is ResolutionRule.HINT
    learner.record(Observation(OTHER, 30.0, succeeded=True, run_id="r1"))
    learner.record(Observation(KEY, 1.0, succeeded=True, run_id="r2", unit_seconds=(4.0,)))
    resolved = learner.resolve(KEY, HINT)
    assert (resolved.rule, resolved.per_worker_gb, resolved.unit_seconds) == (
        ResolutionRule.PERCENTILE,
        1127 / 1024,
        4.0,
    )  # 1.1 GiB, up to a MiB
    learner.record(Observation(KEY, 1.0, oom_killed=True, oom_per_worker_gb=2.0, run_id="r3"))
    assert learner.resolve(KEY, HINT).per_worker_gb == 3.0


def test_record_refuses_a_bad_observation(learner: ResourceLearner) -> None:
    with pytest.raises(InvalidArgument):
        learner.record(Observation(ObservationKey("t", ""), 1.0))
    with pytest.raises(InvalidArgument):
        learner.record_all([Observation(KEY, 1.0), Observation(KEY, -1.0)])
    assert learner.observations(KEY) == []


def test_estimate(learner: ResourceLearner) -> None:
    with pytest.raises(FailedPrecondition):
        learner.estimate(KEY, 10, 1, 4)
    learner.record(Observation(KEY, 1.0, unit_seconds=(1.0, 2.0, 9.0), run_id="r1"))
    assert learner.estimate(KEY, 10, 1, 4).seconds == 6.0


def test_list_observations_pages(learner: ResourceLearner) -> None:
    learner.record_all(Observation(KEY, float(i), run_id=f"r{i}") for i in range(5))
    first, token = learner.list_observations(KEY, 2)
    second, token2 = learner.list_observations(KEY, 2, token)
    third, end = learner.list_observations(KEY, 2, token2)
    assert [o.per_worker_gb for o in first + second + third] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert end == ""
    with pytest.raises(InvalidArgument):
        learner.list_observations(OTHER, 2, token)


def report(worker: str, started_ms: int, **kw: object) -> WorkerReport:
    processes = kw.pop("processes", 4)
    peak = kw.pop("peak_memory_gb", 8.0)
    fields = {
        "run_id": "run-1",
        "task_id": "fit",
        "worker": worker,
        "role": "coordinator" if worker == "w0" else "extra",
        "started_ms": started_ms,
        "task_type": KEY.task_type,
        "model": KEY.model,
        "cost_value": KEY.cost_value,
        "processes": processes,
        "memory_source": "process_tree",
        "peak_memory_gb": peak,
        "per_process_gb": peak / processes if processes else 0.0,  # type: ignore[operator]
        "memory_samples": 10,
        "oom_kills": 0,
        "ended": WorkerEnd.DONE,
        "started_at": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=started_ms),
        **kw,
    }
    return WorkerReport.model_validate(fields)


def test_observations_from_reports(tmp_path: Path) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    reports = [
        report("w0", 1000, units=[UnitSeconds(unit=0, seconds=2.0), UnitSeconds(unit=2, seconds=3.0)]),
        report("w1", 1100, peak_memory_gb=9.5, oom_kills=1, ended=WorkerEnd.FAILED),
        report("w1", 5000, peak_memory_gb=10.0, units=[UnitSeconds(unit=1, seconds=4.0)]),
        report("w2", 1200, peak_memory_gb=3.0, ended=WorkerEnd.RUNNING),  # gone without its last report: SIGKILL
        report("w3", 1300, processes=2, peak_memory_gb=2.0, ended=WorkerEnd.STOPPED),
        report("merge", 9000, role="merge", processes=1, peak_memory_gb=50.0),
    ]
    for r in reports:
        r.write(task)
    observations = observations_from_reports(task, KEY, True, "run-1", memory_gb=10, retry_memory_gb=14)
    assert [(o.per_worker_gb, o.oom_killed, o.oom_per_worker_gb) for o in observations] == [
        (2.0, False, None),
        (2.375, True, 2.5),
        (0.75, True, 2.5),
        (1.0, False, None),
        (2.5, False, None),
    ]
    assert [o.unit_seconds for o in observations] == [(2.0, 3.0), (), (), (), (4.0,)]
    assert all(o.key == KEY and o.succeeded and o.run_id == "run-1" for o in observations)


def test_a_retry_killed_again_has_the_retry_memory(tmp_path: Path) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    report("w1", 1, oom_kills=1, ended=WorkerEnd.FAILED).write(task)
    report("w1", 2, oom_kills=1, ended=WorkerEnd.FAILED).write(task)
    observations = observations_from_reports(task, KEY, False, "run-1", memory_gb=10, retry_memory_gb=14)
    assert [o.oom_per_worker_gb for o in observations] == [2.5, 3.5]
    assert not any(o.succeeded for o in observations)


def test_without_the_plans_memory_a_kill_takes_its_measured_peak(tmp_path: Path) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    report("w0", 1, peak_memory_gb=9.0, oom_kills=2, ended=WorkerEnd.FAILED).write(task)
    report("w1", 2, peak_memory_gb=0.0, ended=WorkerEnd.RUNNING).write(task)
    observations = observations_from_reports(task, KEY, False, "run-1")
    assert [(o.per_worker_gb, o.oom_killed, o.oom_per_worker_gb) for o in observations] == [
        (2.25, True, 2.25),
        (None, False, None),
    ]


def test_no_reports_no_observations(tmp_path: Path, learner: ResourceLearner) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    assert observations_from_reports(task, KEY, True, "run-1") == []


def test_reports_feed_the_learner(tmp_path: Path, learner: ResourceLearner) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    report("w0", 1, peak_memory_gb=8.0, oom_kills=1, ended=WorkerEnd.FAILED).write(task)
    learner.record_all(observations_from_reports(task, KEY, True, "run-1", memory_gb=10, retry_memory_gb=14))
    resolved = learner.resolve(KEY, HINT)
    assert (resolved.rule, resolved.per_worker_gb) == (ResolutionRule.OOM_FLOOR, 3.75)


def test_observations_from_summarised_reports_keep_the_learners_median(tmp_path: Path) -> None:
    """Schema 2 reports keep a summary of constant size: the median the learner takes over the observations is
    the exact one up to 64 units per report, and within the histogram's 2.2% beyond."""
    from simrun_learner.rules import median_unit_seconds
    from simrun_runtime.reports import SecondsSketch

    task = StoreLayout(tmp_path).run("run-2").task("fit")
    few, many = SecondsSketch(), SecondsSketch()
    few_seconds = [0.5, 2.0, 3.0]
    many_seconds = [0.01 * (1 + (k * 7919) % 1000) for k in range(5000)]
    for seconds in few_seconds:
        few.add(seconds)
    for seconds in many_seconds:
        many.add(seconds)
    report("w0", 1000, unit_seconds=few.summary()).write(task)
    report("w1", 2000, unit_seconds=many.summary()).write(task)
    first, second = observations_from_reports(task, KEY, True, "run-2")
    assert first.unit_seconds == tuple(few_seconds)
    assert len(second.unit_seconds) == 5000
    exact = median_unit_seconds([Observation(KEY, 1.0, unit_seconds=tuple(few_seconds + many_seconds))])
    learned = median_unit_seconds([first, second])
    assert exact is not None and learned is not None and abs(learned - exact) <= 0.022 * exact


def test_an_unsplit_task_that_ran_to_its_end_learns_its_seconds_as_one_unit(
    tmp_path: Path, learner: ResourceLearner
) -> None:
    task = StoreLayout(tmp_path).run("run-1").task("report")
    begun = datetime(2026, 1, 1, tzinfo=UTC)
    report("exec", 1, role="exec", processes=1, started_at=begun, ended_at=begun + timedelta(seconds=2.5)).write(task)
    report("exec", 2, role="exec", processes=1, ended=WorkerEnd.STOPPED, ended_at=begun).write(task)
    observations = observations_from_reports(task, KEY, True, "run-1", memory_gb=1)
    assert [o.unit_seconds for o in observations] == [(2.5,), ()]
    assert [o.per_worker_gb for o in observations] == [8.0, 8.0]  # the memory rule reads what it read before
    learner.record_all(observations)
    assert learner.estimate(KEY, 1, 1, 1).seconds == 2.5


def test_the_servers_facts_bound_what_reports_claim(tmp_path: Path) -> None:
    """The task's pods write its reports: reports of workers the server never started, kills it never saw and
    memory beyond what it gave are not observed."""
    task = StoreLayout(tmp_path).run("run-1").task("fit")
    report("w0", 100, processes=1, peak_memory_gb=56.0, oom_kills=1).write(task)  # one process, 56 GiB, a kill
    report("w0", 200, processes=2, peak_memory_gb=1.5).write(task)  # the retry
    for n in range(5):
        report(f"w{n + 1}", 300 + n, processes=1, peak_memory_gb=56.0, ended=WorkerEnd.RUNNING).write(task)
    facts = {"memory_gb": 2, "retry_memory_gb": 3, "processes": 2, "retry_processes": 2}
    seen = observations_from_reports(task, KEY, True, "run-1", **facts, attempts={"w0": 2}, kills={"w0": 1})
    assert [(o.per_worker_gb, o.oom_killed, o.oom_per_worker_gb) for o in seen] == [
        (1.0, True, 1.0),
        (0.75, False, None),
    ]
    unseen = observations_from_reports(task, KEY, True, "run-1", **facts, attempts={"w0": 2}, kills={})
    assert [(o.per_worker_gb, o.oom_killed) for o in unseen] == [(1.0, False), (0.75, False)]


def test_reports_claim_no_more_than_the_executor_measured_so_forgeries_do_not_compound(
    tmp_path: Path, learner: ResourceLearner
) -> None:
    """A task whose pods really use 0.2 GiB forges reports that claim all the memory they were given: bounded by
    the limit only, each run's plan would be 1.1x the last; bounded by the executor's own measurement (with its
    margin), the key learns the same memory run after run. A worker the executor did not measure (a cluster's)
    is bounded by its limit."""
    learned = []
    limit_gb = 1.0
    for n in range(5):
        task = StoreLayout(tmp_path).run(f"run-{n}").task("fit")
        report("w0", 100, processes=1, peak_memory_gb=limit_gb).write(task)
        facts = {"memory_gb": limit_gb, "processes": 1, "attempts": {"w0": 1}, "kills": {}}
        (observation,) = observations_from_reports(task, KEY, True, f"run-{n}", **facts, measured_gb={"w0": 0.2})
        assert observation.per_worker_gb == pytest.approx(0.2 * MEASURED_MARGIN + MEASURED_SLACK_GB)
        learner.record(observation)
        limit_gb = learner.resolve(KEY, HINT).per_worker_gb
        learned.append(limit_gb)
    assert learned == [learned[0]] * 5, learned
    task = StoreLayout(tmp_path).run("run-k").task("fit")
    report("w0", 100, processes=1, peak_memory_gb=56.0).write(task)
    (unmeasured,) = observations_from_reports(task, KEY, True, "run-k", memory_gb=2, processes=1, measured_gb={})
    assert unmeasured.per_worker_gb == 2.0


def test_a_key_s_observations_kept_in_memory_follow_every_write_of_any_connection(tmp_path: Path) -> None:
    """Reads are served from memory while the database is unchanged; a write through this store, through
    another store on the same file or by another program is seen by the next read."""
    path = StoreLayout(tmp_path).observations
    with ResourceLearner(path) as learner, ResourceLearner(path) as other:
        first = learner.record(Observation(KEY, 1.0, succeeded=True, run_id="r1"))
        assert learner.observations(KEY) == [first]
        assert learner.observations(KEY) == [first]  # from memory
        second = other.record(Observation(KEY, 2.0, succeeded=True, run_id="r2"))
        assert learner.observations(KEY) == [first, second]
        with sqlite3.connect(path) as connection:  # another program
            connection.execute("UPDATE observations SET per_worker_gb = 9.0 WHERE run_id = 'r1'")
        assert [o.per_worker_gb for o in learner.observations(KEY)] == [9.0, 2.0]
        assert learner.resolve(KEY, HINT).per_worker_gb >= 9.0
        other.forget(KEY)
        assert learner.observations(KEY) == []
        returned = learner.observations(KEY)
        returned.append(first)  # a caller changing its list changes nothing kept
        assert learner.observations(KEY) == []


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.5, 1.0, 2.0, 3.0]),
            st.sampled_from([False, False, True]),
            st.sampled_from([False, False, False, True]),  # few successes: kills older than the window stand
            st.sampled_from(["", "r1", "r1", "r2"]),
            st.integers(0, 5),
        ),
        max_size=60,
    )
)
@example([(3.0, True, False, "r1", 0)] + [(0.5, False, True, "r1", 1)] * 25)  # the killed run's retries only
@example([(0.5, False, True, "r2", 0), (3.0, True, False, "r1", 1)] + [(0.5, False, True, "r1", 2)] * 25)
@example([(3.0, True, False, "r1", 0), (3.0, True, False, "", 1)] + [(0.5, False, True, "", 2)] * 25)
def test_the_rules_read_from_the_store_answer_as_over_every_observation(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[float, bool, bool, str, int]]
) -> None:
    """`resolve` and `estimate` read only the window and the observations that can still decide the floor; the
    answers equal the rules over the key's whole history, with ties in time ordered as they were stored."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with ResourceLearner(tmp_path_factory.mktemp("learner") / "observations.sqlite") as learner:
        learner.record_all(
            Observation(
                KEY,
                gb,
                oom_killed=kill,
                oom_per_worker_gb=gb if kill else None,
                succeeded=ok,
                run_id=run,
                unit_seconds=(gb,),
                observed_at=start + timedelta(seconds=second),  # few distinct times: many ties
            )
            for gb, kill, ok, run, second in rows
        )
        learner.record(Observation(ObservationKey("other:T", "m", ""), 9.0, succeeded=True))  # another key
        every = learner.observations(KEY)
        assert learner.resolve(KEY, HINT) == rules.resolve(every, HINT)
        if rules.median_unit_seconds(every[-rules.WINDOW :]) is not None:
            assert learner.estimate(KEY, 100, 2, 3) == rules.estimate(every, 100, 2, 3)


def test_pages_of_observations_follow_the_order_through_ties_in_time(learner: ResourceLearner) -> None:
    """Keyset pages: each starts after the last row of the one before (its time, then its id), so observations
    stored at one instant are neither skipped nor repeated, and one stored meanwhile appears in its place."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    learner.record_all(Observation(KEY, float(i), observed_at=at + timedelta(seconds=i // 3)) for i in range(7))
    seen, token = [], ""
    while True:
        chunk, token = learner.list_observations(KEY, 2, token)
        seen += [o.per_worker_gb for o in chunk]
        if not token:
            break
        if len(seen) == 4:
            learner.record(Observation(KEY, 99.0, observed_at=at + timedelta(hours=1)))
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 99.0]
    scope = json.dumps([KEY.task_type, KEY.model, KEY.cost_value])
    for bad in ("x", encode_key_token(["not a time", "1"], scope), encode_key_token([at.isoformat()], scope)):
        with pytest.raises(InvalidArgument, match="page_token"):
            learner.list_observations(KEY, 2, bad)


def test_an_observation_of_a_source_is_recorded_once_also_in_a_store_of_an_older_learner(tmp_path: Path) -> None:
    """A store made before observations named their source gains the column; one of a source is kept once (the
    stored one is returned again), while observations without a source are all kept."""
    path = tmp_path / "observations.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE observations (id INTEGER PRIMARY KEY, task_type VARCHAR NOT NULL, model VARCHAR NOT NULL, "
        "cost_value VARCHAR NOT NULL, per_worker_gb FLOAT, oom_killed BOOLEAN NOT NULL, oom_per_worker_gb FLOAT, "
        "succeeded BOOLEAN NOT NULL, unit_seconds VARCHAR NOT NULL, run_id VARCHAR NOT NULL, observed_at DATETIME "
        "NOT NULL)"
    )
    old.execute(
        "INSERT INTO observations VALUES (1, 'model.tasks:Fit', 'pkmodel', '8', 1.0, 0, NULL, 1, '[]', 'r0', "
        "'2026-01-01 00:00:00')"
    )
    old.commit()
    old.close()
    with ResourceLearner(path) as learner:
        first = learner.record(Observation(KEY, 1.5, succeeded=True, run_id="r1", source="r1/fit/w0-1"))
        again = learner.record_all([Observation(KEY, 9.0, succeeded=True, run_id="r1", source="r1/fit/w0-1")])
        learner.record_all([Observation(KEY, 2.0, run_id="r2"), Observation(KEY, 2.0, run_id="r2")])
        assert again == [first]
        assert [(o.run_id, o.per_worker_gb, o.source) for o in learner.observations(KEY)] == [
            ("r0", 1.0, ""),
            ("r1", 1.5, "r1/fit/w0-1"),
            ("r2", 2.0, ""),
            ("r2", 2.0, ""),
        ]
