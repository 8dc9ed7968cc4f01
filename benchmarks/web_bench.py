"""The web view's cost: its heavy pages beside the gateway calls they make, and live pages beside none.

A real embedded simrun on loopback and the web view beside it (in one process, as `simrun server` runs them),
called over HTTP with a logged-in session. Prints medians:

- the runs page with 5,000 runs (its first page of 50, and a page deep in the list by its keyset token) beside the
  ListRuns call it makes (goal: each page under 300 ms on the server);
- the page of a finished 100,000-unit run beside the GetRun and ListOutputs calls it makes (goal: under 300 ms);
- other calls' latency (a run's page) while 50 pages follow live runs, beside the same with none open (goal: within
  1.2 times), and the process's CPU with those 50 pages open on runs that do not change, beside none (goal: under 2%
  of a core).

    uv run --frozen python benchmarks/web_bench.py [--units 100000] [--calls 50] [--pages 50]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import requests
import yaml
from big_run_reads import model_repo
from e2e_support import E2E_MODEL, git_repo
from simrun_client.client import Client
from simrun_core.config import EnvironmentsConfig, NodeConfig, ServerConfig
from simrun_gateway.embedded import EmbeddedServer, start_embedded
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunState
from simrun_web.app import WebConfig
from simrun_web.serve import WebServer
from timing import median_seconds
from tracker_scale import seed

TOKEN = "bench-token"


def cpu_percent(seconds: float) -> float:
    """Percent of one core this process used over `seconds`."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 100.0 * used / (time.monotonic() - start)


def start(root: Path, runs: int) -> tuple[EmbeddedServer, WebServer, requests.Session]:
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}}))
    config = ServerConfig(
        home=root / "home",
        store=root / "store",
        address="127.0.0.1:0",
        tokens_file=tokens,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        environments=EnvironmentsConfig(kind="server"),
        limits={"active_runs_per_identity": 1000},
    )
    seed(StoreLayout(config.store), runs, RunState.SUCCEEDED)
    server = start_embedded(config)
    web = WebServer("127.0.0.1:0")
    web.start(WebConfig(server.address))
    assert web.app is not None
    web.app.state.streams.total = web.app.state.streams.per_identity = 200
    session = requests.Session()
    code = session.post(f"{web.url}/login/links", headers={"Authorization": f"Bearer {TOKEN}"}).json()["path"]
    session.get(web.url + code)
    return server, web, session


def page(session: requests.Session, url: str) -> Callable[[], object]:
    def get() -> object:
        response = session.get(url)
        assert response.status_code == 200, response.text[:300]
        return response

    return get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server, web, session = start(root, args.runs)
        try:
            with Client(server.address, TOKEN) as client:
                deep = ""
                for _ in range(args.runs // 50 - 1):
                    deep = client.list_runs_page(page_size=50, page_token=deep or None).next_page_token
                first_page = median_seconds(page(session, f"{web.url}/runs"), args.calls)
                deep_page = median_seconds(page(session, f"{web.url}/runs?page_token={deep}"), args.calls)
                listing = median_seconds(lambda: client.list_runs_page(page_size=50), args.calls)
                print(
                    f"runs page of {args.runs} runs: first {first_page * 1e3:.1f} ms, deep {deep_page * 1e3:.1f} ms; "
                    f"its ListRuns {listing * 1e3:.1f} ms: ratio {first_page / listing:.2f} (goal: page < 300 ms)"
                )

                model = model_repo(root / "tiny")
                workflow = model / "big.yaml"
                workflow.write_text(
                    f"tasks:\n  sum:\n    type: tinymodel.tasks:Tiny\n    settings: {{units: {args.units}}}\n"
                )
                big = client.submit(workflow).run_id
                final = client.wait(big, timeout_s=1800)
                assert final.state == 4, final.message
                run_page = median_seconds(page(session, f"{web.url}/runs/{big}"), args.calls)
                calls = median_seconds(lambda: (client.get_run(big), client.outputs(big)), args.calls)
                print(
                    f"run page of a {args.units}-unit run: {run_page * 1e3:.1f} ms; its GetRun + ListOutputs "
                    f"{calls * 1e3:.1f} ms: ratio {run_page / calls:.2f} (goal: page < 300 ms)"
                )

                slow = git_repo(E2E_MODEL, root / "e2e")
                waiting = slow / "wait.yaml"
                waiting.write_text(
                    "tasks:\n  wait:\n    type: e2etasks.tasks:Slow\n    settings: {units: 4, seconds: 3600}\n"
                )
                held = client.submit(waiting, single_server=True).run_id
                while client.get_run(held).state != 3:  # RUNNING
                    time.sleep(0.1)
                other = page(session, f"{web.url}/runs/{big}")
                time.sleep(1.0)
                idle_none = cpu_percent(args.cpu_seconds)
                alone = median_seconds(other, args.calls)
                opened: list[tuple[requests.Response, object]] = []  # the readers kept: a dropped one closes
                for _ in range(args.pages):
                    response = session.get(f"{web.url}/runs/{held}/events", stream=True)
                    assert response.status_code == 200, response.text
                    lines = response.iter_lines(chunk_size=1)
                    assert next(lines) == b"event: run"
                    opened.append((response, lines))
                time.sleep(1.0)
                assert web.app is not None and web.app.state.streams.open() == args.pages
                idle_open = cpu_percent(args.cpu_seconds)
                beside = median_seconds(other, args.calls)
                for response, _ in opened:
                    response.close()
                print(
                    f"a run's page with {args.pages} live pages open: {beside * 1e3:.1f} ms, with none "
                    f"{alone * 1e3:.1f} ms: ratio {beside / alone:.2f} (goal <= 1.2)"
                )
                print(
                    f"the process's CPU with {args.pages} live pages of a run that does not change: {idle_open:.2f}% "
                    f"of a core, with none {idle_none:.2f}% (goal < 2%)"
                )
                client.cancel(held)
        finally:
            web.stop()
            server.stop()


if __name__ == "__main__":
    main()
