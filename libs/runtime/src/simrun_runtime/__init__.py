"""What runs inside a simrun pod and what a model imports."""

from simrun_runtime.loading import ENTRY_POINT_GROUP, TypeDescription, describe_type, load_task_type
from simrun_runtime.tasktype import (
    ExecContext,
    MergeContext,
    ResourceHint,
    SettingsError,
    SplitTaskType,
    TaskSettings,
    TaskType,
    TaskTypeError,
    UnitContext,
    UnsplitTaskType,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExecContext",
    "MergeContext",
    "ResourceHint",
    "SettingsError",
    "SplitTaskType",
    "TaskSettings",
    "TaskType",
    "TaskTypeError",
    "TypeDescription",
    "UnitContext",
    "UnsplitTaskType",
    "describe_type",
    "load_task_type",
]
