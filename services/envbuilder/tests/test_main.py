"""`python -m simrun_envbuilder` serves the builder alone, as a real process, until SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from simrun.v1 import envbuilder_pb2, envbuilder_pb2_grpc


def test_the_builder_serves_alone_and_stops_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SIMRUN_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simrun_envbuilder",
            "--store",
            str(tmp_path / "store"),
            "--address",
            f"127.0.0.1:{port}",
            "--no-auth",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = envbuilder_pb2_grpc.EnvironmentBuilderServiceStub(channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                listed = stub.ListEnvironments(envbuilder_pb2.ListEnvironmentsRequest(), timeout=2)
                break
            except grpc.RpcError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        assert list(listed.environments) == []
        assert (tmp_path / "home" / "environments" / "runtime").is_dir()
        channel.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
