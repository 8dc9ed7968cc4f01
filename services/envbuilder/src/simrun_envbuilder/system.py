"""The Debian packages of a model's `[tool.simrun] system-packages`, checked before any build."""

from __future__ import annotations

import shutil
import subprocess

from simrun_core.errors import InvalidArgument


def check_packages(names: list[str], *, installed_here: bool) -> None:
    """Refuses a package apt does not know; with `installed_here` (a venv on this machine), also one that is
    not installed, since a venv cannot install it.

    Raises:
        InvalidArgument: naming the unknown or missing packages and what to do.
    """
    if not names:
        return
    if shutil.which("apt-cache") is None:
        raise InvalidArgument(
            f"the model asks for the Debian packages {', '.join(names)}, and this server has no apt-cache to check "
            "them: build its environment where Debian's apt is installed"
        )
    unknown = [n for n in names if not _known(n)]
    if unknown:
        raise InvalidArgument(
            f"[tool.simrun] system-packages: {', '.join(unknown)} is not a Debian package (apt-cache knows no such "
            "name): fix the name in the model's pyproject.toml"
        )
    if installed_here:
        missing = [n for n in names if not _installed(n)]
        if missing:
            raise InvalidArgument(
                f"[tool.simrun] system-packages: {', '.join(missing)} is not installed on this machine, and a local "
                f"environment cannot install it: `apt-get install {' '.join(missing)}` on the server"
            )


def _known(name: str) -> bool:
    result = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", name], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode == 0 and "Package:" in result.stdout


def _installed(name: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Status}", name], capture_output=True, text=True, timeout=30, check=False
    )
    return result.returncode == 0 and "install ok installed" in result.stdout
