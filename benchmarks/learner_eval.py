"""Replays synthetic runs through the resource learner and compares its requests with the hint and with Kubernetes' VPA.

Every run of a key has a few pods of a few processes; each pod's peak memory per process is drawn from the key's
distribution at that point of the sequence (drifting means, rare spikes, and a task type whose cost setting changes
its memory tenfold). Three policies request memory per process for each pod:

- hint: the task type's resource hint, always;
- simrun: `ResourceLearner.resolve` over the observations recorded so far (the pods' reports, one per incarnation);
- vpa: Kubernetes' Vertical Pod Autoscaler: the 90th percentile of the peaks plus a 15% margin; a pod killed for
  memory adds the sample max(1.2 x usage, usage + 100 MiB). VPA keys by workload (task type and model): it does not
  know the cost setting.

A pod whose peak exceeds its request is killed at a random point of its run and retried: by simrun's rule with 1.5
times the memory per process (hint and simrun; a second kill fails the run), by VPA's with its bumped
recommendation until it fits. Reported per key and overall: the mean slack (request over the measured peak, minus
one, of the attempt that completed), the share of pods killed for memory, of pods killed again on their retry, and
the GiB-hours requested (killed attempts included). Google's Autopilot reports 23% slack.

Run: `uv run --frozen python benchmarks/learner_eval.py [--seed N] [--runs N]`.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from simrun_core.resources import ResolvedResources
from simrun_learner import Observation, ObservationKey, ResourceLearner, percentile

MIB = 1 / 1024
PROCESSES = 8
MODEL = "pkmodel"


@dataclass(frozen=True)
class Workload:
    """A key's memory per process over its runs: a drifting median, lognormal noise, rare spikes."""

    label: str
    task_type: str
    cost_value: str
    hint_gb: float
    start_gb: float
    end_gb: float
    sigma: float = 0.05
    spike_p: float = 0.0
    pods: int = 4

    def median_gb(self, progress: float) -> float:
        return self.start_gb + (self.end_gb - self.start_gb) * progress


WORKLOADS = [
    Workload("steady", "scan:Scan", "", hint_gb=4.0, start_gb=2.0, end_gb=2.0),
    Workload("drift-up", "fit:FitA", "", hint_gb=2.0, start_gb=1.0, end_gb=2.2),
    Workload("drift-down", "fit:FitB", "", hint_gb=2.0, start_gb=3.0, end_gb=1.5),
    Workload("spiky", "sim:Sim", "", hint_gb=2.5, start_gb=1.5, end_gb=1.5, sigma=0.06, spike_p=0.03),
    Workload("cost 1e3", "mc:Pi", "1000", hint_gb=1.0, start_gb=0.3, end_gb=0.3),
    Workload("cost 1e4", "mc:Pi", "10000", hint_gb=1.0, start_gb=3.0, end_gb=3.0),
]


@dataclass
class Tally:
    """What one policy requested and what became of its pods."""

    slacks: list[float] = field(default_factory=list)
    pods: int = 0
    killed: int = 0
    killed_again: int = 0
    gib_hours: float = 0.0

    def add(self, other: Tally) -> None:
        self.slacks += other.slacks
        self.pods += other.pods
        self.killed += other.killed
        self.killed_again += other.killed_again
        self.gib_hours += other.gib_hours


class Vpa:
    """The VPA recommender, per workload: p90 of the peak samples plus 15%; a kill adds a bumped sample."""

    def __init__(self, history: int = 80) -> None:
        self._samples: dict[str, list[float]] = defaultdict(list)
        # VPA keeps days of decaying history; here the last `history` samples (20 runs of 4 pods).
        self._history = history

    def request(self, workload: str, hint_gb: float) -> float:
        samples = self._samples[workload][-self._history :]
        return percentile(samples, 90) * 1.15 if samples else hint_gb

    def bump(self, usage_gb: float) -> float:
        # Per process: the pod's usage at the kill is its limit, PROCESSES times the request per process.
        return max(1.2 * usage_gb, usage_gb + 100 * MIB / PROCESSES)

    def observe(self, workload: str, peak_gb: float) -> None:
        self._samples[workload].append(peak_gb)


def run_pod(request_gb: float, peak_gb: float, hours: float, kill_at: float, retry_gb: float | None) -> tuple:
    """One pod: (killed, killed again, GiB-hours, the request that completed or None)."""
    if peak_gb <= request_gb:
        return False, False, request_gb * PROCESSES * hours, request_gb
    spent = request_gb * PROCESSES * hours * kill_at
    assert retry_gb is not None
    if peak_gb <= retry_gb:
        return True, False, spent + retry_gb * PROCESSES * hours, retry_gb
    return True, True, spent + retry_gb * PROCESSES * hours * kill_at, None


def replay(seed: int, runs_per_key: int, db: Path) -> dict[str, dict[str, Tally]]:
    rng = np.random.default_rng(seed)
    # The runs of the keys interleave at random, the two cost values of mc:Pi among them.
    order = [w for w in WORKLOADS for _ in range(runs_per_key)]
    rng.shuffle(order)
    done: dict[str, int] = defaultdict(int)
    tallies: dict[str, dict[str, Tally]] = defaultdict(lambda: defaultdict(Tally))
    vpa = Vpa()
    with ResourceLearner(db) as learner:
        for number, workload in enumerate(order):
            progress = done[workload.label] / max(runs_per_key - 1, 1)
            done[workload.label] += 1
            key = ObservationKey(workload.task_type, MODEL, workload.cost_value)
            hint = ResolvedResources(base_memory_gb=0, per_worker_gb=workload.hint_gb)
            spikes = np.where(rng.random(workload.pods) < workload.spike_p, rng.uniform(1.5, 2.0, workload.pods), 1)
            noise = rng.lognormal(0, workload.sigma, workload.pods)
            peaks = workload.median_gb(progress) * noise * spikes
            hours = rng.lognormal(0, 0.5)
            kill_at = rng.uniform(0.2, 1.0, workload.pods)
            run_id = f"run-{number}"

            simrun_gb = learner.resolve(key, hint).per_worker_gb
            vpa_gb = vpa.request(workload.task_type, workload.hint_gb)
            pending: list[Observation] = []
            outcomes = []
            for pod, peak in enumerate(peaks):
                tally = tallies[workload.label]
                for name, request, retry in (
                    ("hint", workload.hint_gb, 1.5 * workload.hint_gb),
                    ("simrun", simrun_gb, 1.5 * simrun_gb),
                    ("vpa", vpa_gb, _vpa_retry(vpa, vpa_gb, peak)),
                ):
                    killed, again, gib_h, completed = run_pod(request, peak, hours, kill_at[pod], retry)
                    t = tally[name]
                    t.pods += 1
                    t.killed += killed
                    t.killed_again += again
                    t.gib_hours += gib_h
                    if completed is not None:
                        t.slacks.append(completed / peak - 1)
                    if name == "simrun":
                        outcomes.append((peak, killed, again))
                    if name == "vpa":
                        if killed:
                            vpa.observe(workload.task_type, vpa.bump(request))
                        vpa.observe(workload.task_type, peak)
            succeeded = not any(again for _, _, again in outcomes)
            for peak, killed, again in outcomes:
                # The killed incarnation's report saw at most its limit; its retry's report saw the whole peak.
                limit = simrun_gb
                if killed:
                    pending.append(_killed(key, limit, succeeded, run_id))
                    retry = 1.5 * simrun_gb
                    pending.append(
                        _killed(key, retry, succeeded, run_id) if again else _seen(key, peak, succeeded, run_id)
                    )
                else:
                    pending.append(_seen(key, peak, succeeded, run_id))
            learner.record_all(pending)
    return tallies


def _vpa_retry(vpa: Vpa, request_gb: float, peak_gb: float) -> float:
    """VPA restarts a killed pod with its bumped recommendation, again and again until it fits."""
    retry = vpa.bump(request_gb)
    while retry < peak_gb:
        retry = vpa.bump(retry)
    return retry


def _seen(key: ObservationKey, peak_gb: float, succeeded: bool, run_id: str) -> Observation:
    return Observation(key, peak_gb, succeeded=succeeded, run_id=run_id)


def _killed(key: ObservationKey, limit_gb: float, succeeded: bool, run_id: str) -> Observation:
    return Observation(key, limit_gb, oom_killed=True, oom_per_worker_gb=limit_gb, succeeded=succeeded, run_id=run_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--runs", type=int, default=60, help="runs per key")
    args = parser.parse_args()
    # SQLite commits every observation; a RAM-backed folder keeps the replay to seconds where there is one.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        tallies = replay(args.seed, args.runs, Path(tmp) / "observations.sqlite")
    total: dict[str, Tally] = defaultdict(Tally)
    print(f"seed {args.seed}, {args.runs} runs per key, {PROCESSES} processes a pod; Autopilot reports 23% slack")
    print(f"{'key':<11} {'policy':<7} {'mean slack':>10} {'killed':>7} {'again':>6} {'GiB-hours':>10}")
    for workload in WORKLOADS:
        for name, tally in tallies[workload.label].items():
            total[name].add(tally)
            print(_row(workload.label, name, tally))
    for name, tally in total.items():
        print(_row("all", name, tally))


def _row(label: str, name: str, tally: Tally) -> str:
    slack = f"{100 * float(np.mean(tally.slacks)):.1f}%" if tally.slacks else "-"
    return (
        f"{label:<11} {name:<7} {slack:>10} {100 * tally.killed / tally.pods:>6.1f}% "
        f"{100 * tally.killed_again / tally.pods:>5.1f}% {tally.gib_hours:>10.0f}"
    )


if __name__ == "__main__":
    main()
