"""Table-driven and property tests of `shape`: which node a pod is sized for and how many processes it gets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simrun_core.errors import InvalidArgument
from simrun_planner import Node, PlanError, PodShape, ResolvedResources, retry_processes, shape


def nodes(count: int, cores: int, memory_gb: float, gpus: int = 0, prefix: str = "n", **kw: object) -> list[Node]:
    return [Node(f"{prefix}{i}", cores, memory_gb, gpus, **kw) for i in range(count)]  # type: ignore[arg-type]


R = ResolvedResources

SHAPES = [
    pytest.param(
        R(2, 4),
        nodes(4, 16, 64),
        None,
        None,
        PodShape(
            cores=15,
            memory_gb=62,
            processes=15,
            per_worker_gb=4,
            retry_memory_gb=63,
            retry_per_worker_gb=6.1,
            scratch_gb=0,
            gpus=0,
        ),
        id="uniform-memory-bound-retry-fewer-processes",
    ),
    pytest.param(
        R(1, 1, scratch_gb=20),
        nodes(4, 16, 64),
        None,
        None,
        PodShape(16, 17, 16, 1, 25, 1.5, 20, 0),
        id="uniform-cores-bound",
    ),
    pytest.param(
        R(0.25, 0.375),
        nodes(2, 4, 16),
        None,
        None,
        PodShape(4, 2, 4, 0.375, 3, 0.6875, 0, 0),
        id="memory-rounded-up-to-whole-gib",
    ),
    pytest.param(
        R(1, 2, cores_per_process=2),
        nodes(3, 16, 64),
        None,
        None,
        PodShape(16, 17, 8, 2, 25, 3, 0, 0),
        id="cores-per-process",
    ),
    pytest.param(
        R(1, 2),
        [*nodes(6, 8, 32, prefix="small"), Node("big", 64, 512)],
        None,
        None,
        PodShape(8, 17, 8, 2, 25, 3, 0, 0),
        id="mixed-sized-for-the-common-small-node",
    ),
    pytest.param(
        R(2, 40),
        [*nodes(6, 8, 32, prefix="small"), Node("big", 64, 512)],
        None,
        None,
        PodShape(12, 482, 12, 40, 483, 60.125, 0, 0),
        id="mixed-worker-too-large-for-small-takes-largest",
    ),
    pytest.param(
        R(1, 2),
        nodes(3, 8, 32, reserved_by="run-other") + nodes(2, 4, 16, prefix="free"),
        None,
        None,
        PodShape(4, 9, 4, 2, 13, 3, 0, 0),
        id="common-nodes-reserved-by-another-run",
    ),
    pytest.param(
        R(1, 2),
        [Node("mine", 32, 128, reserved_by="run-me"), *nodes(4, 8, 32)],
        None,
        "run-me",
        PodShape(32, 65, 32, 2, 97, 3, 0, 0),
        id="run-with-a-reservation-uses-its-node",
    ),
    pytest.param(
        R(1, 2),
        [Node("theirs", 32, 128, reserved_by="run-other"), *nodes(4, 8, 32)],
        None,
        "run-me",
        PodShape(8, 17, 8, 2, 25, 3, 0, 0),
        id="run-without-a-reservation-skips-others",
    ),
    pytest.param(
        R(1, 2, gpus=1),
        nodes(5, 32, 128) + nodes(2, 8, 64, gpus=2, prefix="gpu"),
        None,
        None,
        PodShape(8, 17, 8, 2, 25, 3, 0, 1),
        id="gpu-task-sized-for-a-gpu-node",
    ),
    pytest.param(
        R(1, 2),
        nodes(4, 16, 64),
        3,
        None,
        PodShape(3, 7, 3, 2, 10, 3, 0, 0),
        id="max-processes",
    ),
    pytest.param(
        R(1, 1),
        nodes(2, 4, 16, prefix="a") + nodes(2, 8, 32, prefix="b"),
        None,
        None,
        PodShape(8, 9, 8, 1, 13, 1.5, 0, 0),
        id="tie-takes-the-larger",
    ),
    pytest.param(
        R(1, 6),
        nodes(2, 4, 8),
        None,
        None,
        PodShape(1, 7, 1, 6, 8, 7, 0, 0),
        id="retry-of-one-process-gets-what-the-node-holds",
    ),
]


@pytest.mark.parametrize(("resources", "cluster", "max_processes", "run_id", "expected"), SHAPES)
def test_shape(
    resources: ResolvedResources, cluster: list[Node], max_processes: int | None, run_id: str | None, expected: PodShape
) -> None:
    assert shape(resources, cluster, max_processes, run_id=run_id) == expected


def test_retry_processes_follow_the_retry_memory() -> None:
    pod = shape(R(2, 4), nodes(4, 16, 64))
    assert retry_processes(pod, 2) == 10
    assert pod.retry_per_worker_gb * retry_processes(pod, 2) + 2 <= pod.retry_memory_gb
    roomy = shape(R(1, 1), nodes(4, 16, 64))
    assert retry_processes(roomy, 1) == roomy.processes == 16


@pytest.mark.parametrize(
    ("resources", "cluster", "message"),
    [
        pytest.param(
            R(2, 600),
            [*nodes(6, 8, 32, prefix="small"), Node("big", 64, 512)],
            "one worker needs 1 core(s), 602 GiB of memory (2 GiB base + 600 GiB per process) and 0 GPU(s); "
            "the largest usable node, big, has 64 cores, 512 GiB and 0 GPU(s)",
            id="worker-larger-than-every-node",
        ),
        pytest.param(R(1, 1, gpus=1), nodes(3, 16, 64), "0 GPU(s)", id="gpu-task-without-gpu-nodes"),
        pytest.param(R(1, 1, cores_per_process=32), nodes(3, 16, 64), "32 core(s)", id="more-cores-than-any-node"),
        pytest.param(R(1, 1), nodes(2, 16, 64, reserved_by="x"), "reserved by other runs", id="all-reserved"),
        pytest.param(R(1, 1), [], "no nodes", id="no-nodes"),
        pytest.param(
            R(1, 100),
            [Node("huge", 64, 512, reserved_by="other"), *nodes(3, 16, 64)],
            "the largest usable node, n0, has 16 cores",
            id="only-a-node-reserved-by-another-run-would-fit",
        ),
    ],
)
def test_plan_error(resources: ResolvedResources, cluster: list[Node], message: str) -> None:
    with pytest.raises(PlanError, match=None) as raised:
        shape(resources, cluster)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("resources", "max_processes"),
    [(R(-1, 1), None), (R(1, -1), None), (R(1, 1, cores_per_process=0), None), (R(1, 1, gpus=-1), None), (R(1, 1), 0)],
)
def test_bad_resources_are_invalid_arguments(resources: ResolvedResources, max_processes: int | None) -> None:
    with pytest.raises(InvalidArgument):
        shape(resources, nodes(2, 16, 64), max_processes)


def test_node_allocatable_defaults_to_cores_and_memory() -> None:
    node = Node("n", 16, 62.5)
    assert (node.allocatable_cores, node.allocatable_memory_gb) == (16, 62.5)
    assert Node("m", 16, 64, allocatable_cores=15.5).allocatable_cores == 15.5


node_strategy = st.builds(
    Node,
    name=st.text("abc", min_size=1, max_size=3),
    cores=st.integers(1, 128),
    memory_gb=st.floats(0.5, 1024, allow_nan=False),
    gpus=st.integers(0, 4),
    reserved_by=st.sampled_from([None, None, "run-me", "run-other"]),
)
resources_strategy = st.builds(
    ResolvedResources,
    base_memory_gb=st.floats(0, 16, allow_nan=False),
    per_worker_gb=st.floats(0.01, 64, allow_nan=False),
    cores_per_process=st.integers(1, 8),
    gpus=st.integers(0, 2),
)


@given(resources_strategy, st.lists(node_strategy, max_size=8), st.none() | st.integers(1, 64))
def test_a_shape_fits_a_usable_node_and_its_retry_too(
    resources: ResolvedResources, cluster: list[Node], max_processes: int | None
) -> None:
    try:
        pod = shape(resources, cluster, max_processes, run_id="run-me")
    except PlanError:
        mine = [n for n in cluster if n.reserved_by == "run-me"]
        assert not any(
            n.cores >= resources.cores_per_process
            and n.gpus >= resources.gpus
            and math.ceil(resources.base_memory_gb + resources.per_worker_gb) <= n.memory_gb
            for n in (mine or [n for n in cluster if n.reserved_by is None])
        )
        return
    assert pod.processes >= 1
    assert max_processes is None or pod.processes <= max_processes
    assert pod.cores == pod.processes * resources.cores_per_process
    assert pod.memory_gb >= resources.base_memory_gb + resources.per_worker_gb * pod.processes - 1e-6
    assert pod.memory_gb - 1 < max(1, resources.base_memory_gb + resources.per_worker_gb * pod.processes)
    hosts = [n for n in cluster if n.cores >= pod.cores and n.gpus >= pod.gpus and n.memory_gb >= pod.memory_gb]
    assert hosts, "the shape fits no node"
    assert any(n.memory_gb >= pod.retry_memory_gb for n in hosts), "the retry fits no node that holds the pod"
    again = retry_processes(pod, resources.base_memory_gb)
    assert 1 <= again <= pod.processes
    assert resources.base_memory_gb + pod.retry_per_worker_gb * again <= pod.retry_memory_gb + 1e-6
    assert pod.retry_per_worker_gb * again == pytest.approx(pod.retry_memory_gb - resources.base_memory_gb)
    assert pod.retry_memory_gb >= pod.memory_gb
    if pod.retry_memory_gb == pod.memory_gb:
        # No more memory for the retry only where the pod already fills a node: then fewer processes, each
        # with more, unless it had a single process.
        assert any(math.floor(n.memory_gb + 1e-9) == pod.memory_gb for n in hosts)
        assert again < pod.processes or pod.processes == 1
    elif again == pod.processes > 1:
        assert pod.retry_per_worker_gb >= 1.5 * pod.per_worker_gb - 1e-9
    if pod.processes > 1 or pod.retry_memory_gb > pod.memory_gb:
        assert pod.retry_per_worker_gb > pod.per_worker_gb


@pytest.mark.parametrize(
    ("resources", "cluster", "first_gb", "retry_gb", "retry_processes_"),
    [
        pytest.param(R(0.5, 0.25), nodes(1, 1, 6), 1, 2, 1, id="rounding-absorbs-the-1.5-then-one-more-gib"),
        pytest.param(R(0.25, 0.1), nodes(1, 4, 8), 1, 2, 4, id="four-small-processes-one-more-gib"),
        pytest.param(R(0, 0.6), [Node("n", 2, 2)], 2, 2, 1, id="pod-fills-its-node-one-process-fewer"),
        pytest.param(R(0, 1.5), [Node("n", 1, 2)], 2, 2, 1, id="one-process-filling-its-node-has-no-more"),
        pytest.param(R(0.5, 0), nodes(1, 2, 4), 1, 2, 2, id="no-memory-per-process-still-one-more-gib"),
        pytest.param(R(0, 2.9), [Node("n", 1, 4)], 3, 4, 1, id="1.5-times-fits-no-node-the-node-then"),
    ],
)
def test_a_retry_has_more_memory_than_the_attempt_killed(
    resources: ResolvedResources, cluster: list[Node], first_gb: int, retry_gb: int, retry_processes_: int
) -> None:
    pod = shape(resources, cluster)
    assert (pod.memory_gb, pod.retry_memory_gb) == (first_gb, retry_gb)
    assert retry_processes(pod, resources.base_memory_gb) == retry_processes_
    assert pod.retry_per_worker_gb == pytest.approx((retry_gb - resources.base_memory_gb) / retry_processes_)
