"""The describer answers the same requests of the same snapshots again from memory, and only what may be kept."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from simrun_runtime.describe import DescribeRequest
from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.local.confinement import PodConfinement

# `cost_value` answers with the describing process's id and how many times that process described the type, so a
# test sees which process answered and whether any did.
MODEL = (
    "import os\nfrom simrun_runtime.tasktype import TaskSettings, UnsplitTaskType\n"
    "calls = 0\n"
    "class Settings(TaskSettings):\n    n: int = 0\n"
    "class Task(UnsplitTaskType):\n    Settings = Settings\n"
    "    def cost_value(self, settings):\n        global calls\n        calls += 1\n"
    "        return f'{os.getpid()}:{calls}'\n"
    "    def run(self, settings, context):\n        return {}\n"
    "class Fresh(Task):\n    cacheable = False\n"
)


def answer(describer: SubprocessDescriber, model: Path, type_name: str, n: int) -> str:
    (response,) = describer.describe(
        sys.executable, model, [DescribeRequest(type=type_name, model_root=str(model), settings={"n": n})]
    )
    assert response.ok, response.error
    assert response.description is not None and response.description.cost_value is not None
    return response.description.cost_value


def test_the_same_requests_again_are_answered_without_the_describer(tmp_path: Path) -> None:
    (tmp_path / "counting.py").write_text(MODEL)
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"))
    try:
        first = answer(describer, tmp_path, "counting:Task", 1)
        pid = int(first.split(":")[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        assert answer(describer, tmp_path, "counting:Task", 1) == first  # the dead describer was not asked
        other = answer(describer, tmp_path, "counting:Task", 2)  # other settings: a new describer is asked
        assert int(other.split(":")[0]) != pid and other.endswith(":1")
        (response,) = describer.describe(
            sys.executable, tmp_path, [DescribeRequest(type="counting:Task", model_root=str(tmp_path), settings={})]
        )
        assert response.description is not None
        response.description.settings = {"changed": True}  # a caller's own copy
        (again,) = describer.describe(
            sys.executable, tmp_path, [DescribeRequest(type="counting:Task", model_root=str(tmp_path), settings={})]
        )
        assert again.description is not None and again.description.settings == {"n": 0}
    finally:
        describer.close()


def test_a_type_that_is_not_cacheable_is_described_every_time(tmp_path: Path) -> None:
    (tmp_path / "counting.py").write_text(MODEL)
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"))
    try:
        answers = [answer(describer, tmp_path, "counting:Fresh", 1) for _ in range(3)]
        assert [a.split(":")[1] for a in answers] == ["1", "2", "3"]
    finally:
        describer.close()


def test_a_type_that_could_not_be_described_is_tried_again(tmp_path: Path) -> None:
    """A failed answer is not kept: the model's next submission is described again (here, once its import no
    longer fails)."""
    marker = tmp_path / "ready"
    (tmp_path / "flaky.py").write_text(
        f"import pathlib\nif not pathlib.Path({str(marker)!r}).exists():\n    raise RuntimeError('not yet')\n" + MODEL
    )
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"))
    request = DescribeRequest(type="flaky:Task", model_root=str(tmp_path), settings={"n": 1})
    try:
        (failed,) = describer.describe(sys.executable, tmp_path, [request])
        assert not failed.ok and failed.error is not None and "not yet" in failed.error
        marker.write_text("")
        (described,) = describer.describe(sys.executable, tmp_path, [request])
        assert described.ok, described.error
    finally:
        describer.close()


def test_only_the_most_recent_answers_are_kept(tmp_path: Path) -> None:
    (tmp_path / "counting.py").write_text(MODEL)
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"), answers_kept=2)
    try:
        one = answer(describer, tmp_path, "counting:Task", 1)
        answer(describer, tmp_path, "counting:Task", 2)
        assert answer(describer, tmp_path, "counting:Task", 1) == one  # kept, and now the most recent
        answer(describer, tmp_path, "counting:Task", 3)  # forgets n=2, the least recently used
        assert answer(describer, tmp_path, "counting:Task", 1) == one
        assert answer(describer, tmp_path, "counting:Task", 2).endswith(":4")  # described again
    finally:
        describer.close()
