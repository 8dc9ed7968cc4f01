"""The typed Python client of simrun: one channel to the gateway, proto messages back, domain errors raised."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

# Only the tracker's messages, which the reading commands call: grpcio and the other services' modules (and
# OpenTelemetry, pydantic, subprocess) are imported by the methods that need them, so `simrun status` starts sooner.
from simrun.v1 import common_pb2, tracker_pb2
from simrun_core.errors import InvalidArgument, SimrunError, Unauthenticated, Unavailable
from simrun_core.home import DEFAULT_ENDPOINT, client_token, simrun_home

from simrun_client import unary
from simrun_client.channel import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    import grpc
    from google.protobuf.message import Message
    from simrun.v1 import tracker_pb2_grpc
    from simrun_core.telemetry import Telemetry

    from simrun_client.snapshots import SnapshotResult

M = TypeVar("M", bound="Message")
T = TypeVar("T")

TRACKER = "/simrun.v1.RunTrackerService/"
GATEWAY = "/simrun.v1.GatewayService/"
LEARNER = "/simrun.v1.ResourceLearnerService/"
"""The paths of the services' methods, before the method's name."""

FINAL_RUN_STATES = frozenset(
    {common_pb2.RUN_STATE_SUCCEEDED, common_pb2.RUN_STATE_FAILED, common_pb2.RUN_STATE_CANCELLED}
)

# What grpc says when nothing listens at the endpoint (as opposed to a service behind the gateway being down).
_UNREACHABLE_MARKERS = ("failed to connect", "connection refused", "dns resolution failed", "name resolution")


def run_state(name: str | int) -> common_pb2.RunState.ValueType:
    """A `RunState` value from its number, its full name (`RUN_STATE_RUNNING`) or its short one (`running`)."""
    if isinstance(name, int):
        return common_pb2.RunState.ValueType(name)
    full = name.upper().replace("-", "_")
    full = full if full.startswith("RUN_STATE_") else f"RUN_STATE_{full}"
    try:
        return common_pb2.RunState.Value(full)
    except ValueError:
        names = ", ".join(n.removeprefix("RUN_STATE_").lower() for n in common_pb2.RunState.keys()[1:])
        raise InvalidArgument(f"unknown run state {name!r}; one of {names}") from None


def reuse_policy(name: str | None) -> common_pb2.ReusePolicy.ValueType:
    """A `ReusePolicy` value from `never`, `same-run` or `any` (None or empty: the default, any)."""
    if not name:
        return common_pb2.REUSE_POLICY_UNSPECIFIED
    full = "REUSE_POLICY_" + name.strip().upper().replace("-", "_")
    try:
        return common_pb2.ReusePolicy.Value(full)
    except ValueError:
        raise InvalidArgument(f"unknown reuse {name!r}: use never, same-run or any") from None


def git_toplevel(path: Path) -> Path:
    """The root of the git working tree that contains `path`.

    Raises:
        InvalidArgument: `path` is not inside a git working tree.
    """
    import subprocess

    folder = path if path.is_dir() else path.parent
    try:
        result = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise InvalidArgument("git is not installed: simrun snapshots the git working tree of the model") from None
    if result.returncode != 0:
        raise InvalidArgument(
            f"{path} is not in a git working tree: simrun runs a snapshot of the git working tree that holds "
            "the workflow; `git init` the model, or name the model's working tree"
        )
    return Path(result.stdout.strip())


class Stream(Iterator[T]):
    """The messages of a server stream, read by iterating; `cancel()` ends it on the server, from any thread.

    A reader blocked in `next` on another thread then stops (`StopIteration`), so a web page that closes or an
    agent that gives up does not hold the server's stream until its deadline. A consumer that stops early and
    drops the stream cancels it too.
    """

    def __init__(self, call: Any, explain: Callable[[SimrunError], SimrunError], *, until: bool) -> None:
        self._call = call
        self._explain = explain
        self._until = until
        self._cancelled = False

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        import grpc
        from simrun_core.rpc.errors import to_domain_error

        try:
            return cast(T, next(self._call))
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if self._cancelled and code == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            if self._until and code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StopIteration from None
            raise self._explain(to_domain_error(exc)) from None

    def cancel(self) -> None:
        """Ends the stream on the server; a reader blocked in `next` stops."""
        self._cancelled = True
        self._call.cancel()

    close = cancel

    def __del__(self) -> None:
        if not self._cancelled:
            self._call.cancel()


class Client:
    """A connection to simrun at one endpoint (the gateway), authenticated by a bearer token.

    Every method returns proto messages of `simrun.v1` and raises the `simrun_core.errors` hierarchy
    (`InvalidArgument`, `NotFound`, `FailedPrecondition`, `PermissionDenied`, `Unauthenticated`,
    `Unavailable`, …) instead of gRPC errors.

    Args:
        endpoint: `host:port` of the gateway; None for `simrun_core.config.DEFAULT_ENDPOINT`.
        token: the bearer token; None for `$SIMRUN_TOKEN`, else `$SIMRUN_HOME/token`.
        timeout_s: seconds a unary call may take (streams are not limited); None for no limit.
        tls_ca: a CA bundle (PEM): connect with TLS and verify the gateway against it; None for
            `$SIMRUN_TLS_CA`, else plaintext.
        tls_cert, tls_key: a client certificate and its key, for a gateway that asks for mutual TLS.
        telemetry: where the client's spans go; by default the client's own, from the OpenTelemetry variables
            (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_EXPORTER`; service name `simrun-client`), made when first
            needed: a client whose calls nothing traces does not load OpenTelemetry.
        quick_start: make unary calls on a plaintext HTTP/2 connection of the client's own
            (`simrun_client.unary`) instead of grpcio's channel, where the two reach the server alike (plaintext,
            a `host:port` endpoint, no proxy, nothing traced): a process that makes a few calls and ends then does
            not load grpcio (the CLI). Streams and uploads still go through grpcio's channel, opened when needed.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float | None = 120.0,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        telemetry: Telemetry | None = None,
        quick_start: bool = False,
    ) -> None:
        from simrun_core.telemetry_env import may_record

        self.endpoint = endpoint or DEFAULT_ENDPOINT
        self.token = client_token(token)
        self.timeout_s = timeout_s
        self._tls_ca = tls_ca or (Path(os.environ["SIMRUN_TLS_CA"]) if os.environ.get("SIMRUN_TLS_CA") else None)
        self._tls_cert, self._tls_key = tls_cert, tls_key
        self._telemetry = telemetry
        self._grpc_channel: grpc.Channel | None = None
        self._opening = threading.Lock()  # threads sharing the client (simrun-mcp's) open one channel
        self._tracker_stub: tracker_pb2_grpc.RunTrackerServiceStub | None = None
        self._unary: unary.UnaryConnection | None = None
        self._quick = quick_start and self._tls_ca is None and telemetry is None and not may_record()
        self._open_unary()

    def _open_unary(self) -> None:
        if self._quick and unary.usable(self.endpoint):
            metadata = [("authorization", f"Bearer {self.token}")] if self.token else []
            self._unary = unary.UnaryConnection(self.endpoint, metadata, MAX_MESSAGE_BYTES)

    @property
    def telemetry(self) -> Telemetry:
        """Where the client's own spans go (`submit`'s, `resume`'s): the given telemetry, else the process's."""
        if self._telemetry is None:
            from simrun_core.telemetry import process_telemetry

            from simrun_client.channel import SERVICE_NAME

            self._telemetry = process_telemetry(SERVICE_NAME)
        return self._telemetry

    @property
    def _tracker(self) -> tracker_pb2_grpc.RunTrackerServiceStub:
        """The tracker's stub on grpcio's channel, for its streams."""
        if self._tracker_stub is None:
            from simrun.v1 import tracker_pb2_grpc

            channel = self.channel
            with self._opening:
                if self._tracker_stub is None:
                    self._tracker_stub = tracker_pb2_grpc.RunTrackerServiceStub(channel)
        return self._tracker_stub

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._unary is not None:
            self._unary.close()
        if self._grpc_channel is not None:
            self._grpc_channel.close()

    @property
    def channel(self) -> grpc.Channel:
        """grpcio's channel to the gateway (opened at first use), for streams, uploads and stubs of services this
        client has no method for. It sends the token as `authorization: Bearer …` on every call."""
        if self._grpc_channel is None:
            from simrun_client.channel import open_channel

            with self._opening:
                if self._grpc_channel is None:
                    self._grpc_channel = open_channel(
                        self.endpoint,
                        self.token,
                        tls_ca=self._tls_ca,
                        tls_cert=self._tls_cert,
                        tls_key=self._tls_key,
                        telemetry=self._telemetry,
                    )
        return self._grpc_channel

    def identity(self) -> common_pb2.Identity:
        """Who the token belongs to and at which priority its runs go."""
        from simrun.v1 import gateway_pb2

        request = gateway_pb2.GetIdentityRequest()
        return self._call(GATEWAY + "GetIdentity", request, gateway_pb2.GetIdentityResponse).identity

    def wait_ready(self, timeout_s: float, poll_s: float = 0.2) -> common_pb2.Identity:
        """Who the token belongs to, once simrun answers: while simrun cannot be reached (it is starting), or no
        token was found and `simrun server` has not yet written its token file, this tries again for up to
        `timeout_s` seconds, then raises the last error (the same one-line error as any call)."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.identity()
            except (Unavailable, Unauthenticated) as error:
                starting = isinstance(error, Unavailable) and str(error).startswith("cannot reach simrun")
                no_token_yet = isinstance(error, Unauthenticated) and self.token is None
                remaining = deadline - time.monotonic()
                if not (starting or no_token_yet) or remaining <= 0:
                    raise
            time.sleep(min(poll_s, remaining))
            token = client_token(None) if self.token is None else self.token
            if token != self.token:
                # The server wrote its token file since: connect again with it.
                self.close()
                self.token, self._grpc_channel, self._tracker_stub, self._unary = token, None, None, None
                self._open_unary()

    def snapshot(self, tree: str | Path, *, name: str | None = None, store: str | Path | None = None) -> SnapshotResult:
        """Snapshots a git working tree: into `store` when it is mounted here, else by uploading what simrun lacks.

        Args:
            tree: the working tree (its top level or a folder in it).
            name: the source name; the tree's folder name by default.
            store: the root of the run store, when it is mounted on this machine.
        """
        # Imported here: snapshotting (and pydantic with it) is for the commands that submit, not for `status`.
        from simrun_client.snapshots import snapshot_to_store, upload_snapshot

        tree = Path(tree)
        if not tree.is_dir():
            raise InvalidArgument(f"cannot snapshot {tree}: not a folder")
        try:
            if store is not None:
                return snapshot_to_store(tree, Path(store), name=name)
            return upload_snapshot(tree, self.channel, name=name, timeout_s=self.timeout_s)
        except SimrunError as exc:
            raise self._explain(exc, self.timeout_s) from None

    def submit(
        self,
        workflow_path: str | Path,
        *,
        model: str | Path | None = None,
        group: str | None = None,
        single_server: bool = False,
        reserve: str | None = None,
        store: str | Path | None = None,
        reuse: str | None = None,
        resume_from: str | None = None,
        rerun: list[str] | tuple[str, ...] = (),
        request_id: str | None = None,
    ) -> common_pb2.Run:
        """Submits a workflow file, run on a snapshot of its model, and returns the run as recorded (SUBMITTING).

        Args:
            workflow_path: the workflow file (YAML).
            model: the model's working tree; None for the git working tree that holds the workflow file.
            group: the run's group; None for the workflow's, else `default`.
            single_server: place every split task's pod on one server.
            reserve: a node to reserve for the run; None for the workflow's or none.
            store: the run store when it is mounted on this machine: the snapshot is written there directly
                instead of being uploaded.
            reuse: where earlier results may be reused from: `never`, `same-run` (only `resume_from`) or `any`
                (the default: any run this identity may read).
            resume_from: a run whose results are reused first.
            rerun: tasks to compute again even where an earlier result has their key.
            request_id: an id you pick for this submission, so retrying it is safe: a submission with a request
                id your identity used before returns that first run instead of starting another.
        """
        # One span over the snapshot and the submission, so both calls sit in one trace under the client's.
        with self.telemetry.span("simrun_client.submit", attributes={"simrun.workflow": str(workflow_path)}) as span:
            text, snapshots = self._prepare(workflow_path, model, store)
            request = tracker_pb2.SubmitRunRequest(
                workflow=text,
                snapshots=snapshots,
                group=group or "",
                mode=common_pb2.SPLIT_MODE_SINGLE_SERVER if single_server else common_pb2.SPLIT_MODE_UNSPECIFIED,
                reserve=reserve or "",
                reuse=reuse_policy(reuse),
                resume_from_run_id=resume_from or "",
                rerun=list(rerun),
                request_id=request_id or "",
            )
            run = self._call(TRACKER + "SubmitRun", request, tracker_pb2.SubmitRunResponse).run
            span.set_attribute("simrun.run_id", run.run_id)
            return run

    def estimate(
        self,
        workflow_path: str | Path,
        *,
        model: str | Path | None = None,
        single_server: bool = False,
        store: str | Path | None = None,
        reuse: str | None = None,
        resume_from: str | None = None,
        rerun: list[str] | tuple[str, ...] = (),
    ) -> tracker_pb2.EstimateRunResponse:
        """Plans a workflow file without running it: each task's plan, resources, once learned seconds, and the
        earlier task it would reuse (`reuse`, `resume_from` and `rerun` as in `submit`)."""
        with self.telemetry.span("simrun_client.estimate", attributes={"simrun.workflow": str(workflow_path)}):
            text, snapshots = self._prepare(workflow_path, model, store)
            request = tracker_pb2.EstimateRunRequest(
                workflow=text,
                snapshots=snapshots,
                mode=common_pb2.SPLIT_MODE_SINGLE_SERVER if single_server else common_pb2.SPLIT_MODE_UNSPECIFIED,
                reuse=reuse_policy(reuse),
                resume_from_run_id=resume_from or "",
                rerun=list(rerun),
            )
            return self._call(TRACKER + "EstimateRun", request, tracker_pb2.EstimateRunResponse)

    def resume(
        self,
        run_id: str,
        *,
        model: str | Path,
        store: str | Path | None = None,
        rerun: list[str] | tuple[str, ...] = (),
    ) -> common_pb2.Run:
        """Snapshots the model's working tree again and submits the workflow `run_id` recorded, reusing what that
        run computed (and what others this identity may read): after a failure or a cancellation only the
        missing tasks and units are computed; an edited file gives new keys, so nothing it touches is reused.

        Args:
            run_id: the run to resume.
            model: the model's working tree (the snapshot is made afresh from it).
            store: the run store when it is mounted here.
            rerun: tasks to compute again.
        """
        from simrun_core.snapshots.convert import snapshot_to_proto

        with self.telemetry.span("simrun_client.resume", attributes={"simrun.resume_from": run_id}) as span:
            earlier = self.get_run(run_id)
            root = Path(model)
            if not root.is_dir():
                raise InvalidArgument(f"cannot resume from {root}: not a folder")
            snapshot = snapshot_to_proto(self.snapshot(git_toplevel(root.resolve()), store=store).snapshot)
            extra = list(earlier.snapshots[1:])  # data snapshots are reused as recorded
            request = tracker_pb2.SubmitRunRequest(
                workflow=earlier.workflow,
                snapshots=[snapshot, *extra],
                group=earlier.group,
                reserve=earlier.reservation,
                resume_from_run_id=run_id,
                rerun=list(rerun),
            )
            run = self._call(TRACKER + "SubmitRun", request, tracker_pb2.SubmitRunResponse).run
            span.set_attribute("simrun.run_id", run.run_id)
            return run

    def get_run(self, run_id: str) -> common_pb2.Run:
        """The run `run_id` now."""
        return self._call(TRACKER + "GetRun", tracker_pb2.GetRunRequest(run_id=run_id), tracker_pb2.GetRunResponse).run

    def list_runs(
        self,
        group: str | None = None,
        state: str | int | None = None,
        owner: str | None = None,
        page_size: int = 0,
    ) -> list[common_pb2.Run]:
        """Every run matching the filters, newest first, read page by page.

        Args:
            group: only this group's runs.
            state: only runs in this state (`running`, `RUN_STATE_RUNNING` or the enum value).
            owner: only runs submitted by this identity name.
            page_size: runs per request; 0 for the server's default.
        """
        request = tracker_pb2.ListRunsRequest(
            group=group or "",
            state=run_state(state) if state is not None else common_pb2.RUN_STATE_UNSPECIFIED,
            owner=owner or "",
            page_size=page_size,
        )
        runs: list[common_pb2.Run] = []
        while True:
            response = self._call(TRACKER + "ListRuns", request, tracker_pb2.ListRunsResponse)
            runs.extend(response.runs)
            if not response.next_page_token:
                return runs
            request.page_token = response.next_page_token

    def list_runs_page(
        self,
        group: str | None = None,
        state: str | int | None = None,
        owner: str | None = None,
        page_size: int = 0,
        page_token: str | None = None,
    ) -> tracker_pb2.ListRunsResponse:
        """One page of the runs matching the filters, newest first, with the token of the next page (empty at the end).

        Args:
            page_token: the `next_page_token` of the previous page; None for the first.
        """
        request = tracker_pb2.ListRunsRequest(
            group=group or "",
            state=run_state(state) if state is not None else common_pb2.RUN_STATE_UNSPECIFIED,
            owner=owner or "",
            page_size=page_size,
            page_token=page_token or "",
        )
        return self._call(TRACKER + "ListRuns", request, tracker_pb2.ListRunsResponse)

    def cancel(self, run_id: str) -> common_pb2.Run:
        """Cancels a run and stops its pods; returns the run."""
        return self._call(
            TRACKER + "CancelRun", tracker_pb2.CancelRunRequest(run_id=run_id), tracker_pb2.CancelRunResponse
        ).run

    def watch(self, run_id: str, timeout_s: float | None = None) -> Stream[tracker_pb2.WatchRunResponse]:
        """The run and its tasks' progress whenever they change, until it ends or `timeout_s` seconds pass.

        The first update is the run as it is now. Once `timeout_s` passes the iteration simply stops (no
        error): the run goes on, and a caller that needs to know whether it ended looks at the last update's
        `run.state` (see `FINAL_RUN_STATES`). None watches until the run ends.
        """
        return self._stream(
            self._tracker.WatchRun, tracker_pb2.WatchRunRequest(run_id=run_id), timeout_s=timeout_s, until=True
        )

    def wait(self, run_id: str, timeout_s: float | None = None) -> common_pb2.Run:
        """Blocks until the run ends, or at most `timeout_s` seconds, and returns the run as it is then.

        After a timeout the run returned has not ended (its state is not in `FINAL_RUN_STATES`).
        """
        run: common_pb2.Run | None = None
        # Read the stream to its end (the server ends it once the run ends) rather than leaving it early.
        for update in self.watch(run_id, timeout_s=timeout_s):
            run = update.run
        if run is None or run.state not in FINAL_RUN_STATES:
            # The stream ended without a final state (the timeout, or the server stopped): the run now.
            return self.get_run(run_id)
        return run

    def logs(
        self,
        run_id: str,
        task_id: str,
        worker: str | None = None,
        follow: bool = False,
        timeout_s: float | None = None,
    ) -> Stream[tracker_pb2.StreamLogsResponse]:
        """The logs of a task's pods (or of one worker, `w0`, `w1`, …), following them while the task runs.

        Args:
            timeout_s: seconds the whole stream may take; past them it fails with `Unavailable` (a stream that
                is not followed); a followed stream simply stops. None for no limit.
        """
        request = tracker_pb2.StreamLogsRequest(run_id=run_id, task_id=task_id, worker=worker or "", follow=follow)
        return self._stream(self._tracker.StreamLogs, request, timeout_s=timeout_s, until=follow)

    def compare(self, run_ids: list[str] | None = None, group: str | None = None) -> tracker_pb2.CompareRunsResponse:
        """The summary values of runs (or of a group's runs) side by side: one row per task and summary key."""
        request = tracker_pb2.CompareRunsRequest(run_ids=list(run_ids or ()), group=group or "")
        return self._call(TRACKER + "CompareRuns", request, tracker_pb2.CompareRunsResponse)

    def nodes(self) -> list[common_pb2.Node]:
        """The executor's nodes with their reservations."""
        request = tracker_pb2.ListNodesRequest()
        nodes: list[common_pb2.Node] = []
        while True:
            response = self._call(TRACKER + "ListNodes", request, tracker_pb2.ListNodesResponse)
            nodes.extend(response.nodes)
            if not response.next_page_token:
                return nodes
            request.page_token = response.next_page_token

    def observations(self, task_type: str, model: str, cost_value: str = "") -> list[common_pb2.Observation]:
        """Every observation the learner holds of a key, oldest first (the owner only)."""
        from simrun.v1 import learner_pb2

        key = common_pb2.ObservationKey(task_type=task_type, model=model, cost_value=cost_value)
        request = learner_pb2.ListObservationsRequest(key=key)
        found: list[common_pb2.Observation] = []
        while True:
            response = self._call(LEARNER + "ListObservations", request, learner_pb2.ListObservationsResponse)
            found.extend(response.observations)
            if not response.next_page_token:
                return found
            request.page_token = response.next_page_token

    def forget_observations(self, task_type: str, model: str, cost_value: str = "") -> int:
        """Deletes every observation of a key, so it resolves from its type's hint again (the owner only)."""
        from simrun.v1 import learner_pb2

        key = common_pb2.ObservationKey(task_type=task_type, model=model, cost_value=cost_value)
        request = learner_pb2.DeleteObservationsRequest(key=key)
        return self._call(LEARNER + "DeleteObservations", request, learner_pb2.DeleteObservationsResponse).deleted_count

    def outputs(
        self, run_id: str, task_id: str | None = None, port: str | None = None, page_size: int = 0
    ) -> list[tracker_pb2.OutputFile]:
        """The files of a run's output ports (of one task, of one port) with their paths in the store and sizes."""
        request = tracker_pb2.ListOutputsRequest(
            run_id=run_id, task_id=task_id or "", port=port or "", page_size=page_size
        )
        files: list[tracker_pb2.OutputFile] = []
        while True:
            response = self._call(TRACKER + "ListOutputs", request, tracker_pb2.ListOutputsResponse)
            files.extend(response.files)
            if not response.next_page_token:
                return files
            request.page_token = response.next_page_token

    def fetch_output(self, run_id: str, task_id: str, port: str, dest: str | Path) -> list[Path]:
        """Copies an output port's files into the folder `dest` (made if missing) through the gateway.

        The files are written beside `dest` first and moved in once every one arrived, so a failed fetch
        leaves nothing half-written. Returns the files written, in `dest`.

        Raises:
            InvalidArgument: `dest` is a file, or the server named a path outside the port (refused).
        """
        import tempfile

        dest = Path(dest)
        if dest.exists() and not dest.is_dir():
            raise InvalidArgument(f"{dest} is a file: give a folder to copy the output {port!r} into")
        dest.parent.mkdir(parents=True, exist_ok=True)
        request = tracker_pb2.FetchOutputRequest(run_id=run_id, task_id=task_id, port=port)
        with tempfile.TemporaryDirectory(prefix=".simrun-fetch-", dir=dest.parent) as staging:
            written: list[str] = []
            handle = None
            try:
                for piece in self._stream(self._tracker.FetchOutput, request):
                    relative = PurePosixPath(piece.path)
                    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
                        raise InvalidArgument(f"refused the output path {piece.path!r}: it leaves the port")
                    if piece.offset == 0:
                        if handle is not None:
                            handle.close()
                        target = Path(staging, *relative.parts)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        handle = target.open("wb")
                        written.append(piece.path)
                    assert handle is not None, "a file's first piece has offset 0"
                    handle.write(piece.data)
            finally:
                if handle is not None:
                    handle.close()
            dest.mkdir(exist_ok=True)
            for path in written:
                target = dest.joinpath(*PurePosixPath(path).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                Path(staging, *PurePosixPath(path).parts).replace(target)
        return [dest.joinpath(*PurePosixPath(path).parts) for path in written]

    def read_output_file(self, run_id: str, task_id: str, port: str, path: str, max_bytes: int) -> bytes:
        """One file of an output port, read through the gateway into memory (the web view's downloads and tables).

        The port's stream is read up to that file and cancelled after it.

        Raises:
            NotFound: the port has no such file.
            InvalidArgument: the file is larger than `max_bytes`.
        """
        from simrun_core.errors import NotFound

        request = tracker_pb2.FetchOutputRequest(run_id=run_id, task_id=task_id, port=port)
        stream = self._stream(self._tracker.FetchOutput, request)
        data = bytearray()
        found = False
        try:
            for piece in stream:
                if piece.path != path:
                    if found:
                        break
                    continue
                found = True
                if piece.size_bytes > max_bytes:
                    raise InvalidArgument(
                        f"{path} is {piece.size_bytes} bytes, more than the {max_bytes} read here: fetch it with "
                        f"`simrun fetch {run_id} {task_id} {port} DEST`"
                    )
                data.extend(piece.data)
        finally:
            stream.cancel()
        if not found:
            raise NotFound(f"the output {task_id}.{port} of run {run_id} has no file {path!r}")
        return bytes(data)

    def _prepare(
        self, workflow_path: str | Path, model: str | Path | None, store: str | Path | None
    ) -> tuple[str, list[common_pb2.Snapshot]]:
        """The workflow's text, checked here first so a bad file costs no snapshot, and the model's snapshot."""
        from simrun_core.snapshots.convert import snapshot_to_proto
        from simrun_core.workflow import parse_workflow

        from simrun_client.libraries import library_trees

        path = Path(workflow_path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the workflow {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise InvalidArgument(f"cannot read the workflow {path}: not UTF-8 text") from None
        parse_workflow(text, source=str(path))
        root = Path(model) if model is not None else git_toplevel(path.resolve())
        snapshots = [snapshot_to_proto(self.snapshot(root, store=store).snapshot)]
        # The model's libraries (path sources out of its tree) are locked with it: snapshot them too.
        snapshots += [snapshot_to_proto(self.snapshot(lib, store=store).snapshot) for lib in library_trees(root)]
        return text, snapshots

    def _call(self, path: str, request: Message, response_type: type[M]) -> M:
        """Calls the unary method `path`: on the client's own connection with `quick_start`, else on grpcio's."""
        if self._unary is not None:
            try:
                return self._unary.call(path, request, response_type, self.timeout_s)
            except SimrunError as exc:
                raise self._explain(exc, self.timeout_s) from None
        import grpc
        from simrun_core.rpc.errors import to_domain_error

        method = self.channel.unary_unary(
            path, request_serializer=type(request).SerializeToString, response_deserializer=response_type.FromString
        )
        try:
            return cast(M, method(request, timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise self._explain(to_domain_error(exc), self.timeout_s) from None

    def _stream(
        self, method: Callable[..., Any], request: Any, *, timeout_s: float | None = None, until: bool = False
    ) -> Stream[Any]:
        """The stream's messages; with `until`, reaching `timeout_s` ends the stream instead of failing it."""
        return Stream(method(request, timeout=timeout_s), lambda exc: self._explain(exc, timeout_s), until=until)

    def _explain(self, error: SimrunError, timeout_s: float | None = None) -> SimrunError:
        """The error, said so that it tells what to fix where the server's words would not."""
        message = str(error)
        if isinstance(error, Unavailable) and any(m in message.lower() for m in _UNREACHABLE_MARKERS):
            return Unavailable(f"cannot reach simrun at {self.endpoint}: start it with `simrun server`")
        if isinstance(error, Unavailable) and message.lower() == "deadline exceeded":
            within = f" within {timeout_s:g} s" if timeout_s is not None else ""
            return Unavailable(f"simrun at {self.endpoint} did not answer{within}; it may be overloaded: try again")
        if isinstance(error, Unauthenticated) and not self.token:
            return Unauthenticated(f"{message} (none in {simrun_home() / 'token'}, where `simrun server` writes one)")
        return error


__all__ = ["FINAL_RUN_STATES", "Client", "Stream", "git_toplevel", "run_state"]
