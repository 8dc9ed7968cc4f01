"""Benchmark of the worker runtime: the cost of a unit in `simrun-worker` beside `multiprocessing.Pool` and joblib.

    uv run --frozen python benchmarks/runtime_worker.py [--repeats 3] [--dirs /tmp /dev/shm] [--processes 2]

Every figure is a median of `--repeats` runs, each tool timed as a fresh interpreter (`python -m …` / `-c`), so
each pays its interpreter's start, on the same units and processes, in the same run:

1. Tiny units (a few µs of arithmetic, the value returned) at 1,000 / 10,000 / 100,000 units, in a store on
   each of `--dirs` (default the disk's temp dir and tmpfs): wall seconds of `simrun-worker` (the coordinator
   with SIMRUN_MERGE=1: ledger, claims, values, done, progress, report, merge), `Pool.imap_unordered` (one unit
   a task) and `joblib.Parallel` (its automatic batching); the marginal µs per unit from the smallest to the
   largest size; the inodes and bytes the task leaves in the store per unit; the coordinator's peak RSS; the
   merge alone (check + read every value + the type's merge) on the finished ledger.
   Goals at 100,000: ≤ 50 µs per unit, ≤ 1 inode and 1 KB per unit, coordinator < 60 MB, merge < 1 s.
2. 2,000 units of ~2 ms and 200 units of ~50 ms of CPU: `simrun-worker` / `Pool.imap_unordered`, goal ≤ 1.05.
3. The worker report's cost per write at 10,000 / 100,000 / 1,000,000 units done: the summary written now
   beside the list of every unit's seconds written before (schema 1). Goal: flat.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from file_systems import file_system
from simrun_runtime.layout import TaskLayout
from simrun_runtime.merge import merge_task
from simrun_runtime.pod import TaskSetup
from simrun_runtime.reports import SecondsSketch, UnitSeconds, WorkerReport
from simrun_runtime.rundir import lay_out_run

MODEL = textwrap.dedent(
    '''
    """The benchmark's model: units of pure-Python arithmetic that return their value."""

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

        def compute_unit(self, settings: SpinSettings, index: int, unit: UnitContext) -> int:
            return spin(settings.loops, index)

        def merge(self, settings: SpinSettings, merge: MergeContext) -> dict:
            total = sum(value for _, value in merge.values())
            (merge.outputs["values"] / "total").write_text(str(total))
            return {"total": total}


    def _one(args: tuple[int, int]) -> int:
        return spin(*args)


    def pool_baseline(units: int, loops: int, processes: int) -> int:
        with get_context("fork").Pool(processes) as pool:
            return sum(pool.imap_unordered(_one, ((loops, i) for i in range(units))))


    def joblib_baseline(units: int, loops: int, processes: int) -> int:
        from joblib import Parallel, delayed

        return sum(Parallel(n_jobs=processes)(delayed(spin)(loops, i) for i in range(units)))
    '''
)
TINY_LOOPS = 3


def clean_environment() -> dict[str, str]:
    """The environment of the timed interpreters: no SIMRUN_ variables, and bytecode cached as in a pod's image
    (PYTHONDONTWRITEBYTECODE would make every tool compile its imports at every start)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_") and k != "PYTHONDONTWRITEBYTECODE"}


def calibrate(target_s: float) -> int:
    """The loops of `spin` that take about `target_s` of CPU here."""
    namespace: dict[str, object] = {}
    exec(MODEL[MODEL.index("def spin") : MODEL.index("class SpinSettings")], namespace)
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


def peak_rss_mb(pid: int, stop: threading.Event, result: list[float]) -> None:
    """Polls the peak resident memory (VmHWM) of a process until it ends."""
    peak = 0.0
    while not stop.is_set():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024)
        except (OSError, ValueError):
            pass
        stop.wait(0.02)
    result.append(peak)


def time_worker(
    store: Path, model_root: Path, run_id: str, units: int, loops: int, processes: int
) -> tuple[float, float, TaskLayout]:
    """(wall seconds, coordinator peak RSS MB, the task) of one coordinator computing and merging the task."""
    run = lay_out_run(store, run_id, "spin", "simrun_bench_model:Spin", {"units": units, "loops": loops}, model_root)
    env = clean_environment()
    env |= {
        "SIMRUN_RUN_DIR": str(run.root),
        "SIMRUN_TASK": "spin",
        "SIMRUN_WORKER": "w0",
        "SIMRUN_PROCESSES": str(processes),
        "SIMRUN_MERGE": "1",
        # The memory of the pod's own cgroup, as on Kubernetes: a walk of /proc every second costs ~1% of a core.
        "SIMRUN_CGROUP": "self",
    }
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "simrun_runtime.worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=peak_rss_mb, args=(process.pid, stop, peak))
    watcher.start()
    _, err = process.communicate()
    elapsed = time.perf_counter() - start
    stop.set()
    watcher.join()
    task = run.task("spin")
    if process.returncode != 0 or not task.merge_marker.exists():
        raise SystemExit(f"simrun-worker failed ({process.returncode}): {err.decode()}")
    return elapsed, peak[0], task


def time_baseline(kind: str, model_root: Path, units: int, loops: int, processes: int) -> float:
    code = (
        f"import sys; sys.path.insert(0, {str(model_root)!r}); import simrun_bench_model as m; "
        f"m.{kind}_baseline({units}, {loops}, {processes})"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_environment())
    return time.perf_counter() - start


def disk_use(root: Path) -> tuple[int, int]:
    """(inodes, bytes allocated) of everything under `root`, itself included."""
    inodes, size = 1, root.stat().st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            stat = os.lstat(os.path.join(dirpath, name))
            inodes += 1
            size += stat.st_blocks * 512
    return inodes, size


def time_merge(task: TaskLayout) -> float:
    setup = TaskSetup.load(task.root.parent.parent, task.task_id)
    shutil.rmtree(task.out)
    start = time.perf_counter()
    merge_task(setup, "bench")
    return time.perf_counter() - start


def tiny_units(root: Path, model_root: Path, label: str, sizes: list[int], processes: int, repeats: int) -> None:
    print(f"\n1. tiny units ({TINY_LOOPS} loops, a few µs) on {processes} processes, store on {label} ({root}):")
    print(
        "   units | simrun-worker s (µs/unit) | Pool s | joblib s | worker/Pool | worker/joblib | inodes/unit "
        "| bytes/unit | coordinator MB | merge s"
    )
    medians: dict[int, tuple[float, float, float]] = {}
    cpu_medians: dict[int, tuple[float, float, float]] = {}
    for units in sizes:
        rows = []
        for repeat in range(repeats):
            run_id = f"tiny-{units}-{repeat}"
            cpu = children_cpu_s()
            w, rss, task = time_worker(root / "store", model_root, run_id, units, TINY_LOOPS, processes)
            w_cpu, cpu = children_cpu_s() - cpu, children_cpu_s()
            inodes, size = disk_use(task.root)
            merge_s = time_merge(task)
            p = time_baseline("pool", model_root, units, TINY_LOOPS, processes)
            p_cpu, cpu = children_cpu_s() - cpu, children_cpu_s()
            j = time_baseline("joblib", model_root, units, TINY_LOOPS, processes)
            j_cpu = children_cpu_s() - cpu
            rows.append((w, p, j, inodes / units, size / units, rss, merge_s, w_cpu, p_cpu, j_cpu))
            shutil.rmtree(task.root.parent.parent)
        w, p, j, inodes, size, rss, merge_s, w_cpu, p_cpu, j_cpu = (
            statistics.median(r[k] for r in rows) for k in range(10)
        )
        medians[units] = (w, p, j)
        cpu_medians[units] = (w_cpu, p_cpu, j_cpu)
        ratio_p = statistics.median(r[0] / r[1] for r in rows)
        ratio_j = statistics.median(r[0] / r[2] for r in rows)
        print(
            f"   {units:>7} | {w:8.3f} ({w / units * 1e6:9.1f}) | {p:6.3f} | {j:8.3f} | {ratio_p:11.2f} | "
            f"{ratio_j:13.2f} | "
            f"{inodes:11.4f} | {size:10.1f} | {rss:14.1f} | {merge_s:7.3f}"
        )
    small, large = min(sizes), max(sizes)
    if large > small:
        span = large - small
        marginal = [(medians[large][k] - medians[small][k]) / span * 1e6 for k in range(3)]
        print(
            f"   marginal µs per unit {small} -> {large}: simrun-worker {marginal[0]:.1f}, Pool {marginal[1]:.1f}, "
            f"joblib {marginal[2]:.1f} (goal: simrun-worker ≤ 50; under load the start of an interpreter varies by "
            f"tenths of a second, which the µs per unit of the whole run bound from above)"
        )
        cpu = [(cpu_medians[large][k] - cpu_medians[small][k]) / span * 1e6 for k in range(3)]
        print(
            f"   marginal CPU µs per unit (all processes; less changed by other load): simrun-worker {cpu[0]:.1f}, "
            f"Pool {cpu[1]:.1f}, joblib {cpu[2]:.1f}"
        )


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def against_pool(root: Path, model_root: Path, units: int, unit_ms: float, processes: int, repeats: int) -> None:
    """Wall seconds, and the CPU seconds of the whole process tree, which other load on the machine changes less."""
    loops = calibrate(unit_ms / 1000)
    worker_s, pool_s, ratios, cpu_ratios = [], [], [], []
    for repeat in range(repeats):
        cpu = children_cpu_s()
        w, _, task = time_worker(root / "store", model_root, f"spin-{units}-{repeat}", units, loops, processes)
        worker_cpu = children_cpu_s() - cpu
        shutil.rmtree(task.root.parent.parent)
        cpu = children_cpu_s()
        p = time_baseline("pool", model_root, units, loops, processes)
        pool_cpu = children_cpu_s() - cpu
        worker_s.append(w)
        pool_s.append(p)
        ratios.append(w / p)
        cpu_ratios.append(worker_cpu / pool_cpu)
    print(
        f"   {units} units of ~{unit_ms:g} ms ({loops} loops): simrun-worker {statistics.median(worker_s):.3f} s, "
        f"Pool.imap_unordered {statistics.median(pool_s):.3f} s, ratio {statistics.median(ratios):.3f} "
        f"(median of {repeats} ratios; goal ≤ 1.05); CPU seconds ratio {statistics.median(cpu_ratios):.3f}; "
        f"difference {(statistics.median(worker_s) - statistics.median(pool_s)) / units * 1e6:.0f} µs per unit "
        f"(the start of a pod — importing pydantic and the model, reading the run — is paid once)"
    )


def report_writes(root: Path, sizes: list[int], repeats: int) -> None:
    print("\n3. the worker report's cost per write (no fsync, as the periodic writes), by units done:")
    base = {
        "run_id": "r",
        "task_id": "t",
        "worker": "w0",
        "role": "coordinator",
        "started_ms": 1,
        "task_type": "m:T",
        "processes": 2,
        "memory_source": "process_tree",
        "peak_memory_gb": 0.1,
        "per_process_gb": 0.05,
        "started_at": datetime.now(UTC),
    }
    for units in sizes:
        # Each size and each schema writes a folder of its own: a write that replaced the big report of the size
        # before would pay for freeing its blocks.
        task, task_before = TaskLayout(root / f"report-{units}"), TaskLayout(root / f"report-{units}-before")
        sketch = SecondsSketch()
        for k in range(units):
            sketch.add(0.001 * (1 + (k * 7919) % 1000))
        report = WorkerReport(**base, unit_seconds=sketch.summary())
        now = []
        for _ in range(repeats):
            start = time.perf_counter()
            report.unit_seconds = sketch.summary()
            report.write(task, fsync=False)
            now.append(time.perf_counter() - start)
        before = WorkerReport(**base, units=[UnitSeconds(unit=k, seconds=0.001) for k in range(units)])
        old = []
        for _ in range(min(repeats, 2)):
            start = time.perf_counter()
            before.write(task_before, fsync=False)
            old.append(time.perf_counter() - start)
        print(
            f"   {units:>9} units: summary {statistics.median(now) * 1e3:8.3f} ms per write, "
            f"every unit's seconds (before) {statistics.median(old) * 1e3:9.1f} ms, ratio "
            f"{statistics.median(now) / statistics.median(old):.5f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--report-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--dirs", type=Path, nargs="+", default=[Path(tempfile.gettempdir()), Path("/dev/shm")], help="store roots"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["tiny", "pool", "report"])
    args = parser.parse_args()
    print(f"{args.repeats} repeats, cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    for directory in args.dirs:
        if not directory.is_dir():
            print(f"(no {directory}: skipped)")
            continue
        with tempfile.TemporaryDirectory(prefix="simrun-bench-", dir=directory) as tmp:
            root = Path(tmp)
            model_root = root / "model"
            model_root.mkdir()
            (model_root / "simrun_bench_model.py").write_text(MODEL)
            label = file_system(directory)
            if "tiny" not in args.skip:
                tiny_units(root, model_root, label, sorted(args.sizes), args.processes, args.repeats)
            if "pool" not in args.skip:
                print(f"\n2. against Pool on {args.processes} processes, store on {label}:")
                against_pool(root, model_root, 2000, 2.0, args.processes, args.repeats)
                against_pool(root, model_root, 200, 50.0, args.processes, args.repeats)
    if "report" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="simrun-bench-report-") as tmp:
            report_writes(Path(tmp), args.report_sizes, args.repeats)


if __name__ == "__main__":
    main()
