"""The working trees of a model's libraries: its `[tool.uv.sources]` path entries that lead out of its tree.

The environment builder locks the model with its libraries, so the client snapshots each of them too, named by
its folder's name (the builder finds a library's snapshot by the last part of its path), following the
libraries' own path sources.
"""

from __future__ import annotations

import os
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
    return found
