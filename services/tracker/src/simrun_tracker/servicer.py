"""The RunTrackerService servicer: decodes a request, makes one call on the run tracker, encodes the answer."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from datetime import UTC

import grpc
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_core.messages import mode_from_proto
from simrun_core.paging import page
from simrun_core.rpc.auth import current_identity
from simrun_runtime.record import RunRecord

from simrun_tracker import convert
from simrun_tracker.outputs import OutputStore
from simrun_tracker.reads import Hangup, TaskProgress
from simrun_tracker.tracker import RunTracker


class RunTrackerServicer(tracker_pb2_grpc.RunTrackerServiceServicer):
    """Thin translation between simrun.v1 and `RunTracker`."""

    def __init__(self, tracker: RunTracker) -> None:
        self.tracker = tracker
        self._watched = _WatchMessages()

    def SubmitRun(
        self, request: tracker_pb2.SubmitRunRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.SubmitRunResponse:
        record = self.tracker.submit(convert.submission(self.tracker.store, request), current_identity())
        # With units done: a retried request id returns its first run, which may be under way or over.
        return tracker_pb2.SubmitRunResponse(run=convert.run_message(record, self.tracker.progress(record)))

    def GetRun(self, request: tracker_pb2.GetRunRequest, context: grpc.ServicerContext) -> tracker_pb2.GetRunResponse:
        record = self.tracker.get(request.run_id, current_identity())
        return tracker_pb2.GetRunResponse(run=convert.run_message(record, self.tracker.progress(record)))

    def ListRuns(
        self, request: tracker_pb2.ListRunsRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.ListRunsResponse:
        state = convert.RUN_STATE_FROM_PROTO.get(request.state)
        records, token = self.tracker.page(
            request.group,
            state.value if state else "",
            request.owner,
            request.page_size,
            request.page_token,
            current_identity(),
        )
        return tracker_pb2.ListRunsResponse(runs=[convert.run_message(r) for r in records], next_page_token=token)

    def CancelRun(
        self, request: tracker_pb2.CancelRunRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.CancelRunResponse:
        record = self.tracker.cancel(request.run_id, current_identity())
        return tracker_pb2.CancelRunResponse(run=convert.run_message(record))

    def WatchRun(
        self, request: tracker_pb2.WatchRunRequest, context: grpc.ServicerContext
    ) -> Iterator[tracker_pb2.WatchRunResponse]:
        hangup = Hangup()
        if not context.add_callback(hangup):  # the call ended (a cancel, the client gone): the watcher wakes
            hangup()
        for record, progress in self.tracker.watch(request.run_id, context.is_active, current_identity(), hangup):
            if not context.is_active():
                return
            yield self._watched.message(record, progress)

    def WatchRuns(
        self, request: tracker_pb2.WatchRunsRequest, context: grpc.ServicerContext
    ) -> Iterator[tracker_pb2.WatchRunsResponse]:
        hangup = Hangup()
        if not context.add_callback(hangup):
            hangup()
        state = convert.RUN_STATE_FROM_PROTO.get(request.state)
        since = request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None
        runs = self.tracker.watch_runs(
            request.group,
            state.value if state else "",
            request.owner,
            since,
            current_identity(),
            context.is_active,
            hangup,
        )
        for record, progress in runs:
            if not context.is_active():
                return
            yield tracker_pb2.WatchRunsResponse(run=convert.run_message(record, progress))

    def StreamLogs(
        self, request: tracker_pb2.StreamLogsRequest, context: grpc.ServicerContext
    ) -> Iterator[tracker_pb2.StreamLogsResponse]:
        identity = current_identity()
        logs = self.tracker.logs(
            request.run_id, request.task_id, request.worker, request.follow, identity, context.is_active
        )
        for pod, lines in logs:
            for piece in _pieces(lines, LOG_MESSAGE_CHARS):
                if not context.is_active():
                    return
                yield tracker_pb2.StreamLogsResponse(pod=pod, lines=piece)

    def CompareRuns(
        self, request: tracker_pb2.CompareRunsRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.CompareRunsResponse:
        comparison = self.tracker.compare(list(request.run_ids), request.group, current_identity())
        return convert.comparison_message(comparison)

    def EstimateRun(
        self, request: tracker_pb2.EstimateRunRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.EstimateRunResponse:
        snapshots = convert.snapshot_refs(self.tracker.store, request.snapshots)
        reuse = convert.reuse_request(request)
        estimates = self.tracker.estimate(
            request.workflow, snapshots, current_identity(), mode_from_proto(request.mode), reuse
        )
        return convert.estimate_message(estimates)

    def ListNodes(
        self, request: tracker_pb2.ListNodesRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.ListNodesResponse:
        nodes = [convert.node_message(node) for node in self.tracker.nodes()]
        chunk, token = page(nodes, request.page_size, request.page_token, "nodes", default=100)
        return tracker_pb2.ListNodesResponse(nodes=chunk, next_page_token=token)

    def ListOutputs(
        self, request: tracker_pb2.ListOutputsRequest, context: grpc.ServicerContext
    ) -> tracker_pb2.ListOutputsResponse:
        files = OutputStore(self.tracker.store).list_files(
            self.tracker.get(request.run_id, current_identity()), request.task_id, request.port
        )
        scope = f"outputs|{request.run_id}|{request.task_id}|{request.port}"
        chunk, token = page(files, request.page_size, request.page_token, scope, default=1000)
        return tracker_pb2.ListOutputsResponse(
            files=[convert.output_file_message(f) for f in chunk], next_page_token=token
        )

    def FetchOutput(
        self, request: tracker_pb2.FetchOutputRequest, context: grpc.ServicerContext
    ) -> Iterator[tracker_pb2.FetchOutputResponse]:
        record = self.tracker.get(request.run_id, current_identity())
        for piece in OutputStore(self.tracker.store).fetch(record, request.task_id, request.port):
            if not context.is_active():
                return
            yield convert.output_chunk_message(piece)


LOG_MESSAGE_CHARS = 1 << 18
"""The most characters of log lines in one StreamLogs message (at most 1 MiB in UTF-8): a whole archive or a burst
of a followed log would pass what a client takes in one message (gRPC's default 4 MiB, simrun's client 64 MiB)."""


class _WatchMessages:
    """The last WatchRun message made for each watched run, kept with the record and progress it was made from:
    the tracker hands a run's watchers the same record and progress, so the message is made once a change, not once
    a watcher. A message is only read (serialized) once made."""

    KEPT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: OrderedDict[str, tuple[RunRecord, list[TaskProgress], tracker_pb2.WatchRunResponse]] = OrderedDict()

    def message(self, record: RunRecord, progress: list[TaskProgress]) -> tracker_pb2.WatchRunResponse:
        with self._lock:
            kept = self._last.get(record.run_id)
            if kept is not None and kept[0] is record and kept[1] is progress:
                self._last.move_to_end(record.run_id)
                return kept[2]
        message = tracker_pb2.WatchRunResponse(
            run=convert.run_message(record, progress), progress=convert.progress_messages(progress)
        )
        with self._lock:
            self._last[record.run_id] = (record, progress, message)
            self._last.move_to_end(record.run_id)
            while len(self._last) > self.KEPT:
                self._last.popitem(last=False)
        return message


def _pieces(text: str, size: int) -> Iterator[str]:
    """`text` in pieces of at most `size` characters, each ending at a line's end where one is within it."""
    while len(text) > size:
        cut = text.rfind("\n", 0, size) + 1 or size
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text
