"""What tracing costs: SubmitRun and GetRun latency on the embedded server with telemetry off, with the API's no-op
provider (the default when no exporter is configured) and with the SDK exporting to an in-memory exporter.

Three servers (one per mode, each with its own store, the driver not started) and, for each, a client channel of
the same mode. The modes take turns in rounds of calls, so a machine shared with others slows them alike; each
figure is the median over rounds of the round's median, beside "off" measured in the same run (a ratio).

Goal (issue 15): no-op within 5% of off.

    uv run --frozen python benchmarks/telemetry_bench.py [--calls 50] [--rounds 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_client.snapshots import upload_snapshot
from simrun_core.config import Limits, NodeConfig, ServerConfig
from simrun_core.rpc.channel import open_channel
from simrun_core.snapshots.convert import snapshot_to_proto
from simrun_core.telemetry import Telemetry
from simrun_gateway.embedded import EmbeddedServer, start_embedded
from timing import median_seconds

MODEL = Path(__file__).resolve().parents[1] / "tests" / "e2e_model"
TOKEN = "bench-token"
WORKFLOW = "tasks:\n  scan:\n    type: e2etasks.tasks:Slow\n    settings: {units: 10000, seconds: 0.01}\n"


def model_repo(dest: Path) -> Path:
    shutil.copytree(MODEL, dest, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def sdk_telemetry(exporter: InMemorySpanExporter, service: str) -> Telemetry:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Telemetry(provider, owns_provider=True)


class Mode:
    """One server and one client channel with the same telemetry."""

    def __init__(self, name: str, root: Path, server_telemetry: Telemetry, client_telemetry: Telemetry) -> None:
        self.name = name
        tokens = root / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
        config = ServerConfig(
            home=root,
            store=root / "store",
            address="127.0.0.1:0",
            tokens_file=tokens,
            nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
            # Every SubmitRun timed records a run that nothing drives to its end: past the default bound of 50.
            limits=Limits(active_runs_per_identity=1_000_000),
        )
        self.telemetry = (server_telemetry, client_telemetry)
        self.server: EmbeddedServer = start_embedded(config, drive_runs=False, telemetry=server_telemetry)
        self.channel = open_channel(self.server.address, token=TOKEN, telemetry=client_telemetry)
        self.stub = tracker_pb2_grpc.RunTrackerServiceStub(self.channel)
        snapshot = snapshot_to_proto(upload_snapshot(model_repo(root / "model"), self.channel).snapshot)
        self.submit_request = tracker_pb2.SubmitRunRequest(workflow=WORKFLOW, snapshots=[snapshot])
        run = self.stub.SubmitRun(self.submit_request)  # warm: the first describes the task types
        self.get_request = tracker_pb2.GetRunRequest(run_id=run.run.run_id)
        self.stub.GetRun(self.get_request)

    def calls(self) -> dict[str, Callable[[], object]]:
        return {
            "SubmitRun": lambda: self.stub.SubmitRun(self.submit_request),
            "GetRun": lambda: self.stub.GetRun(self.get_request),
        }

    def close(self) -> None:
        self.channel.close()
        self.server.stop()
        for telemetry in self.telemetry:
            telemetry.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per round and mode")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    exporter = InMemorySpanExporter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setups = {
            "off": (Telemetry.off(), Telemetry.off()),
            "no-op": (Telemetry.noop(), Telemetry.noop()),
            "sdk, in-memory": (sdk_telemetry(exporter, "server"), sdk_telemetry(exporter, "client")),
        }
        modes = []
        for name, (server_telemetry, client_telemetry) in setups.items():
            folder = root / name.replace(" ", "").replace(",", "-")
            folder.mkdir()
            modes.append(Mode(name, folder, server_telemetry, client_telemetry))
        try:
            medians: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.rounds):
                for method in ("SubmitRun", "GetRun"):
                    # Each round starts with another mode, so a drift of the machine's load favours none.
                    for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
                        medians.setdefault((method, mode.name), []).append(
                            median_seconds(mode.calls()[method], args.calls, warm=0)
                        )
        finally:
            for mode in modes:
                mode.close()
    print(f"latency, median of {args.rounds} rounds of each round's median of {args.calls} calls:")
    for method in ("SubmitRun", "GetRun"):
        off = statistics.median(medians[(method, "off")])
        cells = []
        for mode in modes:
            value = statistics.median(medians[(method, mode.name)])
            cells.append(f"{mode.name} {value * 1e3:6.2f} ms ({value / off:.3f}x)")
        print(f"  {method:9}  " + "   ".join(cells))
    print(f"  spans exported by the SDK mode: {len(exporter.get_finished_spans())}")
    print("goal: no-op within 5% of off (ratio <= 1.05)")


if __name__ == "__main__":
    main()
