"""The learner port served by the resource learner in this process."""

from __future__ import annotations

from simrun_core.errors import FailedPrecondition
from simrun_core.resources import ResolvedResources
from simrun_learner.learner import ResourceLearner
from simrun_learner.reports import observations_from_reports
from simrun_learner.rules import ObservationKey
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import RunRecord


class InProcessLearner:
    """Calls the learner's domain directly: the embedded server's learner port."""

    def __init__(self, learner: ResourceLearner, store: StoreLayout) -> None:
        self._learner = learner
        self._store = store

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        return self._learner.resolve(key, hint)

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        task = record.tasks[task_id]
        if not record.snapshots:
            return 0
        key = ObservationKey(task.type, record.snapshots[0].name, task.cost_value or "")
        shape = (task.plan or {}).get("shape", {})
        observations = observations_from_reports(
            self._store.run(record.run_id).task(task_id),
            key,
            succeeded,
            record.run_id,
            memory_gb=shape.get("memory_gb"),
            retry_memory_gb=shape.get("retry_memory_gb"),
        )
        return len(self._learner.record_all(observations))

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        try:
            return self._learner.estimate(key, units, pods, processes).seconds
        except FailedPrecondition:
            return None
