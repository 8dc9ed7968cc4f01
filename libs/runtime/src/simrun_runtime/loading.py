"""Loading a task type by `module:Class` or entry point, and describing it (ports, hint, schema, settings check)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from simrun_runtime.sources import import_roots, put_first
from simrun_runtime.tasktype import (
    ResourceHint,
    SettingsError,
    SplitTaskType,
    TaskType,
    TaskTypeError,
    UnsplitTaskType,
    check_task_type,
)

ENTRY_POINT_GROUP = "simrun.task_types"


def put_model_root_first(model_root: Path | str | None, libraries: Sequence[Path | str] = ()) -> None:
    """Puts the model root first on `sys.path`, as `python -m` in its checkout does, and after it each library
    that is not a package (`simrun_runtime.sources`)."""
    put_first(import_roots(model_root, libraries))


def _import_hint(exc: ImportError, module_name: str, model_root: Path | str | None) -> str:
    """What to fix when a task type's module cannot be imported: a missing dependency names where dependencies
    come from, a missing model module where the model root is."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if not missing or model_root is None:
        return ""
    if module_name == missing or module_name.startswith(f"{missing}."):
        return f"; is the model root right? It is the folder holding {missing.replace('.', '/')} (give --model FOLDER)"
    if (Path(model_root) / "pyproject.toml").is_file():
        return (
            f"; add the package that provides {missing.split('.')[0]!r} to the dependencies of the model's "
            "pyproject.toml: its environment holds those only"
        )
    return (
        "; a model without pyproject.toml runs in simrun's own Python: give it a pyproject.toml whose "
        f"[project] dependencies name the package that provides {missing.split('.')[0]!r}"
    )


def load_task_type(name: str, model_root: Path | str | None = None, libraries: Sequence[Path | str] = ()) -> TaskType:
    """An instance of the task type `name`: `module:Class` imported with the model root first on `sys.path`,
    or the name of an entry point in the group `simrun.task_types`.

    Raises:
        TaskTypeError: the type cannot be found or imported, or is not a valid task type.
    """
    put_model_root_first(model_root, libraries)
    if ":" in name:
        module_name, _, qualname = name.partition(":")
        if not module_name or not qualname:
            raise TaskTypeError(f"task type {name!r} must be written `module:Class`")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            where = f" (model root {model_root})" if model_root else ""
            raise TaskTypeError(
                f"cannot import module {module_name!r} of task type {name!r}{where}: {exc}"
                f"{_import_hint(exc, module_name, model_root)}"
            ) from exc
        for part in qualname.split("."):
            if not hasattr(obj, part):
                raise TaskTypeError(f"module {module_name!r} has no {qualname!r}: check the task type {name!r}")
            obj = getattr(obj, part)
    else:
        # Imported here: importlib.metadata is a fifth of a pod's start, and `module:Class` names never need it.
        from importlib import metadata

        found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
            raise TaskTypeError(
                f"unknown task type {name!r}: not `module:Class` and no entry point of that name in group "
                f"{ENTRY_POINT_GROUP} (known: {', '.join(known) or 'none'})"
            )
        try:
            obj = found[0].load()
        except Exception as exc:
            raise TaskTypeError(f"cannot load entry point {name!r} ({found[0].value}): {exc}") from exc
    check_task_type(obj, name)
    try:
        return obj()
    except Exception as exc:
        raise TaskTypeError(f"task type {name!r} cannot be instantiated without arguments: {exc}") from exc


class TypeDescription(BaseModel):
    """What the control plane needs to know of a type, and of given settings, without importing user code itself."""

    type: str = Field(description="The name it was loaded by.")
    split: bool
    inputs: list[str]
    outputs: list[str]
    resources: ResourceHint
    cost_setting: str | None
    cacheable: bool = Field(default=True, description="Whether its tasks may be reused from earlier runs.")
    settings_schema: dict[str, Any] = Field(description="The JSON schema of the type's Settings.")
    command: list[str] | None = Field(default=None, description="The command of an unsplit type, if it has one.")
    doc: str = ""
    settings_checked: bool = Field(default=False, description="Whether settings were given and checked.")
    settings_errors: list[str] = Field(
        default_factory=list, description="One message per unknown, misspelled or invalid setting."
    )
    settings: dict[str, Any] | None = Field(default=None, description="The validated settings, defaults filled in.")
    units: int | None = Field(default=None, description="The unit count of a split type for the settings.")
    cost_value: str | None = None
    unit_timeout_s: float | None = Field(
        default=None,
        description="The type's own time limit of a unit (an unsplit type: its run), seconds (None: none declared).",
    )
    unit_retries: int | None = Field(default=None, description="How often a split type retries a failed unit.")
    unit_keys: list[str] | None = Field(
        default=None,
        description="Per unit, the SHA-256 of its `unit_key` as canonical JSON (None: the type gives no unit keys).",
    )
    unit_inputs: list[dict[str, list[int]]] | None = Field(
        default=None, description="Per unit, the upstream units it reads per input port (None: not declared)."
    )


@functools.lru_cache(maxsize=256)
def _settings_schema(settings: type[BaseModel]) -> dict[str, Any]:
    """A settings class's JSON schema, made once per class: a long-lived describer is asked at every submission."""
    return settings.model_json_schema()


def describe_type(
    name: str,
    model_root: Path | str | None = None,
    settings: Mapping[str, Any] | None = None,
    libraries: Sequence[Path | str] = (),
) -> TypeDescription:
    """Describes the type `name` and, with `settings`, checks them and computes their unit count and cost value.

    Raises:
        TaskTypeError: the type cannot be loaded, or `count_units` failed for valid settings.
    """
    task_type = load_task_type(name, model_root, libraries)
    cls = type(task_type)
    description = TypeDescription(
        type=name,
        split=isinstance(task_type, SplitTaskType),
        inputs=list(cls.inputs),
        outputs=list(cls.outputs),
        resources=cls.resources,
        cost_setting=cls.cost_setting,
        cacheable=bool(getattr(cls, "cacheable", True)),
        settings_schema=_settings_schema(cls.Settings),
        command=list(task_type.command) if isinstance(task_type, UnsplitTaskType) and task_type.command else None,
        doc=(cls.__doc__ or "").strip(),
    )
    description.unit_timeout_s = getattr(cls, "unit_timeout_s", None)
    if isinstance(task_type, SplitTaskType):
        description.unit_retries = cls.unit_retries  # type: ignore[attr-defined]
    if settings is None:
        return description
    description.settings_checked = True
    try:
        validated = task_type.validate_settings(settings)
    except SettingsError as exc:
        description.settings_errors = exc.problems
        return description
    description.settings = validated.model_dump(mode="json")
    description.cost_value = task_type.cost_value(validated)
    if isinstance(task_type, SplitTaskType):
        description.units = count_units(task_type, validated, name)
        if type(task_type).unit_key is not SplitTaskType.unit_key:
            description.unit_keys, description.unit_inputs = unit_keys(
                task_type, validated, name, description.units, cls.inputs
            )
    return description


def unit_keys(
    task_type: SplitTaskType, settings: BaseModel, name: str, count: int, inputs: Sequence[str]
) -> tuple[list[str] | None, list[dict[str, list[int]]] | None]:
    """Each unit's `unit_key` digest and, when the type declares them, the upstream units each reads; (None, None)
    when the type returns None for a unit (then it has no unit keys for these settings).

    Raises:
        TaskTypeError: `unit_key` or `unit_inputs` failed, gave a value that is not JSON, named a port the type
            does not read, or an index that is not an integer ≥ 0.
    """
    keys: list[str] = []
    reads: list[dict[str, list[int]]] = []
    declared = type(task_type).unit_inputs is not SplitTaskType.unit_inputs
    for index in range(count):
        try:
            value = task_type.unit_key(settings, index)
            wanted = task_type.unit_inputs(settings, index) if declared else None
        except Exception as exc:
            raise TaskTypeError(
                f"unit_key of task type {name!r} failed for unit {index}: {type(exc).__name__}: {exc}"
            ) from exc
        if value is None:
            return None, None
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TaskTypeError(
                f"unit_key of task type {name!r} gave unit {index} a value that is not JSON ({exc}): return "
                "numbers, strings, lists and dicts"
            ) from None
        keys.append(hashlib.sha256(text.encode()).hexdigest())
        if declared:
            reads.append(_unit_reads(wanted, name, index, inputs))
    return keys, (reads if declared else None)


def _unit_reads(wanted: Any, name: str, index: int, inputs: Sequence[str]) -> dict[str, list[int]]:
    """One unit's `unit_inputs`, checked: known ports, integer indices ≥ 0."""
    if wanted is None:
        wanted = {}
    if not isinstance(wanted, Mapping):
        raise TaskTypeError(f"unit_inputs of task type {name!r} must map input ports to unit indices")
    reads = {}
    for port, indices in wanted.items():
        if port not in inputs:
            raise TaskTypeError(
                f"unit_inputs of task type {name!r} names port {port!r} for unit {index}; its inputs: "
                f"{', '.join(inputs) or 'none'}"
            )
        if isinstance(indices, (str, bytes)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices
        ):
            raise TaskTypeError(
                f"unit_inputs of task type {name!r} gave unit {index} port {port!r} {indices!r}: give unit "
                "indices (integers ≥ 0)"
            )
        reads[str(port)] = sorted(set(indices))
    return reads


def count_units(task_type: SplitTaskType, settings: BaseModel, name: str) -> int:
    """`count_units`, checked to be a positive integer."""
    try:
        count = task_type.count_units(settings)
    except Exception as exc:
        raise TaskTypeError(f"count_units of task type {name!r} failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TaskTypeError(f"count_units of task type {name!r} returned {count!r}; it must be an integer ≥ 1")
    return count
