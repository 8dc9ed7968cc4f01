"""The web view's pages: a FastAPI application that is a client of the gateway, as the CLI and the MCP bridge are.

Every page reads and acts through the logged-in identity's own gRPC client, so what it shows and what it may do
are the gateway's answers for that identity. Pages are server-side templates (Jinja2, autoescaped); scripts are
files served by the view itself, never inline, under a Content-Security-Policy that allows nothing else; live parts
are server-sent events (`simrun_web.live`); no GET changes anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from google.protobuf.json_format import MessageToDict
from simrun.v1 import common_pb2, tracker_pb2
from simrun_client.client import FINAL_RUN_STATES, Client, run_state
from simrun_client.compare import differing_settings
from simrun_client.reading import run_json, summary_value, who
from simrun_client.streams import AsyncStreams
from simrun_core.errors import InvalidArgument, NotFound, SimrunError, Unauthenticated
from simrun_web import dag, live, tables
from simrun_web.sessions import Session, Sessions

HERE = Path(__file__).parent
COOKIE = "simrun_session"
PAGE_SIZE = 50
MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024
"""The largest file the view hands out (it passes through its memory); `simrun fetch` has no bound."""
MAX_WATCHED_RUNS = 20
"""Runs of one runs page whose changes arrive live (its running ones, newest first)."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class LoginNeeded(Exception):
    """A request without a live session: a page is sent to the login page, a data request gets 401."""


def wants_data(request: Request) -> bool:
    """Whether a request asks for data (JSON or events) rather than a page: its errors are answered as JSON."""
    path = request.url.path
    return path.endswith((".json", "/events")) or path == "/login/links" or request.query_params.get("format") == "json"


def logged_in_session(request: Request) -> Session:
    """The request's session; without one, `LoginNeeded` (a page goes to the login page, data gets 401)."""
    session: Session | None = request.app.state.sessions.get(request.cookies.get(COOKIE))
    if session is None:
        raise LoginNeeded
    return session


SessionOf = Annotated[Session, Depends(logged_in_session)]
"""A route's logged-in session (FastAPI's dependency)."""


@dataclass
class WebConfig:
    """Where the gateway is and how to reach it, for every session's client."""

    endpoint: str
    tls_ca: Path | None = None
    secure_cookie: bool = False
    """Mark the session cookie Secure (the view is served over TLS, or behind a proxy that is)."""


def _name(value: int, enum: Any, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


def _when(stamp: Any) -> str:
    """A timestamp as the CLI shows it: `2026-12-06 22:44:13` (UTC)."""
    return str(stamp.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"))


def run_view(run: common_pb2.Run) -> dict[str, Any]:
    """The facts of a run a page shows: the API's JSON of it, with states in their short names."""
    data = MessageToDict(run, preserving_proto_field_name=True)
    data["state"] = _name(run.state, common_pb2.RunState, "RUN_STATE_")
    data["final"] = run.state in FINAL_RUN_STATES
    data["owner"] = run.identity.name
    data["submitted_by"] = who(run.identity)
    data["priority"] = _name(run.identity.priority, common_pb2.Priority, "PRIORITY_")
    data["submitted"] = _when(run.create_time) if run.HasField("create_time") else ""
    data["ended"] = _when(run.end_time) if run.HasField("end_time") else ""
    data["tasks_done"] = sum(t.state == common_pb2.TASK_STATE_SUCCEEDED for t in run.tasks)
    for task, view in zip(run.tasks, data.get("tasks", []), strict=True):
        view["state"] = _name(task.state, common_pb2.TaskState, "TASK_STATE_")
        view["units"] = task.units if task.HasField("units") else None
        view["units_done"] = task.units_done
        view["pods_started"] = task.pods_started
    return data


def task_progress(run: common_pb2.Run, started: dict[str, tuple[float, int]]) -> dict[str, Any]:
    """A run's change as a page shows it: states, units done of total, the rate and the estimate left per task.

    `started` keeps, per task, when and at how many units done this page first saw it computing, so the rate is
    measured over what the page watched.
    """
    now = time.monotonic()
    tasks = []
    for task in run.tasks:
        units = task.units if task.HasField("units") else None
        state = _name(task.state, common_pb2.TaskState, "TASK_STATE_")
        rate = left = None
        if units is not None and state == "running":
            since, done_then = started.setdefault(task.task_id, (now, task.units_done))
            if now - since > 0.5 and task.units_done > done_then:
                rate = (task.units_done - done_then) / (now - since)
                left = (units - task.units_done) / rate
        tasks.append(
            {
                "task_id": task.task_id,
                "state": state,
                "units": units,
                "units_done": task.units_done,
                "pods_started": task.pods_started,
                "message": task.message,
                "rate": rate,
                "left_s": left,
            }
        )
    return {
        "run_id": run.run_id,
        "tasks_done": sum(t.state == common_pb2.TASK_STATE_SUCCEEDED for t in run.tasks),
        "tasks_total": len(run.tasks),
        "state": _name(run.state, common_pb2.RunState, "RUN_STATE_"),
        "message": run.message,
        "final": run.state in FINAL_RUN_STATES,
        "tasks": tasks,
    }


def new_run(run: common_pb2.Run, started: dict[str, tuple[float, int]]) -> dict[str, Any]:
    """A run submitted while a runs page is open, as its row shows it: its change, its group, owner and time."""
    return {
        **task_progress(run, started),
        "new": True,
        "group": run.group,
        "owner": run.identity.name,
        "submitted_by": who(run.identity),
        "submitted": _when(run.create_time) if run.HasField("create_time") else "",
    }


def _since(stamp: str) -> datetime | None:
    """The `since` of a runs page's new-runs feed: an ISO time, else None (from the feed's start)."""
    try:
        when = datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        raise InvalidArgument(f"bad since {stamp!r}: an ISO 8601 time") from None
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


def memory(gb: float) -> str:
    """Measured memory as a page shows it: MiB below a GiB (`3.6 MiB`, `412 MiB`), so a small process does not read
    as `0.00 GiB`, and GiB to two places above."""
    if gb >= 1:
        return f"{gb:.2f} GiB"
    mib = gb * 1024
    return f"{mib:.1f} MiB" if mib < 10 else f"{mib:.0f} MiB"


def create_app(config: WebConfig, *, bounds: live.StreamBounds | None = None) -> FastAPI:
    """The web view for the gateway at `config.endpoint`."""

    def connect(token: str) -> Client:
        return Client(config.endpoint, token, tls_ca=config.tls_ca)

    sessions = Sessions(connect)
    streams = bounds or live.StreamBounds()
    followed = AsyncStreams(config.endpoint, config.tls_ca)  # every page's live reads, on the view's event loop
    app = FastAPI(title="simrun", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sessions = sessions
    app.state.streams = streams
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["tojson_attr"] = lambda value: json.dumps(value, separators=(",", ":"))
    templates.env.filters["memory"] = memory
    templates.env.filters["value"] = summary_value  # a compared value reads as in the CLI's tables
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def headers(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"  # a same-site form then names its Origin
        response.headers["X-Frame-Options"] = "DENY"
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def page(request: Request, name: str, session: Session | None, status: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(
            request, name, {"session": session, "csrf": session.csrf if session else "", **context}, status_code=status
        )

    def failure(request: Request, session: Session | None, error: SimrunError) -> Response:
        if isinstance(error, Unauthenticated) and session is None:
            return RedirectResponse("/login", status_code=303)
        return page(request, "error.html", session, status=error.http_status, message=str(error))

    def current(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(COOKIE))

    def login_redirect(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)

    def logged_in(response: Response, session: Session, request: Request) -> Response:
        secure = config.secure_cookie or request.url.scheme == "https"
        response.set_cookie(COOKIE, session.session_id, httponly=True, samesite="strict", secure=secure, path="/")
        return response

    def check_form(request: Request, session: Session, csrf: str | None) -> None:
        origin = request.headers.get("origin")
        if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise InvalidArgument("refused a form sent from another site")
        if not session.csrf_ok(csrf):
            raise InvalidArgument("the form is stale (its CSRF token does not match): reload the page and try again")

    @app.exception_handler(LoginNeeded)
    def login_needed(request: Request, exc: LoginNeeded) -> Response:
        if wants_data(request):
            return JSONResponse({"error": "log in first: `simrun ui` opens a logged-in page"}, status_code=401)
        return login_redirect(request)

    @app.exception_handler(SimrunError)
    def simrun_error(request: Request, exc: SimrunError) -> Response:
        if wants_data(request):
            return JSONResponse({"error": str(exc)}, status_code=exc.http_status)
        return failure(request, current(request), exc)

    def safe_next(target: str | None) -> str:
        return target if target and target.startswith("/") and not target.startswith("//") else "/runs"

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return RedirectResponse("/runs", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, next: str | None = None) -> Response:
        return page(request, "login.html", None, next=safe_next(next), message="")

    @app.post("/login")
    def login(request: Request, token: str = Form(""), next: str | None = Form(None)) -> Response:
        try:
            session = sessions.login(token)
        except SimrunError as exc:
            return page(request, "login.html", None, status=exc.http_status, next=safe_next(next), message=str(exc))
        return logged_in(RedirectResponse(safe_next(next), status_code=303), session, request)

    @app.post("/login/links")
    def login_link(request: Request) -> Response:
        """A one-time login link for the bearer token of the request (what `simrun ui` asks for)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return JSONResponse({"error": "send the token as `Authorization: Bearer TOKEN`"}, status_code=401)
        try:
            code = sessions.link(token)
        except SimrunError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.http_status)
        return JSONResponse({"path": f"/login/link/{code}"})

    @app.get("/login/link/{code}")
    def open_link(request: Request, code: str) -> Response:
        try:
            session = sessions.redeem(code)
        except SimrunError as exc:
            return page(request, "login.html", None, status=exc.http_status, next="/runs", message=str(exc))
        # The redirect takes the spent code out of the address bar and the history.
        return logged_in(RedirectResponse("/runs", status_code=303), session, request)

    @app.post("/logout")
    def logout(request: Request, csrf: str = Form("")) -> Response:
        session = current(request)
        if session is not None:
            try:
                check_form(request, session, csrf)
            except SimrunError as exc:
                return failure(request, session, exc)
            sessions.end(session.session_id)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page(
        request: Request,
        session: SessionOf,
        group: str = "",
        state: str = "",
        owner: str = "",
        page_token: str = "",
        format: str = "",
    ) -> Response:
        response = session.client.list_runs_page(
            group or None, state or None, owner or None, page_size=PAGE_SIZE, page_token=page_token or None
        )
        if format == "json":
            return JSONResponse(MessageToDict(response, preserving_proto_field_name=True))
        runs = [run_view(run) for run in response.runs]
        watched = [run["run_id"] for run in runs if not run["final"]][:MAX_WATCHED_RUNS]
        filters = {"group": group, "state": state, "owner": owner}
        following = urlencode({**{k: v for k, v in filters.items() if v}, "page_token": response.next_page_token})
        states = [n.removeprefix("RUN_STATE_").lower() for n in common_pb2.RunState.keys()[1:]]
        events: dict[str, str] = {"ids": ",".join(watched)} if watched else {}
        if not page_token:
            # The first page (newest first) shows new runs as they are submitted: those after its newest run, or
            # after now when it shows none.
            newest = response.runs[0].create_time.ToDatetime(tzinfo=UTC) if response.runs else datetime.now(UTC)
            events.update({**{k: v for k, v in filters.items() if v}, "new": "1", "since": newest.isoformat()})
        return page(
            request,
            "runs.html",
            session,
            runs=runs,
            events=f"/runs/events?{urlencode(events)}" if events else "",
            filters=filters,
            states=states,
            next_page=f"/runs?{following}" if response.next_page_token else "",
        )

    def event_stream(session: Session, feeds: Callable[[], list[live.Feed]]) -> Response:
        name = session.identity.name
        streams.acquire(name)  # over a bound: ResourceExhausted, answered 429
        try:
            opened = feeds()
        except BaseException:
            streams.release(name)
            raise
        return StreamingResponse(
            live.events(opened, release=lambda: streams.release(name)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def watch_feed(session: Session, run_id: str) -> live.Feed:
        started: dict[str, tuple[float, int]] = {}
        stream = followed.watch(session.client.token, run_id)
        return live.Feed(stream, lambda update: ("run", task_progress(update.run, started)))

    def new_runs_feed(session: Session, group: str, state: str, owner: str, since: datetime | None) -> live.Feed:
        started: dict[str, dict[str, tuple[float, int]]] = {}
        stream = followed.new_runs(
            session.client.token, group, run_state(state) if state else common_pb2.RUN_STATE_UNSPECIFIED, owner, since
        )
        return live.Feed(stream, lambda update: ("run", new_run(update.run, started.setdefault(update.run.run_id, {}))))

    @app.get("/runs/events")
    def runs_events(
        request: Request,
        session: SessionOf,
        ids: str = "",
        new: str = "",
        group: str = "",
        state: str = "",
        owner: str = "",
        since: str = "",
    ) -> Response:
        """The changes of a runs page's runs and, with `new`, the runs submitted after `since` that match its filters
        (WatchRuns), in one stream: one of the bounded live streams per page."""
        run_ids = [i for i in ids.split(",") if i][:MAX_WATCHED_RUNS]
        after = _since(since)
        if state:
            run_state(state)  # an unknown state: refused before a stream opens

        def feeds() -> list[live.Feed]:
            opened = [watch_feed(session, run_id) for run_id in run_ids]
            if new:
                opened.append(new_runs_feed(session, group, state, owner, after))
            return opened

        return event_stream(session, feeds)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, session: SessionOf, run_id: str, format: str = "") -> Response:
        run = session.client.get_run(run_id)
        outputs = session.client.outputs(run_id)
        if format == "json":  # as `simrun status --json` prints it
            return JSONResponse(run_json(run, outputs))
        view = run_view(run)
        may_cancel = not view["final"] and (
            run.identity.name == session.identity.name or session.identity.kind == "owner"
        )
        files = [
            {
                "task_id": f.task_id,
                "port": f.port,
                "path": f.path,
                "size": f.size_bytes,
                "table": tables.is_table(f.path),
            }
            for f in outputs
        ]
        return page(
            request,
            "run.html",
            session,
            run=view,
            graph=dag.layout(
                [
                    (t.task_id, view_task["state"], t.inputs)
                    for t, view_task in zip(run.tasks, view.get("tasks", []), strict=True)
                ]
            ),
            files=files,
            may_cancel=may_cancel,
            environment=environment_view(session, run.environment),
        )

    def environment_view(session: Session, environment_id: str) -> dict[str, Any] | None:
        """The run's environment as the builder has it, or None where there is none to show (the server's own)."""
        from simrun_client.environments import get_environment

        if not environment_id or environment_id == "default":
            return None
        try:
            environment = get_environment(session.client, environment_id)
        except SimrunError:
            return None
        return MessageToDict(environment, preserving_proto_field_name=True)

    @app.get("/runs/{run_id}/events")
    def run_events(request: Request, session: SessionOf, run_id: str) -> Response:
        return event_stream(session, lambda: [watch_feed(session, run_id)])

    @app.post("/runs/{run_id}/cancel")
    def cancel(request: Request, session: SessionOf, run_id: str, csrf: str = Form("")) -> Response:
        check_form(request, session, csrf)
        session.client.cancel(run_id)
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    @app.get("/runs/{run_id}/tasks/{task_id}/logs", response_class=HTMLResponse)
    def logs_page(request: Request, session: SessionOf, run_id: str, task_id: str, worker: str = "") -> Response:
        run = session.client.get_run(run_id)
        if task_id not in {t.task_id for t in run.tasks}:
            return failure(request, session, NotFound(f"run {run_id} has no task {task_id!r}"))
        query = urlencode({"worker": worker} if worker else {})
        return page(
            request,
            "logs.html",
            session,
            run=run_view(run),
            task_id=task_id,
            worker=worker,
            events=f"/runs/{run_id}/tasks/{task_id}/logs/events" + (f"?{query}" if query else ""),
        )

    @app.get("/runs/{run_id}/tasks/{task_id}/logs/events")
    def logs_events(request: Request, session: SessionOf, run_id: str, task_id: str, worker: str = "") -> Response:

        def feeds() -> list[live.Feed]:
            stream = followed.logs(session.client.token, run_id, task_id, worker=worker)
            return [live.Feed(stream, lambda chunk: ("lines", {"pod": chunk.pod, "lines": chunk.lines}))]

        return event_stream(session, feeds)

    def read_file(session: Session, run_id: str, task_id: str, port: str, path: str) -> bytes:
        return session.client.read_output_file(run_id, task_id, port, path, MAX_DOWNLOAD_BYTES)

    @app.get("/runs/{run_id}/outputs/{task_id}/{port}/{path:path}")
    def download(request: Request, session: SessionOf, run_id: str, task_id: str, port: str, path: str) -> Response:
        data = read_file(session, run_id, task_id, port, path)
        filename = path.rsplit("/", 1)[-1].replace('"', "")
        # Never shown by the browser as a page: a run's file is the run's words, not the view's.
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )

    def load_table(session: Session, run_id: str, task_id: str, port: str, path: str) -> tables.Table:
        if not tables.is_table(path):
            raise InvalidArgument(f"{path!r} is not a table: the web view plots .csv, .jsonl, .json and .parquet files")
        return tables.parse_table(
            path, session.client.read_output_file(run_id, task_id, port, path, tables.MAX_TABLE_BYTES)
        )

    @app.get("/runs/{run_id}/tasks/{task_id}/table", response_class=HTMLResponse)
    def table_page(
        request: Request,
        session: SessionOf,
        run_id: str,
        task_id: str,
        port: str,
        path: str,
        x: str = "",
        y: str = "",
        color: str = "",
    ) -> Response:
        table = load_table(session, run_id, task_id, port, path)
        if not x:  # first opened: the plot the table's columns call for; chosen columns are kept as chosen
            x, y, color = tables.first_axes(table)
        if x:
            tables.plot_spec(table, x, y or None, color or None)  # refuses a column the table lacks
        chosen = {"port": port, "path": path, "x": x, "y": y, "color": color}
        base = f"/runs/{run_id}/tasks/{task_id}"
        return page(
            request,
            "table.html",
            session,
            run_id=run_id,
            task_id=task_id,
            columns=table.columns,
            rows=table.rows[:20],
            row_count=len(table.rows),
            chosen=chosen,
            kind=tables.plot_kind(table, x, y or None) if x else "",
            spec_url=f"{base}/table.json?{urlencode(chosen)}",
            csv_url=f"{base}/table.csv?{urlencode({'port': port, 'path': path})}",
        )

    @app.get("/runs/{run_id}/tasks/{task_id}/table.json")
    def table_spec(
        request: Request,
        session: SessionOf,
        run_id: str,
        task_id: str,
        port: str,
        path: str,
        x: str,
        y: str = "",
        color: str = "",
    ) -> Response:
        table = load_table(session, run_id, task_id, port, path)
        return JSONResponse(tables.plot_spec(table, x, y or None, color or None))

    @app.get("/runs/{run_id}/tasks/{task_id}/table.csv")
    def table_csv(request: Request, session: SessionOf, run_id: str, task_id: str, port: str, path: str) -> Response:
        table = load_table(session, run_id, task_id, port, path)
        name = path.rsplit("/", 1)[-1].rsplit(".", 1)[0].replace('"', "") + ".csv"
        return Response(
            table.to_csv(), media_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{name}"'}
        )

    def comparison(session: Session, runs: list[str], group: str) -> dict[str, Any]:
        result = session.client.compare(run_ids=runs, group=group or None)
        records = [session.client.get_run(run_id) for run_id in result.run_ids]
        settings = differing_settings(records)
        return {"result": result, "settings": settings, "runs": [run_view(r) for r in records]}

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(
        request: Request,
        session: SessionOf,
        runs: Annotated[list[str] | None, Query()] = None,
        group: str = "",
        x: str = "",
        y: str = "",
        format: str = "",
    ) -> Response:
        runs = [r for value in runs or [] for r in value.replace(",", " ").split() if r]
        if not runs and not group:
            return page(request, "compare.html", session, compared=None, runs="", group="")
        compared = comparison(session, runs, group)
        if format == "json":  # as `simrun compare --json` prints it
            data = MessageToDict(compared["result"], preserving_proto_field_name=True)
            data["settings"] = [{"task_id": t, "key": k, "values": v} for t, k, v in compared["settings"]]
            return JSONResponse(data)
        settings = [f"{task}.{key}" for task, key, _ in compared["settings"]]
        summaries = [f"{row.task_id}.{row.key}" for row in compared["result"].rows]
        x = x if x in settings else (settings[0] if settings else "")
        y = y if y in summaries else (summaries[0] if summaries else "")
        query = {"runs": ",".join(runs), "group": group, "x": x, "y": y}
        return page(
            request,
            "compare.html",
            session,
            compared=compared,
            runs=",".join(runs),
            group=group,
            setting_names=settings,
            summary_names=summaries,
            x=x,
            y=y,
            spec_url=f"/compare/plot.json?{urlencode(query)}" if x and y else "",
            parallel_url=f"/compare/parallel.json?{urlencode({'runs': ','.join(runs), 'group': group})}"
            if len(compared["runs"]) > 1
            else "",
        )

    def compared_columns(session: Session, runs: str, group: str) -> tuple[list[str], dict[str, list[Any]]]:
        """The runs compared and, per differing setting and summary (`task.key`), its value in each run."""
        compared = comparison(session, [r for r in runs.split(",") if r], group)
        columns: dict[str, list[Any]] = {f"{t}.{k}": [_json_value(v) for v in vs] for t, k, vs in compared["settings"]}
        for row in compared["result"].rows:
            columns[f"{row.task_id}.{row.key}"] = [_json_value(v) for v in row.values]
        return list(compared["result"].run_ids), columns

    @app.get("/compare/plot.json")
    def compare_plot(request: Request, session: SessionOf, x: str, y: str, runs: str = "", group: str = "") -> Response:
        run_ids, columns = compared_columns(session, runs, group)
        if x not in columns or y not in columns:
            return JSONResponse({"error": f"no setting {x!r} or summary {y!r} in these runs"}, status_code=400)
        points = [{"run": run_id, x: columns[x][i], y: columns[y][i]} for i, run_id in enumerate(run_ids)]
        return JSONResponse(tables.scatter_spec([p for p in points if p[x] is not None and p[y] is not None], x, y))

    @app.get("/compare/parallel.json")
    def compare_parallel(request: Request, session: SessionOf, runs: str = "", group: str = "") -> Response:
        run_ids, columns = compared_columns(session, runs, group)
        numeric = [name for name, values in columns.items() if _numeric(values)]
        rows = [{"run": run_id, **{name: columns[name][i] for name in numeric}} for i, run_id in enumerate(run_ids)]
        return JSONResponse(tables.parallel_spec(rows, numeric))

    @app.get("/cluster", response_class=HTMLResponse)
    def cluster_page(request: Request, session: SessionOf, format: str = "") -> Response:
        nodes = session.client.nodes()
        active = [
            run_view(run)
            for state in ("running", "queued")
            for run in session.client.list_runs(state=run_state(state), page_size=200)
        ]
        by_identity: dict[str, dict[str, float]] = {}
        per_node: dict[str, dict[str, Any]] = {n.name: _held() for n in nodes}
        per_run: dict[str, dict[str, Any]] = {}
        for run in active:
            counts = by_identity.setdefault(
                run["owner"], {"running": 0, "queued": 0, "pods": 0, "cores": 0, "memory_gb": 0}
            )
            counts[run["state"]] += 1
            held_by_run = per_run[run["run_id"]] = _held()
            for task in run.get("tasks", []):
                if task["state"] != "running":
                    continue
                shape = (task.get("plan") or {}).get("shape") or {}
                for pod in task.get("pods", []):
                    memory = pod.get("memory_gb", shape.get("memory_gb", 0))  # a record from before it was kept
                    node = per_node.setdefault(pod.get("node", "(not placed)"), _held())
                    for held in (counts, node, held_by_run):
                        held["pods"] += 1
                        held["cores"] += shape.get("cores", 0)
                        held["memory_gb"] += memory
                    if "peak_memory_gb" in pod:
                        node["measured_gb"] = (node["measured_gb"] or 0.0) + pod["peak_memory_gb"]
        in_use: dict[str, Any] = {
            key: sum(c[key] for c in by_identity.values()) for key in ("pods", "cores", "memory_gb")
        }
        # Kueue's order: the owner's first, other people's next, agents' last; a higher one waiting takes back
        # capacity from the running runs of the lowest priority first.
        rank = {"owner": 0, "standard": 1, "agent": 2}
        active.sort(key=lambda run: (run["state"] != "running", rank.get(run["priority"], 3), run["run_id"]))
        running = [rank.get(r["priority"], 3) for r in active if r["state"] == "running"]
        waiting = [rank.get(r["priority"], 3) for r in active if r["state"] == "queued"]
        lowest = max(running) if running and waiting and min(waiting) < max(running) else None
        for run in active:
            run["gives_way"] = run["state"] == "running" and rank.get(run["priority"], 3) == lowest
        node_views = [
            MessageToDict(n, preserving_proto_field_name=True, always_print_fields_with_no_presence=True) for n in nodes
        ]
        measured = [held["measured_gb"] for held in per_node.values() if held["measured_gb"] is not None]
        in_use["measured_gb"] = sum(measured) if measured else None
        total = {
            "cores": sum(n.allocatable_cores or n.cores for n in nodes),
            "memory_gb": sum(n.allocatable_memory_gb or n.memory_gb for n in nodes),
        }
        if format == "json":  # the nodes as `simrun nodes --json` prints them, and what the page adds up
            held = {**in_use, "of_cores": total["cores"], "of_memory_gb": total["memory_gb"]}
            queue = [
                {key: run[key] for key in ("run_id", "owner", "submitted_by", "priority", "state", "gives_way")}
                | {"held": per_run[run["run_id"]]}
                for run in active
            ]
            return JSONResponse(
                {
                    "nodes": MessageToDict(
                        tracker_pb2.ListNodesResponse(nodes=nodes), preserving_proto_field_name=True
                    ).get("nodes", []),
                    "held_per_node": per_node,
                    "held": held,
                    "by_identity": by_identity,
                    "runs": queue,
                }
            )
        return page(
            request,
            "cluster.html",
            session,
            nodes=node_views,
            active=active,
            by_identity=by_identity,
            per_node=per_node,
            per_run=per_run,
            in_use=in_use,
            total=total,
        )

    return app


def _held() -> dict[str, Any]:
    """What the running tasks' pods of a node (or of a run) hold, and the sum of their measured peaks (None
    while none of them is measured)."""
    return {"pods": 0, "cores": 0, "memory_gb": 0, "measured_gb": None}


def _numeric(values: list[Any]) -> bool:
    """Whether a column of the comparison is a number in every run that has it, and not the same in all."""
    present = [v for v in values if v is not None]
    return (
        len(present) > 1
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)
        and len(set(present)) > 1
    )


def _json_value(text: str) -> Any:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else json.dumps(value)
