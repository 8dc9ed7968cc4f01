"""The gateway's cost when the tracker runs apart: idle streams it forwards, and the calls it relays.

The tracker and the gateway each in a process of its own on loopback (`python -m simrun_tracker`, `python -m
simrun_gateway` with `services.tracker`), as a split deployment runs them. Prints medians over `--repeats`:

- the gateway process's CPU while `--streams` callers follow the runs list (WatchRuns) of a tracker where nothing
  changes, beside the same gateway with none open (goal: under 2% of a core; each stream waits on the service, so
  it should cost nothing while nothing is sent);
- a ListRuns call through the gateway beside the same call made to the tracker directly (the relay's hop).

    uv run --frozen python benchmarks/gateway_forwarding.py [--streams 50] [--repeats 3] [--cpu-seconds 10]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from timing import median_seconds

TOKEN = "bench-token"
_SERVING = re.compile(rb"serving on (?:port |[\d.]+:)(\d+)")


def serve(module: str, config: dict[str, object], root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m module --config` started with `config` (its log in a file: a pipe nobody reads would fill and
    stop it), and the port it says it serves on."""
    path, log = root / f"{module}.yaml", root / f"{module}.log"
    path.write_text(yaml.safe_dump(config))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--config", str(path)], stderr=sink, stdout=subprocess.DEVNULL
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        found = _SERVING.search(log.read_bytes())
        if found:
            return process, int(found.group(1))
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{module} did not serve: {log.read_text()[-2000:]}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_percent(pid: int, seconds: float) -> float:
    """Percent of one core process `pid` used over `seconds`."""
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - before) / (time.monotonic() - start)


def repeat(root: Path, streams: int, seconds: float, calls: int) -> tuple[float, float, float, float]:
    """(CPU with the streams, CPU with none, forwarded ListRuns s, direct ListRuns s) of one fresh deployment."""
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
    common = {
        "tokens_file": str(tokens),
        "address": "127.0.0.1:0",
        "nodes": [{"name": "node-a", "cores": 2, "memory_gb": 4}],
        "environments": {"kind": "server"},
    }
    tracker, tracker_port = serve("simrun_tracker", {**common, "home": str(root), "store": str(root / "store")}, root)
    gateway, gateway_port = serve(
        "simrun_gateway",
        {
            **common,
            "home": str(root / "gateway"),
            "store": str(root / "gateway-store"),
            "services": {"tracker": f"127.0.0.1:{tracker_port}"},
        },
        root,
    )
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    through = grpc.insecure_channel(f"127.0.0.1:{gateway_port}")
    direct = grpc.insecure_channel(f"127.0.0.1:{tracker_port}")
    try:
        via_gateway = tracker_pb2_grpc.RunTrackerServiceStub(through)
        listing = tracker_pb2.ListRunsRequest(page_size=50)
        forwarded = median_seconds(lambda: via_gateway.ListRuns(listing, metadata=metadata, timeout=10), calls, warm=5)
        direct_stub = tracker_pb2_grpc.RunTrackerServiceStub(direct)
        alone = median_seconds(lambda: direct_stub.ListRuns(listing, metadata=metadata, timeout=10), calls, warm=5)
        time.sleep(1.0)
        none_open = cpu_percent(gateway.pid, seconds)
        following = [via_gateway.WatchRuns(tracker_pb2.WatchRunsRequest(), metadata=metadata) for _ in range(streams)]
        time.sleep(1.0)
        for call in following:
            assert not call.done(), f"a stream ended: {call.code()} {call.details()}"
        with_open = cpu_percent(gateway.pid, seconds)
        for call in following:
            call.cancel()
        return with_open, none_open, forwarded, alone
    finally:
        through.close()
        direct.close()
        for process in (gateway, tracker):
            process.terminate()
            process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-seconds", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    results = []
    for index in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(repeat(Path(tmp), args.streams, args.cpu_seconds, args.calls))
        with_open, none_open, forwarded, alone = results[-1]
        print(
            f"repeat {index + 1}: CPU {with_open:.2f}% with {args.streams} streams, {none_open:.2f}% with none; "
            f"ListRuns {forwarded * 1e3:.2f} ms forwarded, {alone * 1e3:.2f} ms direct"
        )
    with_open, none_open, forwarded, alone = (statistics.median(column) for column in zip(*results, strict=True))
    print(
        f"the gateway's CPU with {args.streams} forwarded streams where nothing changes: {with_open:.2f}% of a core, "
        f"with none {none_open:.2f}% (goal < 2%)"
    )
    print(
        f"ListRuns through the gateway: {forwarded * 1e3:.2f} ms, to the tracker directly {alone * 1e3:.2f} ms: "
        f"ratio {forwarded / alone:.2f}"
    )


if __name__ == "__main__":
    main()
