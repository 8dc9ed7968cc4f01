"""What the benchmarks say of where their files are: the type of the file system that holds a folder."""

from __future__ import annotations

from pathlib import Path


def file_system(path: Path) -> str:
    """The type of the file system that holds `path`, from /proc/mounts (the longest mount point above it)."""
    path = path.resolve()
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and path.is_relative_to(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind
