"""The working trees of a model's libraries: its `[tool.uv.sources]` path entries that lead out of its tree.

The environment builder locks the model with its libraries, so the client snapshots each of them too, named by
its folder's name (the builder finds a library's snapshot by the last part of its path), following the
libraries' own path sources.
"""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from pathlib import Path

from simrun_core.errors import InvalidArgument
from simrun_core.snapshots.model import sanitize_name


def library_trees(model_root: Path) -> list[Path]:
    """The folders of the model's libraries, each once, in the order found; empty without pyproject.toml.

    Raises:
        InvalidArgument: a bad pyproject.toml, a path source that does not exist, two libraries whose folders
            have the same name.
    """
    model_root = Path(model_root).resolve()
    found: list[Path] = []
    names: dict[str, Path] = {}
    queue = [model_root]
    seen = {model_root}
    while queue:
        tree = queue.pop(0)
        for entry, folder in _path_sources(tree):
            if folder == tree or tree in folder.parents or folder in seen:
                continue  # inside a tree already snapshotted
            if any(root in folder.parents for root in seen):
                continue
            if not folder.is_dir():
                if folder.exists():
                    continue  # a wheel or an archive: not a tree to snapshot
                raise InvalidArgument(
                    f"{tree / 'pyproject.toml'}: [tool.uv.sources] {entry} names {folder}, which does not exist"
                )
            name = sanitize_name(folder.name)
            if name in names and names[name] != folder:
                raise InvalidArgument(
                    f"two libraries of the model are folders named {name!r} ({names[name]} and {folder}): rename one"
                )
            names[name] = folder
            seen.add(folder)
            found.append(folder)
            queue.append(folder)
    return found


def _path_sources(tree: Path) -> list[tuple[str, Path]]:
    try:
        data = tomllib.loads((tree / "pyproject.toml").read_text())
    except FileNotFoundError:
        return []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{tree / 'pyproject.toml'} is not valid TOML: {exc}") from None
    sources = data.get("tool", {}).get("uv", {}).get("sources", {})
    found = []
    for entry, value in sources.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and "path" in item:
                found.append((entry, Path(os.path.normpath(tree / str(item["path"])))))
            elif isinstance(item, dict) and item.get("workspace") is True:
                found.append((entry, workspace_member(tree, entry)))
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def workspace_member(tree: Path, name: str) -> Path:
    """The folder of the uv workspace member `name` that `tree` (a member itself) depends on with
    `{ workspace = true }`: found in the `[tool.uv.workspace] members` of the nearest workspace root above it.

    Raises:
        InvalidArgument: no workspace root above `tree`, or no member of that name.
    """
    for root in [tree, *tree.parents]:
        try:
            data = tomllib.loads((root / "pyproject.toml").read_text())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"{root / 'pyproject.toml'} is not valid TOML: {exc}") from None
        workspace = data.get("tool", {}).get("uv", {}).get("workspace")
        if not isinstance(workspace, dict):
            continue
        excluded = {p.resolve() for pattern in workspace.get("exclude", []) for p in root.glob(pattern)}
        for pattern in workspace.get("members", []):
            for member in sorted(root.glob(pattern)):
                if member.resolve() in excluded or not (member / "pyproject.toml").is_file():
                    continue
                with contextlib.suppress(tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
                    project = tomllib.loads((member / "pyproject.toml").read_text()).get("project", {})
                    if _normalized(str(project.get("name", ""))) == _normalized(name):
                        return member.resolve()
        raise InvalidArgument(
            f"{tree / 'pyproject.toml'}: [tool.uv.sources] {name} = {{ workspace = true }}, and the workspace at "
            f"{root} has no member named {name!r}: add its folder to [tool.uv.workspace] members"
        )
    raise InvalidArgument(
        f"{tree / 'pyproject.toml'}: [tool.uv.sources] {name} = {{ workspace = true }}, and no folder above it "
        "holds a pyproject.toml with [tool.uv.workspace]"
    )
