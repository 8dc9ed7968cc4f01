"""The task-type API: loading by `module:Class` and entry point, refusing bad types, checking settings, describing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from simrun_runtime import (
    ResourceHint,
    SettingsError,
    SplitTaskType,
    TaskSettings,
    TaskTypeError,
    UnsplitTaskType,
    describe_type,
    load_task_type,
)

MODEL_ROOT = Path(__file__).parent / "model"


@pytest.fixture(autouse=True)
def isolated_imports() -> Iterator[None]:
    """Loading puts the model root first on sys.path and imports the model; undo both after each test."""
    path = list(sys.path)
    modules = set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_a_type_is_loaded_by_module_and_class_with_the_model_root_first() -> None:
    scan = load_task_type("simrun_toymodel:Scan", MODEL_ROOT)
    assert isinstance(scan, SplitTaskType) and scan.split
    assert sys.path[0] == str(MODEL_ROOT.resolve())
    assert type(scan).outputs == ("table",) and type(scan).cost_setting == "points"
    assert type(scan).resources == ResourceHint(base_memory_gb=0.25, per_worker_gb=0.1)
    total = load_task_type("simrun_toymodel:Total", MODEL_ROOT)
    assert isinstance(total, UnsplitTaskType) and not total.split


def test_a_type_is_loaded_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "toy_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[simrun.task_types]\ntoy-scan = simrun_toymodel:Scan\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    scan = load_task_type("toy-scan", MODEL_ROOT)
    assert type(scan).__name__ == "Scan"
    with pytest.raises(TaskTypeError, match=r"unknown task type 'toy-scann'.*known: .*toy-scan"):
        load_task_type("toy-scann", MODEL_ROOT)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("simrun_nomodel:Scan", r"cannot import module 'simrun_nomodel'"),
        ("simrun_toymodel:Nope", r"has no 'Nope'"),
        ("simrun_toymodel:hold_memory", r"not a subclass"),
        ("simrun_toymodel:Loose", r'forbid unknown fields.*extra="forbid"'),
        ("simrun_toymodel:NoRun", r"neither `command` nor `run`"),
        ("simrun_toymodel:", r"`module:Class`"),
    ],
)
def test_bad_types_are_refused_with_what_to_fix(name: str, message: str) -> None:
    with pytest.raises(TaskTypeError, match=message):
        load_task_type(name, MODEL_ROOT)


def test_a_split_type_must_define_its_three_methods() -> None:
    from simrun_runtime import TaskSettings
    from simrun_runtime.tasktype import check_task_type

    class Half(SplitTaskType):
        Settings = TaskSettings

        def count_units(self, settings: Any) -> int:
            return 1

    with pytest.raises(TaskTypeError, match="does not define compute_unit, merge"):
        check_task_type(Half, "Half")


@pytest.mark.parametrize(
    ("attribute", "value", "message"),
    [
        ("unit_timeout_s", 0, "unit_timeout_s must be a number of seconds > 0, not 0"),
        ("unit_timeout_s", "1h", "unit_timeout_s must be a number of seconds > 0"),
        ("unit_retries", -1, "unit_retries must be an integer >= 0, not -1"),
        ("unit_retries", 1.5, "unit_retries must be an integer >= 0"),
    ],
)
def test_a_split_types_time_limit_and_retries_are_checked(attribute: str, value: Any, message: str) -> None:
    from simrun_runtime.tasktype import check_task_type

    scan = type(load_task_type("simrun_toymodel:Scan", MODEL_ROOT))
    bad = type("Bad", (scan,), {attribute: value})
    with pytest.raises(TaskTypeError, match=message):
        check_task_type(bad, "Bad")


def test_settings_errors_name_the_unknown_or_misspelled_setting() -> None:
    scan = load_task_type("simrun_toymodel:Scan", MODEL_ROOT)
    with pytest.raises(SettingsError) as caught:
        scan.validate_settings({"pionts": 3, "steps": "many", "colour": 1})
    problems = caught.value.problems
    assert "unknown setting 'pionts' (did you mean 'points'?)" in problems
    assert any(p.startswith("unknown setting 'colour' (known settings: ") for p in problems)
    assert any(p.startswith("setting 'steps':") for p in problems)
    settings = scan.validate_settings({"points": 7})
    assert settings.points == 7 and scan.cost_value(settings) == "7"


def test_describe_gives_ports_hint_schema_and_checks_settings() -> None:
    plain = describe_type("simrun_toymodel:Scan", MODEL_ROOT)
    assert plain.split and plain.outputs == ["table"] and plain.inputs == []
    assert plain.settings_schema["additionalProperties"] is False
    assert "points" in plain.settings_schema["properties"] and not plain.settings_checked
    good = describe_type("simrun_toymodel:Scan", MODEL_ROOT, {"points": 12})
    assert good.settings_checked and good.settings_errors == []
    assert good.units == 12 and good.cost_value == "12" and good.settings and good.settings["steps"] == 4000
    bad = describe_type("simrun_toymodel:Scan", MODEL_ROOT, {"pionts": 12})
    assert bad.settings_errors == ["unknown setting 'pionts' (did you mean 'points'?)"] and bad.units is None
    shell = describe_type("simrun_toymodel:Shell", MODEL_ROOT, {})
    assert not shell.split and shell.command and shell.units is None and shell.outputs == ["result-files"]
    assert (plain.unit_timeout_s, plain.unit_retries) == (None, 1) and shell.unit_retries is None
    quick = describe_type("simrun_toymodel:QuickHang", MODEL_ROOT)
    assert (quick.unit_timeout_s, quick.unit_retries) == (1.0, 2)


def test_describe_runs_as_a_subprocess_with_json_on_stdin_and_stdout() -> None:
    requests = [
        {"type": "simrun_toymodel:Scan", "model_root": str(MODEL_ROOT), "settings": {"points": 5}},
        {"type": "simrun_toymodel:Scan", "model_root": str(MODEL_ROOT), "settings": {"pionts": 5}},
        {"type": "simrun_noisy_model:Noisy", "model_root": str(MODEL_ROOT)},
        {"type": "simrun_toymodel:Loose", "model_root": str(MODEL_ROOT)},
    ]
    done = subprocess.run(
        [sys.executable, "-m", "simrun_runtime.describe"],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    responses = json.loads(done.stdout)
    assert [r["ok"] for r in responses] == [True, True, True, False]
    assert responses[0]["description"]["units"] == 5
    assert responses[1]["description"]["settings_errors"] == ["unknown setting 'pionts' (did you mean 'points'?)"]
    assert responses[2]["description"]["split"] is False
    assert "forbid" in responses[3]["error"]
    assert "noisy model imported" in done.stderr

    single = subprocess.run(
        [sys.executable, "-m", "simrun_runtime.describe"],
        input=json.dumps(requests[0]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(single.stdout)["description"]["cost_value"] == "5"


def test_describe_refuses_a_malformed_request() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "simrun_runtime.describe"],
        input='{"model_root": "/x"}',
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("simrun-describe: error: stdin is not a describe request")


def test_describe_serve_answers_one_line_per_line_until_stdin_closes() -> None:
    scan = {"type": "simrun_toymodel:Scan", "model_root": str(MODEL_ROOT), "settings": {"points": 3}}
    lines = [json.dumps([scan]), "not json", json.dumps([scan | {"settings": {"pionts": 3}}])]
    done = subprocess.run(
        [sys.executable, "-m", "simrun_runtime.describe", "--serve"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == 3
    assert answers[0][0]["description"]["units"] == 3
    assert answers[1][0]["ok"] is False and "not a describe request" in answers[1][0]["error"]
    assert answers[2][0]["description"]["settings_errors"] == ["unknown setting 'pionts' (did you mean 'points'?)"]


def test_an_import_error_says_where_dependencies_and_the_model_come_from(tmp_path: Path) -> None:
    with_project = tmp_path / "with"
    (with_project / "needsdep").mkdir(parents=True)
    (with_project / "pyproject.toml").write_text('[project]\nname = "needsdep"\nversion = "0"\ndependencies = []\n')
    (with_project / "needsdep" / "__init__.py").write_text("")
    (with_project / "needsdep" / "tasks.py").write_text("import simrun_absent_dependency.sub\n")
    with pytest.raises(TaskTypeError) as refused:
        load_task_type("needsdep.tasks:Scan", with_project)
    assert "No module named 'simrun_absent_dependency'" in str(refused.value)
    assert "add the package that provides 'simrun_absent_dependency' to the dependencies of the model's" in str(
        refused.value
    )
    bare = tmp_path / "bare"
    (bare / "baremodel").mkdir(parents=True)
    (bare / "baremodel" / "__init__.py").write_text("import simrun_absent_dependency\n")
    with pytest.raises(TaskTypeError, match=r"a model without pyproject\.toml runs in simrun's own Python"):
        load_task_type("baremodel:Scan", bare)
    with pytest.raises(TaskTypeError, match=r"is the model root right\? .*\(give --model FOLDER\)"):
        load_task_type("simrun_not_here.tasks:Scan", tmp_path)


class _Points(SplitTaskType):
    """Unit keys by the scanned point: a scan with one more point keeps every other unit's key."""

    class Settings(TaskSettings):
        points: list[float] = Field(default=[1.0, 2.0])

    inputs = ("fits",)

    def count_units(self, settings: Any) -> int:
        return len(settings.points)

    def unit_key(self, settings: Any, index: int) -> Any:
        return {"point": settings.points[index]}

    def unit_inputs(self, settings: Any, index: int) -> Any:
        return {"fits": [index]}


def test_unit_keys_are_digests_of_the_units_own_values_and_bad_ones_are_named() -> None:
    from simrun_runtime.loading import unit_keys

    task = _Points()
    two, reads = unit_keys(task, task.Settings(points=[1.0, 2.0]), "m:Points", 2, ["fits"])
    three, _ = unit_keys(task, task.Settings(points=[0.5, 1.0, 2.0]), "m:Points", 3, ["fits"])
    assert two is not None and three is not None and three[1:] == two and len(set(three)) == 3
    assert reads == [{"fits": [0]}, {"fits": [1]}]

    class NotJson(_Points):
        def unit_key(self, settings: Any, index: int) -> Any:
            return {"point": float("nan")}

    with pytest.raises(TaskTypeError, match="unit_key of task type 'm:Points' gave unit 0 a value that is not JSON"):
        unit_keys(NotJson(), task.Settings(), "m:Points", 2, ["fits"])

    class WrongPort(_Points):
        def unit_inputs(self, settings: Any, index: int) -> Any:
            return {"fit": [index]}

    with pytest.raises(TaskTypeError, match="names port 'fit' for unit 0; its inputs: fits"):
        unit_keys(WrongPort(), task.Settings(), "m:Points", 2, ["fits"])

    class Negative(_Points):
        def unit_inputs(self, settings: Any, index: int) -> Any:
            return {"fits": [-1]}

    with pytest.raises(TaskTypeError, match="give unit indices"):
        unit_keys(Negative(), task.Settings(), "m:Points", 2, ["fits"])

    class NoKeys(_Points):
        def unit_key(self, settings: Any, index: int) -> Any:
            return None

    assert unit_keys(NoKeys(), task.Settings(), "m:Points", 2, ["fits"]) == (None, None)
