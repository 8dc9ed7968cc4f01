"""The resource learner's domain facade: record observations, resolve requests, estimate split tasks."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from types import TracebackType

from simrun_core.errors import InvalidArgument
from simrun_core.paging import decode_key_token, encode_key_token
from simrun_core.paging import page_size as page_size_of
from simrun_core.resources import ResolvedResources

from simrun_learner import rules
from simrun_learner.rules import Estimate, Observation, ObservationKey
from simrun_learner.store import ObservationStore

DEFAULT_PAGE_SIZE = 100


class ResourceLearner:
    """Learns memory and unit seconds per key from the observations in one SQLite file.

    The run tracker calls it in-process; the gRPC servicer is a thin layer over the same methods.
    """

    def __init__(self, db_path: Path | str) -> None:
        self._store = ObservationStore(db_path)

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        """The request of a key from its observations and its type's hint; `rule` and `reason` say why."""
        key.check()
        return rules.resolve(self._store.rule_inputs(key), hint)

    def record(self, observation: Observation) -> Observation:
        """Records one observation; returns it with its id and time. `InvalidArgument` for a bad one."""
        observation.check()
        return self._store.add(observation)

    def record_all(self, observations: Iterable[Observation]) -> list[Observation]:
        """Records several observations (e.g. those of a finished task's reports), checking all first."""
        observations = list(observations)
        for observation in observations:
            observation.check()
        return [self._store.add(o) for o in observations]

    def observations(self, key: ObservationKey) -> list[Observation]:
        """Every observation of a key, oldest first."""
        key.check()
        return self._store.of_key(key)

    def list_observations(
        self, key: ObservationKey, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[Observation], str]:
        """One page of a key's observations, oldest first, and the token of the next page (empty at the end)."""
        key.check()
        scope = json.dumps([key.task_type, key.model, key.cost_value])
        after = decode_key_token(page_token, scope)
        place = None
        if after is not None:
            try:
                at, row_id = after
                place = (datetime.fromisoformat(at), int(row_id))
            except ValueError:
                raise InvalidArgument("bad page_token: pass the next_page_token of the previous page") from None
        observations, more = self._store.page_of_key(key, page_size_of(page_size, DEFAULT_PAGE_SIZE), place)
        if not more or not observations:
            return observations, ""
        last = observations[-1]
        assert last.observed_at is not None and last.observation_id is not None  # stored ones have both
        return observations, encode_key_token([last.observed_at.isoformat(), last.observation_id], scope)

    def forget(self, key: ObservationKey) -> int:
        """Forgets every observation of a key (e.g. poisoned ones), so it resolves from the hint again."""
        key.check()
        return self._store.delete_key(key)

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> Estimate:
        """The median seconds of a unit times the rounds of the units over the processes of the pods.

        Raises:
            FailedPrecondition: no unit seconds are learned for the key.
        """
        key.check()
        return rules.estimate(self._store.rule_inputs(key), units, pods, processes)

    def close(self) -> None:
        """Closes the database."""
        self._store.close()

    def __enter__(self) -> ResourceLearner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
