"""Tests of the local executor's admission pass: order, fit, preemption, claims and reservations, without processes."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from simrun_tracker.local.admission import Placed, Preemption, Slot, Waiting, decide, decide_arrivals

BASE, EXTRA, LOW_BASE, LOW_EXTRA = 500, 400, 200, 100


def waiting(pod_id: str, priority: int, seq: int, cores: float = 1, memory_gb: float = 1, **kw: object) -> Waiting:
    return Waiting(pod_id, str(kw.pop("run_id", pod_id)), cores, memory_gb, priority, seq, **kw)  # type: ignore[arg-type]


def placed(pod_id: str, node: str, priority: int, seq: int, cores: float = 1, memory_gb: float = 1, **kw: object):
    return Placed(pod_id, str(kw.pop("run_id", pod_id)), node, cores, memory_gb, priority, seq, **kw)  # type: ignore[arg-type]


def test_admits_in_priority_order_then_fifo_while_resources_last() -> None:
    nodes = [Slot("a", 2, 8)]
    pending = [waiting("low", LOW_BASE, 1), waiting("late", BASE, 3), waiting("early", BASE, 2)]
    assert decide(nodes, [], pending).admit == [("early", "a"), ("late", "a")]


def test_memory_limits_admission_as_cores_do() -> None:
    nodes = [Slot("a", 4, 1.0)]
    decisions = decide(nodes, [placed("big", "a", BASE, 1, memory_gb=0.75)], [waiting("p", BASE, 2, memory_gb=0.5)])
    assert decisions.admit == []
    assert decisions.preempt == []


def test_first_node_with_room_in_configured_order() -> None:
    nodes = [Slot("a", 1, 4), Slot("b", 1, 4)]
    decisions = decide(nodes, [placed("x", "a", BASE, 1)], [waiting("p", BASE, 2)])
    assert decisions.admit == [("p", "b")]


def test_preempts_lowest_priority_then_newest_and_only_what_is_needed() -> None:
    nodes = [Slot("a", 3, 8)]
    running = [
        placed("extra-old", "a", EXTRA, 1),
        placed("low-old", "a", LOW_EXTRA, 2),
        placed("low-new", "a", LOW_EXTRA, 3),
    ]
    decisions = decide(nodes, running, [waiting("p", BASE, 4)])
    assert decisions.preempt == [Preemption("p", "a", ("low-new",))]
    assert decisions.claims == {"p": "a"}
    assert decisions.admit == []


def test_gives_back_victims_the_pod_does_not_need() -> None:
    # Greedy takes the 1-core lowest first, then the 2-core one; the 2-core one alone suffices.
    nodes = [Slot("a", 3, 8)]
    running = [placed("small", "a", LOW_EXTRA, 1, cores=1), placed("big", "a", EXTRA, 2, cores=2)]
    decisions = decide(nodes, running, [waiting("p", BASE, 3, cores=2)])
    assert decisions.preempt == [Preemption("p", "a", ("big",))]


def test_equal_priorities_never_preempt() -> None:
    nodes = [Slot("a", 1, 8)]
    decisions = decide(nodes, [placed("x", "a", EXTRA, 1)], [waiting("p", EXTRA, 2)])
    assert decisions.preempt == []
    assert decisions.claims == {}


def test_waits_for_its_victims_without_preempting_again() -> None:
    nodes = [Slot("a", 2, 8)]
    running = [placed("v", "a", LOW_EXTRA, 1, terminating=True), placed("w", "a", LOW_EXTRA, 2)]
    decisions = decide(nodes, running, [waiting("p", BASE, 3, claim="a")])
    assert decisions.preempt == []
    assert decisions.admit == []
    assert decisions.claims == {}


def test_lower_priorities_do_not_take_the_node_the_head_waits_on() -> None:
    nodes = [Slot("a", 2, 8), Slot("b", 1, 8)]
    running = [placed("v", "a", LOW_EXTRA, 1, cores=2, terminating=True), placed("x", "b", BASE, 2)]
    pending = [waiting("head", BASE, 3, cores=2, claim="a"), waiting("small", LOW_BASE, 4)]
    # Once the victim has gone, `a` has room for both; `small` must still not go in front of the head.
    running_after = [running[1]]
    assert decide(nodes, running, pending).admit == []
    assert decide(nodes, running_after, pending).admit == [("head", "a")]
    blocked = decide(nodes, running, [*pending, waiting("other", LOW_BASE, 5)])
    assert blocked.preempt == []


def test_lower_priorities_still_use_other_nodes_while_the_head_waits() -> None:
    nodes = [Slot("a", 2, 8), Slot("b", 1, 8)]
    running = [placed("v", "a", LOW_EXTRA, 1, cores=2, terminating=True)]
    pending = [waiting("head", BASE, 2, cores=2, claim="a"), waiting("small", LOW_BASE, 3)]
    decisions = decide(nodes, running, pending)
    assert decisions.admit == [("small", "b")]
    assert decisions.preempt == []


def test_a_second_need_preempts_on_another_node_not_the_claimed_one() -> None:
    nodes = [Slot("a", 1, 8), Slot("b", 1, 8)]
    running = [placed("v1", "a", LOW_EXTRA, 1, terminating=True), placed("v2", "b", LOW_EXTRA, 2)]
    pending = [waiting("p1", BASE, 3, claim="a"), waiting("p2", BASE, 4)]
    decisions = decide(nodes, running, pending)
    assert decisions.preempt == [Preemption("p2", "b", ("v2",))]
    assert decisions.claims == {"p2": "b"}


def test_reserved_node_only_for_its_run() -> None:
    nodes = [Slot("a", 1, 8, reserved_by="r1"), Slot("b", 1, 8)]
    running = [placed("x", "b", LOW_EXTRA, 1)]
    other = decide(nodes, running, [waiting("p", BASE, 2, run_id="r2")])
    assert other.admit == []
    assert other.preempt == [Preemption("p", "b", ("x",))]
    owner = decide(nodes, running, [waiting("q", BASE, 2, run_id="r1")])
    assert owner.admit == [("q", "a")]


def test_pod_larger_than_every_node_is_unschedulable() -> None:
    nodes = [Slot("a", 2, 1.0), Slot("b", 1, 4.0)]
    decisions = decide(nodes, [], [waiting("p", BASE, 1, cores=2, memory_gb=2.0), waiting("q", BASE, 2)])
    assert decisions.unschedulable == ["p"]
    assert decisions.admit == [("q", "a")]


def test_fractions_of_gib_add_up_without_rounding_errors() -> None:
    nodes = [Slot("a", 3, 0.3)]
    pending = [waiting(f"p{i}", BASE, i, memory_gb=0.1) for i in range(3)]
    assert len(decide(nodes, [], pending).admit) == 3


def test_a_run_that_reserves_a_node_selects_it_and_other_runs_avoid_it() -> None:
    nodes = [Slot("a", 1, 8), Slot("b", 1, 8, reserved_by="r1")]
    pending = [waiting("p", BASE, 1, run_id="r1"), waiting("q", BASE, 2, run_id="r1"), waiting("o", BASE, 3)]
    decisions = decide(nodes, [], pending)
    assert decisions.admit == [("p", "b"), ("o", "a")]  # q waits for the reserved node, not the free one


PRIORITIES = st.sampled_from([LOW_EXTRA, LOW_BASE, EXTRA, BASE])
SIZES = st.sampled_from([0.5, 1.0, 2.0, 3.0])


@st.composite
def queues(draw: st.DrawFn) -> tuple[list[Slot], list[Placed], list[Waiting]]:
    runs = [f"r{i}" for i in range(4)]
    nodes = [
        Slot(f"n{i}", draw(SIZES) + 1, draw(SIZES) * 2, draw(st.sampled_from([None, None, "r0"])))
        for i in range(draw(st.integers(1, 3)))
    ]
    running = [
        placed(
            f"p{i}",
            draw(st.sampled_from(nodes)).name,
            draw(PRIORITIES),
            i,
            draw(SIZES),
            draw(SIZES),
            run_id=draw(st.sampled_from(runs)),
            terminating=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 5)))
    ]
    pending = [
        waiting(
            f"w{i}",
            draw(PRIORITIES),
            100 + i,
            draw(SIZES),
            draw(SIZES),
            run_id=draw(st.sampled_from(runs)),
            claim=draw(st.sampled_from([None, None, None, *[n.name for n in nodes]])),
        )
        for i in range(draw(st.integers(0, 25)))
    ]
    return nodes, running, pending


@settings(max_examples=400, deadline=None)
@given(queues())
def test_passing_over_pods_alike_a_stuck_one_decides_as_evaluating_every_pod(
    queue: tuple[list[Slot], list[Placed], list[Waiting]],
) -> None:
    nodes, running, pending = queue
    assert decide(nodes, running, pending) == decide(nodes, running, pending, skip_stuck=False)


def test_a_queue_of_alike_pods_behind_a_full_node_still_lets_a_smaller_one_in() -> None:
    nodes = [Slot("a", 2, 8)]
    running = [placed("holder", "a", BASE, 1, cores=1.5)]
    pending = [waiting(f"big{i}", BASE, 10 + i, cores=1) for i in range(1000)] + [waiting("small", BASE, 5000, 0.5)]
    assert decide(nodes, running, pending).admit == [("small", "a")]


def after(nodes: list[Slot], running: list[Placed], pending: list[Waiting]) -> tuple[list[Placed], list[Waiting]]:
    """The running and pending pods once a pass's decisions are carried out (admitted pods run, victims stop)."""
    decisions = decide(nodes, running, pending)
    victims = {v for p in decisions.preempt for v in p.victims}
    seq = max((p.seq for p in [*running, *pending]), default=0)
    by_id = {p.pod_id: p for p in pending}
    admitted = [
        Placed(
            pod_id,
            by_id[pod_id].run_id,
            node,
            by_id[pod_id].cores,
            by_id[pod_id].memory_gb,
            by_id[pod_id].priority,
            seq + 1 + i,
        )
        for i, (pod_id, node) in enumerate(decisions.admit)
    ]
    running = [p._replace(terminating=p.terminating or p.pod_id in victims) for p in running] + admitted
    gone = {pod_id for pod_id, _ in decisions.admit} | set(decisions.unschedulable)
    pending = [p._replace(claim=decisions.claims.get(p.pod_id, p.claim)) for p in pending if p.pod_id not in gone]
    return running, pending


@settings(max_examples=400, deadline=None)
@given(queues(), st.lists(st.tuples(PRIORITIES, SIZES, SIZES, st.integers(0, 3)), max_size=8))
@example(  # an arrival of a higher priority takes the node `w0` claimed: `w1`, held back by the claim, fits now
    queue=(
        [Slot("n0", 1.5, 1.0), Slot("n1", 1.5, 2.0)],
        [placed(f"p{i}", "n0" if i < 4 else "n1", 100, i, 0.5, 0.5, run_id="r0") for i in range(5)],
        [waiting("w0", 200, 100, 0.5, 2.0, run_id="r0")]
        + [waiting(f"w{i}", 100, 100 + i, 0.5, 0.5, run_id="r0") for i in (1, 2, 3)],
    ),
    arrivals=[(400, 0.5, 0.5, 0)],
)
def test_a_pass_over_arrived_and_claiming_pods_decides_as_a_pass_over_the_whole_queue(
    queue: tuple[list[Slot], list[Placed], list[Waiting]], arrivals: list[tuple[int, float, float, int]]
) -> None:
    """What lets the local executor consider only the pods that arrived since its last pass (and those holding a
    claim) while nothing else changed: every other pending pod found no room and no victims then, and finds none
    with more pods in the queue, unless a claim lapses or moves (`decide_arrivals` then passes over the whole
    queue)."""
    nodes, running, pending = queue
    running, pending = after(nodes, running, pending)
    arrived = [
        waiting(f"new{i}", priority, 1000 + i, cores, memory_gb, run_id=f"r{run}")
        for i, (priority, cores, memory_gb, run) in enumerate(arrivals)
    ]
    claiming = [p for p in pending if p.claim is not None]
    whole = decide(nodes, running, pending + arrived)
    assert decide_arrivals(nodes, running, arrived + claiming, lambda: pending + arrived) == whole


def test_a_claim_that_lapses_on_an_arrival_lets_the_pods_it_held_back_in() -> None:
    """The case above by hand: `n0` is full; `w0` waits on `n1` for `p4` to stop; `new0`, of a higher priority,
    takes room there, so `w0` can never fit on `n1` and its claim lapses; `w1`, which the claim kept off `n1`, fits
    there now."""
    nodes = [Slot("n0", 1.5, 1.0), Slot("n1", 1.5, 2.0)]
    full = [placed(f"p{i}", "n0", 100, i, 0.5, 0.3) for i in range(3)]
    running = [*full, placed("p4", "n1", 100, 4, 0.5, 0.5, terminating=True)]
    pending = [waiting("w0", 200, 100, 0.5, 2.0, claim="n1"), waiting("w1", 100, 101, 0.5, 0.5)]
    assert decide(nodes, running, pending).admit == []
    arrived = [waiting("new0", 400, 1000, 0.5, 0.5)]
    claiming = [pending[0]]
    only_considered = decide(nodes, running, arrived + claiming)
    assert only_considered.claims == {"w0": None}
    decisions = decide_arrivals(nodes, running, arrived + claiming, lambda: pending + arrived)
    assert decisions.admit == [("new0", "n1"), ("w1", "n1")]
