"""End to end: open WatchRun streams never starve other calls; past the bound, calls are refused at once."""

from __future__ import annotations

import threading
import time

import grpc
from e2e_support import TOKENS, wait_final, write_workflow
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tracker_pb2, tracker_pb2_grpc
from simrun_core.rpc.auth import bearer_metadata

SLOW = """
name: slow
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {units: 40, seconds: 0.5, seed: 3}
"""


def _open_watches(address: str, run_id: str, count: int) -> tuple[list[grpc.Channel], list[object], list[int]]:
    """`count` WatchRun streams on one channel each; returns the channels, the calls and who got a first message."""
    channels, calls, first = [], [], []
    lock = threading.Lock()

    def read(index: int, call: object) -> None:
        try:
            for _ in call:  # type: ignore[attr-defined]
                with lock:
                    first.append(index)
                return
        except grpc.RpcError:
            return

    for index in range(count):
        channel = grpc.insecure_channel(address)
        stub = tracker_pb2_grpc.RunTrackerServiceStub(channel)
        call = stub.WatchRun(tracker_pb2.WatchRunRequest(run_id=run_id), metadata=bearer_metadata(TOKENS["owner"]))
        threading.Thread(target=read, args=(index, call), daemon=True).start()
        channels.append(channel)
        calls.append(call)
    return channels, calls, first


def test_two_hundred_watchers_leave_other_calls_fast(start_server, client_for, e2e_model) -> None:
    server = start_server()
    owner = client_for(server, "owner")
    run = owner.submit(write_workflow(e2e_model, SLOW, "slow.yaml"))
    channels, calls, first = _open_watches(server.address, run.run_id, 200)
    try:
        deadline = time.monotonic() + 30
        while len(first) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(first) == 200, f"only {len(first)} of 200 streams got their first message"
        stub = gateway_pb2_grpc.GatewayServiceStub(owner.channel)
        began = time.monotonic()
        stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=bearer_metadata(TOKENS["owner"]), timeout=3)
        assert time.monotonic() - began < 0.5
        second = owner.submit(write_workflow(e2e_model, SLOW.replace("seed: 3", "seed: 4"), "again.yaml"))
        assert second.run_id != run.run_id
    finally:
        for call in calls:
            call.cancel()  # type: ignore[attr-defined]
        for channel in channels:
            channel.close()
    owner.cancel(run.run_id)
    owner.cancel(second.run_id)


def test_past_the_bound_of_concurrent_calls_a_call_is_refused_at_once(start_server, client_for, e2e_model) -> None:
    server = start_server(max_concurrent_calls=8)
    owner = client_for(server, "owner")
    run = owner.submit(write_workflow(e2e_model, SLOW, "slow.yaml"))
    channels, calls, first = _open_watches(server.address, run.run_id, 8)
    try:
        deadline = time.monotonic() + 15
        while len(first) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(first) == 8
        stub = gateway_pb2_grpc.GatewayServiceStub(owner.channel)
        began = time.monotonic()
        try:
            stub.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=bearer_metadata(TOKENS["owner"]), timeout=5)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        else:
            raise AssertionError("a call past the bound was served")
        assert time.monotonic() - began < 1.0
    finally:
        for call in calls:
            call.cancel()  # type: ignore[attr-defined]
        for channel in channels:
            channel.close()
    # Once the streams are gone, calls are served again.
    deadline = time.monotonic() + 10
    while True:
        try:
            owner.cancel(run.run_id)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


TWO = """
name: two
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {units: 6, seconds: 0.5, seed: 5}
  total:
    type: e2etasks.tasks:Sum
    inputs: {values: values.values}
"""


def test_following_the_logs_of_a_task_waiting_for_its_inputs_follows_it_to_its_end(
    start_server, client_for, e2e_model
) -> None:
    server = start_server()
    owner = client_for(server, "owner")
    run = owner.submit(write_workflow(e2e_model, TWO, "two.yaml"))

    def total_state() -> int:
        return next(t.state for t in owner.get_run(run.run_id).tasks if t.task_id == "total")

    assert total_state() == 1  # PENDING: its input is not done
    text = "".join(chunk.lines for chunk in owner.logs(run.run_id, "total", follow=True, timeout_s=90))
    assert "attempt 1 exited with exit code 0" in text, text
    # The stream ends with the task's pods; the driver records the task's end a moment later.
    assert wait_final(owner, run.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert total_state() == 4


def test_watchers_of_a_run_that_does_not_change_sleep_and_end_as_their_calls_end(
    start_server, client_for, e2e_model
) -> None:
    server = start_server()
    owner = client_for(server, "owner")
    held = SLOW.replace("units: 40, seconds: 0.5", "units: 2, seconds: 120")
    run = owner.submit(write_workflow(e2e_model, held, "held.yaml"))
    deadline = time.monotonic() + 30

    def measured() -> bool:  # the run changes once more when its pod's memory is first measured
        got = owner.get_run(run.run_id)
        pods = [pod for task in got.tasks for pod in task.pods]
        return got.state == common_pb2.RUN_STATE_RUNNING and any(pod.peak_memory_gb > 0 for pod in pods)

    while not measured() and time.monotonic() < deadline:
        time.sleep(0.05)
    reader = server.tracker.reader
    channels, calls, first = _open_watches(server.address, run.run_id, 20)
    try:
        while (len(first) < 20 or reader.watching() < 20) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(first) == 20 and reader.watching() == 20
        reads = reader.watch_reads
        assert reads <= 4, reads  # one reading of the run for all of them (another if it changed as they came)
        time.sleep(1.5)
        assert reader.watch_reads == reads  # nothing changed: nobody read it again
    finally:
        for call in calls:
            call.cancel()  # type: ignore[attr-defined]
        ended = time.monotonic()
        for channel in channels:
            channel.close()
    while reader.watching() and time.monotonic() - ended < 5:
        time.sleep(0.01)
    # The calls' end wakes their watchers at once, not at their next check of the caller.
    assert reader.watching() == 0 and time.monotonic() - ended < 0.8
    owner.cancel(run.run_id)
