"""The web view over HTTP against a real embedded simrun: logins, refusals, live streams that end and are bounded."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from e2e_support import E2E_MODEL, git_repo
from simrun_client.client import Client
from simrun_core.config import EnvironmentsConfig, NodeConfig, ServerConfig
from simrun_gateway.embedded import EmbeddedServer, start_embedded
from simrun_web import live
from simrun_web.app import WebConfig, memory
from simrun_web.serve import WebServer
from simrun_web.sessions import Sessions


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    home = tmp_path_factory.mktemp("home")
    config = ServerConfig(
        home=home,
        store=home / "store",
        address="127.0.0.1:0",
        grace_s=2,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        environments=EnvironmentsConfig(kind="server"),
    )
    server = start_embedded(config)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def web(embedded: EmbeddedServer) -> Iterator[WebServer]:
    server = WebServer("127.0.0.1:0")
    server.start(WebConfig(embedded.address))
    try:
        yield server
    finally:
        server.stop()


def _session(web: WebServer, token: str) -> requests.Session:
    client = requests.Session()
    code = client.post(f"{web.url}/login/links", headers={"Authorization": f"Bearer {token}"}).json()["path"]
    assert client.get(web.url + code, allow_redirects=False).status_code == 303
    return client


def _slow_run(embedded: EmbeddedServer, tmp_path: Path) -> str:
    model = git_repo(E2E_MODEL, tmp_path / "model")
    workflow = model / "slow.yaml"
    workflow.write_text(
        "name: slow\ntasks:\n  s:\n    type: e2etasks.tasks:Slow\n    settings: {units: 4, seconds: 20}\n"
    )
    with Client(embedded.address, embedded.token) as client:
        return client.submit(workflow, model=model).run_id


@pytest.mark.parametrize(
    ("gb", "shown"),
    [(0.0, "0.0 MiB"), (3.6 / 1024, "3.6 MiB"), (412 / 1024, "412 MiB"), (1023.4 / 1024, "1023 MiB"), (1, "1.00 GiB")],
)
def test_measured_memory_reads_in_mib_below_a_gib(gb: float, shown: str) -> None:
    assert memory(gb) == shown


def test_a_wrong_token_logs_nobody_in_and_says_why(web: WebServer) -> None:
    with requests.Session() as client:
        page = client.post(f"{web.url}/login", data={"token": "wrong"})
        assert page.status_code == 401 and "simrun_session" not in client.cookies
        assert "unknown" in page.text or "token" in page.text
        assert client.post(f"{web.url}/login/links").status_code == 401
        assert client.post(f"{web.url}/login/links", headers={"Authorization": "Bearer wrong"}).status_code == 401
        moved = client.get(f"{web.url}/runs", allow_redirects=False)
        assert moved.headers["location"].startswith("/login?next=%2Fruns")


def test_every_page_carries_the_policy_and_logout_ends_the_session(web: WebServer, embedded: EmbeddedServer) -> None:
    with _session(web, embedded.token) as client:
        page = client.get(f"{web.url}/runs")
        assert page.status_code == 200
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe" not in policy
        assert re.search(r"<script(?![^>]*\bsrc=)", page.text) is None  # no inline script
        assert re.search(r"\son[a-z]+=", page.text) is None  # no event handler attribute
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        assert client.post(f"{web.url}/logout", data={"csrf": csrf}, allow_redirects=False).status_code == 303
        assert client.get(f"{web.url}/runs", allow_redirects=False).status_code == 303  # gone: to the login page


def test_a_closed_page_ends_its_live_stream_and_the_bound_refuses_more(
    web: WebServer, embedded: EmbeddedServer, tmp_path: Path
) -> None:
    run_id = _slow_run(embedded, tmp_path)
    assert web.app is not None
    streams: live.StreamBounds = web.app.state.streams
    streams.per_identity = 2
    with _session(web, embedded.token) as client:
        opened = []
        for _ in range(2):
            response = client.get(f"{web.url}/runs/{run_id}/events", stream=True)
            assert response.status_code == 200
            lines = response.iter_lines(decode_unicode=True)  # kept: a dropped reader closes the connection
            assert next(lines) == "event: run"
            opened.append((response, lines))
        assert streams.open() == 2
        refused = client.get(f"{web.url}/runs/{run_id}/events")
        assert refused.status_code == 429 and "live pages open" in refused.json()["error"]
        for response, _ in opened:
            response.close()  # the page closes
        deadline = time.monotonic() + 10
        while streams.open() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert streams.open() == 0
        again = client.get(f"{web.url}/runs/{run_id}/events", stream=True)
        assert again.status_code == 200
        again.close()
    with Client(embedded.address, embedded.token) as owner:
        owner.cancel(run_id)


def test_a_one_time_link_expires_and_is_spent_once() -> None:
    now = [0.0]

    class Known:
        def identity(self) -> object:
            return object()

        def close(self) -> None:
            pass

    sessions = Sessions(lambda token: Known(), clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    code = sessions.link("t")
    assert sessions.redeem(code).session_id
    with pytest.raises(Exception, match="spent or expired"):
        sessions.redeem(code)
    late = sessions.link("t")
    now[0] += 121
    with pytest.raises(Exception, match="spent or expired"):
        sessions.redeem(late)


def test_simrun_web_serves_the_view_alone_and_refuses_plaintext_beyond_loopback(embedded: EmbeddedServer) -> None:
    import shutil
    import subprocess
    import sys

    simrun = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"
    refused = subprocess.run(
        [simrun, "web", "--endpoint", embedded.address, "--address", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "beyond loopback" in refused.stderr and "Traceback" not in refused.stderr
    with subprocess.Popen(
        [simrun, "web", "--endpoint", embedded.address, "--address", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as alone:
        try:
            assert alone.stdout is not None
            line = alone.stdout.readline()
            url = re.search(r"is at (http://127\.0\.0\.1:\d+)", line)
            assert url, line
            link = subprocess.run(
                [simrun, "ui", "--no-browser", "--web", url.group(1), "--token", embedded.token],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert link.returncode == 0, link.stderr
            with requests.Session() as browser:
                opened = browser.get(link.stdout.strip().splitlines()[-1])
                assert opened.url == f"{url.group(1)}/runs" and "owner (owner)" in opened.text
        finally:
            alone.terminate()


def test_under_tls_the_session_cookie_is_secure_and_simrun_ui_trusts_the_given_ca(
    embedded: EmbeddedServer, tmp_path: Path
) -> None:
    import gc
    import shutil
    import subprocess
    import sys

    from tls_support import make_certificates

    certificates = make_certificates(tmp_path / "tls")
    server = WebServer("127.0.0.1:0", cert=certificates.server_cert, key=certificates.server_key)
    server.start(WebConfig(embedded.address))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        simrun = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"
        ui = [simrun, "ui", "--no-browser", "--web", server.url, "--token", embedded.token]
        untrusted = subprocess.run(ui, capture_output=True, text=True, timeout=60)
        assert untrusted.returncode == 1, untrusted.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr and "Traceback" not in untrusted.stderr
        gc.collect()  # a transport the refused handshake left open would warn here (warnings are errors)
        link = subprocess.run([*ui, "--tls-ca", str(certificates.ca)], capture_output=True, text=True, timeout=60)
        assert link.returncode == 0, link.stderr
        with requests.get(  # the connection closed by the view after it answers, before the view stops
            link.stdout.strip().splitlines()[-1],
            verify=str(certificates.ca),
            allow_redirects=False,
            headers={"Connection": "close"},
        ) as opened:
            cookie = opened.headers["set-cookie"]
        assert opened.status_code == 303 and "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    finally:
        server.stop()
