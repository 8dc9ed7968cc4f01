"""What reuse saves: the wall time of a resubmission whose every task is reused, beside the first run that computed
them, on the embedded server of this machine.

A workflow of a 10,000-unit split task and a task reading its output. The first run computes everything; then the
same workflow is submitted again several times (the snapshot is made again, each time unchanged): each resubmission
finds both tasks' keys and hard-links their outputs, from submission (snapshot included) to SUCCEEDED.

Goal (issue 15): a resubmission with everything reused under 1 s for a 10,000-unit task.

    uv run --frozen python benchmarks/reuse_bench.py [--units 10000] [--repeats 5]
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
from simrun.v1 import common_pb2
from simrun_client.client import Client
from simrun_core.config import NodeConfig, ServerConfig
from simrun_gateway.embedded import start_embedded

MODEL = Path(__file__).resolve().parents[1] / "tests" / "e2e_model"
TOKEN = "bench-token"


def model_repo(dest: Path) -> Path:
    shutil.copytree(MODEL, dest, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def timed_run(client: Client, workflow: Path, **options: object) -> tuple[float, common_pb2.Run]:
    start = time.perf_counter()
    run = client.submit(workflow, **options)  # type: ignore[arg-type]
    final = client.wait(run.run_id)
    wall = time.perf_counter() - start
    if final.state != common_pb2.RUN_STATE_SUCCEEDED:
        raise SystemExit(f"run {run.run_id} ended {final.state}: {final.message}")
    return wall, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokens = root / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
        config = ServerConfig(
            home=root,
            store=root / "store",
            address="127.0.0.1:0",
            tokens_file=tokens,
            nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        )
        server = start_embedded(config)
        try:
            model = model_repo(root / "model")
            workflow = model / "bench.yaml"
            workflow.write_text(
                "tasks:\n"
                f"  values:\n    type: e2etasks.tasks:Slow\n    settings: {{units: {args.units}, seconds: 0}}\n"
                "  total:\n    type: e2etasks.tasks:Sum\n    inputs: {values: values.values}\n"
            )
            with Client(server.address, TOKEN) as client:
                first, computed = timed_run(client, workflow)
                walls = []
                for _ in range(args.repeats):
                    wall, final = timed_run(client, workflow)
                    reused = [t.task_id for t in final.tasks if t.HasField("reused_from")]
                    if reused != ["values", "total"]:
                        raise SystemExit(f"expected every task reused, got {reused}")
                    walls.append(wall)
        finally:
            server.stop()
    wall = statistics.median(walls)
    print(f"a {args.units:,}-unit split task and a task reading it, submission (snapshot included) to success:")
    print(f"  first run, computed:        {first:7.2f} s   (run {computed.run_id})")
    each = ", ".join(f"{w:.3f}" for w in walls)
    print(f"  resubmitted, all reused:    {wall:7.3f} s   median of {args.repeats}: {each}")
    print(f"  ratio reused / computed:    {wall / first:7.3f}")
    print("goal: a resubmission with everything reused under 1 s")


if __name__ == "__main__":
    main()
