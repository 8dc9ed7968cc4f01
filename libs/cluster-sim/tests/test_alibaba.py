"""Tests of the cluster-trace-v2018 loader on the real sample rows and a small batch-task file."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cluster_sim import ClusterSimulator, ProcessState, SimulatorConfig
from cluster_sim.alibaba import BATCH_TASK_COLUMNS, load_alibaba_v2018

# task_name, instance_num, job_name, task_type, status, start_time, end_time, plan_cpu, plan_mem
TASKS = [
    ("M1", "1", "j_1", "1", "Terminated", "200", "800", "100", "0.39"),
    ("R2_1", "3", "j_1", "1", "Terminated", "900", "1500", "50", "0.2"),
    ("M3", "1", "j_2", "1", "Running", "300", "0", "100", "0.4"),  # not terminated
    ("M4", "1", "j_3", "1", "Terminated", "0", "100", "100", "0.4"),  # starts outside the window
    ("M5", "1", "j_3", "1", "Terminated", "1000", "5000", "", "0.4"),  # no plan_cpu
    ("M6", "1", "j_4", "1", "Terminated", "1000", "5000", "20000", "0.4"),  # 200 cores
]


@pytest.fixture
def batch_task(tmp_path: Path) -> Path:
    path = tmp_path / "batch_task.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(TASKS)
    assert len(BATCH_TASK_COLUMNS) == len(TASKS[0])
    return path


def test_loads_real_machine_rows_and_usage(alibaba_sample: Path, batch_task: Path) -> None:
    flow = load_alibaba_v2018(
        alibaba_sample / "v2018_machine_meta.csv",
        machine_usage=alibaba_sample / "v2018_machine_usage_m1933_m1934.csv",
        batch_task=batch_task,
    )
    assert [m.name for m in flow.machines] == ["m_1933", "m_1934"]
    assert all(m.cpu == 96 and m.memory == 100 and m.online_memory == 50 for m in flow.machines)
    # The window starts at the first usage sample (t = 140 s) and ends at the last (691,080 s).
    assert flow.horizon == 691_080 - 140
    first = flow.demand[0]
    # Row "m_1933,140,5,91,..." gives 5 % of 96 cores; m_1934's first sample is back-filled.
    assert first.time == 0 and first.cpu[0] == pytest.approx(0.05 * 96)
    assert all(0 <= v <= 96 for s in flow.demand for v in s.cpu)
    mean_1934 = sum(s.cpu[1] for s in flow.demand) / len(flow.demand)
    assert 0.3 * 96 < mean_1934 < 0.55 * 96  # the README gives a 42.8 % mean for m_1934
    names = [p.name for p in flow.processes]
    assert names == ["j_1/M1", "j_1/R2_1"]
    m1 = flow.processes[0]
    assert (m1.release, m1.cpu, m1.memory, m1.duration, m1.estimate) == (60, 1.0, 0.39, 600, 600)
    assert flow.processes[1].cpu == 0.5
    for why in ("status: 1", "outside the window: 1", "missing plan: 1", "larger than every machine: 1"):
        assert why in flow.provenance
    simulator = ClusterSimulator(flow, SimulatorConfig(borrowing=True))
    simulator.advance(2000)
    assert simulator.status("j_1/M1").state is ProcessState.FINISHED
    assert simulator.status("j_1/M1").finish == 660


def test_invalid_usage_samples_are_dropped_and_instances_expand(alibaba_sample: Path, batch_task: Path) -> None:
    usage = batch_task.parent / "usage.csv"
    usage.write_text(
        "m_1,100,10,50,,,1,1,1\nm_1,160,-1,50,,,1,1,1\nm_1,220,101,50,,,1,1,1\nm_1,280,20,50,,,1,1,1\n"
        "m_1,0,30,50,,,1,1,1\n"
    )
    flow = load_alibaba_v2018(
        alibaba_sample / "v2018_machine_meta.csv",
        machine_usage=usage,
        batch_task=batch_task,
        start=100,
        horizon=1000,
        online_memory_fraction=0.25,
        expand_instances=True,
    )
    assert [(s.time, s.cpu) for s in flow.demand] == [(0, (9.6,)), (180, (19.2,))]
    assert "3 invalid usage rows dropped" in flow.provenance
    assert flow.machines[0].online_memory == 25
    assert [p.name for p in flow.processes] == ["j_1/M1#0", "j_1/R2_1#0", "j_1/R2_1#1", "j_1/R2_1#2"]


def test_unknown_machine_is_named(alibaba_sample: Path) -> None:
    with pytest.raises(ValueError, match="machine 'm_nope'"):
        load_alibaba_v2018(alibaba_sample / "v2018_machine_meta.csv", machines=["m_nope"])
