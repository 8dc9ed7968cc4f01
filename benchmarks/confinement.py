"""Benchmark of pod confinement: a split task's wall time confined by Landlock against unconfined, in one run.

    uv run --frozen python benchmarks/confinement.py [--repeats 7] [--units 2000] [--processes 2]

The same coordinator pod (`simrun-worker`, SIMRUN_MERGE=1: ledger, results, done, progress, report, merge) of
2,000 units of about 2 ms of CPU on 2 processes runs as the local executor starts it: once with the pod
allow-list of variables and plain, once with the same variables through `python -m simrun_runtime.confine`
(Landlock over the run's and model's paths, and, for root, the read-only mount namespace and no capabilities).
The two alternate within each repeat, so a busy machine slows both alike. Goal: median ratio ≤ 1.05.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime_worker import MODEL, calibrate
from simrun_runtime.confine import landlock_abi
from simrun_runtime.rundir import lay_out_run
from simrun_tracker.local.confinement import PodConfinement, PodPaths, pod_environment


def time_pod(
    root: Path, model_root: Path, run_id: str, units: int, loops: int, processes: int, confine: bool
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the pod's processes) of one coordinator pod over a fresh run."""
    store = root / "store"
    run = lay_out_run(store, run_id, "spin", "simrun_bench_model:Spin", {"units": units, "loops": loops}, model_root)
    scratch = root / f"scratch-{run_id}"
    scratch.mkdir()
    contract = {
        "SIMRUN_RUN_DIR": str(run.root),
        "SIMRUN_TASK": "spin",
        "SIMRUN_WORKER": "w0",
        "SIMRUN_PROCESSES": str(processes),
        "SIMRUN_MERGE": "1",
    }
    command = [sys.executable, "-m", "simrun_runtime.worker"]
    if confine:
        paths = PodPaths(read=(run.root, model_root), write=(run.task("spin").root, scratch))
        command = PodConfinement("landlock").command(sys.executable, command, paths)
    env = pod_environment(contract, scratch)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=run.root, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0 or not run.task("spin").merge_marker.exists():
        raise SystemExit(f"the pod failed ({done.returncode}, confined={confine}): {done.stderr[-2000:]}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--unit-ms", type=float, default=2.0)
    args = parser.parse_args()
    abi = landlock_abi()
    if abi < 1:
        raise SystemExit("this kernel has no Landlock: nothing to compare")
    with tempfile.TemporaryDirectory(prefix="simrun-confine-bench-") as tmp:
        root = Path(tmp)
        model_root = root / "model"
        model_root.mkdir()
        (model_root / "simrun_bench_model.py").write_text(MODEL)
        loops = calibrate(args.unit_ms / 1000)
        who = "root: Landlock + read-only mount namespace + no capabilities" if os.geteuid() == 0 else "Landlock"
        print(f"landlock ABI {abi}, {who}; cpu count {os.cpu_count()}, {args.repeats} repeats")
        print(f"{args.units} units of ~{args.unit_ms} ms CPU ({loops} loops) on {args.processes} processes:")
        plain_s, confined_s, ratios, cpu_ratios = [], [], [], []
        for repeat in range(args.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            times = {}
            for confine in order:
                run_id = f"bench-{repeat}-{'c' if confine else 'p'}"
                times[confine] = time_pod(root, model_root, run_id, args.units, loops, args.processes, confine)
            (plain, plain_cpu), (confined, confined_cpu) = times[False], times[True]
            plain_s.append(plain)
            confined_s.append(confined)
            ratios.append(confined / plain)
            cpu_ratios.append(confined_cpu / plain_cpu)
            print(f"  repeat {repeat}: unconfined {plain:.3f} s ({plain_cpu:.2f} s CPU), confined {confined:.3f} s "
                  f"({confined_cpu:.2f} s CPU), ratio {ratios[-1]:.3f} (CPU {cpu_ratios[-1]:.3f})")  # fmt: skip
        print(
            f"median: unconfined {statistics.median(plain_s):.3f} s, confined {statistics.median(confined_s):.3f} s, "
            f"wall ratio (median of the repeats' ratios) {statistics.median(ratios):.3f} (goal ≤ 1.05), "
            f"CPU ratio {statistics.median(cpu_ratios):.3f}"
        )


if __name__ == "__main__":
    main()
