"""Reads of a big finished run: GetRun of a 100,000-unit run beside a 40-unit one, and the run's disk per unit.

Both runs go through a real embedded server on loopback (the environment is the server's Python), with a model
made here whose units return a small JSON value (no file per unit). After both have ended, GetRun of each is timed
over many calls (medians), and the store folder of each run is counted: bytes and inodes per unit.
Goal (issue 12): GetRun of the big run within 2x of the small run's. Before this wave the issue measured 176 ms
against 0.8 ms, and 8 KB and 3 inodes per unit.

    uv run --frozen python benchmarks/big_run_reads.py [--units 100000] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_core.config import EnvironmentsConfig, NodeConfig, ServerConfig
from simrun_core.rpc.auth import bearer_metadata
from simrun_gateway.embedded import start_embedded

TOKEN = "bench-token"
MODEL = '''
from simrun_runtime import SplitTaskType, TaskSettings, ResourceHint


class TinySettings(TaskSettings):
    units: int = 40


class Tiny(SplitTaskType):
    """Units that return their index squared; the merge sums them."""

    Settings = TinySettings
    outputs = ("total",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings):
        return settings.units

    def compute_unit(self, settings, index, unit):
        return index * index

    def merge(self, settings, merge):
        total = sum(value for _, value in merge.values())
        (merge.outputs["total"] / "total.txt").write_text(str(total))
        return {"total": total}
'''


def model_repo(dest: Path) -> Path:
    (dest / "tinymodel").mkdir(parents=True)
    (dest / "tinymodel" / "__init__.py").write_text("")
    (dest / "tinymodel" / "tasks.py").write_text(MODEL)
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def disk_use(root: Path) -> tuple[int, int]:
    """Bytes (allocated) and inodes under `root`."""
    blocks = inodes = 0
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            stat = os.lstat(Path(folder) / name)
            blocks += stat.st_blocks * 512
            inodes += 1
    return blocks, inodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokens = root / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
        config = ServerConfig(
            home=root / "home",
            store=root / "store",
            address="127.0.0.1:0",
            tokens_file=tokens,
            nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
            environments=EnvironmentsConfig(kind="server"),
        )
        model = model_repo(root / "tiny")
        server = start_embedded(config)
        try:
            with Client(server.address, TOKEN) as client:
                runs = {}
                for label, units in (("small", 40), ("big", args.units)):
                    workflow = model / f"{label}.yaml"
                    workflow.write_text(
                        f"tasks:\n  sum:\n    type: tinymodel.tasks:Tiny\n    settings: {{units: {units}}}\n"
                    )
                    began = time.monotonic()
                    run = client.submit(workflow)
                    final = client.wait(run.run_id, timeout_s=1800)
                    assert final.state == 4, final.message  # SUCCEEDED
                    runs[label] = (run.run_id, units, time.monotonic() - began)
                stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
                metadata = bearer_metadata(TOKEN)
                figures = {}
                for label, (run_id, units, wall) in runs.items():
                    request = tracker_pb2.GetRunRequest(run_id=run_id)
                    stub.GetRun(request, metadata=metadata)
                    times = []
                    for _ in range(args.calls):
                        start = time.perf_counter()
                        stub.GetRun(request, metadata=metadata)
                        times.append(time.perf_counter() - start)
                    size, inodes = disk_use(config.store / "runs" / run_id)
                    figures[label] = statistics.median(times)
                    print(
                        f"{label:5s} {units:7d} units: ran in {wall:6.1f} s; GetRun median "
                        f"{figures[label] * 1e3:6.2f} ms; {size / units:9.1f} bytes and {inodes / units:7.4f} "
                        f"inodes per unit ({size / 1e6:.1f} MB, {inodes} inodes)"
                    )
                print(f"GetRun big / small: {figures['big'] / figures['small']:.2f} (goal <= 2)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
