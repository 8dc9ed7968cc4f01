"""SubmitRun latency and the wall time of a small split run, on the embedded server of this machine.

1. SubmitRun: median and 99th percentile over many submissions of a workflow with a 10,000-unit task, beside a
   GetIdentity round trip (the cost of one authenticated gRPC call) measured in the same run. The tracker's
   driver is not started here, so the submissions are not also computed while they are measured: SubmitRun only
   records a run and returns (everything after it happens in the background anyway).
2. A 200-unit task of 50 ms units on one pod of 2 processes, from submission (snapshot included) to success,
   divided by the ideal (units x seconds / processes); medians of several runs.

Goals (issue 6): p99 under 100 ms; ratio under 1.25 plus 3 s of start-up.

    uv run --frozen python benchmarks/e2e_submit.py [--submissions 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_client.snapshots import upload_snapshot
from simrun_core.config import NodeConfig, ServerConfig
from simrun_core.rpc.auth import bearer_metadata
from simrun_core.snapshots.convert import snapshot_to_proto
from simrun_gateway.embedded import start_embedded

MODEL = Path(__file__).resolve().parents[1] / "tests" / "e2e_model"
TOKEN = "bench-token"


def model_repo(dest: Path) -> Path:
    shutil.copytree(MODEL, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return model_repo_at(dest)


def model_repo_at(dest: Path) -> Path:
    """Makes `dest` a git repository with everything in it committed."""
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def config(root: Path, cores: int) -> ServerConfig:
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
    return ServerConfig(
        home=root,
        store=root / "store",
        address="127.0.0.1:0",
        tokens_file=tokens,
        nodes=[NodeConfig(name="node-a", cores=cores, memory_gb=8)],
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def submit_latency(root: Path, submissions: int) -> None:
    server = start_embedded(config(root, cores=2), drive_runs=False)
    try:
        model = model_repo(root / "model")
        with Client(server.address, TOKEN) as client:
            snapshot = snapshot_to_proto(upload_snapshot(model, client.channel).snapshot)
            stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
            gateway = gateway_pb2_grpc.GatewayServiceStub(client.channel)
            metadata = bearer_metadata(TOKEN)
            workflow = "tasks:\n  scan:\n    type: e2etasks.tasks:Slow\n    settings: {units: 10000, seconds: 0.01}\n"
            request = tracker_pb2.SubmitRunRequest(workflow=workflow, snapshots=[snapshot])
            start = time.perf_counter()
            stub.SubmitRun(request, metadata=metadata)
            cold = time.perf_counter() - start
            latencies = []
            for _ in range(submissions):
                start = time.perf_counter()
                stub.SubmitRun(request, metadata=metadata)
                latencies.append(time.perf_counter() - start)
            baseline = []
            for _ in range(submissions):
                start = time.perf_counter()
                gateway.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=metadata)
                baseline.append(time.perf_counter() - start)
    finally:
        server.stop()
    median, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    base = statistics.median(baseline)
    print(
        f"SubmitRun, {submissions} submissions of a 10,000-unit task (one cold submission first: {cold * 1e3:.0f} ms):"
    )
    print(f"  median {median * 1e3:7.1f} ms   p99 {p99 * 1e3:7.1f} ms   (goal: p99 < 100 ms)")
    print(f"  GetIdentity round trip, median {base * 1e3:.2f} ms: SubmitRun median is {median / base:.1f}x one call")


def wall_ratio(root: Path, repeats: int, units: int = 200, unit_s: float = 0.05, processes: int = 2) -> None:
    ideal = units * unit_s / processes
    walls = []
    for repeat in range(repeats):
        run_root = root / f"wall-{repeat}"
        run_root.mkdir()
        server = start_embedded(config(run_root, cores=processes))
        try:
            model = model_repo(run_root / "model")
            workflow = model / "bench.yaml"
            workflow.write_text(
                f"tasks:\n  scan:\n    type: e2etasks.tasks:Slow\n    settings: {{units: {units}, seconds: {unit_s}}}\n"
            )
            with Client(server.address, TOKEN) as client:
                start = time.perf_counter()
                run = client.submit(workflow)
                assert run.tasks[0].plan.pods == 1 and run.tasks[0].plan.shape.processes == processes
                final = client.wait(run.run_id)
                walls.append(time.perf_counter() - start)
                assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
        finally:
            server.stop()
    wall = statistics.median(walls)
    print(f"{units} units of {unit_s * 1e3:.0f} ms on {processes} processes, submission to success, {repeats} runs:")
    print(f"  wall {', '.join(f'{w:.2f}' for w in walls)} s, median {wall:.2f} s; ideal {ideal:.2f} s")
    goal = 1.25 * ideal + 3
    print(f"  ratio {wall / ideal:.2f}; goal: wall under 1.25 x ideal + 3 s = {goal:.2f} s (ratio {goal / ideal:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "latency").mkdir()
        submit_latency(root / "latency", args.submissions)
        wall_ratio(root, args.repeats)


if __name__ == "__main__":
    main()
