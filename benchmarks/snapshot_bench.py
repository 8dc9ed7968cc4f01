"""Benchmark of snapshots on a generated tree of 10,000 files (about 100 MB) beside `git status` and `cp -al`.

Run: `uv run --frozen python benchmarks/snapshot_bench.py [--files 10000] [--mib 100] [--runs 5]`.
Prints, for the first snapshot, the snapshot of the unchanged tree and one after changing 10 files, the median
time of the mounted path and of the upload path, each beside `git status --porcelain` and `cp -al` on the same
tree in the same run, and what the unchanged snapshot sent and wrote.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from simrun_client.channel import open_channel
from simrun_client.snapshots import SnapshotResult, snapshot_to_store, upload_snapshot
from simrun_snapshot.server import create_server

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def generate(root: Path, git_dir: Path, files: int, total_mib: int) -> None:
    """Files of 0.2 to 1.8 times the mean size in 100 folders, committed to a repository kept outside the tree."""
    rng = random.Random(20240601)
    mean = total_mib * 1024 * 1024 // files
    root.mkdir(parents=True)
    for i in range(files):
        folder = root / f"pkg{i % 100:03d}" / f"sub{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{i:05d}.dat").write_bytes(rng.randbytes(int(mean * rng.uniform(0.2, 1.8))))
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    git(root, "init", "-q", "-b", "main", f"--separate-git-dir={git_dir}")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "generated")


def git(root: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median_of(runs: int, action: Callable[[], object], before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        times.append(timed(action))
    return statistics.median(times)


def interleaved(
    runs: int,
    action: Callable[[], object],
    cp_al: Callable[[], object],
    git_status: Callable[[], object],
    settle: Callable[[], object],
    before: Callable[[], object] | None,
) -> list[float]:
    """Medians of the action, `git status` and `cp -al`, run in turn so that all see the same load of the machine.

    `cp -al` changes the ctime of every file it links, which makes git re-read them all once: `settle` refreshes
    git's index (untimed) after it, so neither `git status` nor the snapshot pays for it.
    """
    times: list[list[float]] = [[], [], []]
    for _ in range(runs):
        times[2].append(timed(cp_al))
        settle()
        times[1].append(timed(git_status))
        if before is not None:
            before()
        times[0].append(timed(action))
    return [statistics.median(t) for t in times]


def store_state(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.lstat().st_ino, p.lstat().st_mtime_ns) for p in root.rglob("*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed at the end)")
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="simrun-snapshot-bench-"))
    try:
        run(work, args.files, args.mib, args.runs)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, files: int, mib: int, runs: int) -> None:
    tree = work / "model"
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    print(f"generating {files} files, about {mib} MiB, in {tree} …", flush=True)
    generate(tree, work / "model.git", files, mib)
    git(tree, "status", "--porcelain")  # let git refresh its index once, as any user's tree has it

    counter = iter(range(10**6))

    def settle() -> None:
        subprocess.run(["git", "update-index", "-q", "--refresh"], cwd=tree, check=False, capture_output=True)

    def git_status() -> None:
        subprocess.run(["git", "status", "--porcelain"], cwd=tree, check=True, capture_output=True)

    def cp_al() -> None:
        dest = work / f"cp-{next(counter)}"
        subprocess.run(["cp", "-al", str(tree), str(dest)], check=True)

    rows: list[tuple[str, float, float, float]] = []
    server = create_server(work / "served", "127.0.0.1:0").start()
    channel = open_channel(f"127.0.0.1:{server.port}")
    try:
        # First snapshot: an empty store and an empty stat cache each run.
        stores = iter(range(10**6))

        def cold_cache() -> None:
            shutil.rmtree(work / "cache", ignore_errors=True)

        def measure(label: str, action: Callable[[], object], before: Callable[[], object] | None = None) -> None:
            value, status_s, cp_s = interleaved(runs, action, cp_al, git_status, settle, before)
            rows.append((label, value, status_s, cp_s))

        measure("first snapshot, mounted", lambda: snapshot_to_store(tree, work / f"store-{next(stores)}"), cold_cache)
        uploads = iter(range(10**6))
        measure(
            "first snapshot, upload", lambda: upload_snapshot(tree, channel, name=f"first{next(uploads)}"), cold_cache
        )

        # The unchanged tree, warm cache.
        store = work / "store"
        snapshot_to_store(tree, store)
        upload_snapshot(tree, channel)
        before, served_before = store_state(store), store_state(work / "served")
        results: list[SnapshotResult] = []
        measure("unchanged, mounted", lambda: results.append(snapshot_to_store(tree, store)))
        measure("unchanged, upload", lambda: results.append(upload_snapshot(tree, channel)))
        written = len(set(store_state(store)) ^ set(before)) + len(
            set(store_state(work / "served")) ^ set(served_before)
        )
        sent = sum(r.bytes_sent for r in results)
        read = sum(r.files_read for r in results)
        existed = all(r.existed for r in results)

        # Ten changed files each run.
        paths = sorted(p for p in tree.rglob("*.dat"))
        rng = random.Random(7)

        def change_ten() -> None:
            for p in rng.sample(paths, 10):
                p.write_bytes(p.read_bytes()[::-1] + b"!")

        changed_results: list[SnapshotResult] = []
        measure("10 files changed, mounted", lambda: changed_results.append(snapshot_to_store(tree, store)), change_ten)
        upload_snapshot(tree, channel)  # the service's latest snapshot catches up with the mounted runs' changes
        measure("10 files changed, upload", lambda: changed_results.append(upload_snapshot(tree, channel)), change_ten)
    finally:
        channel.close()
        server.stop(None)

    size_mib = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file()) / 2**20
    print(f"\nmedians of {runs} runs; {files} files, {size_mib:.0f} MiB")
    print(f"{'figure':28} {'snapshot':>10} {'git status':>11} {'ratio':>7} {'cp -al':>9} {'ratio':>7}")
    for label, value, status_s, cp_s in rows:
        print(
            f"{label:28} {value * 1000:8.1f}ms {status_s * 1000:9.1f}ms {value / status_s:6.2f}x "
            f"{cp_s * 1000:7.1f}ms {value / cp_s:6.2f}x"
        )
    print(
        f"\nunchanged tree: existed={existed}, file contents sent on the upload path={sent} bytes, "
        f"files read={read}, store entries written={written}"
    )
    per_snapshot = sorted({r.contents_sent for r in changed_results})
    print(f"10 changed files: contents written or sent per snapshot = {per_snapshot}")


if __name__ == "__main__":
    main()
