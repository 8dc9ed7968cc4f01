"""Task types of an attacker: each tries what its settings say from inside a pod and records what happened."""

ATTACKS = '''
"""An attacker's task types: every attempt is recorded in the summary (what it read, or how it was refused)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from simrun_runtime import ExecContext, MergeContext, SplitTaskType, TaskSettings, UnitContext, UnsplitTaskType


HELD: list[int] = []


def attempt(action: str, path: str) -> str:
    """One attack: what it got, or `refused:<error>`; `TASK_DIR` in a path is the task's own folder."""
    task_dir = os.path.join(os.environ.get("SIMRUN_RUN_DIR", ""), "tasks", os.environ.get("SIMRUN_TASK", ""))
    path = path.replace("TASK_DIR", task_dir)
    try:
        if action == "read":
            return "read:" + Path(path).read_text()[:400]
        if action == "list":
            return "list:" + ",".join(sorted(os.listdir(path)))
        if action == "write":
            with open(path, "a") as f:
                f.write("pwned")
            return "wrote"
        if action == "replace":
            tmp = Path(os.environ["TMPDIR"]) / "forged"
            tmp.write_text('{"forged": true}')
            os.replace(tmp, path)
            return "replaced"
        if action == "chmod":
            os.chmod(path, 0o666)
            return "chmodded"
        if action == "link":
            link = Path(os.environ["TMPDIR"]) / "link"
            os.link(path, link)
            with open(link, "a") as f:
                f.write("pwned")
            return "linked"
        if action == "rename":
            os.rename(path, path + ".moved")
            return "renamed"
        if action == "unlink":
            os.unlink(path)
            return "unlinked"
        if action == "env":
            return "env:" + json.dumps(sorted(os.environ))
        if action == "nice":
            return f"nice:{os.nice(0)}"
        if action == "connect":
            host, port = path.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()
            return "connected"
        if action == "processes":
            # Every process this one sees in /proc, with its command line (None where it cannot be read).
            seen: dict[str, str | None] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        seen[entry] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
                    except OSError:
                        seen[entry] = None
            return "processes:" + json.dumps({"own": os.getpid(), "seen": seen})
        if action == "symlink":
            link, target = path.split("|")
            Path(link).parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(target, link)
            return "planted"
        if action == "fifo":
            # A FIFO held open for writing: whoever reads it waits for as long as this process lives.
            if os.path.lexists(path):
                os.unlink(path)
            os.mkfifo(path)
            HELD.append(os.open(path, os.O_RDWR))
            return "fifo"
        if action == "raise":
            raise RuntimeError(path.replace("ESC", chr(27)).replace("BEL", chr(7)))
        if action == "sleep":
            time.sleep(float(path))
            return "slept"
        if action == "junk":
            # Lines that are not JSON, one line of 4 MiB, and 4 MiB without an end of line.
            with open(path, "w") as f:
                f.write("not json\\n" * 1000 + "[" * (4 << 20) + "\\n" + "{" * (4 << 20))
            return "junk"
        raise ValueError(f"unknown action {action}")
    except OSError as exc:
        return f"refused:{type(exc).__name__}"


class ProbeSettings(TaskSettings):
    attacks: list[list[str]] = []
    units: int = 1


class Probe(UnsplitTaskType):
    """Attacks from an unsplit task's command."""

    Settings = ProbeSettings
    outputs = ("report",)

    def run(self, settings: ProbeSettings, context: ExecContext) -> dict[str, Any]:
        results = [attempt(action, path) for action, path in settings.attacks]
        (context.outputs["report"] / "report.json").write_text(json.dumps(results))
        return {"results": results}


class SplitProbe(SplitTaskType):
    """Attacks from a unit (in the pool) and from the merge (in the coordinator)."""

    Settings = ProbeSettings
    outputs = ("report",)

    def count_units(self, settings: ProbeSettings) -> int:
        return settings.units

    def compute_unit(self, settings: ProbeSettings, index: int, unit: UnitContext) -> None:
        results = [attempt(action, path) for action, path in settings.attacks]
        (unit.result_dir / "r.json").write_text(json.dumps(results))

    def merge(self, settings: ProbeSettings, merge: MergeContext) -> dict[str, Any]:
        units = [json.loads((path / "r.json").read_text()) for _, path in merge.units()]
        merged = [attempt(action, path) for action, path in settings.attacks]
        return {"units": units, "merge": merged}


class CountSettings(TaskSettings):
    units: int = 1


class Huge(SplitTaskType):
    """A split type whose count is whatever it is told (10^16, 2^31)."""

    Settings = CountSettings
    outputs = ("x",)

    def count_units(self, settings: CountSettings) -> int:
        return settings.units

    def compute_unit(self, settings: CountSettings, index: int, unit: UnitContext) -> None:
        (unit.result_dir / "x").write_text("x")

    def merge(self, settings: CountSettings, merge: MergeContext) -> dict[str, Any]:
        return {"units": sum(1 for _ in merge.units())}


class WriteSettings(TaskSettings):
    mib: int = 1
    pause_s: float = 0.0
    """Seconds between two MiB: a task that fills the disk slowly, long before it ends."""


class Writer(UnsplitTaskType):
    """Writes `mib` MiB of output, `pause_s` apart."""

    Settings = WriteSettings
    outputs = ("blob",)

    def run(self, settings: WriteSettings, context: ExecContext) -> dict[str, Any]:
        with open(context.outputs["blob"] / "blob", "wb") as f:
            for _ in range(settings.mib):
                f.write(os.urandom(1 << 20))
                f.flush()
                time.sleep(settings.pause_s)
        return {"mib": settings.mib}


class ShoutSettings(TaskSettings):
    evade: bool = False


class Shouter(UnsplitTaskType):
    """Prints without end; with `evade`, first moves its log aside, so the path no longer names what it fills."""

    Settings = ShoutSettings

    def run(self, settings: ShoutSettings, context: ExecContext) -> dict[str, Any]:
        if settings.evade:
            task_dir = Path(os.environ["SIMRUN_RUN_DIR"]) / "tasks" / os.environ["SIMRUN_TASK"]
            for log in (task_dir / "logs").glob("*.log"):
                os.rename(log, log.with_name(log.name + ".moved"))
        line = "x" * 1023 + "\\n"
        while True:
            os.write(1, line.encode() * 64)
'''

FORGED_REPORTS = '''

class _ForgingSlow(Slow):
    """`Slow` as an attacker's snapshot has it: its first unit forges worker reports of 56 GiB per process, kills
    for memory among them, for incarnations of workers the task never had."""

    def compute_unit(self, settings, index, unit):
        if index == 0:
            import glob, json as _json, os as _os
            workers = _os.path.join(_os.environ["SIMRUN_RUN_DIR"], "tasks", _os.environ["SIMRUN_TASK"], "workers")
            real = _json.loads(open(sorted(glob.glob(workers + "/*.json"))[0]).read())
            for n in range(20):
                forged = dict(real, worker="w0" if n % 2 else f"w{n}", started_ms=real["started_ms"] + n + 1,
                              processes=1, peak_memory_gb=56.0, per_process_gb=56.0, oom_kills=1, ended="running")
                with open(_os.path.join(workers, f"forged-{n}.json"), "w") as f:
                    f.write(_json.dumps(forged))
        return super().compute_unit(settings, index, unit)


Slow = _ForgingSlow
'''
