"""The simulator's incremental structures give exactly what the full computations they replace give."""

from __future__ import annotations

import math

import numpy as np
from cluster_sim._structures import TOL, MachineIndex, OrderedQueue, round9
from hypothesis import given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=300, deadline=None)


def reference_best_fit(free_cpu: np.ndarray, free_memory: np.ndarray, cpu: float, memory: float) -> int:
    """Best fit over all machines at once, as the simulator computed it before the index existed."""
    fits = np.flatnonzero((free_cpu >= cpu - TOL) & (free_memory >= memory - TOL))
    if fits.size == 0:
        return -1
    if fits.size == 1:
        return int(fits[0])
    cpu_left = np.round(free_cpu[fits] - cpu, 9)
    memory_left = np.round(free_memory[fits] - memory, 9)
    return int(fits[np.lexsort((memory_left, cpu_left))[0]])


# Values with exact ties, near-ties below the rounding (1e-10 apart) and float noise (0.1 + 0.2).
_TIES = [0.0, 0.5, 1.0, 2.0, 2.0 + 1e-10, 2.0 - 1e-10, 0.1 + 0.2, 0.3, 4.0, 8.0, 7.999999999, 16.0, 24.0]
free_cpu_values = st.one_of(
    st.sampled_from([*_TIES, -1.5, -math.inf]), st.floats(-4, 40, allow_nan=False, allow_infinity=False)
)
free_memory_values = st.one_of(st.sampled_from(_TIES), st.floats(-4, 100, allow_nan=False, allow_infinity=False))
requests = st.tuples(
    st.one_of(st.sampled_from([0.25, 0.5, 1.0, 2.0, 0.3, 8.0]), st.floats(0, 30)),
    st.one_of(st.sampled_from([0.0, 1.0, 2.0, 0.3, 4.0]), st.floats(0, 90)),
)


@st.composite
def index_scripts(draw: st.DrawFn) -> tuple[list[float], list[float], list[tuple[int, float, float]]]:
    count = draw(st.integers(1, 12))
    cpu = draw(st.lists(free_cpu_values, min_size=count, max_size=count))
    memory = draw(st.lists(free_memory_values, min_size=count, max_size=count))
    updates = draw(st.lists(st.tuples(st.integers(0, count - 1), free_cpu_values, free_memory_values), max_size=15))
    return cpu, memory, updates


@SETTINGS
@given(index_scripts(), st.lists(requests, min_size=1, max_size=6))
def test_best_fit_equals_the_full_comparison(
    script: tuple[list[float], list[float], list[tuple[int, float, float]]], asked: list[tuple[float, float]]
) -> None:
    cpu, memory, updates = script
    index = MachineIndex(cpu, memory)
    free_cpu, free_memory = np.array(cpu), np.array(memory)
    for step in [None, *updates]:
        if step is not None:
            machine, new_cpu, new_memory = step
            index.set(machine, new_cpu, new_memory)
            free_cpu[machine], free_memory[machine] = new_cpu, new_memory
        assert index.cpu == free_cpu.tolist() and index.memory == free_memory.tolist()
        # The keys are the free CPU in ascending order, each beside its machine (moved or updated in place).
        assert index.keys == sorted(index.cpu)
        assert [index.cpu[m] for m in index._machines] == index.keys
        assert sorted(index._machines) == list(range(len(cpu)))
        assert index.max_cpu == free_cpu.max() and index.max_memory == free_memory.max()
        for threshold in (0.0, 2.0, -1.5):
            assert sorted(index.below(threshold)) == np.flatnonzero(free_cpu < threshold).tolist()
        for process_cpu, process_memory in asked:
            assert index.best_fit(process_cpu, process_memory) == reference_best_fit(
                free_cpu, free_memory, process_cpu, process_memory
            )


@SETTINGS
@given(index_scripts())
def test_rebuild_equals_the_same_values_set_one_by_one(
    script: tuple[list[float], list[float], list[tuple[int, float, float]]],
) -> None:
    cpu, memory, updates = script
    stepwise = MachineIndex(cpu, memory)
    for machine, new_cpu, new_memory in updates:
        stepwise.set(machine, new_cpu, new_memory)
    rebuilt = MachineIndex([0.0] * len(cpu), [0.0] * len(cpu))
    rebuilt.rebuild(list(stepwise.cpu), list(stepwise.memory))
    for process_cpu in (0.25, 1.0, 2.0, 8.0):
        for process_memory in (0.0, 2.0, 16.0):
            assert stepwise.best_fit(process_cpu, process_memory) == rebuilt.best_fit(process_cpu, process_memory)
    assert (stepwise.max_cpu, stepwise.max_memory) == (rebuilt.max_cpu, rebuilt.max_memory)


@SETTINGS
@given(st.floats(allow_nan=False))
def test_round9_is_numpy_round(value: float) -> None:
    with np.errstate(over="ignore"):
        expected = float(np.round(np.float64(value), 9))
    assert round9(value) == expected  # equal values (a zero may differ in sign, which no comparison sees)


@st.composite
def queue_scripts(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    count = draw(st.integers(1, 40))
    # A full sort by a key with many ties, ties broken by flow order, like the simulator's orders.
    key = np.array(draw(st.lists(st.integers(0, 5), min_size=count, max_size=count)))
    order = np.lexsort((np.arange(count), key))
    toggles = draw(st.lists(st.integers(0, count - 1), max_size=80))
    return order, toggles


@SETTINGS
@given(queue_scripts(), st.integers(0, 45), st.integers(0, 45))
def test_ordered_queue_equals_a_full_sort_of_the_queued(
    script: tuple[np.ndarray, list[int]], limit: int, rank: int
) -> None:
    order, toggles = script
    queue = OrderedQueue(order)
    queued = np.zeros(order.size, dtype=bool)
    for process in toggles:  # each toggle enters a process that is not queued, starts one that is
        if queued[process]:
            queue.remove(process)
        else:
            queue.add(process)
        queued[process] = not queued[process]
        full_sort = order[queued[order]].tolist()
        assert queue.processes() == full_sort
        assert len(queue) == len(full_sort)
    full_sort = order[queued[order]].tolist()
    assert queue.processes(limit) == full_sort[:limit]
    assert list(queue.processes_before(rank)) == [int(p) for p in order[:rank] if queued[p]]


@SETTINGS
@given(
    queue_scripts(),
    st.data(),
    st.sampled_from([0.0, 0.5, 1.0, 2.0 - 1e-10, 2.0, 8.0, -1.0]),
    st.sampled_from([0.0, 1.0, 3.0, 3.0 + 1e-10, 50.0]),
)
def test_processes_within_equals_filtering_the_queue_one_by_one(
    script: tuple[np.ndarray, list[int]], data: st.DataObject, cpu_limit: float, memory_limit: float
) -> None:
    order, toggles = script
    queue = OrderedQueue(order)
    queued: set[int] = set()
    for process in toggles:
        if process in queued:
            queue.remove(process)
            queued.discard(process)
        else:
            queue.add(process)
            queued.add(process)
    size = order.size
    cpu = np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=size, max_size=size)))
    memory = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 3.0, 7.5]), min_size=size, max_size=size)))
    also = data.draw(st.lists(st.sampled_from(sorted(queued)), unique=True)) if queued else []
    expected = [
        p for p in queue.processes() if (cpu[p] - TOL <= cpu_limit and memory[p] - TOL <= memory_limit) or p in also
    ]
    assert queue.processes_within(cpu, memory, cpu_limit, memory_limit, also) == expected
    if len(queued) < size:
        queue.add(min(set(range(size)) - queued))  # numpy's view of the ranks is released: they can change
