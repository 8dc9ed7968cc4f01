"""How fast the `simrun` command starts: `simrun --version` and `simrun status RUN` beside `python -c pass`.

Each figure is the median wall time of several runs of the real command as a process, printed beside the
interpreter's own start (`python -c pass`, the baseline measured in the same run) and as a ratio to it.
`simrun status` asks a real `simrun server` (started here with a fresh home) about a run of the Monte Carlo
example that has ended, so it imports the client, makes two authenticated calls and draws its tables; `--json`
and `simrun whoami` print JSON or a line. None of them imports grpcio (their unary calls go on the client's own
HTTP/2 connection) or rich. Beside them, two floors: that of a Python gRPC client through grpcio
(`python -c "import grpc, google.protobuf..."`), which is what these commands paid before, and that of the
libraries `simrun status` now calls and draws with (click, the tracker's messages, hpack, socket), imported and
nothing done with them.

Goal (issue 16): both commands under 0.2 s.

    uv run --frozen python benchmarks/cli_start.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"
LIBRARIES = "import click, simrun.v1.tracker_pb2, hpack, socket"
"""What `simrun status` cannot start without: the command line, the messages, the call's headers and socket."""


def median_s(command: list[str], env: dict[str, str], repeats: int) -> tuple[float, float]:
    """The median wall and CPU (user + system) seconds of `command` over `repeats` runs, after one unmeasured
    run that warms the caches. The CPU seconds say what the command costs on a busy machine, where wall time
    mostly measures the wait for a core."""
    walls, cpus = [], []
    for attempt in range(repeats + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begun = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - begun
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
        if attempt:
            walls.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="runs of each command (median)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="simrun-cli-start-") as tmp:
        home = Path(tmp) / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
        env["SIMRUN_HOME"] = str(home)
        # As a user starts it: with the bytecode caches Python writes (a CI setting may turn them off, and then
        # every start compiles every module again, which is what this would measure).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        server = subprocess.Popen(
            [SIMRUN, "server", "--address", "127.0.0.1:0"], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            match = re.match(r"simrun serves at (\S+),", server.stdout.readline())
            if not match:
                raise SystemExit("simrun server did not start")
            env["SIMRUN_ENDPOINT"] = match.group(1)
            submitted = subprocess.run(
                [SIMRUN, "submit", str(ROOT / "examples" / "montecarlo" / "pi.yaml"), "--watch", "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if submitted.returncode != 0:
                raise SystemExit(f"the example run failed: {submitted.stderr.strip()}")
            run_id = json.loads(submitted.stdout)["run_id"]
            baseline = median_s([sys.executable, "-c", "pass"], env, args.repeats)
            # The floor of a Python gRPC client through grpcio: the two libraries it cannot do without.
            floor = median_s([sys.executable, "-c", "import grpc, google.protobuf.descriptor_pool"], env, args.repeats)
            libraries = median_s([sys.executable, "-c", LIBRARIES], env, args.repeats)
            figures = {
                "simrun --version": median_s([SIMRUN, "--version"], env, args.repeats),
                f"simrun status {run_id}": median_s([SIMRUN, "status", run_id], env, args.repeats),
                "simrun status RUN --json": median_s([SIMRUN, "status", run_id, "--json"], env, args.repeats),
                "simrun whoami": median_s([SIMRUN, "whoami"], env, args.repeats),
            }
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    load = os.getloadavg()[0]
    print(
        f"medians of {args.repeats} runs on {os.cpu_count()} cores at load {load_before:.1f} to {load:.1f}; "
        f"baseline `python -c pass`: wall {baseline[0]:.3f} s"
    )
    floor_name = "python -c 'import grpc, protobuf'"
    print(
        f"{floor_name:<40} wall {floor[0]:.3f} s ({floor[0] / baseline[0]:5.1f}x the baseline): "
        "the floor of a command that calls through grpcio"
    )
    libraries_name = "python -c 'import click, …, hpack'"
    print(
        f"{libraries_name:<40} wall {libraries[0]:.3f} s ({libraries[0] / baseline[0]:5.1f}x the baseline), "
        f"CPU {libraries[1]:.3f} s: the libraries of `simrun status` (click, protobuf, hpack, socket), imported"
    )
    for name, (wall, cpu) in figures.items():
        verdict = "under" if wall < 0.2 else "over"
        print(
            f"{name:<40} wall {wall:.3f} s ({wall / baseline[0]:5.1f}x the baseline, {verdict} the 0.2 s goal), "
            f"CPU {cpu:.3f} s ({cpu / max(baseline[1], 1e-3):5.1f}x the baseline's {baseline[1]:.3f} s)"
        )


if __name__ == "__main__":
    main()
