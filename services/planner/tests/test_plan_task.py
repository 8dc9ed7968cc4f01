"""Table-driven and property tests of `plan_task`: pods, processes and priority classes of a task."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simrun_core.errors import InvalidArgument
from simrun_planner import (
    MAX_PIECES,
    POD_START_S,
    Node,
    PlanError,
    Priority,
    ResolvedResources,
    SplitMode,
    plan_task,
    shape,
    slots,
)

R = ResolvedResources
FASTEST, SINGLE = SplitMode.FASTEST, SplitMode.SINGLE_SERVER


@dataclass(frozen=True)
class Task:
    id: str = "fit"


@dataclass(frozen=True)
class Type:
    name: str = "model.tasks:Fit"
    split: bool = True


def nodes(count: int, cores: int, memory_gb: float, gpus: int = 0, prefix: str = "n", **kw: object) -> list[Node]:
    return [Node(f"{prefix}{i}", cores, memory_gb, gpus, **kw) for i in range(count)]  # type: ignore[arg-type]


MIXED = [*nodes(6, 8, 32, prefix="small"), Node("big", 64, 512)]

PLANS = [
    # resources, cluster, mode, units, run_id, expected (pods, processes)
    pytest.param(R(2, 4), nodes(4, 16, 64), FASTEST, 100, None, (4, 15), id="uniform-one-slot-per-node"),
    pytest.param(R(2, 4), nodes(12, 16, 64), FASTEST, 1000, None, (MAX_PIECES, 15), id="uniform-capped-at-max-pieces"),
    pytest.param(R(1, 2), MIXED, FASTEST, 1000, None, (MAX_PIECES, 8), id="mixed-large-node-holds-several-pods"),
    pytest.param(R(1, 2), MIXED[:2] + MIXED[-1:], FASTEST, 1000, None, (MAX_PIECES, 8), id="mixed-big-node-8-slots"),
    pytest.param(R(1, 2), MIXED[:3], FASTEST, 1000, None, (3, 8), id="mixed-without-the-big-node"),
    pytest.param(R(2, 40), MIXED, FASTEST, 1000, None, (1, 12), id="mixed-only-the-big-node-holds-a-worker"),
    pytest.param(R(1, 2), MIXED, FASTEST, 20, None, (2, 8), id="few-units-no-pod-without-a-unit-per-process"),
    pytest.param(R(1, 2), MIXED, FASTEST, 5, None, (1, 5), id="fewer-units-than-processes"),
    pytest.param(R(1, 2), MIXED, FASTEST, 0, None, (1, 1), id="no-units-coordinator-only"),
    pytest.param(
        R(1, 2),
        nodes(2, 8, 32, reserved_by="run-other") + nodes(3, 8, 32, prefix="free"),
        FASTEST,
        1000,
        "run-me",
        (3, 8),
        id="nodes-reserved-for-another-run-are-not-usable",
    ),
    pytest.param(
        R(1, 2),
        [Node("mine", 8, 32, reserved_by="run-me"), *nodes(5, 8, 32)],
        FASTEST,
        1000,
        "run-me",
        (1, 8),
        id="a-run-with-a-reservation-plans-on-its-node",
    ),
    pytest.param(
        R(1, 2, gpus=1),
        nodes(5, 32, 128) + nodes(2, 8, 64, gpus=2, prefix="gpu"),
        FASTEST,
        1000,
        None,
        (2, 8),
        id="gpus-only-gpu-nodes-have-slots",
    ),
    pytest.param(
        R(1, 2, gpus=1),
        nodes(5, 32, 128) + nodes(2, 8, 64, gpus=2, prefix="gpu"),
        FASTEST,
        4,
        None,
        (1, 4),
        id="gpus-few-units",
    ),
    pytest.param(R(1, 2), MIXED, SINGLE, 1000, None, (1, 8), id="single-server"),
    # 160 units on 8-process pods over 8 nodes: with u seconds a unit, p pods have 160 u / (8 p) seconds each.
    pytest.param(R(1, 2, unit_seconds=1.0), nodes(8, 8, 32), FASTEST, 160, None, (2, 8), id="learned-20s-two-pods"),
    pytest.param(R(1, 2, unit_seconds=3.0), nodes(8, 8, 32), FASTEST, 160, None, (6, 8), id="learned-60s-six-pods"),
    pytest.param(R(1, 2, unit_seconds=4.0), nodes(8, 8, 32), FASTEST, 160, None, (8, 8), id="learned-80s-all-slots"),
    pytest.param(R(1, 2, unit_seconds=0.1), nodes(8, 8, 32), FASTEST, 160, None, (1, 8), id="learned-short-one-pod"),
    pytest.param(R(1, 2, unit_seconds=0.0), nodes(8, 8, 32), FASTEST, 160, None, (1, 8), id="learned-zero-one-pod"),
]


@pytest.mark.parametrize(("resources", "cluster", "mode", "units", "run_id", "expected"), PLANS)
def test_plan_task(
    resources: ResolvedResources,
    cluster: list[Node],
    mode: SplitMode,
    units: int,
    run_id: str | None,
    expected: tuple[int, int],
) -> None:
    plan = plan_task(Task(), Type(), resources, cluster, mode, Priority.STANDARD, units, run_id=run_id)
    assert (plan.pods, plan.shape.processes) == expected
    assert plan.units == units
    assert plan.task_id == "fit"
    assert plan.coordinator_merges is True


@pytest.mark.parametrize(
    ("pod_start_s", "pods"),
    [(20.0, 1), (10.0, 2), (5.0, 4), (2.5, 8), (20 / 3, 3)],
)
def test_a_further_pod_only_while_every_pod_has_pod_start_s_of_work(pod_start_s: float, pods: int) -> None:
    # 160 units of 1 s on 8 processes a pod: p pods have 20/p seconds each, so the boundary is included.
    resources = R(1, 2, unit_seconds=1.0)
    plan = plan_task(Task(), Type(), resources, nodes(8, 8, 32), FASTEST, Priority.OWNER, 160, pod_start_s)
    assert plan.pods == pods


def test_pod_start_default() -> None:
    assert POD_START_S == 10
    resources = R(1, 2, unit_seconds=1.0)
    assert plan_task(Task(), Type(), resources, nodes(8, 8, 32), FASTEST, Priority.OWNER, 160).pods == 2


def test_unsplit_task_is_one_pod_of_one_process() -> None:
    plan = plan_task(Task("sim"), Type(split=False), R(1, 2), MIXED, FASTEST, Priority.AGENT, None)
    assert (plan.pods, plan.shape.processes, plan.units) == (1, 1, None)
    assert plan.shape.memory_gb == 3


@pytest.mark.parametrize(
    ("priority", "base", "extra"),
    [
        (Priority.OWNER, "simrun-owner-base", "simrun-owner-extra"),
        (Priority.STANDARD, "simrun-standard-base", "simrun-standard-extra"),
        (Priority.AGENT, "simrun-agent-base", "simrun-agent-extra"),
        ("agent", "simrun-agent-base", "simrun-agent-extra"),
    ],
)
def test_priority_classes(priority: Priority, base: str, extra: str) -> None:
    plan = plan_task(Task(), Type(), R(1, 2), MIXED, "fastest", priority, 100)  # type: ignore[arg-type]
    assert (plan.base_priority, plan.extra_priority) == (base, extra)


def test_a_task_that_fits_no_node_names_task_and_type() -> None:
    with pytest.raises(PlanError, match=r"task 'fit' of type model.tasks:Fit: one worker needs .* 602 GiB"):
        plan_task(Task(), Type(), R(2, 600), MIXED, FASTEST, Priority.OWNER, 10)


@pytest.mark.parametrize(
    ("units", "pod_start_s", "mode", "priority"),
    [(None, 10, "fastest", "owner"), (-1, 10, "fastest", "owner"), (5, -1, "fastest", "owner")],
)
def test_bad_inputs_are_invalid_arguments(units: int | None, pod_start_s: float, mode: str, priority: str) -> None:
    with pytest.raises(InvalidArgument):
        plan_task(Task(), Type(), R(1, 2), MIXED, mode, priority, units, pod_start_s)  # type: ignore[arg-type]


def test_unknown_mode_or_priority_are_value_errors() -> None:
    with pytest.raises(ValueError):
        plan_task(Task(), Type(), R(1, 2), MIXED, "slowest", Priority.OWNER, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        plan_task(Task(), Type(), R(1, 2), MIXED, FASTEST, "boss", 5)  # type: ignore[arg-type]


def test_slots_count_allocatable_requests() -> None:
    pod = shape(R(1, 2), nodes(4, 8, 32))
    assert slots(pod, Node("big", 64, 512)) == 8
    assert slots(pod, Node("tight", 64, 512, allocatable_cores=20)) == 2
    assert slots(pod, Node("small", 4, 512)) == 0


node_strategy = st.builds(
    Node,
    name=st.just("n"),
    cores=st.integers(1, 64),
    memory_gb=st.floats(1, 512, allow_nan=False),
    gpus=st.integers(0, 2),
    reserved_by=st.sampled_from([None, None, "run-other"]),
)


@given(
    st.lists(node_strategy, min_size=1, max_size=10),
    st.integers(0, 500),
    st.none() | st.floats(0, 100, allow_nan=False),
    st.sampled_from(list(SplitMode)),
)
def test_plan_bounds(cluster: list[Node], units: int, unit_seconds: float | None, mode: SplitMode) -> None:
    resources = R(0.5, 1.5, unit_seconds=unit_seconds)
    try:
        plan = plan_task(Task(), Type(), resources, cluster, mode, Priority.OWNER, units)
    except PlanError:
        return
    assert 1 <= plan.pods <= MAX_PIECES
    assert 1 <= plan.shape.processes <= max(units, 1)
    if plan.pods > 1:
        assert mode is SplitMode.FASTEST
        assert plan.pods * plan.shape.processes <= units
        assert plan.pods <= sum(slots(plan.shape, n) for n in cluster if n.reserved_by is None)
        if unit_seconds is not None:
            assert units * unit_seconds / (plan.pods * plan.shape.processes) >= POD_START_S - 1e-6
