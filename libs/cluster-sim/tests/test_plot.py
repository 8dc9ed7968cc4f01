"""The plot command writes a PNG of one episode."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_sim.plot import main, run_episode
from cluster_sim.simulator import SimulatorConfig


def test_plot_command_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots" / "episode.png"
    main(["--seed", "3", "--online", "2", "--batch", "0", "--borrowing", "--out", str(out)])
    assert capsys.readouterr().out.strip() == str(out)
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_episode_covers_the_horizon_with_every_event() -> None:
    simulator, observations = run_episode(3, 1, 3, SimulatorConfig())
    times = [o.time for o in observations]
    assert times[0] == 0 and times[-1] == simulator.flow.horizon
    assert times == sorted(times)
    assert len(observations) > simulator.flow.horizon / 60  # events between the control boundaries too
