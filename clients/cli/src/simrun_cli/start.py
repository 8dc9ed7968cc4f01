"""The `simrun` command's entry point: the command group, imported with the garbage collector paused."""

from __future__ import annotations

import gc


def main() -> None:
    """Runs `simrun`. The modules a command starts with (click, the command group) are imported without garbage
    collection and then frozen (`gc.freeze`): they live as long as the process, so collecting among them only
    spends time, a twentieth of the start of `simrun status`. The command itself runs with the collector on."""
    gc.disable()
    try:
        from simrun_cli.main import cli
    finally:
        gc.freeze()
        gc.enable()
    cli()
