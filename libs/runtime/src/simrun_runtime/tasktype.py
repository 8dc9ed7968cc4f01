"""The task-type API a model imports: settings, ports, resource hint, split and unsplit types, their contexts."""

from __future__ import annotations

import difflib
import json
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

PORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class TaskTypeError(Exception):
    """A task type which cannot be loaded or is not a valid task type; the message says what to fix."""


class SettingsError(ValueError):
    """Settings which the settings model of their type refuses; `problems` name each setting at fault."""

    def __init__(self, type_name: str, problems: list[str]) -> None:
        self.type_name = type_name
        self.problems = problems
        super().__init__(f"invalid settings for task type {type_name}: " + "; ".join(problems))


class ResourceHint(BaseModel):
    """What a pod of the type needs before any observation was learned: memory is `base + per_worker × processes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_memory_gb: float = 0.5
    per_worker_gb: float = 0.5
    cores_per_process: int = 1
    gpus: int = 0
    scratch_gb: float = 0


class TaskSettings(BaseModel):
    """A convenient base for a type's `Settings`: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class _Scratch:
    """A scratch directory on the local disk, created on first use and removed by the runtime afterwards."""

    def __init__(self, path: Path | str) -> None:
        self._path = path  # a str until used: a unit that never asks for it costs no Path
        self._created = False

    def get(self) -> Path:
        if not self._created:
            self._path = Path(self._path)
            self._path.mkdir(parents=True, exist_ok=True)
            self._created = True
        return Path(self._path)

    def remove(self) -> None:
        if self._created:
            shutil.rmtree(self._path, ignore_errors=True)
            self._created = False


@dataclass
class UnitContext:
    """What `compute_unit` gets besides settings and index.

    Attributes:
        index: the unit's index, 0 … count-1.
        result_path: where `result_dir` is; nothing is created there unless the unit uses `result_dir`.
        inputs: input port -> the upstream `tasks/<task>/out/<port>` directory.
        worker: the worker computing the unit (`w0` is the coordinator).
        provenance: the task's `provenance.json`, if the pod was given one.
    """

    index: int
    result_path: Path | str
    inputs: dict[str, Path]
    worker: str = "w0"
    provenance: Path | None = None
    _scratch: _Scratch | None = field(default=None, repr=False)
    _used: bool = field(default=False, repr=False)

    @property
    def result_dir(self) -> Path:
        """An empty directory to write the unit's files into, created when first asked for; the runtime renames
        it to `units/results/<index>/` once `compute_unit` returns, so a unit's files appear whole or not at all.
        A unit whose results are small returns them from `compute_unit` instead and creates no file at all."""
        path = Path(self.result_path)
        if not self._used:
            path.mkdir(parents=True, exist_ok=True)
            self._used = True
        return path

    @property
    def wrote_files(self) -> bool:
        """The unit asked for its `result_dir` (so its files are renamed into `results/<index>/`)."""
        return self._used

    @property
    def scratch_dir(self) -> Path:
        """A directory on the pod's local disk for this unit only, removed once the unit is computed."""
        if self._scratch is None:
            raise RuntimeError("this unit context has no scratch directory")
        return self._scratch.get()


@dataclass
class MergeContext:
    """What `merge` gets: the unit results in index order, and one empty directory per output port to fill.

    Attributes:
        count: the number of units.
        results: the ledger's `units/results/` directory.
        outputs: output port -> the directory to write; the runtime puts them in place as `out/<port>` afterwards.
        inputs: input port -> the upstream `tasks/<task>/out/<port>` directory.
        scratch_dir: a directory on the local disk, removed after the merge.
    """

    count: int
    results: Path
    outputs: dict[str, Path]
    inputs: dict[str, Path]
    scratch_dir: Path
    _load_values: Callable[[], list[Any]] | None = field(default=None, repr=False)
    _values: list[Any] | None = field(default=None, repr=False)

    def unit_results(self, index: int) -> Path:
        """The directory of unit `index`'s files (absent for a unit that wrote none)."""
        if not 0 <= index < self.count:
            raise IndexError(f"unit {index} out of range 0..{self.count - 1}")
        return self.results / str(index)

    def units(self) -> Iterator[tuple[int, Path]]:
        """Every unit's index and results directory, in index order (so the merge never depends on timing)."""
        for index in range(self.count):
            yield index, self.results / str(index)

    def _all_values(self) -> list[Any]:
        if self._values is None:
            self._values = self._load_values() if self._load_values is not None else [None] * self.count
        return self._values

    def unit_value(self, index: int) -> Any:
        """What `compute_unit` of unit `index` returned (None if it returned nothing)."""
        if not 0 <= index < self.count:
            raise IndexError(f"unit {index} out of range 0..{self.count - 1}")
        return self._all_values()[index]

    def values(self) -> Iterator[tuple[int, Any]]:
        """Every unit's index and returned value in index order, read in bulk (a log of values per pool process)."""
        yield from enumerate(self._all_values())


@dataclass
class ExecContext:
    """What an unsplit type's `run` gets.

    Attributes:
        inputs: input port -> the upstream `tasks/<task>/out/<port>` directory.
        outputs: output port -> the directory to write; put in place as `out/<port>` once `run` returns.
        scratch_dir: a directory on the local disk, removed afterwards.
        model_root: the root of the model's snapshot (the working directory of a `command`).
        task_id: the task being run.
        provenance: the task's `provenance.json`, if the pod was given one.
    """

    inputs: dict[str, Path]
    outputs: dict[str, Path]
    scratch_dir: Path
    model_root: Path
    task_id: str
    provenance: Path | None = None


class TaskType:
    """A type of task: declare `Settings`, ports and a resource hint; subclass `SplitTaskType` or `UnsplitTaskType`.

    Class attributes:
        Settings: the pydantic model of the settings; it must forbid unknown fields
            (`model_config = ConfigDict(extra="forbid")`, or subclass `TaskSettings`), so a misspelled
            setting is an error instead of silently falling back to its default.
        inputs: the names of the input ports; a workflow connects each to an upstream `<task>.<port>`.
        outputs: the names of the output ports; port `p` is the directory `tasks/<task>/out/p`.
        resources: the resource hint used until observations of the type are learned.
        cost_setting: the name of the setting whose value decides the resources (part of the learner's key).
        cacheable: False for a type whose results are not a function of its settings, inputs, code and
            environment (it reads the clock, the network, …): its tasks are never reused from earlier runs.
    """

    Settings: ClassVar[type[BaseModel]]
    inputs: ClassVar[tuple[str, ...]] = ()
    outputs: ClassVar[tuple[str, ...]] = ()
    resources: ClassVar[ResourceHint] = ResourceHint()
    cost_setting: ClassVar[str | None] = None
    cacheable: ClassVar[bool] = True

    @property
    def split(self) -> bool:
        return isinstance(self, SplitTaskType)

    def validate_settings(self, data: Mapping[str, Any]) -> BaseModel:
        """Settings from their JSON form; raises `SettingsError` naming each unknown, misspelled or invalid setting."""
        name = type_label(type(self))
        if not isinstance(data, Mapping):
            raise SettingsError(name, [f"settings must be a JSON object, not {type(data).__name__}"])
        try:
            return self.Settings.model_validate(dict(data))
        except ValidationError as exc:
            raise SettingsError(name, _describe_errors(self.Settings, exc)) from None

    def cost_value(self, settings: BaseModel) -> str | None:
        """The value of `cost_setting` as a string (JSON for anything but a string), or None without one."""
        if self.cost_setting is None:
            return None
        value = getattr(settings, self.cost_setting)
        if isinstance(value, str):
            return value
        if isinstance(value, BaseModel):
            return value.model_dump_json()
        return json.dumps(value, sort_keys=True, default=str)


class SplitTaskType(TaskType):
    """A task computed as units claimed from a ledger by several pods, then merged by the coordinator.

    `compute_unit` must write outputs which depend on the settings and the index only: a unit may be computed
    twice (an evicted worker, a restarted pod) and the merged result must not depend on the number of pods.

    Class attributes:
        unit_timeout_s: the time limit of one unit, seconds; a unit past it is killed and counts as failed. A
            workflow's `unit_timeout_s` of the task (SIMRUN_UNIT_TIMEOUT_S) overrides it; neither: a day.
        unit_retries: how often a failed unit is computed again (on another worker when there is one) before it
            fails the task.
    """

    unit_timeout_s: ClassVar[float | None] = None
    unit_retries: ClassVar[int] = 1

    def count_units(self, settings: Any) -> int:
        """The number of units for these settings (e.g. the points of a scan)."""
        raise NotImplementedError

    def compute_unit(self, settings: Any, index: int, unit: UnitContext) -> Any:
        """Computes unit `index`: returns its result (a JSON value, stored with the other units of its claim in
        one file and read back by `merge.values()`), or writes files into `unit.result_dir` and returns None."""
        raise NotImplementedError

    def merge(self, settings: Any, merge: MergeContext) -> dict[str, Any]:
        """Combines the results of every unit into `merge.outputs[port]`; returns the task's summary."""
        raise NotImplementedError

    def unit_key(self, settings: Any, index: int) -> Any:
        """What unit `index`'s result depends on among the settings, as a JSON value (e.g. the scanned point and
        the settings every unit reads), or None (the default: no unit keys). With unit keys, a run whose settings
        differ (a scan with one more point) reuses every earlier unit of the same code and environment whose
        key is equal, at whatever index it now has."""
        return None

    def unit_inputs(self, settings: Any, index: int) -> Mapping[str, Sequence[int]] | None:
        """The units of each upstream split task (input port -> unit indices) whose results unit `index` reads
        from that port's merged output, or None (the default: it may read all of them). Used only with unit
        keys: a declared unit's key then holds those upstream units' keys instead of the upstream task's key."""
        return None


class UnsplitTaskType(TaskType):
    """A task run by one pod: either `command` as a subprocess in the model root, or the method `run`.

    A `command` finds its settings and directories in these environment variables:
        SIMRUN_SETTINGS: a JSON file of the validated settings, defaults filled in.
        SIMRUN_OUTPUTS / SIMRUN_INPUTS: JSON objects port -> directory.
        SIMRUN_OUTPUT_<PORT> / SIMRUN_INPUT_<PORT>: each port's directory (port upper-cased, other than
            letters and digits replaced by `_`).
        SIMRUN_SUMMARY: where the command may write its summary as a JSON object (else the summary is `{}`).
        SIMRUN_SCRATCH: a scratch directory on the local disk.

    Class attributes:
        unit_timeout_s: the time limit of the task's run (its one unit), seconds; past it the run is killed and
            the task fails. A workflow's `unit_timeout_s` of the task (SIMRUN_UNIT_TIMEOUT_S) overrides it;
            neither: no limit.
    """

    command: ClassVar[list[str] | None] = None
    unit_timeout_s: ClassVar[float | None] = None

    def run(self, settings: Any, context: ExecContext) -> dict[str, Any] | None:
        """Runs the task, writing `context.outputs[port]`; returns its summary (or None for `{}`)."""
        raise NotImplementedError


def type_label(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def port_env_name(prefix: str, port: str) -> str:
    """`SIMRUN_OUTPUT_<PORT>`: the port upper-cased, anything but letters and digits replaced by `_`."""
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9]', '_', port).upper()}"


def check_task_type(cls: type, name: str) -> None:
    """Refuses a class which is not a complete task type, with a message that says what to fix."""
    if not (isinstance(cls, type) and issubclass(cls, TaskType)):
        raise TaskTypeError(f"task type {name} is not a subclass of simrun_runtime.SplitTaskType or UnsplitTaskType")
    if not issubclass(cls, SplitTaskType | UnsplitTaskType):
        raise TaskTypeError(f"task type {name} must subclass SplitTaskType or UnsplitTaskType, not TaskType")
    settings = getattr(cls, "Settings", None)
    if not (isinstance(settings, type) and issubclass(settings, BaseModel)):
        raise TaskTypeError(f"task type {name} has no `Settings` pydantic model")
    if settings.model_config.get("extra") != "forbid":
        raise TaskTypeError(
            f"task type {name}: its Settings must forbid unknown fields so a misspelled setting is an error; "
            'add model_config = ConfigDict(extra="forbid") (or subclass simrun_runtime.TaskSettings)'
        )
    for kind in ("inputs", "outputs"):
        ports = getattr(cls, kind)
        if not isinstance(ports, tuple | list) or not all(isinstance(p, str) for p in ports):
            raise TaskTypeError(f"task type {name}: `{kind}` must be a tuple of port names")
        bad = [p for p in ports if not PORT_NAME.match(p) or p.endswith(".json")]
        if bad:
            raise TaskTypeError(f"task type {name}: invalid {kind[:-1]} port name(s) {bad}; use letters, digits, _ . -")
        if len(set(ports)) != len(ports):
            raise TaskTypeError(f"task type {name}: duplicate {kind[:-1]} port names in {list(ports)}")
    if not isinstance(cls.resources, ResourceHint):
        raise TaskTypeError(f"task type {name}: `resources` must be a simrun_runtime.ResourceHint")
    if cls.cost_setting is not None and cls.cost_setting not in settings.model_fields:
        raise TaskTypeError(
            f"task type {name}: cost_setting {cls.cost_setting!r} is not a setting "
            f"(settings: {sorted(settings.model_fields)})"
        )
    timeout = getattr(cls, "unit_timeout_s", None)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise TaskTypeError(f"task type {name}: unit_timeout_s must be a number of seconds > 0, not {timeout!r}")
    if issubclass(cls, SplitTaskType):
        retries = cls.unit_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise TaskTypeError(f"task type {name}: unit_retries must be an integer >= 0, not {retries!r}")
        missing = [m for m in ("count_units", "compute_unit", "merge") if getattr(cls, m) is getattr(SplitTaskType, m)]
        if missing:
            raise TaskTypeError(f"split task type {name} does not define {', '.join(missing)}")
    else:
        has_run = cls.run is not UnsplitTaskType.run
        if cls.command is None and not has_run:
            raise TaskTypeError(f"unsplit task type {name} defines neither `command` nor `run`")
        if cls.command is not None and (
            not isinstance(cls.command, list | tuple)
            or not cls.command
            or not all(isinstance(a, str) for a in cls.command)
        ):
            raise TaskTypeError(f"unsplit task type {name}: `command` must be a non-empty list of strings")


def _describe_errors(model: type[BaseModel], exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error["loc"]) or "<settings>"
        if error["type"] == "extra_forbidden":
            known = sorted(model.model_fields)
            close = difflib.get_close_matches(str(error["loc"][-1]), known, n=1) if len(error["loc"]) == 1 else []
            hint = f"did you mean {close[0]!r}?" if close else f"known settings: {', '.join(known) or 'none'}"
            problems.append(f"unknown setting {loc!r} ({hint})")
        else:
            problems.append(f"setting {loc!r}: {error['msg']}")
    return problems
