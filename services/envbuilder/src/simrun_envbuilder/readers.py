"""Which model snapshots each environment was resolved for (`readers/<environment id>.json` of the builder's
folder): what the read policy decides an environment's visibility by.

An environment is keyed by its lock's third-party packages, so the models of several identities may share one; a
caller may see it when it may read one of the snapshots it was resolved for (`simrun_core.access.may_read_any`
over the snapshot service's readers of each).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from simrun_runtime.files import write_json_atomic
from simrun_runtime.record import SnapshotRef

MODELS_PER_ENVIRONMENT = 1000
"""Most model snapshots kept per environment (the newest): a bound on the file whatever the number of commits."""


class EnvironmentReaders:
    """The model snapshots (name, snapshot id) resolved to each environment, kept in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._noted: set[tuple[str, str, str]] = set()

    def note(self, environment_id: str, model: SnapshotRef) -> None:
        """Records that `model` resolved to the environment (once per process and snapshot: a file read then)."""
        seen = (environment_id, model.name, model.snapshot_id)
        if seen in self._noted:
            return
        with self._lock:
            models = self.models(environment_id)
            entry = (model.name, model.snapshot_id)
            if entry not in models:
                models = [*models, entry][-MODELS_PER_ENVIRONMENT:]
                write_json_atomic(self._path(environment_id), [list(m) for m in models], durable=False)
            self._noted.add(seen)

    def models(self, environment_id: str) -> list[tuple[str, str]]:
        """The model snapshots the environment was resolved for, oldest first; none for one resolved before
        environments recorded them (only the owner and services see it, until a submission resolves it again)."""
        try:
            data = json.loads(self._path(environment_id).read_text())
        except (FileNotFoundError, ValueError):
            return []
        return [(str(m[0]), str(m[1])) for m in data if isinstance(m, list) and len(m) == 2]

    def _path(self, environment_id: str) -> Path:
        return self.folder / f"{environment_id}.json"
