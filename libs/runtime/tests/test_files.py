"""Tests of the store's writes: a failed write leaves nothing of its own, a new file is never written through a link."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from simrun_runtime.files import write_bytes_atomic, write_bytes_new


def write_beyond_file_size_limit(call: str, folder: Path) -> str:
    """Runs `call` in a process whose files may not grow past 100 bytes (the kernel refuses the write: EFBIG, a real
    failed write, as a full disk gives one); returns what it printed."""
    script = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from simrun_runtime.files import write_bytes_atomic, write_bytes_new
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
        folder = Path({str(folder)!r})
        try:
            {call}
        except OSError as exc:
            print(exc.strerror)
        """
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_bytes_atomic(target, b"the old record\n")
    printed = write_beyond_file_size_limit("write_bytes_atomic(folder / 'run.json', b'x' * 1000)", tmp_path)
    assert printed.strip() == "File too large"
    assert target.read_bytes() == b"the old record\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_failed_new_file_is_removed(tmp_path: Path) -> None:
    printed = write_beyond_file_size_limit("write_bytes_new(folder / 'settings.json', b'x' * 1000)", tmp_path)
    assert printed.strip() == "File too large"
    assert list(tmp_path.iterdir()) == []


def test_a_new_file_refuses_a_name_that_exists_and_never_writes_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the owner's")
    planted = tmp_path / "settings.json"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_bytes_new(planted, b"{}\n")
    assert victim.read_text() == "the owner's" and planted.is_symlink()
    fresh = tmp_path / "provenance.json"
    write_bytes_new(fresh, b"x" * 70_000)
    assert fresh.read_bytes() == b"x" * 70_000
