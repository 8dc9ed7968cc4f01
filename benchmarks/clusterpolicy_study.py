"""The clusterpolicy study's wall time through simrun beside the same episodes in one process with
multiprocessing.Pool (goal: at most 1.1 times).

A `simrun server` process in a fresh home serves a copy of the repository (the example and the simulator it
depends on by path); a first study with other seeds builds the environment, so the figure is a study's run, not
an environment's build. Each repeat submits `examples/clusterpolicy/study.yaml` with `--reuse never` and times
`simrun submit --watch` from its start to `succeeded`; the baseline trains the same policies, runs the same
episodes with a Pool of one process per core and writes the same table. Medians of `--repeats`.

    uv run --frozen python benchmarks/clusterpolicy_study.py [--repeats 3] [--hours 6]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples" / "clusterpolicy"))

from clusterpolicy.episodes import FlowSpec, make_flow, policy_of, run_episode, train_q_table  # noqa: E402
from clusterpolicy.tasks import (  # noqa: E402
    TRAINING_SEED,
    Episodes,
    Rank,
    TrainPolicies,
    episode_list,
    training_pairs,
    write_table,
)
from e2e_support import research_tree  # noqa: E402
from simrun_runtime.tasktype import ExecContext  # noqa: E402

SIMRUN = Path(sys.executable).parent / "simrun"


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def study_settings(workflow: dict[str, Any]) -> tuple[TrainPolicies.Settings, Episodes.Settings]:
    tasks = workflow["tasks"]
    return (
        TrainPolicies.Settings(**tasks["train"]["settings"]),
        Episodes.Settings(**tasks["episodes"]["settings"]),
    )


def _train(job: tuple[str, int, TrainPolicies.Settings]) -> dict[str, Any]:
    flow, seed, s = job
    flows = [make_flow(FlowSpec(flow, TRAINING_SEED + seed + k, s.hours)) for k in range(2)]
    return {"flow": flow, "seed": seed, "q": train_q_table(flows, seed, s.episodes, s.alpha, s.gamma, s.epsilon)}


def _episode(job: tuple[str, str, int, float, Any]) -> dict[str, Any]:
    policy, flow_name, seed, hours, q_table = job
    flow = make_flow(FlowSpec(flow_name, seed, hours))
    report = run_episode(flow, policy_of(policy, len(flow.machines), q_table), seed)
    return {"policy": policy, "flow": flow_name, "seed": seed, **report}


def baseline(workflow: dict[str, Any], out: Path) -> float:
    """Seconds to train and run the study's episodes with multiprocessing.Pool, write its table and rank it, as the
    study's three tasks do."""
    train, episodes = study_settings(workflow)
    rank = Rank.Settings(**workflow["tasks"]["rank"].get("settings", {}))
    start = time.perf_counter()
    with multiprocessing.Pool(os.cpu_count()) as pool:
        learned = pool.map(_train, [(flow, seed, train) for flow, seed in training_pairs(train)], chunksize=1)
        q = {(p["flow"], p["seed"]): p["q"] for p in learned}
        jobs = [
            (policy, flow, seed, episodes.hours, q[(flow, seed)] if policy == "learned" else None)
            for policy, flow, seed in episode_list(episodes, episodes.policies)
        ]
        rows = pool.map(_episode, jobs, chunksize=1)
    (out / "table").mkdir(parents=True)
    (out / "report").mkdir()
    write_table(out / "table" / "episodes.csv", rows)
    context = ExecContext(
        inputs={"table": out / "table"},
        outputs={"report": out / "report"},
        scratch_dir=out,
        model_root=out,
        task_id="rank",
    )
    Rank().run(rank, context)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hours", type=float, default=None, help="episode length (default: the workflow's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clusterpolicy-bench-") as folder:
        root = Path(folder)
        model = research_tree(root / "repo")
        workflow = yaml.safe_load((model / "study.yaml").read_text())
        if args.hours is not None:
            for task in ("train", "episodes"):
                workflow["tasks"][task]["settings"]["hours"] = args.hours
        (model / "timed.yaml").write_text(yaml.safe_dump(workflow))
        warm = json.loads(json.dumps(workflow))
        for task in ("train", "episodes"):
            warm["tasks"][task]["settings"]["seeds"] = [999]
            warm["tasks"][task]["settings"]["hours"] = 0.25
        warm["tasks"]["episodes"]["settings"]["policies"] = ["constant-0-0", "learned"]
        (model / "warm.yaml").write_text(yaml.safe_dump(warm))
        home = root / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMRUN_", "VIRTUAL_ENV"))}
        env.update(
            HOME=str(home),
            SIMRUN_ENDPOINT=free_address(),
            SIMRUN_WEB_ADDRESS="127.0.0.1:0",
            UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
        )
        log = (root / "server.log").open("w")
        server = subprocess.Popen([str(SIMRUN), "server"], env=env, stdout=log, stderr=subprocess.STDOUT)

        def cli(*command: str) -> str:
            done = subprocess.run(
                [str(SIMRUN), *command], cwd=model, env=env, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            return done.stdout

        try:
            cli("whoami", "--wait", "60")
            cli("submit", "warm.yaml", "--watch")  # builds the environment and the run overlay's packages
            train, episodes = study_settings(workflow)
            units = len(training_pairs(train)) + len(episode_list(episodes, episodes.policies))
            print(f"study: {units} units ({len(training_pairs(train))} trainings, then the episodes), one core each")
            simrun_s, pool_s = [], []
            for repeat in range(args.repeats):
                start = time.perf_counter()
                out = cli("submit", "timed.yaml", "--watch", "--reuse", "never")
                simrun_s.append(time.perf_counter() - start)
                assert " succeeded" in out, out
                pool_s.append(baseline(workflow, root / f"baseline-{repeat}"))
                print(f"repeat {repeat + 1}: simrun {simrun_s[-1]:.1f} s, Pool {pool_s[-1]:.1f} s")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
            log.close()
    simrun, pool = statistics.median(simrun_s), statistics.median(pool_s)
    paired = statistics.median(s / p for s, p in zip(simrun_s, pool_s, strict=True))
    print(
        f"| the whole study, submit to succeeded | {simrun:.1f} s | multiprocessing.Pool({os.cpu_count()}), "
        f"{pool:.1f} s | {paired:.2f} (median of the repeats' ratios; {simrun / pool:.2f} of the medians) | ≤ 1.1 |"
    )


if __name__ == "__main__":
    main()
