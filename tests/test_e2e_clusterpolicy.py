"""The clusterpolicy study through a `simrun server` process and the CLI: a reduced study (three policies, two
seeds, both flows) to `succeeded`, its table checked bit for bit against the same episodes run here directly
through ClusterEnv, then a study with one more seed that computes only that seed's units."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from cluster_sim.envs import ClusterEnv
from e2e_support import research_tree

REPO = Path(__file__).resolve().parents[1]
SIMRUN = Path(sys.executable).parent / "simrun"

STUDY = """\
name: small-study
group: clusterpolicy
tasks:
  train:
    type: clusterpolicy.tasks:TrainPolicies
    settings:
      <<: &study
        seeds: {seeds}
        flows: [synthetic, alibaba]
        hours: 1
      episodes: 2
  episodes:
    type: clusterpolicy.tasks:Episodes
    inputs:
      policies: train.policies
    settings:
      <<: *study
      policies: [constant-0-0, queue-aware, learned]
  rank:
    type: clusterpolicy.tasks:Rank
    inputs:
      table: episodes.table
"""
POLICIES = 3
FLOWS = ("synthetic", "alibaba")


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def episode_directly(flow: object, act: object, seed: int) -> dict[str, float]:
    """One episode through ClusterEnv, written here: the reference the study's table must equal bit for bit."""
    env = ClusterEnv(flow)
    observation, _ = env.reset(seed=seed)
    while True:
        observation, _, terminated, truncated, info = env.step(act(observation))  # type: ignore[operator]
        if terminated or truncated:
            break
    report = info["report"]
    return {
        "cost": report["cost"]["total"],
        "unfinished": report["unfinished"],
        "online_shortfall": report["cost"]["online_shortfall"],
        "restricted_flow_time": report["restricted_flow_time"],
    }


def run_record(home: Path, run_id: str) -> dict:
    return json.loads((home / ".simrun" / "store" / "runs" / run_id / "run.json").read_text())


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reduced_study_matches_cluster_env_and_one_more_seed_computes_only_its_units(tmp_path: Path) -> None:
    model = research_tree(tmp_path / "repo")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMRUN_", "VIRTUAL_ENV"))}
    env.update(
        HOME=str(home),
        SIMRUN_ENDPOINT=free_address(),
        SIMRUN_WEB_ADDRESS="127.0.0.1:0",
        UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
        COLUMNS="160",
    )
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([str(SIMRUN), "server"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def cli(*args: str) -> str:
            done = subprocess.run(
                [str(SIMRUN), *args], cwd=model, env=env, capture_output=True, text=True, timeout=240, check=False
            )
            assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "server.log").read_text()[-3000:]
            return done.stdout

        cli("whoami", "--wait", "60")
        (model / "study.yaml").write_text(STUDY.format(seeds="[1, 2]"))
        out = cli("submit", "study.yaml", "--watch")
        first = run_record(home, out.split()[2])
        assert first["state"] == "succeeded", out
        # The simulator is a snapshot of its own, so its code is in the study's provenance and its units' keys.
        assert [s["name"] for s in first["snapshots"]] == ["clusterpolicy", "cluster-sim"]

        fetched = tmp_path / "fetched"
        cli("fetch", first["run_id"], "episodes", "table", str(fetched / "table"))
        cli("fetch", first["run_id"], "train", "policies", str(fetched / "policies"))
        with (fetched / "table" / "episodes.csv").open() as file:
            table = {(r["policy"], r["flow"], int(r["seed"])): r for r in csv.DictReader(file)}
        assert len(table) == POLICIES * len(FLOWS) * 2

        sys.path.insert(0, str(model))
        try:
            from clusterpolicy.episodes import FlowSpec, make_flow, policy_of, train_q_table
            from clusterpolicy.tasks import TRAINING_SEED
        finally:
            sys.path.remove(str(model))
        learned = {
            (p["flow"], p["seed"]): p["q"] for p in json.loads((fetched / "policies" / "policies.json").read_text())
        }
        for (policy, flow_name, seed), row in table.items():
            flow = make_flow(FlowSpec(flow_name, seed, 1.0))
            q_table = None
            if policy == "learned":
                training = [make_flow(FlowSpec(flow_name, TRAINING_SEED + seed + k, 1.0)) for k in range(2)]
                q_table = train_q_table(training, seed, 2, 0.1, 0.95, 0.2)
                assert np.array_equal(np.asarray(q_table), np.asarray(learned[(flow_name, seed)]))
            expected = episode_directly(flow, policy_of(policy, len(flow.machines), q_table), seed)
            got = {key: float(row[key]) for key in ("cost", "online_shortfall", "restricted_flow_time")}
            assert got == {key: float(expected[key]) for key in got}, (policy, flow_name, seed)
            assert int(row["unfinished"]) == expected["unfinished"]

        # The web view, logged in by `simrun ui`'s one-time link: the run's locked packages, and the table's plot
        # with one mark per episode.
        link = cli("ui", "--no-browser").strip().splitlines()[-1]
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        browser.open(link, timeout=30).close()
        base = link.split("/login")[0]
        run_page = browser.open(f"{base}/runs/{first['run_id']}", timeout=30).read().decode()
        assert re.search(r"<li><code>numpy==[0-9.]+</code></li>", run_page), run_page[-3000:]
        query = urllib.parse.urlencode({"port": "table", "path": "episodes.csv", "x": "seed", "y": "cost"})
        spec = json.load(browser.open(f"{base}/runs/{first['run_id']}/tasks/episodes/table.json?{query}", timeout=30))
        assert len(spec["data"]["values"]) == len(table), spec

        report = tmp_path / "report"
        cli("fetch", first["run_id"], "rank", "report", str(report))
        assert "## synthetic" in (report / "report.md").read_text()
        assert (report / "pareto.csv").read_text().startswith("flow,policy,mean_cost,mean_shortfall")

        # One more seed, in a second workflow file beside the first (a workflow file of the tree is not in the
        # keys): every unit computed already is reused at its new index; only seed 3's are computed.
        (model / "study-3-seeds.yaml").write_text(STUDY.format(seeds="[1, 2, 3]"))
        estimated = {t["task_id"]: t for t in json.loads(cli("estimate", "study-3-seeds.yaml", "--json"))["tasks"]}
        assert estimated["train"]["reused_from"] == {
            "run_id": first["run_id"],
            "task_id": "train",
            "units": len(FLOWS) * 2,
        }
        assert estimated["episodes"]["reused_from"]["units"] == POLICIES * len(FLOWS) * 2
        out = cli("submit", "study-3-seeds.yaml", "--watch")
        second = run_record(home, out.split()[2])
        assert second["state"] == "succeeded", out
        train, episodes = second["tasks"]["train"], second["tasks"]["episodes"]
        assert train["reused_from"] == {"run_id": first["run_id"], "task_id": "train", "units": len(FLOWS) * 2}
        assert episodes["reused_from"]["units"] == POLICIES * len(FLOWS) * 2
        assert train["units"] - train["reused_from"]["units"] == len(FLOWS)  # seed 3's trainings
        assert episodes["units"] - episodes["reused_from"]["units"] == POLICIES * len(FLOWS)  # seed 3's episodes
        cli("fetch", second["run_id"], "episodes", "table", str(tmp_path / "second"))
        with (tmp_path / "second" / "episodes.csv").open() as file:
            again = {(r["policy"], r["flow"], int(r["seed"])): r for r in csv.DictReader(file)}
        assert {k: v for k, v in again.items() if k[2] != 3} == table
        compared = cli("compare", first["run_id"], second["run_id"])
        assert re.search(r"episodes\s+settings\.seeds\s+\[1, 2\]\s+\[1, 2, 3\]", compared), compared
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
