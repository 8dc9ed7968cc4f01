"""The describer's time limit: a model whose import hangs is one clear error, soon, and not tried again."""

from __future__ import annotations

import itertools
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition
from simrun_runtime.confine import landlock_abi
from simrun_runtime.describe import DescribeRequest, DescribeResponse
from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.local.confinement import PodConfinement


def test_a_model_whose_import_hangs_fails_once_within_the_limit(tmp_path: Path) -> None:
    started = tmp_path / "started"
    (tmp_path / "hangs.py").write_text(
        f"import pathlib, time\nwith pathlib.Path({str(started)!r}).open('a') as f:\n"
        "    f.write('x')\ntime.sleep(600)\n"
    )
    # The model marks its start beside itself, which a confined describer could not: this tests the time limit.
    describer = SubprocessDescriber(timeout_s=2, confinement=PodConfinement("off"))
    try:
        begun = time.monotonic()
        with pytest.raises(FailedPrecondition, match="no answer within 2 s: does importing the model hang"):
            describer.describe(sys.executable, tmp_path, [DescribeRequest(type="hangs:Task")])
        assert time.monotonic() - begun < 20
        time.sleep(0.5)
        assert started.read_text() == "x", "the describer started the hanging model a second time"
    finally:
        describer.close()


def test_concurrent_submissions_of_a_model_get_a_second_describer_and_one_at_a_time_reuse_the_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "slowtype.py").write_text(
        "import os, time\nfrom simrun_runtime.tasktype import TaskSettings, UnsplitTaskType\n"
        "class Settings(TaskSettings):\n    seconds: float = 0.0\n    tag: int = 0\n"
        "class Task(UnsplitTaskType):\n    Settings = Settings\n"
        "    def cost_value(self, settings):\n        time.sleep(settings.seconds)\n        return str(os.getpid())\n"
        "    def run(self, settings, context):\n        return {}\n"
    )
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"))
    tags = itertools.count()

    def pid_of(seconds: float) -> int:
        # Each submission's settings differ (`tag`): the same requests again would be answered from memory.
        request = DescribeRequest(type="slowtype:Task", settings={"seconds": seconds, "tag": next(tags)})
        (response,) = describer.describe(sys.executable, tmp_path, [request])
        assert response.ok, response.error
        assert response.description is not None
        return int(response.description.cost_value or 0)

    try:
        one_at_a_time = {pid_of(0) for _ in range(3)}
        assert len(one_at_a_time) == 1
        with ThreadPoolExecutor(max_workers=4) as pool:
            at_once = set(pool.map(pid_of, [1.0] * 4))
        assert len(at_once) == 2 and one_at_a_time < at_once  # two describers at most, the first one among them
    finally:
        describer.close()


def test_a_burst_of_submissions_waits_for_the_warm_describer_not_for_a_second_ones_imports(tmp_path: Path) -> None:
    """The second describer of a model warms in the background: while it imports, the burst that asked for it is
    answered by the first one, which is free again within milliseconds."""
    (tmp_path / "slowimport.py").write_text(
        "import os, time\nfrom simrun_runtime.tasktype import TaskSettings, UnsplitTaskType\ntime.sleep(3)\n"
        "class Settings(TaskSettings):\n    seconds: float = 0.0\n    tag: int = 0\n"
        "class Task(UnsplitTaskType):\n    Settings = Settings\n"
        "    def cost_value(self, settings):\n        time.sleep(settings.seconds)\n        return str(os.getpid())\n"
        "    def run(self, settings, context):\n        return {}\n"
    )
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("off"))

    tags = itertools.count()

    def timed_pid(seconds: float) -> tuple[float, int]:
        # Each submission's settings differ (`tag`): the same requests again would be answered from memory.
        begun = time.monotonic()
        request = DescribeRequest(type="slowimport:Task", settings={"seconds": seconds, "tag": next(tags)})
        (response,) = describer.describe(sys.executable, tmp_path, [request])
        assert response.ok, response.error
        assert response.description is not None
        return time.monotonic() - begun, int(response.description.cost_value or 0)

    try:
        first_seconds, first = timed_pid(0)
        assert first_seconds >= 3  # the model's first describer: its caller waits for the imports
        with ThreadPoolExecutor(max_workers=4) as pool:
            burst = list(pool.map(timed_pid, [0.0] * 4))
        assert {pid for _, pid in burst} == {first}
        assert max(seconds for seconds, _ in burst) < 2, burst  # none waited for the second one's 3 s import
        time.sleep(4)  # the second describer has imported the model meanwhile
        with ThreadPoolExecutor(max_workers=4) as pool:
            slow = list(pool.map(timed_pid, [0.5] * 4))
        assert len({pid for _, pid in slow}) == 2 and first in {pid for _, pid in slow}
        assert max(seconds for seconds, _ in slow) < 2.5, slow
    finally:
        describer.close()


def test_concurrent_submissions_of_a_model_whose_import_hangs_each_fail_within_the_limit(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(600)\n")
    describer = SubprocessDescriber(timeout_s=2, confinement=PodConfinement("off"))

    def fails_in() -> float:
        begun = time.monotonic()
        with pytest.raises(FailedPrecondition, match="no answer within 2 s: does importing the model hang"):
            describer.describe(sys.executable, tmp_path, [DescribeRequest(type="hangs:Task")])
        return time.monotonic() - begun

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            waits = [pool.submit(fails_in) for _ in range(3)]
            assert all(wait.result(timeout=30) < 15 for wait in waits)
    finally:
        describer.close()


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_confined_describer_reads_the_library_snapshots_it_is_given_and_no_other(tmp_path: Path) -> None:
    """A model importing a library whose editable install is a finder (setuptools), not a `sys.path` line: the
    import reads the library's snapshot, which the describer must allow as the run's pods do."""
    model, library, other = tmp_path / "model", tmp_path / "lib", tmp_path / "other"
    for folder in (model, library, other):
        folder.mkdir()
    (library / "data.txt").write_text("from the library")
    (other / "data.txt").write_text("from elsewhere")
    (model / "uselib.py").write_text(
        "import sys\nfrom pathlib import Path\nfrom simrun_runtime.tasktype import TaskSettings, UnsplitTaskType\n"
        "class Settings(TaskSettings):\n    folder: str = ''\n"
        "class Task(UnsplitTaskType):\n    Settings = Settings\n"
        "    def cost_value(self, settings):\n        return (Path(settings.folder) / 'data.txt').read_text()\n"
        "    def run(self, settings, context):\n        return {}\n"
    )
    describer = SubprocessDescriber(timeout_s=30, confinement=PodConfinement("landlock"))

    def read(folder: Path) -> DescribeResponse:
        request = DescribeRequest(type="uselib:Task", settings={"folder": str(folder)})
        (response,) = describer.describe(sys.executable, model, [request], (library,))
        return response

    try:
        found = read(library)
        assert found.ok, found.error
        assert found.description is not None and found.description.cost_value == "from the library"
        refused = read(other)
        assert not refused.ok and "Permission denied" in (refused.error or "")
    finally:
        describer.close()
