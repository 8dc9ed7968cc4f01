"""Where an agent may read: workflow files and the working trees that hold them must lie under the bridge's roots."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from simrun_core.errors import InvalidArgument, PermissionDenied

ROOTS_VARIABLE = "SIMRUN_MCP_ROOTS"


class Roots:
    """The folders the bridge was started with; paths are resolved (symlinks followed) before they are checked.

    Args:
        roots: the folders; each is resolved once, now. A relative workflow path is taken from the first.
    """

    def __init__(self, roots: Iterable[str | Path]) -> None:
        resolved = []
        for root in roots:
            path = Path(root).expanduser().resolve()
            if not path.is_dir():
                raise InvalidArgument(f"root {root} is not a folder: give the folders agents may submit from")
            resolved.append(path)
        if not resolved:
            raise InvalidArgument("no root: give at least one folder agents may submit from")
        self.paths: tuple[Path, ...] = tuple(resolved)

    @classmethod
    def from_environment(cls, given: list[str] | None = None) -> Roots:
        """The roots given, else `$SIMRUN_MCP_ROOTS` (separated by the path separator), else the working directory."""
        if given:
            return cls(given)
        if env := os.environ.get(ROOTS_VARIABLE):
            return cls(p for p in env.split(os.pathsep) if p)
        return cls([Path.cwd()])

    def contains(self, path: Path) -> bool:
        """Whether a resolved path is one of the roots or lies under one."""
        return any(path == root or path.is_relative_to(root) for root in self.paths)

    def workflow(self, workflow_path: str) -> Path:
        """The workflow file, resolved, if it lies under a root.

        Raises:
            PermissionDenied: it lies outside every root (after `..` and symlinks are resolved).
            InvalidArgument: it does not exist or is not a file.
        """
        if "\0" in workflow_path:
            raise InvalidArgument("a workflow path cannot hold a NUL character: give the path of a workflow YAML file")
        given = Path(workflow_path).expanduser()
        candidate = given if given.is_absolute() else self.paths[0] / given
        try:
            resolved = candidate.resolve(strict=True)
        except FileNotFoundError:
            # Say nothing about what exists outside the roots.
            if not self.contains(candidate.resolve()):
                raise self._refused(workflow_path) from None
            raise InvalidArgument(
                f"no workflow file {workflow_path!r}: give the path of a workflow YAML under {self._listed()} "
                "(relative paths start at the first)"
            ) from None
        except (OSError, RuntimeError):
            raise self._refused(workflow_path) from None
        if not self.contains(resolved):
            raise self._refused(workflow_path)
        if not resolved.is_file():
            raise InvalidArgument(f"{workflow_path!r} is not a file: give the path of a workflow YAML file")
        return resolved

    def check_tree(self, tree: Path) -> Path:
        """The working tree a snapshot would read, if it lies under a root.

        Raises:
            PermissionDenied: the git working tree holding the workflow reaches above every root.
        """
        resolved = tree.resolve()
        if not self.contains(resolved):
            raise PermissionDenied(
                f"the workflow's git working tree {resolved} reaches outside the folders this bridge may read "
                f"({self._listed()}); its snapshot would read files there. Put the workflow in a working tree under "
                "them, or ask for the bridge to be started with that tree as a root"
            )
        return resolved

    def _refused(self, workflow_path: str) -> PermissionDenied:
        return PermissionDenied(
            f"{workflow_path!r} is outside the folders this bridge may read ({self._listed()}): give a workflow "
            "file under them"
        )

    def _listed(self) -> str:
        return ", ".join(str(p) for p in self.paths)
