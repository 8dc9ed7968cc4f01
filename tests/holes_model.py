"""Task types the tests of the last holes add to the end-to-end model (`e2etasks/holes.py` of a test's copy)."""

HOLES = '''
"""Task types that print a given line, or stay quiet for a while."""

from __future__ import annotations

import time
from typing import Any

from simrun_runtime import ExecContext, TaskSettings, UnsplitTaskType


class PrintSettings(TaskSettings):
    line: str = ""
    repeat: int = 1
    quiet_s: float = 0.0


class Printer(UnsplitTaskType):
    """Prints `line` `repeat` times, then stays quiet for `quiet_s` seconds."""

    Settings = PrintSettings

    def run(self, settings: PrintSettings, context: ExecContext) -> dict[str, Any]:
        for _ in range(settings.repeat):
            print(settings.line, flush=True)
        time.sleep(settings.quiet_s)
        return {"printed": settings.repeat}
'''
