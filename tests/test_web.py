"""The web view in a real browser, against a real `simrun server` process whose runs are submitted with the CLI.

The browser logs in through the one-time link `simrun ui --no-browser` prints, watches a run reach `succeeded`
without a reload, follows a pod's log, downloads an output, counts a heatmap's marks (one per unit of a
two-parameter scan), compares two runs, cancels one; an agent's session does not see another's run; markup in a
setting or a task's message is shown as text and runs nothing. Each page is photographed at 1280x800.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import E2E_MODEL, TOKENS, git_repo
from web_support import console_errors, shoot, start_browser, wait_for

pytestmark = pytest.mark.slow

SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"


def _free() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class Served:
    endpoint: str
    web: str
    model: Path
    env: dict[str, str]
    downloads: Path

    def cli(self, *args: str, who: str = "owner", check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "SIMRUN_ENDPOINT": self.endpoint, "SIMRUN_TOKEN": TOKENS[who]}
        done = subprocess.run([SIMRUN, *args], capture_output=True, text=True, timeout=60, env=env, check=False)
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done

    def submit(
        self,
        name: str,
        settings: dict[str, Any],
        who: str = "owner",
        group: str = "webtest",
        tasks: dict[str, Any] | None = None,
    ) -> str:
        """Submits a workflow of one Grid task with `settings`, or of `tasks` as given."""
        workflow = {
            "name": name,
            "group": group,
            "tasks": tasks or {"grid": {"type": "e2etasks.tasks:Grid", "settings": settings}},
        }
        path = self.model / f"{name}.yaml"
        path.write_text(yaml.safe_dump(workflow))
        done = self.cli("submit", str(path), "--model", str(self.model), who=who)
        match = re.search(r"submitted run (\S+)", done.stdout)
        assert match, done.stdout
        return match.group(1)

    def wait(self, run_id: str, state: str, timeout_s: float = 90) -> None:
        def reached() -> bool:
            data = json.loads(self.cli("status", run_id, "--json").stdout)
            return data["state"] == f"RUN_STATE_{state.upper()}"

        wait_for(reached, timeout_s, f"run {run_id} {state}")

    def link(self, who: str = "owner") -> str:
        done = self.cli("ui", "--no-browser", "--web", f"http://{self.web}", who=who)
        return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("web")
    tokens = root / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "owner": "alice",
                "tokens": {
                    TOKENS["owner"]: {"name": "alice"},
                    TOKENS["person"]: {"name": "bob"},
                    TOKENS["agent"]: {"name": "bob-agent", "agent_of": "bob"},
                },
            }
        )
    )
    config = root / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "home": str(root / "home"),
                "store": str(root / "home" / "store"),
                "tokens_file": str(tokens),
                "environments": {"kind": "server"},
                "executor": {"local": {"nodes": [{"name": "node-a", "cores": 2, "memory_gb": 8}]}},
                "grace_s": 5,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    env["SIMRUN_HOME"] = str(root / "home")
    endpoint, web = _free(), _free()
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [SIMRUN, "server", "--config", str(config), "--address", endpoint, "--web-address", web],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    downloads = root / "downloads"
    downloads.mkdir()
    served = Served(endpoint, web, git_repo(E2E_MODEL, root / "model"), env, downloads)
    try:
        wait_for(lambda: served.cli("whoami", check=False).returncode == 0, 60, "the server")
        yield served
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Any]:
    driver = start_browser(served.downloads)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def owner(browser: Any, served: Served) -> Any:
    """The browser logged in as the owner through a one-time link."""
    link = served.link()
    assert "/login/link/" in link and TOKENS["owner"] not in link
    browser.get(link)
    assert browser.current_url == f"http://{served.web}/runs"  # the spent code left the address bar
    assert browser.find_element("id", "identity").text == "alice (owner)"
    return browser


def _text(driver: Any, element_id: str) -> str:
    return str(driver.find_element("id", element_id).text)


def test_a_login_link_works_once_and_the_token_never_shows(browser: Any, served: Served) -> None:
    link = served.link()
    browser.get(link)
    assert browser.current_url.endswith("/runs")
    cookie = browser.get_cookie("simrun_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert TOKENS["owner"] not in browser.page_source
    browser.get(link)  # a second time: spent
    assert "spent or expired" in _text(browser, "message")
    shoot(browser, "login")


def test_a_run_moves_to_succeeded_without_a_reload(owner: Any, served: Served) -> None:
    console_errors(owner)  # what the earlier tests left in the console (a spent link's refusal)
    listed = served.submit("listed", {"xs": [1, 2, 3, 4], "ys": [1, 2], "seconds": 0.5})
    owner.get(f"http://{served.web}/runs")
    owner.execute_script("window.simrunMarker = 'same page';")
    row = f'tr[data-run="{listed}"]'
    wait_for(lambda: "units" in owner.find_element("css selector", f"{row} .units").text, 30, "live units in the list")
    shoot(owner, "runs")
    wait_for(lambda: owner.find_element("css selector", f'{row} [data-field="state"]').text == "succeeded", 60, "done")
    assert owner.find_element("css selector", f"{row} .done").text == "1/1"
    assert owner.execute_script("return window.simrunMarker") == "same page"
    run_id = served.submit("live", {"xs": [1, 2, 3, 4], "ys": [1, 2, 3], "seconds": 0.4})
    owner.get(f"http://{served.web}/runs/{run_id}")
    owner.execute_script("window.simrunMarker = 'same page';")
    seen: set[str] = set()

    def done() -> bool:
        seen.add(owner.find_element("css selector", '#tasks tr[data-task="grid"] .count').text)
        return _text(owner, "run-state") == "succeeded"

    wait_for(done, 60, "succeeded")
    assert owner.execute_script("return window.simrunMarker") == "same page"  # no reload
    assert len(seen) > 1, seen  # the units arrived as they were done
    assert owner.find_element("css selector", '#tasks tr[data-task="grid"] .count').text == "12/12"
    assert (
        owner.find_element("css selector", '.dag [data-task="grid"]').get_attribute("class").endswith("state-succeeded")
    )
    # What the stream does not carry is fetched again as pods start and when the run ends, still without a reload.
    wait_for(lambda: owner.find_elements("css selector", '#pods tr[data-task="grid"][data-worker="w0"]'), 10, "pods")
    wait_for(lambda: owner.find_elements("css selector", "#outputs a.download"), 10, "the outputs, live")
    assert _text(owner, "run-ended").endswith("UTC")
    assert owner.execute_script("return window.simrunMarker") == "same page"
    owner.refresh()
    pod = owner.find_element("css selector", '#pods tr[data-task="grid"][data-worker="w0"]').text.split()
    assert pod[:6] == ["grid", "w0", "node-a", "1", "0", "0"], pod  # on the node, started once, never killed
    (task,) = json.loads(served.cli("status", run_id, "--json").stdout)["tasks"]
    assert [(p["worker"], p["node"]) for p in task["pods"]] == [("w0", "node-a")]  # the CLI's JSON names it too
    shoot(owner, "run")
    assert console_errors(owner) == []


def test_a_run_s_tasks_are_drawn_as_their_graph_with_states_that_follow_the_run(owner: Any, served: Served) -> None:
    tasks = {
        "values": {"type": "e2etasks.tasks:Slow", "settings": {"units": 4, "seconds": 1.0}},
        "total": {"type": "e2etasks.tasks:Sum", "inputs": {"values": "values.values"}},
        "offset": {"type": "e2etasks.tasks:Sum", "inputs": {"values": "values.values"}, "settings": {"offset": 1}},
    }
    run_id = served.submit("graph", {}, tasks=tasks)
    owner.get(f"http://{served.web}/runs/{run_id}")
    boxes = owner.find_elements("css selector", "#dag g.task")
    assert sorted(box.get_attribute("data-task") for box in boxes) == ["offset", "total", "values"]
    edges = owner.find_elements("css selector", "#dag path.edge")
    assert sorted((e.get_attribute("data-from"), e.get_attribute("data-to")) for e in edges) == [
        ("values", "offset"),
        ("values", "total"),
    ]
    # The readers stand in a column right of what they read.
    x = {box.get_attribute("data-task"): box.find_element("css selector", "rect").rect["x"] for box in boxes}
    assert x["values"] < x["total"] == x["offset"], x

    def state(task: str) -> str:
        return owner.find_element("css selector", f'#dag g[data-task="{task}"] text.state').text

    wait_for(lambda: state("values") == "running", 60, "values running")
    wait_for(lambda: [state(t) for t in tasks] == ["succeeded"] * 3, 90, "all succeeded, drawn live")
    assert (
        owner.find_element("css selector", '#dag g[data-task="total"]').get_attribute("class") == "task state-succeeded"
    )
    shoot(owner, "graph")
    assert console_errors(owner) == []


def test_a_run_submitted_while_the_runs_page_is_open_appears_at_its_top(owner: Any, served: Served) -> None:
    owner.get(f"http://{served.web}/runs?group=live-list")  # the first page of a group with no runs yet
    assert "No runs" in _text(owner, "runs")
    owner.execute_script("window.simrunMarker = 'same page';")
    elsewhere = served.submit("elsewhere", {"xs": [1], "ys": [1]}, group="live-other")
    run_id = served.submit("appears", {"xs": [1, 2], "ys": [1]}, group="live-list", who="agent")
    row = f'#runs tbody tr[data-run="{run_id}"]'
    wait_for(lambda: owner.find_elements("css selector", row), 20, "the new run's row")
    assert owner.find_element("css selector", "#runs tbody tr").get_attribute("data-run") == run_id  # at the top
    wait_for(lambda: owner.find_element("css selector", f'{row} [data-field="state"]').text == "succeeded", 60, "done")
    cells = [cell.text for cell in owner.find_elements("css selector", f"{row} td")]
    assert cells[:4] == [run_id, "live-list", "bob-agent (agent of bob)", "succeeded"], cells
    assert cells[4].startswith("1/1"), cells
    assert owner.find_element("css selector", f"{row} a").get_attribute("href").endswith(f"/runs/{run_id}")
    assert owner.find_elements("css selector", f'#runs tr[data-run="{elsewhere}"]') == []  # not the page's group
    assert "No runs" not in _text(owner, "runs")
    assert owner.execute_script("return window.simrunMarker") == "same page"  # no reload
    assert console_errors(owner) == []


def test_a_pod_s_log_follows_as_it_is_written(owner: Any, served: Served) -> None:
    run_id = served.submit("logs", {"xs": [1, 2, 3], "ys": [1, 2], "seconds": 1.0})
    owner.get(f"http://{served.web}/runs/{run_id}/tasks/grid/logs")
    first = wait_for(lambda: "unit 0: x=1.0" in _text(owner, "log"), 40, "the first unit's line")
    assert first and "unit 5" not in _text(owner, "log")  # the log arrived while the task still ran
    wait_for(lambda: "unit 5: x=3.0 y=2.0" in _text(owner, "log"), 60, "the last unit's line")
    wait_for(lambda: "ended" in _text(owner, "log-state"), 60, "the log's end")
    shoot(owner, "logs")


def test_an_output_downloads_and_its_heatmap_has_a_mark_per_unit(owner: Any, served: Served) -> None:
    xs, ys = [1, 2, 3, 4, 5], [10, 20, 30, 40]
    run_id = served.submit("heatmap", {"xs": xs, "ys": ys})
    console_errors(owner)
    served.wait(run_id, "succeeded")
    owner.get(f"http://{served.web}/runs/{run_id}")
    owner.find_element("css selector", "#outputs a.download").click()
    saved = wait_for(
        lambda: (served.downloads / "grid.csv").is_file() and served.downloads / "grid.csv", 20, "grid.csv"
    )
    fetched = served.model.parent / "fetched"
    served.cli("fetch", run_id, "grid", "grid", str(fetched))
    assert saved.read_bytes() == (fetched / "grid.csv").read_bytes()
    owner.find_element("css selector", "#outputs a.plot").click()
    wait_for(lambda: owner.find_element("id", "plot").get_attribute("data-ready") == "true", 30, "the plot")
    assert _text(owner, "kind") == "heatmap"
    marks = owner.find_elements("css selector", "#plot g.mark-rect.role-mark path")
    assert len(marks) == len(xs) * len(ys)
    shoot(owner, "table")
    # y set to none: the histogram of x, a bar per value.
    from selenium.webdriver.support.select import Select

    Select(owner.find_element("css selector", "#columns select[name=y]")).select_by_value("")
    owner.find_element("css selector", "#columns button").click()
    wait_for(lambda: owner.find_element("id", "plot").get_attribute("data-ready") == "true", 30, "the histogram")
    assert _text(owner, "kind") == "histogram"
    assert len(owner.find_elements("css selector", "#plot g.mark-rect.role-mark path")) == len(xs)
    assert console_errors(owner) == []


def test_a_parquet_output_is_plotted_first_as_its_grid(owner: Any, served: Served) -> None:
    xs, ys = [1, 2, 3], [5, 6]
    run_id = served.submit("parquet", {"xs": xs, "ys": ys, "parquet": True, "note": "pq"})
    served.wait(run_id, "succeeded")
    owner.get(f"http://{served.web}/runs/{run_id}")
    owner.find_element("css selector", '#outputs a.plot[href$="grid.parquet"]').click()
    wait_for(lambda: owner.find_element("id", "plot").get_attribute("data-ready") == "true", 30, "the plot")
    assert _text(owner, "kind") == "heatmap"
    chosen = [owner.find_element("css selector", f"#columns select[name={axis}]") for axis in ("x", "y", "color")]
    assert [axis.get_attribute("value") for axis in chosen] == ["x", "y", "value"]
    assert len(owner.find_elements("css selector", "#plot g.mark-rect.role-mark path")) == len(xs) * len(ys)
    rows = [
        [cell.text for cell in row.find_elements("css selector", "td")]
        for row in owner.find_elements("css selector", "table.preview tbody tr")
    ]
    assert rows[0] == ["1.0", "5.0", "6.0", "pq"] and len(rows) == len(xs) * len(ys), rows


def test_two_runs_compare_with_their_differing_setting(owner: Any, served: Served) -> None:
    first = served.submit("cmp-a", {"xs": [1, 2], "ys": [1.0], "seconds": 0.0})
    second = served.submit("cmp-b", {"xs": [1, 2], "ys": [5.0], "seconds": 0.1})
    for run_id in (first, second):
        served.wait(run_id, "succeeded")
    owner.get(f"http://{served.web}/compare?runs={first},{second}")
    settings = owner.find_elements("css selector", "#comparison tr.setting")
    assert [row.text for row in settings] == ["grid seconds 0 0.1", "grid ys [1.0] [5.0]"]
    summary = {row.text for row in owner.find_elements("css selector", "#comparison tr.summary")}
    assert "grid max 5 9" in summary, summary
    for plot in ("plot", "parallel"):
        wait_for(lambda plot=plot: owner.find_element("id", plot).get_attribute("data-ready") == "true", 30, plot)
    # The summary against the first differing setting, a point per run; the numeric columns, a line per run.
    assert len(owner.find_elements("css selector", "#plot g.mark-symbol.role-mark path")) == 2
    assert len(owner.find_elements("css selector", "#parallel g.mark-line.role-mark path")) == 2
    shoot(owner, "compare")
    # Each page's JSON view holds what the CLI's --json prints.
    json_link = owner.find_element("id", "json").get_attribute("href")
    assert _json_view(owner, json_link) == json.loads(served.cli("compare", first, second, "--json").stdout)
    assert _json_view(owner, f"http://{served.web}/runs/{first}?format=json") == json.loads(
        served.cli("status", first, "--json").stdout
    )
    listed = _json_view(owner, f"http://{served.web}/runs?group=webtest&format=json")["runs"]
    cli_listed = json.loads(served.cli("list", "--group", "webtest", "--json").stdout)["runs"]
    assert [run["run_id"] for run in listed] == [run["run_id"] for run in cli_listed][: len(listed)]
    cluster = _json_view(owner, f"http://{served.web}/cluster?format=json")
    assert cluster["nodes"] == json.loads(served.cli("nodes", "--json").stdout)["nodes"]
    assert {"held", "held_per_node", "by_identity", "runs"} <= cluster.keys()


def test_the_cluster_page_shows_the_nodes_and_who_holds_them(owner: Any, served: Served) -> None:
    run_id = served.submit("holding", {"xs": [1, 2, 3, 4], "ys": [1, 2], "seconds": 30.0})
    try:
        served.wait(run_id, "running")
        owner.get(f"http://{served.web}/cluster")
        assert "node-a" in _text(owner, "nodes")
        wait_for(lambda: "alice" in _text(owner, "holders"), 5, "alice among the holders")
        # The holder's one pod of 2 cores (its plan), of the node's 2, and the memory the executor measured in it.
        assert _text(owner, "in-use").startswith("The running tasks' 1 pod holds 2 of 2 cores and 1 of 8 GiB")
        row = owner.find_elements("css selector", "#nodes tbody tr td")
        assert [cell.text for cell in row[6:8]] == ["1", "2 cores, 1 GiB"]
        queued = owner.find_elements("css selector", f'#queue tr[data-run="{run_id}"] td')
        assert [cell.text for cell in queued[3:7]] == ["running", "1", "2", "1 GiB"]

        def measured() -> str | None:  # its peak is first told a second after it starts: the page is loaded again
            owner.refresh()
            shown = owner.find_elements("css selector", "#nodes tbody tr td")[8].text
            mib = re.fullmatch(r"(\d+(\.\d)?) MiB", shown)  # a Python process, under 1 GiB
            return shown if mib and float(mib.group(1)) > 0 else None  # 0 until the pod has run a second

        peak = wait_for(measured, 20, "the pod's measured peak")
        assert f"measured in them adds up to {peak}." in _text(owner, "in-use")
        shoot(owner, "cluster")

        # Its pod killed by SIGKILL runs again at its retry memory: both pages show what it holds now.
        _kill_pod(run_id, "w0")
        wait_for(lambda: owner.refresh() or "2 of 2 cores and 2 of 8 GiB" in _text(owner, "in-use"), 30, "the retry")
        owner.get(f"http://{served.web}/runs/{run_id}")
        memory = owner.find_element("css selector", '#pods tr[data-worker="w0"] td[data-field="memory"]').text
        assert memory == "2 GiB, its retry memory", memory
    finally:  # a run left holding the node would hold up the tests after it
        served.cli("cancel", run_id)


def _kill_pod(run_id: str, worker: str) -> None:
    """Kills a pod of the run by SIGKILL, as the kernel or a person would: its process group, found by its
    runtime contract variables."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = dict(v.split("=", 1) for v in environ.read_bytes().decode().split("\0") if "=" in v)
        except OSError:
            continue
        if variables.get("SIMRUN_RUN_DIR", "").endswith(run_id) and variables.get("SIMRUN_WORKER") == worker:
            os.killpg(os.getpgid(int(environ.parent.name)), signal.SIGKILL)
            return
    raise AssertionError(f"no process of pod {worker} of run {run_id}")


def test_a_run_is_cancelled_from_its_page(owner: Any, served: Served) -> None:
    run_id = served.submit("cancel-me", {"xs": list(range(10)), "ys": [1, 2], "seconds": 3.0})
    served.wait(run_id, "running")
    owner.get(f"http://{served.web}/runs/{run_id}")
    owner.find_element("id", "cancel").click()
    owner.switch_to.alert.accept()
    try:
        wait_for(lambda: _text(owner, "run-state") == "cancelled", 30, "cancelled")
    except AssertionError:
        shoot(owner, "cancel-failed")
        raise
    served.wait(run_id, "cancelled", 10)


def _json_view(owner: Any, url: str) -> Any:
    """A page's JSON view (`format=json`), fetched with the logged-in session of the browser."""
    cookie = owner.get_cookie("simrun_session")["value"]
    request = urllib.request.Request(url, headers={"Cookie": f"simrun_session={cookie}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"
        return json.loads(response.read())


def _post(url: str, data: dict[str, str], cookie: str, origin: str | None = None) -> int:
    from urllib.parse import urlencode

    headers = {"Cookie": f"simrun_session={cookie}", "Content-Type": "application/x-www-form-urlencoded"}
    if origin:
        headers["Origin"] = origin
    request = urllib.request.Request(url, data=urlencode(data).encode(), headers=headers, method="POST")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def test_a_cancel_without_the_form_s_secret_or_from_another_site_is_refused(owner: Any, served: Served) -> None:
    run_id = served.submit("forged", {"xs": list(range(10)), "ys": [1, 2], "seconds": 3.0})
    served.wait(run_id, "running")
    cookie = owner.get_cookie("simrun_session")["value"]
    url = f"http://{served.web}/runs/{run_id}/cancel"
    assert _post(url, {}, cookie) == 400
    assert _post(url, {"csrf": "guessed"}, cookie) == 400
    owner.get(f"http://{served.web}/runs/{run_id}")
    secret = owner.find_element("css selector", "#cancel-form input[name=csrf]").get_attribute("value")
    assert _post(url, {"csrf": secret}, cookie, origin="http://evil.example") == 400
    with pytest.raises(urllib.error.HTTPError) as refused:  # no write by GET
        urllib.request.urlopen(urllib.request.Request(url, headers={"Cookie": f"simrun_session={cookie}"}), timeout=10)
    assert refused.value.code == 405
    refused.value.close()
    assert json.loads(served.cli("status", run_id, "--json").stdout)["state"] == "RUN_STATE_RUNNING"
    assert _post(url, {"csrf": secret}, cookie, origin=f"http://{served.web}") == 303
    served.wait(run_id, "cancelled", 30)


def test_an_agent_sees_only_what_the_cli_shows_it(browser: Any, served: Served) -> None:
    hidden = served.submit("hidden", {"xs": [1], "ys": [1]})
    own = served.submit("agents-own", {"xs": [1], "ys": [1]}, who="agent")
    browser.delete_all_cookies()
    browser.get(f"http://{served.web}/login")
    browser.find_element("name", "token").send_keys(TOKENS["agent"])
    browser.find_element("css selector", "form.login button").click()
    assert _text(browser, "identity") == "bob-agent (agent)"
    listed = {row.get_attribute("data-run") for row in browser.find_elements("css selector", "#runs tr[data-run]")}
    cli_listed = {run["run_id"] for run in json.loads(served.cli("list", "--json", who="agent").stdout).get("runs", [])}
    assert listed == cli_listed and own in listed and hidden not in listed
    submitted_by = browser.find_elements("css selector", f'#runs tr[data-run="{own}"] td')[2].text
    assert submitted_by == "bob-agent (agent of bob)", submitted_by  # as `simrun list` says it
    browser.get(f"http://{served.web}/runs/{hidden}")
    assert _text(browser, "message")  # the gateway's refusal, as `simrun status` would say it
    assert browser.find_elements("id", "run") == []
    browser.find_element("css selector", "form.logout button").click()
    browser.get(f"http://{served.web}/runs")
    assert browser.current_url.startswith(f"http://{served.web}/login")


def test_markup_in_a_setting_or_a_message_is_text_and_runs_nothing(owner: Any, served: Served) -> None:
    owner.get(f"http://{served.web}/runs")  # the owner's session again (the agent test logged out its own)
    if "/login" in owner.current_url:
        owner.get(served.link())
    note = '<img src=x onerror="window.simrunPwned=1">'
    message = "<script>window.simrunPwned=2</script>"
    run_id = served.submit("markup", {"xs": [1, 2], "ys": [1.0], "note": note, "fail_with": message})
    served.wait(run_id, "failed")
    owner.get(f"http://{served.web}/runs/{run_id}")
    assert message in _text(owner, "tasks") or message in _text(owner, "run-message")
    assert note in owner.find_element("css selector", "pre.workflow").text
    owner.get(f"http://{served.web}/runs/{run_id}/tasks/grid/logs")
    wait_for(lambda: note in _text(owner, "log"), 30, "the note in the log")
    shown = served.submit("markup-table", {"xs": [1, 2], "ys": [1.0, 2.0], "note": note})
    served.wait(shown, "succeeded")
    owner.get(f"http://{served.web}/runs/{shown}/tasks/grid/table?port=grid&path=grid.csv")
    wait_for(lambda: owner.find_element("id", "plot").get_attribute("data-ready") == "true", 30, "the plot")
    cells = {cell.text for cell in owner.find_elements("css selector", "table.preview td")}
    assert note in cells  # a table's cell, as text
    owner.get(f"http://{served.web}/compare?runs={run_id},{shown}")
    owner.get(f"http://{served.web}/runs?group=webtest")
    assert owner.execute_script("return window.simrunPwned === undefined")
    assert owner.find_elements("css selector", "main img, main script") == []
    shoot(owner, "escaped")


def test_the_live_streams_end_when_the_pages_close(owner: Any, served: Served) -> None:
    """The server's own count of streams is not visible from here; the gateway's is: after closing, the next
    page still gets its live stream at once, well within the identity's bound of streams, time after time."""
    run_id = served.submit("bounded", {"xs": list(range(10)), "ys": [1, 2], "seconds": 3.0})
    served.wait(run_id, "running")
    for _ in range(20):  # more pages, one after another, than the identity's bound of live streams (16)
        owner.get(f"http://{served.web}/runs/{run_id}")
        wait_for(lambda: _text(owner, "run-state") == "running", 10, "the run page")
        owner.get("about:blank")
    owner.get(f"http://{served.web}/runs/{run_id}")
    owner.execute_script("window.simrunMarker = 'kept';")
    served.cli("cancel", run_id)
    wait_for(lambda: _text(owner, "run-state") == "cancelled", 30, "the cancel, live")
    assert owner.execute_script("return window.simrunMarker") == "kept"
