"""Benchmark of the worker runtime: `simrun-worker` against `multiprocessing.Pool`, and the ledger's cost per unit.

    uv run --frozen python benchmarks/runtime_worker.py [--repeats 5] [--units 2000] [--processes 2]

1. The same units (about 2 ms of CPU each) on the same number of processes, through `simrun-worker` (a run
   directory laid out by hand, the coordinator with SIMRUN_MERGE=1: ledger, results, done, progress, report,
   merge) and through `multiprocessing.Pool.imap_unordered`; both are timed as fresh interpreters
   (`python -m …`), so both pay the interpreter's start. Goal: ratio at most 1.3.
2. The ledger's overhead per unit without computing (claim + result directory + done + progress line) at
   1,000 and 100,000 units, in one process. Goal: flat within 1.5× from 1,000 to 100,000.
Medians of several repeats are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from simrun_runtime.layout import TaskLayout
from simrun_runtime.ledger import Ledger, create_ledger
from simrun_runtime.reports import ProgressLog
from simrun_runtime.rundir import lay_out_run

MODEL = textwrap.dedent(
    '''
    """The benchmark's model: units of pure-Python arithmetic."""

    from multiprocessing import get_context

    from simrun_runtime import MergeContext, SplitTaskType, TaskSettings, UnitContext


    def spin(loops: int, index: int) -> int:
        x = index
        for k in range(loops):
            x = (x * 1103515245 + k) % 2147483647
        return x


    class SpinSettings(TaskSettings):
        units: int = 2000
        loops: int = 10000


    class Spin(SplitTaskType):
        Settings = SpinSettings
        outputs = ("values",)

        def count_units(self, settings: SpinSettings) -> int:
            return settings.units

        def compute_unit(self, settings: SpinSettings, index: int, unit: UnitContext) -> None:
            (unit.result_dir / "value").write_text(str(spin(settings.loops, index)))

        def merge(self, settings: SpinSettings, merge: MergeContext) -> dict:
            total = sum(int((path / "value").read_text()) for _, path in merge.units())
            (merge.outputs["values"] / "total").write_text(str(total))
            return {"total": total}


    def _one(args: tuple[int, int]) -> int:
        return spin(*args)


    def pool_baseline(units: int, loops: int, processes: int) -> int:
        with get_context("fork").Pool(processes) as pool:
            return sum(pool.imap_unordered(_one, ((loops, i) for i in range(units))))
    '''
)


def calibrate(target_s: float) -> int:
    """The loops of `spin` that take about `target_s` of CPU here."""
    namespace: dict[str, object] = {}
    exec(_spin_source(), namespace)
    spin = namespace["spin"]
    loops = 1000
    while True:
        start = time.process_time()
        for index in range(20):
            spin(loops, index)  # type: ignore[operator]
        elapsed = (time.process_time() - start) / 20
        if elapsed > 0.0005:
            return max(1, int(loops * target_s / elapsed))
        loops *= 2


def _spin_source() -> str:
    return MODEL[MODEL.index("def spin") : MODEL.index("class SpinSettings")]


def time_worker(store: Path, model_root: Path, run_id: str, units: int, loops: int, processes: int) -> float:
    run = lay_out_run(store, run_id, "spin", "simrun_bench_model:Spin", {"units": units, "loops": loops}, model_root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    env |= {
        "SIMRUN_RUN_DIR": str(run.root),
        "SIMRUN_TASK": "spin",
        "SIMRUN_WORKER": "w0",
        "SIMRUN_PROCESSES": str(processes),
        "SIMRUN_MERGE": "1",
    }
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "simrun_runtime.worker"], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or not run.task("spin").merge_marker.exists():
        raise SystemExit(f"simrun-worker failed ({done.returncode}): {done.stderr}")
    return elapsed


def time_pool(model_root: Path, units: int, loops: int, processes: int) -> float:
    code = (
        f"import sys; sys.path.insert(0, {str(model_root)!r}); import simrun_bench_model as m; "
        f"m.pool_baseline({units}, {loops}, {processes})"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def ledger_overhead(root: Path, units: int) -> tuple[float, float]:
    """(seconds to create the ledger, seconds per unit of claim + result + done + progress)."""
    task = TaskLayout(root / "tasks" / "spin")
    task.root.mkdir(parents=True)
    start = time.perf_counter()
    create_ledger(task, units)
    created = time.perf_counter() - start
    ledger = Ledger.of(task)
    claimer = ledger.claimer("w0")
    progress = ProgressLog(task.progress)

    def nothing(directory: Path) -> None:
        return None

    start = time.perf_counter()
    while (index := claimer.claim()) is not None:
        ledger.write_result(index, "w0", nothing)
        ledger.mark_done(index, "w0")
        progress.append(index, "w0", 0.0, time.time())
    per_unit = (time.perf_counter() - start) / units
    progress.close()
    if ledger.done_count() != units:
        raise SystemExit("the ledger benchmark did not complete every unit")
    return created, per_unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--unit-ms", type=float, default=2.0)
    parser.add_argument("--ledger-sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--ledger-repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to put the store (default: the temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="simrun-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        model_root = root / "model"
        model_root.mkdir()
        (model_root / "simrun_bench_model.py").write_text(MODEL)
        loops = calibrate(args.unit_ms / 1000)
        print(f"store in {root} ({args.repeats} repeats, each a fresh interpreter, cpu count {os.cpu_count()})")
        print(f"{args.units} units of ~{args.unit_ms} ms CPU ({loops} loops) on {args.processes} processes:")
        worker_s, pool_s, ratios = [], [], []
        for repeat in range(args.repeats):
            w = time_worker(root / "store", model_root, f"bench-{repeat}", args.units, loops, args.processes)
            p = time_pool(model_root, args.units, loops, args.processes)
            worker_s.append(w)
            pool_s.append(p)
            ratios.append(w / p)
            print(f"  repeat {repeat}: simrun-worker {w:.3f} s, Pool.imap_unordered {p:.3f} s, ratio {w / p:.3f}")
        print(
            f"median: simrun-worker {statistics.median(worker_s):.3f} s, "
            f"Pool.imap_unordered {statistics.median(pool_s):.3f} s, "
            f"ratio (median of the repeats' ratios) {statistics.median(ratios):.3f} (goal ≤ 1.3)"
        )

        print("ledger overhead per unit (claim + result + done + progress, no computing):")
        per_size = {}
        for size in args.ledger_sizes:
            runs = [ledger_overhead(root / f"ledger-{size}-{k}", size) for k in range(args.ledger_repeats)]
            created = statistics.median(c for c, _ in runs)
            per_unit = statistics.median(u for _, u in runs)
            per_size[size] = per_unit
            print(
                f"  {size:>7} units: {per_unit * 1e6:7.1f} µs per unit (median of {len(runs)}), "
                f"creating the ledger {created:.3f} s"
            )
        sizes = sorted(per_size)
        if len(sizes) > 1:
            growth = per_size[sizes[-1]] / per_size[sizes[0]]
            print(f"  growth {sizes[0]} -> {sizes[-1]} units: {growth:.2f}x (goal ≤ 1.5x)")


if __name__ == "__main__":
    main()
