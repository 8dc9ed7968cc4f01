"""The server streams of simrun on an asyncio channel, for a client that follows many at once (the web view).

One channel serves every caller: each stream carries its caller's own token, so the gateway checks every read
for that identity as it checks the typed client's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
from simrun.v1 import common_pb2, tracker_pb2, tracker_pb2_grpc
from simrun_core.errors import SimrunError
from simrun_core.rpc.channel import open_aio_channel
from simrun_core.rpc.errors import to_domain_error

from simrun_client.channel import MAX_MESSAGE_BYTES, channel_credentials


class AsyncStreams:
    """WatchRun, WatchRuns and StreamLogs as async iterators over one asyncio channel, opened on first use.

    Args:
        endpoint: `host:port` of the gateway.
        tls_ca: a CA bundle to verify the gateway with TLS; None for plaintext.
    """

    def __init__(self, endpoint: str, tls_ca: Path | None = None) -> None:
        self.endpoint = endpoint
        self._tls_ca = tls_ca
        self._stub: tracker_pb2_grpc.RunTrackerServiceStub | None = None
        self._channel: grpc.aio.Channel | None = None

    def _tracker(self) -> tracker_pb2_grpc.RunTrackerServiceStub:
        if self._stub is None:
            options = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ]
            credentials = channel_credentials(self._tls_ca) if self._tls_ca is not None else None
            self._channel = open_aio_channel(self.endpoint, options=options, credentials=credentials)
            self._stub = tracker_pb2_grpc.RunTrackerServiceStub(self._channel)
        return self._stub

    async def watch(self, token: str, run_id: str) -> AsyncIterator[tracker_pb2.WatchRunResponse]:
        """The run and its progress whenever they change, until it ends (the first: the run now)."""
        call = self._tracker().WatchRun(tracker_pb2.WatchRunRequest(run_id=run_id), metadata=_bearer(token))
        async for update in _read(call):
            yield update

    async def new_runs(
        self,
        token: str,
        group: str = "",
        state: common_pb2.RunState.ValueType = common_pb2.RUN_STATE_UNSPECIFIED,
        owner: str = "",
        since: datetime | None = None,
    ) -> AsyncIterator[tracker_pb2.WatchRunsResponse]:
        """The runs submitted after `since` (None: from now) that a listing with these filters shows the caller, as
        they are submitted and whenever they change, until the stream is left (WatchRuns)."""
        request = tracker_pb2.WatchRunsRequest(group=group, state=state, owner=owner)
        if since is not None:
            request.since.FromDatetime(since)
        call = self._tracker().WatchRuns(request, metadata=_bearer(token))
        async for update in _read(call):
            yield update

    async def logs(
        self, token: str, run_id: str, task_id: str, worker: str = "", follow: bool = True
    ) -> AsyncIterator[tracker_pb2.StreamLogsResponse]:
        """The logs of a task's pods (or one worker's), following them while the task runs."""
        request = tracker_pb2.StreamLogsRequest(run_id=run_id, task_id=task_id, worker=worker, follow=follow)
        call = self._tracker().StreamLogs(request, metadata=_bearer(token))
        async for chunk in _read(call):
            yield chunk

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _read(call: Any) -> AsyncIterator[Any]:
    """The messages of an aio stream, a failed call raised as its domain error; left early, the call is cancelled."""
    try:
        async for message in call:
            yield message
    except grpc.aio.AioRpcError as exc:
        error: SimrunError = to_domain_error(exc)
        raise error from None
    finally:
        call.cancel()
