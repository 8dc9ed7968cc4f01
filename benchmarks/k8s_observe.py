"""Benchmark of the kubernetes executor's observation path: informer events -> pod statuses -> driver steps.

A fake API server (the tests' `kubernetes_fake_api`, in a child process so its HTTP work does not share this
process's interpreter) holds 100 nodes; 50 runs of 5 split tasks of 8 pods (2,000 pods) are handed to the executor;
the child then plays Argo and Kueue, moving every pod pending -> running -> succeeded (6,000 pod events) as fast as
it can and stamping each change. Here a driver thread wakes on the executor's listener and reads `pods(run)` per
woken run, as the tracker's driver does. Figures, medians of ``--runs`` runs:

* events/s: pod events over the seconds from the first change to the driver seeing the last;
* latency: from a pod's change in the API to the driver's step that sees it (median and 95th percentile).

Baseline in the same run: the same 2,000 pods (`/bin/sh -c 'date +%s.%N'`, each stamping its own end) through the
local executor on 100 nodes, with the same driver: its events/s, and its latency from a pod's exit to the step.

Run from the repository root: ``uv run --frozen python benchmarks/k8s_observe.py`` (``--runs N``, ``--pods-per-task``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services" / "tracker" / "tests"))

from kubernetes_fake_api import ArgoScript, FakeApiServer, node  # noqa: E402
from kubernetes_runs import task  # noqa: E402
from simrun_planner import Node  # noqa: E402
from simrun_runtime.layout import StoreLayout  # noqa: E402
from simrun_tracker.executor import PodPhase, RunSpec  # noqa: E402

RUNS, TASKS, NODES = 50, 5, 100
FINAL = {PodPhase.SUCCEEDED, PodPhase.FAILED}


def runs(pods_per_task: int) -> list[RunSpec]:
    specs = []
    for r in range(RUNS):
        run_id = f"20261201-0800{r // 10:02d}-{r:06x}"
        specs.append(
            RunSpec(
                run_id,
                [
                    task(run_id, f"t{t}", pods_per_task, cores=1, memory_gb=1.0, retry_memory_gb=1.5, processes=1)
                    for t in range(TASKS)
                ],
            )
        )
    return specs


class Driver:
    """Wakes on the executor's listener and reads `pods(run)` for each woken run; stamps what each step sees."""

    def __init__(self, executor, expected: int) -> None:
        self.executor = executor
        self.expected = expected
        self.dirty: set[str] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.seen: dict[tuple[str, str], float] = {}
        self.done = threading.Event()
        self.steps = 0
        executor.subscribe(self.notify)
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def notify(self, run_id: str) -> None:
        with self.lock:
            self.dirty.add(run_id)
        self.wake.set()

    def loop(self) -> None:
        while not self.done.is_set():
            self.wake.wait(0.5)
            self.wake.clear()
            with self.lock:
                woken, self.dirty = self.dirty, set()
            for run_id in woken:
                now = time.time()
                self.steps += 1
                for status in self.executor.pods(run_id):
                    key = (status.spec.pod_id, status.phase.value)
                    if status.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) and key not in self.seen:
                        self.seen[key] = now
            if sum(1 for (_, phase) in self.seen if phase == "succeeded") >= self.expected:
                self.done.set()


def _play(url_queue, stamps_queue, done_queue, specs: list[RunSpec]) -> None:
    """The child: the fake API, then Argo and Kueue moving every pod through its life as fast as it can."""
    with FakeApiServer() as server:
        cluster = server.cluster
        cluster.bookmark_s = 5.0
        for n in range(NODES):
            cluster.put("nodes", node(f"node-{n:03d}", 32, 128))
        url_queue.put(server.url)
        argo = ArgoScript(cluster)
        while len(cluster.items("workflows")) < len(specs):
            time.sleep(0.01)
        stamps: dict[tuple[str, str], float] = {}
        names: dict[str, str] = {}
        for spec in specs:
            for t in spec.tasks:
                for pod in t.pods:
                    template = f"{t.task_id}-w0" if pod.worker == "w0" else f"{t.task_id}-extra"
                    names[pod.pod_id] = argo.create_pod(spec.run_id, template, pod.worker)
        for step, phase in ((lambda n: argo.admit(n, "node-000"), "running"), (lambda n: argo.exit(n, 0), "succeeded")):
            for pod_id, name in names.items():
                step(name)
                stamps[(pod_id, phase)] = time.time()
        stamps_queue.put(stamps)
        done_queue.get()  # until the parent has seen everything


def kubernetes_once(specs: list[RunSpec]) -> tuple[float, list[float]]:
    from kubernetes import client as k8s
    from simrun_tracker.kubernetes.adapter import KubernetesExecutor
    from simrun_tracker.kubernetes.config import KubernetesSettings

    context = multiprocessing.get_context("fork")
    urls, stamps_queue, done_queue = context.Queue(), context.Queue(), context.Queue()
    child = context.Process(target=_play, args=(urls, stamps_queue, done_queue, specs), daemon=True)
    child.start()
    url = urls.get(timeout=60)
    configuration = k8s.Configuration()
    configuration.host = url
    with tempfile.TemporaryDirectory() as tmp:
        executor = KubernetesExecutor(
            KubernetesSettings(watch_timeout_s=60), StoreLayout(Path(tmp)), client=k8s.ApiClient(configuration)
        )
        pods = sum(len(t.pods) for s in specs for t in s.tasks)
        driver = Driver(executor, pods)
        for spec in specs:
            executor.start_run(spec)
        stamps = stamps_queue.get(timeout=600)
        driver.done.wait(600)
        executor.close()
        done_queue.put("done")
        child.join(timeout=30)
    events = len(stamps) + pods  # the created pods' events too
    first = min(stamps.values())
    elapsed = max(driver.seen.values()) - first
    latencies = [driver.seen[k] - v for k, v in stamps.items() if k in driver.seen]
    return events / elapsed, latencies


def local_once(specs: list[RunSpec]) -> tuple[float, list[float]]:
    from simrun_tracker.local import LocalExecutor

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        ends = store / "ends"
        ends.mkdir()

        def launch(spec) -> list[str]:
            return ["/bin/sh", "-c", f"date +%s.%N > {ends}/{spec.pod_id}"]

        nodes = [Node(f"node-{n:03d}", 32, 128.0) for n in range(NODES)]
        executor = LocalExecutor(store, launch, nodes=nodes, cgroup_root=None, poll_s=0.1)
        for spec in specs:
            (store / "runs" / spec.run_id).mkdir(parents=True)
        pods = [p for s in specs for t in s.tasks for p in t.pods]
        driver = Driver(executor, len(pods))
        start = time.time()
        executor.start_pods(pods)
        driver.done.wait(900)
        executor.close()
        ended = {p.pod_id: float((ends / p.pod_id).read_text()) for p in pods if (ends / p.pod_id).exists()}
    events = 2 * len(pods)
    elapsed = max(driver.seen.values()) - start
    latencies = [driver.seen[(k, "succeeded")] - v for k, v in ended.items() if (k, "succeeded") in driver.seen]
    return events / elapsed, latencies


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pods-per-task", type=int, default=8)
    args = parser.parse_args()
    specs = runs(args.pods_per_task)
    total = sum(len(t.pods) for s in specs for t in s.tasks)
    print(f"{RUNS} runs, {total} pods, {NODES} nodes; medians of {args.runs} runs (started {datetime.now():%H:%M})")
    results = {}
    for name, once in (("kubernetes", kubernetes_once), ("local", local_once)):
        rates, medians, tails = [], [], []
        for _ in range(args.runs):
            rate, latencies = once(specs)
            rates.append(rate)
            medians.append(statistics.median(latencies))
            tails.append(p95(latencies))
        results[name] = (statistics.median(rates), statistics.median(medians), statistics.median(tails))
    k, b = results["kubernetes"], results["local"]
    print(f"{'':24}{'kubernetes':>12}{'local':>12}{'ratio':>8}")
    print(f"{'events/s kept up with':24}{k[0]:12.0f}{b[0]:12.0f}{k[0] / b[0]:8.2f}")
    print(f"{'latency median, ms':24}{k[1] * 1000:12.1f}{b[1] * 1000:12.1f}{k[1] / b[1]:8.2f}")
    print(f"{'latency p95, ms':24}{k[2] * 1000:12.1f}{b[2] * 1000:12.1f}{k[2] / b[2]:8.2f}")


if __name__ == "__main__":
    main()
