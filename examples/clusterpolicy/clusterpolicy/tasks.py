"""The task types of the clusterpolicy study: TrainPolicies (split, a learned policy per seed and flow), Episodes
(split, one episode per policy, seed and flow; the merge writes the table) and Rank (policies per flow with a
bootstrap confidence interval over seeds, a Markdown report and the Pareto front of cost against shortfall).

Both split types give unit keys, so a study with one more seed reuses every episode and training already computed
with the same code and environment, and computes only the new seed's.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator
from simrun_runtime import (
    ExecContext,
    MergeContext,
    ResourceHint,
    SplitTaskType,
    TaskSettings,
    UnitContext,
    UnsplitTaskType,
)

from clusterpolicy.episodes import (
    ALL_POLICIES,
    FLOWS,
    LEARNED_POLICY,
    FlowSpec,
    make_flow,
    policy_of,
    run_episode,
    train_q_table,
)

TABLE_COLUMNS = ("policy", "flow", "seed", "cost", "unfinished", "online_shortfall", "restricted_flow_time", "finished")
TRAINING_SEED = 100_000
"""Training flows are drawn from seeds this far from the evaluation seeds: a policy is not scored on its
training flows."""


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


class StudySettings(TaskSettings):
    """What the training and the episodes share: give both the same lists (YAML anchors in the workflow)."""

    seeds: list[int] = Field(default=[1, 2, 3], min_length=1, description="Evaluation seeds of the flows.")
    flows: list[str] = Field(default=list(FLOWS), min_length=1, description="Process flows: synthetic, alibaba.")
    hours: float = Field(default=6.0, gt=0, le=192, description="Length of every episode, hours.")

    @field_validator("flows")
    @classmethod
    def _known_flows(cls, flows: list[str]) -> list[str]:
        unknown = sorted(set(flows) - set(FLOWS))
        if unknown:
            raise ValueError(f"unknown flows {unknown}: use {', '.join(FLOWS)}")
        if len(set(flows)) != len(flows):
            raise ValueError("a flow is named twice")
        return flows

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("a seed is named twice")
        return seeds


def training_pairs(settings: StudySettings) -> list[tuple[str, int]]:
    """The training units in order: (flow, seed)."""
    return [(flow, seed) for seed in settings.seeds for flow in settings.flows]


class TrainPolicies(SplitTaskType):
    """Trains the learned policy (tabular Q-learning over the 18 joint actions) for each seed and flow."""

    class Settings(StudySettings):
        episodes: int = Field(default=8, ge=1, le=10_000, description="Training episodes per seed and flow.")
        alpha: float = Field(default=0.1, gt=0, le=1, description="Learning rate.")
        gamma: float = Field(default=0.95, ge=0, le=1, description="Discount.")
        epsilon: float = Field(default=0.2, ge=0, le=1, description="Exploration rate.")

    outputs = ("policies",)
    resources = ResourceHint(base_memory_gb=0.4, per_worker_gb=0.3)

    def count_units(self, settings: Settings) -> int:
        return len(training_pairs(settings))

    def unit_key(self, settings: Settings, index: int) -> Any:
        flow, seed = training_pairs(settings)[index]
        training = {name: getattr(settings, name) for name in ("episodes", "alpha", "gamma", "epsilon", "hours")}
        return {"flow": flow, "seed": seed, **training}

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> None:
        flow, seed = training_pairs(settings)[index]
        flows = [make_flow(FlowSpec(flow, TRAINING_SEED + seed + k, settings.hours)) for k in range(2)]
        table = train_q_table(flows, seed, settings.episodes, settings.alpha, settings.gamma, settings.epsilon)
        _write_json(unit.result_dir / "policy.json", {"flow": flow, "seed": seed, "q": table})

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, Any]:
        policies = [json.loads((result / "policy.json").read_text()) for _, result in sorted(merge.units())]
        _write_json(merge.outputs["policies"] / "policies.json", policies)
        return {"policies": len(policies)}


def episode_list(settings: StudySettings, policies: Sequence[str]) -> list[tuple[str, str, int]]:
    """The episode units in order: (policy, flow, seed)."""
    return [(policy, flow, seed) for policy in policies for flow in settings.flows for seed in settings.seeds]


class Episodes(SplitTaskType):
    """One cluster_sim episode per policy, flow and seed; the merge writes the study's table."""

    class Settings(StudySettings):
        policies: list[str] = Field(
            default=list(ALL_POLICIES),
            min_length=1,
            description="constant-<online>-<batch> (18), load-headroom, queue-aware, cautious, learned.",
        )

        @field_validator("policies")
        @classmethod
        def _known_policies(cls, policies: list[str]) -> list[str]:
            unknown = sorted(set(policies) - set(ALL_POLICIES))
            if unknown:
                raise ValueError(f"unknown policies {unknown}: use constant-<0..2>-<0..5> or the heuristics")
            if len(set(policies)) != len(policies):
                raise ValueError("a policy is named twice")
            return policies

    inputs = ("policies",)
    outputs = ("table",)
    resources = ResourceHint(base_memory_gb=0.4, per_worker_gb=0.3)

    def count_units(self, settings: Settings) -> int:
        return len(episode_list(settings, settings.policies))

    def unit_key(self, settings: Settings, index: int) -> Any:
        policy, flow, seed = episode_list(settings, settings.policies)[index]
        return {"policy": policy, "flow": flow, "seed": seed, "hours": settings.hours}

    def unit_inputs(self, settings: Settings, index: int) -> Mapping[str, Sequence[int]]:
        policy, flow, seed = episode_list(settings, settings.policies)[index]
        if policy != LEARNED_POLICY:
            return {}
        return {"policies": [training_pairs(settings).index((flow, seed))]}

    def compute_unit(self, settings: Settings, index: int, unit: UnitContext) -> None:
        policy_name, flow_name, seed = episode_list(settings, settings.policies)[index]
        flow = make_flow(FlowSpec(flow_name, seed, settings.hours))
        q_table = None
        if policy_name == LEARNED_POLICY:
            policies = json.loads((unit.inputs["policies"] / "policies.json").read_text())
            wanted = training_pairs(settings).index((flow_name, seed))
            learned = policies[wanted] if wanted < len(policies) else {}
            if (learned.get("flow"), learned.get("seed")) != (flow_name, seed):
                raise ValueError(
                    f"the training's policies do not hold flow {flow_name} seed {seed} at {wanted}: give TrainPolicies "
                    "the same seeds and flows as Episodes"
                )
            q_table = learned["q"]
        report = run_episode(flow, policy_of(policy_name, len(flow.machines), q_table), seed)
        _write_json(
            unit.result_dir / "episode.json", {"policy": policy_name, "flow": flow_name, "seed": seed, **report}
        )

    def merge(self, settings: Settings, merge: MergeContext) -> dict[str, Any]:
        rows = [json.loads((result / "episode.json").read_text()) for _, result in sorted(merge.units())]
        out = merge.outputs["table"]
        write_table(out / "episodes.csv", rows)
        best = {}
        for flow in settings.flows:
            costs: dict[str, list[float]] = {}
            for row in rows:
                if row["flow"] == flow:
                    costs.setdefault(row["policy"], []).append(row["cost"])
            best[flow] = min(costs, key=lambda p: float(np.mean(costs[p])))
        return {"episodes": len(rows), "best": best}


def write_table(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """The table as CSV, floats written exactly (repr), so a reader gets the simulator's values bit for bit."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(TABLE_COLUMNS)
        for row in rows:
            writer.writerow([repr(row[c]) if isinstance(row[c], float) else row[c] for c in TABLE_COLUMNS])


def read_table(path: Path) -> list[dict[str, Any]]:
    """The table written by `write_table`, numbers as numbers."""
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    numbers = {"cost": float, "online_shortfall": float, "restricted_flow_time": float}
    integers = {"seed": int, "unfinished": int, "finished": int}
    return [{k: numbers.get(k, integers.get(k, str))(v) for k, v in row.items()} for row in rows]


def bootstrap_interval(values: Sequence[float], resamples: int, seed: int) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of the mean of `values` (resampled with replacement)."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The policies no other policy beats on both mean cost and mean shortfall (lower is better), by cost."""
    front = [
        name
        for name, (cost, shortfall) in points.items()
        if not any(
            (c <= cost and s <= shortfall) and (c < cost or s < shortfall)
            for other, (c, s) in points.items()
            if other != name
        )
    ]
    return sorted(front, key=lambda name: points[name])


class Rank(UnsplitTaskType):
    """Ranks the policies per flow by mean cost over seeds with a bootstrap 95 % interval, writes a Markdown
    report, the ranking as CSV and the Pareto front of cost against online shortfall."""

    class Settings(TaskSettings):
        resamples: int = Field(default=2000, ge=100, le=1_000_000, description="Bootstrap resamples.")
        seed: int = Field(default=0, description="Seed of the bootstrap.")

    inputs = ("table",)
    outputs = ("report",)

    def run(self, settings: Settings, context: ExecContext) -> dict[str, Any]:
        rows = read_table(context.inputs["table"] / "episodes.csv")
        out = context.outputs["report"]
        ranking: list[dict[str, Any]] = []
        lines = ["# Policies per flow", ""]
        fronts: dict[str, list[str]] = {}
        for flow in sorted({row["flow"] for row in rows}):
            by_policy: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                if row["flow"] == flow:
                    by_policy.setdefault(row["policy"], []).append(row)
            ranked = []
            for policy, episodes in by_policy.items():
                costs = [row["cost"] for row in episodes]
                low, high = bootstrap_interval(costs, settings.resamples, settings.seed)
                ranked.append(
                    {
                        "flow": flow,
                        "policy": policy,
                        "seeds": len(costs),
                        "mean_cost": float(np.mean(costs)),
                        "cost_low": low,
                        "cost_high": high,
                        "mean_shortfall": float(np.mean([row["online_shortfall"] for row in episodes])),
                        "mean_unfinished": float(np.mean([row["unfinished"] for row in episodes])),
                    }
                )
            ranked.sort(key=lambda r: (r["mean_cost"], r["policy"]))
            front = pareto_front({r["policy"]: (r["mean_cost"], r["mean_shortfall"]) for r in ranked})
            fronts[flow] = front
            lines += [
                f"## {flow}",
                "",
                "| rank | policy | mean cost | 95 % CI | mean shortfall (core-s) | mean unfinished | Pareto |",
                "|---:|---|---:|---|---:|---:|:-:|",
            ]
            for place, r in enumerate(ranked, 1):
                r["rank"] = place
                r["pareto"] = r["policy"] in front
                lines.append(
                    f"| {place} | {r['policy']} | {r['mean_cost']:.1f} | {r['cost_low']:.1f} – {r['cost_high']:.1f} "
                    f"| {r['mean_shortfall']:.0f} | {r['mean_unfinished']:.1f} | {'●' if r['pareto'] else ''} |"
                )
            lines.append("")
            ranking += ranked
        columns = [
            "flow",
            "rank",
            "policy",
            "seeds",
            "mean_cost",
            "cost_low",
            "cost_high",
            "mean_shortfall",
            "mean_unfinished",
            "pareto",
        ]
        with (out / "ranking.csv").open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows({c: r[c] for c in columns} for r in ranking)
        with (out / "pareto.csv").open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["flow", "policy", "mean_cost", "mean_shortfall"])
            for r in ranking:
                if r["pareto"]:
                    writer.writerow([r["flow"], r["policy"], r["mean_cost"], r["mean_shortfall"]])
        (out / "report.md").write_text("\n".join(lines))
        return {
            "best": {flow: next(r["policy"] for r in ranking if r["flow"] == flow) for flow in fronts},
            "pareto": fronts,
        }
