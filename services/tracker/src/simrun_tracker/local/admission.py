"""Admission as Kueue does it, as a pure function: which pending pods start where, and which running pods to preempt."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

_EPS = 1e-9


@dataclass(frozen=True)
class Slot:
    """A node as admission sees it: its allocatable cores and memory (GiB) and the run holding its reservation."""

    name: str
    cores: float
    memory_gb: float
    reserved_by: str | None = None

    def admits(self, run_id: str) -> bool:
        """A pod of `run_id` may be placed here: the node is unreserved or reserved by that run."""
        return self.reserved_by is None or self.reserved_by == run_id


class Placed(NamedTuple):
    """A running pod: where it runs, what it holds, and whether it is stopping already (preempted, evicted, stopped)."""

    pod_id: str
    run_id: str
    node: str
    cores: float
    memory_gb: float
    priority: int
    seq: int
    """Order of admission: larger is newer."""
    terminating: bool = False


class Waiting(NamedTuple):
    """A pending pod, with the node whose preempted pods it is waiting for (its claim), if any."""

    pod_id: str
    run_id: str
    cores: float
    memory_gb: float
    priority: int
    seq: int
    """Order of queueing: FIFO among equal priorities."""
    claim: str | None = None


@dataclass(frozen=True)
class Preemption:
    """Running pods to stop with SIGTERM so that a pending pod fits on a node."""

    pod_id: str
    node: str
    victims: tuple[str, ...]


@dataclass
class Decisions:
    """What one admission pass decided."""

    admit: list[tuple[str, str]] = field(default_factory=list)
    """(pending pod, node) to start now, in admission order."""
    preempt: list[Preemption] = field(default_factory=list)
    claims: dict[str, str | None] = field(default_factory=dict)
    """New claim of a pending pod (a node it waits on), or None where its old claim lapsed."""
    unschedulable: list[str] = field(default_factory=list)
    """Pending pods larger than every node, even an empty one: they would wait forever."""


def queue_order(pod: Waiting) -> tuple[int, int]:
    """Kueue's order: the higher priority first, then first in, first out."""
    return (-pod.priority, pod.seq)


def decide(
    nodes: Sequence[Slot], running: Iterable[Placed], pending: Iterable[Waiting], *, skip_stuck: bool = True
) -> Decisions:
    """One admission pass over the pending pods in queue order.

    A pod starts on the first node that admits its run and has its cores and memory free, in the configured order;
    a run that reserves nodes selects them only, as its pods select the reservation's label on a cluster.
    A pod that fits nowhere looks for a node where stopping running pods of strictly lower priority (lowest first,
    newest first) frees enough; it claims that node, and no pod behind it in the queue is placed on it or preempts
    there while it waits, so lower priorities cannot starve it. Pods stopping already count as freed, so a need is
    preempted for once.

    Within a pass free room only shrinks and a node whose pods are preempted is claimed, so a pod that found neither
    room nor victims is followed by others of its size and priority that cannot either: with `skip_stuck` they are
    passed over at once, and a long queue of alike pods costs a lookup each (False evaluates every pod).

    A pending pod that found neither room nor victims finds none in a later pass over the same running pods with
    only more pods queued while every claim holds (they take room and block nodes, they free none): see
    `decide_arrivals`.
    """
    decisions = Decisions()
    running = list(running)
    free: dict[str, list[float]] = {n.name: [n.cores, n.memory_gb] for n in nodes}
    stopping: dict[str, list[float]] = {n.name: [0.0, 0.0] for n in nodes}
    candidates: dict[str, list[Placed]] = {n.name: [] for n in nodes}
    for placed in running:
        if placed.node not in free:
            continue
        free[placed.node][0] -= placed.cores
        free[placed.node][1] -= placed.memory_gb
        if placed.terminating:
            stopping[placed.node][0] += placed.cores
            stopping[placed.node][1] += placed.memory_gb
        else:
            candidates[placed.node].append(placed)
    blocked: set[str] = set()
    reserving = {n.reserved_by for n in nodes if n.reserved_by is not None}
    stuck: set[tuple[float, float, int]] = set()  # (cores, memory, priority) of pods that found no room, no victims

    for pod in sorted(pending, key=queue_order):
        # A claim or a reservation makes a pod's options its own; any other pod's depend on its shape alone.
        alike = (pod.cores, pod.memory_gb, pod.priority) if pod.claim is None and pod.run_id not in reserving else None
        if skip_stuck and alike in stuck:
            continue
        if not any(_fits(pod, n.cores, n.memory_gb) for n in nodes):
            decisions.unschedulable.append(pod.pod_id)
            continue
        # A run that reserves nodes selects them, as its pods select the node's reservation label on a cluster.
        reserved = [n for n in nodes if n.reserved_by == pod.run_id]
        eligible = [n for n in (reserved or nodes) if n.admits(pod.run_id) and n.name not in blocked]
        target = next((n for n in eligible if _fits(pod, *free[n.name])), None)
        if target is not None:
            free[target.name][0] -= pod.cores
            free[target.name][1] -= pod.memory_gb
            decisions.admit.append((pod.pod_id, target.name))
            if pod.claim is not None:
                decisions.claims[pod.pod_id] = None
            continue
        best: tuple[tuple[int, int, int], str, list[Placed]] | None = None
        for order, node in enumerate(eligible):
            victims = _victims(pod, free[node.name], stopping[node.name], candidates[node.name])
            if victims is None:
                continue
            # Prefer waiting on a node that is freeing up (no victims), then the lowest priorities, then fewest pods.
            key = (max((v.priority for v in victims), default=-(2**31)), len(victims), order)
            if pod.claim == node.name and not victims:
                key = (-(2**31) - 1, 0, -1)
            if best is None or key < best[0]:
                best = (key, node.name, victims)
        if best is None:
            if pod.claim is not None:
                decisions.claims[pod.pod_id] = None
            if alike is not None:
                stuck.add(alike)
            continue
        _, node_name, victims = best
        blocked.add(node_name)
        if pod.claim != node_name:
            decisions.claims[pod.pod_id] = node_name
        if victims:
            decisions.preempt.append(Preemption(pod.pod_id, node_name, tuple(v.pod_id for v in victims)))
            for victim in victims:
                candidates[node_name].remove(victim)
                stopping[node_name][0] += victim.cores
                stopping[node_name][1] += victim.memory_gb
    return decisions


def decide_arrivals(
    nodes: Sequence[Slot],
    running: Sequence[Placed],
    considered: Sequence[Waiting],
    queue: Callable[[], Iterable[Waiting]],
) -> Decisions:
    """The pass over the same running pods as the last one when only pods arrived since: over `considered`, the
    arrived and the claiming pods, which decides as a pass over the whole `queue` would, unless it lapses or moves a
    claim. An arrival of a higher priority can take the node a pod waits on, and the claim that lapses then no
    longer blocks the node for the pods behind it that this pass did not consider; so then the whole queue is
    passed over (`queue` is called only then: a long queue is not listed on every arrival)."""
    decisions = decide(nodes, running, considered)
    if any(pod.claim is not None and pod.pod_id in decisions.claims for pod in considered):
        return decide(nodes, running, queue())
    return decisions


def _fits(pod: Waiting, cores: float, memory_gb: float) -> bool:
    return pod.cores <= cores + _EPS and pod.memory_gb <= memory_gb + _EPS


def _victims(pod: Waiting, free: list[float], stopping: list[float], running: list[Placed]) -> list[Placed] | None:
    """The fewest lower-priority pods to stop on a node so that `pod` fits once they (and those stopping) are gone."""
    cores = free[0] + stopping[0]
    memory = free[1] + stopping[1]
    chosen: list[Placed] = []
    lower = sorted((p for p in running if p.priority < pod.priority), key=lambda p: (p.priority, -p.seq))
    for victim in lower:
        if _fits(pod, cores, memory):
            break
        chosen.append(victim)
        cores += victim.cores
        memory += victim.memory_gb
    if not _fits(pod, cores, memory):
        return None
    # As Kueue does after its greedy pass: give back any victim the pod does not need, the most valuable first.
    for victim in reversed(list(chosen)):
        if _fits(pod, cores - victim.cores, memory - victim.memory_gb):
            chosen.remove(victim)
            cores -= victim.cores
            memory -= victim.memory_gb
    return chosen
