"""Conformance and determinism tests of the Gymnasium and PettingZoo adapters."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from cluster_sim import ClusterSimulator, SimulatorConfig, decode_actions, synthetic_process_flow
from cluster_sim.envs import ClusterEnv, ClusterParallelEnv
from cluster_sim.envs._encoding import ObservationEncoder, join_actions, split_action
from cluster_sim.envs.gymnasium import ENV_ID
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test


def _small_flow(rng: np.random.Generator) -> Any:
    return synthetic_process_flow(machines=3, horizon=1800.0, rng=rng)


def test_gymnasium_check_env() -> None:
    env = gym.make(ENV_ID, flow=synthetic_process_flow(seed=7, machines=3, horizon=1800.0))
    check_env(env.unwrapped)
    env.close()


def test_gymnasium_check_env_with_a_flow_factory() -> None:
    check_env(ClusterEnv(_small_flow, SimulatorConfig(borrowing=True, actuation_delay=5)), skip_render_check=True)


def test_pettingzoo_parallel_api(capsys: pytest.CaptureFixture[str]) -> None:
    parallel_api_test(ClusterParallelEnv(_small_flow), num_cycles=100)
    assert "Passed Parallel API test" in capsys.readouterr().out


def test_spaces_are_cached_objects() -> None:
    env = ClusterParallelEnv(_small_flow, queue_rows=4)
    assert env.observation_space("online") is env.observation_space("online")
    assert env.action_space("batch") is env.action_space("batch")
    assert env.action_space("online").n == 3 and env.action_space("batch").n == 6
    gym_env = env.env
    assert gym_env.action_space is gym_env.action_space and gym_env.action_space.n == 18
    # 3 machines × 5 features + 6 summary features, then 4 queue rows × 5 features.
    assert env.observation_space("online").shape == (21,)
    assert env.observation_space("batch").shape == (41,)
    assert env.state_space.shape == (41,)


def test_joint_action_encoding() -> None:
    for online in range(3):
        for batch in range(6):
            joint = join_actions(online, batch)
            assert joint == online * 6 + batch
            assert split_action(joint) == divmod(joint, 6) == (online, batch)
    with pytest.raises(ValueError, match="joint action"):
        split_action(18)


def _gym_trajectory(seed: int, actions: list[int]) -> list[tuple[Any, ...]]:
    env = ClusterEnv(_small_flow, SimulatorConfig(borrowing=True))
    observation, _ = env.reset(seed=seed)
    steps: list[tuple[Any, ...]] = [(observation.tobytes(),)]
    for action in actions:
        observation, reward, terminated, truncated, info = env.step(action)
        steps.append((observation.tobytes(), reward, terminated, truncated, repr(info)))
        if truncated:
            break
    return steps


def test_same_seed_and_actions_give_the_same_gymnasium_episode() -> None:
    actions = np.random.default_rng(1).integers(0, 18, size=40).tolist()
    first = _gym_trajectory(3, actions)
    assert len(first) == 31  # 1800 s / 60 s steps, the last one truncated
    assert first[-1][3] is True
    assert first == _gym_trajectory(3, actions)
    assert first != _gym_trajectory(4, actions)  # the flow is drawn from the seeded generator


def _pz_trajectory(seed: int) -> list[tuple[Any, ...]]:
    env = ClusterParallelEnv(_small_flow)
    observations, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    steps: list[tuple[Any, ...]] = []
    while env.agents:
        actions = {"online": int(rng.integers(3)), "batch": int(rng.integers(6))}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        steps.append(
            (
                {a: o.tobytes() for a, o in observations.items()},
                rewards,
                terminations,
                truncations,
                repr(infos),
                env.state().tobytes(),
            )
        )
    return steps


def test_same_seed_and_actions_give_the_same_pettingzoo_episode() -> None:
    first = _pz_trajectory(5)
    assert len(first) == 30
    assert first == _pz_trajectory(5)


def test_agents_share_the_reward_and_the_online_agent_does_not_see_queue_rows() -> None:
    env = ClusterParallelEnv(synthetic_process_flow(seed=2, machines=3, horizon=1800.0), queue_rows=4)
    observations, infos = env.reset(seed=0)
    assert set(observations) == set(infos) == {"online", "batch"}
    hidden_rows_seen = 0
    while env.agents:
        observations, rewards, *_ = env.step({"online": 2, "batch": 0})
        assert rewards["online"] == rewards["batch"]
        state = env.state()
        np.testing.assert_array_equal(observations["batch"], state)
        np.testing.assert_array_equal(observations["online"], state[:21])
        assert observations["online"] is not observations["batch"]
        hidden_rows_seen += bool(state[21:].any())  # queue rows the online agent does not see
    assert hidden_rows_seen > 0


def test_reward_is_minus_the_step_cost_and_the_env_runs_the_simulator() -> None:
    flow = synthetic_process_flow(seed=9, machines=3, horizon=1800.0)
    config = SimulatorConfig(borrowing=False)
    env = ClusterEnv(flow, config)
    env.reset(seed=0)
    twin = ClusterSimulator(flow, config)
    observation = twin.advance(0)
    total = 0.0
    truncated = False
    k = 0
    while not truncated:
        action = (k * 7) % 18
        _, reward, _, truncated, info = env.step(action)
        online, batch = divmod(action, 6)
        twin.submit(decode_actions(online, batch, observation.demand, flow.machines))
        observation = twin.advance(twin.time + 60)
        assert reward == pytest.approx(-info["cost"]["total"])
        assert info["cost"]["total"] == pytest.approx(
            info["cost"]["shortfall_cost"] + info["cost"]["unfinished_cost"] + info["cost"]["quota_change_cost"]
        )
        total += reward
        k += 1
    report = twin.report()
    assert total == pytest.approx(-report.costs.total)
    assert info["report"]["unfinished"] == report.unfinished
    assert info["report"]["remaining_work"] == pytest.approx(report.remaining_work)


def test_warmup_runs_at_reset() -> None:
    env = ClusterEnv(synthetic_process_flow(seed=1, machines=2, horizon=1800.0), SimulatorConfig(warmup=300))
    observation, info = env.reset(seed=0)
    assert info["time"] == 300
    assert observation[2 * 5] == pytest.approx(300 / 1800)


def test_encoder_refuses_flows_with_another_machine_count() -> None:
    encoder = ObservationEncoder(synthetic_process_flow(seed=1, machines=2, horizon=600.0), queue_rows=2)
    with pytest.raises(ValueError, match="needs 2 machines, got 3"):
        encoder.bind(synthetic_process_flow(seed=1, machines=3, horizon=600.0))


def test_stepping_a_finished_episode_is_refused() -> None:
    env = ClusterEnv(synthetic_process_flow(seed=1, machines=2, horizon=120.0))
    env.reset(seed=0)
    env.step(0)
    *_, truncated, _ = env.step(0)
    assert truncated
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(0)
