"""What an environment is locked from: the model's and its libraries' pyproject.toml, read from their snapshots.

A library is a `[tool.uv.sources]` path entry that leads out of the model's tree (`lib = {path = "../lib"}`); the
client snapshots its working tree too, under the library folder's name. Each snapshot gets its place relative to
the model, so the lock project can lay them out as a tree of symlinks with the checkouts' relative paths: uv then
honours the model's own relative sources, and the lock holds no snapshot id.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from simrun_core.errors import InvalidArgument, NotFound
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef
from simrun_runtime.sources import is_package

_DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?")
_FOLDER_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Source:
    """A snapshot of the run placed relative to the model.

    Attributes:
        ref: the snapshot as the run records it.
        root: its folder in the store, absolute.
        place: its place relative to the model's folder (`.` for the model, `../lib` for a library beside it).
        pyproject: the bytes of its `pyproject.toml`; None without one.
    """

    ref: SnapshotRef
    root: Path
    place: PurePosixPath
    pyproject: bytes | None
    member: bool = False
    """A uv workspace member another source depends on with `{ workspace = true }` (the model is one too then)."""

    @property
    def project(self) -> dict[str, Any]:
        return _parse(self.pyproject, self.ref.name) if self.pyproject is not None else {}

    @property
    def project_name(self) -> str | None:
        name = self.project.get("project", {}).get("name")
        return str(name) if name else None

    @property
    def is_package(self) -> bool:
        """Whether the source is built and installed editable (uv's rule, `simrun_runtime.sources`); one that is
        not is imported from its root."""
        return self.project_name is not None and is_package(self.project)

    @property
    def folder(self) -> str:
        """Where the source is, in the words a submitter knows: its snapshot's name and its place."""
        return f"snapshot {self.ref.name} (folder {self.place.as_posix()})"


@dataclass(frozen=True)
class ModelInputs:
    """Everything of a run's snapshots an environment depends on.

    Attributes:
        sources: the model first, then its libraries in the order they were found.
        project_name: the model's `[project] name`.
        requires_python: the model's `requires-python` (empty: any).
        system_packages: Debian packages of the model's `[tool.simrun] system-packages`.
        build_requires: the `[build-system] requires` of every source that is a package, in first-seen order.
        model_lock: the model's own `uv.lock`, the lock's seed; None without one.
        per_snapshot: a snapshot's content decides its dependencies (dynamic metadata), so the digest holds its id.
    """

    sources: list[Source]
    project_name: str
    requires_python: str
    system_packages: list[str]
    build_requires: list[str]
    model_lock: bytes | None
    per_snapshot: list[str] = field(default_factory=list)

    @property
    def model(self) -> Source:
        return self.sources[0]

    def digest(self, *extra: str) -> str:
        """SHA-256 over the places and pyproject bytes of every source, the model's uv.lock and `extra`.

        A change of code (any other file) leaves it unchanged, so the lock is found again without uv.
        """
        body = {
            "version": 1,
            "sources": [
                [s.place.as_posix(), s.ref.name, hashlib.sha256(s.pyproject or b"").hexdigest()] for s in self.sources
            ],
            "model_lock": hashlib.sha256(self.model_lock).hexdigest() if self.model_lock is not None else "",
            "per_snapshot": self.per_snapshot,
            "extra": list(extra),
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_inputs(store: StoreLayout, snapshots: list[SnapshotRef]) -> ModelInputs | None:
    """The inputs of a run's snapshots; None for a model without `pyproject.toml` (or without a `[project]`).

    Raises:
        InvalidArgument: no snapshot, a bad pyproject.toml, a path source out of the model with no snapshot of it,
            an absolute path source, two sources in one place, a bad Debian package name.
        NotFound: a snapshot not in the store.
    """
    if not snapshots:
        raise InvalidArgument("an environment needs the snapshot of its model: snapshot the working tree first")
    roots = []
    for ref in snapshots:
        root = ref.resolve(store)
        if not root.is_dir():
            raise NotFound(ref.not_in_store("environment builder"))
        roots.append(root)
    model = Source(snapshots[0], roots[0], PurePosixPath("."), _read(roots[0] / "pyproject.toml"))
    if model.pyproject is None or "project" not in model.project:
        return None
    if not model.project_name:
        raise InvalidArgument(f"{model.ref.name}/pyproject.toml: [project] has no name")
    by_name = {ref.name: (ref, root) for ref, root in zip(snapshots[1:], roots[1:], strict=True)}
    sources = [model]
    places = {PurePosixPath("."): model.ref.name}
    members: set[str] = set()
    queue = [model]
    while queue:
        source = queue.pop(0)
        for entry in _workspace_sources(source):
            member = _member(entry, source, by_name, sources)
            members |= {source.ref.name, member.ref.name}
            if member not in sources:
                sources.append(member)
                places[member.place] = member.ref.name
                queue.append(member)
        for entry, path in _path_sources(source):
            place = _normalize(source.place / path)
            if not _leaves(place, source.place):
                continue  # inside this snapshot already: uv finds it in the tree
            folder = _FOLDER_NAME.sub("-", place.name).lstrip("._-")[:128] or "tree"
            found = by_name.get(folder)
            if found is None:
                raise InvalidArgument(
                    f"{source.ref.name}/pyproject.toml: [tool.uv.sources] {entry} = {{path = {path.as_posix()!r}}} "
                    f"leads out of its tree, and the run has no snapshot {folder!r} of it: submit with the simrun "
                    "client, which snapshots the working trees of path sources"
                )
            if place in places:
                if places[place] != folder:
                    raise InvalidArgument(f"two snapshots at {place}: {places[place]} and {folder}")
                continue
            if any(s.ref.name == folder for s in sources):
                raise InvalidArgument(
                    f"two path sources lead to folders named {folder!r} ({place} and another): rename one"
                )
            ref, root = found
            library = Source(ref, root, place, _read(root / "pyproject.toml"))
            places[place] = folder
            sources.append(library)
            queue.append(library)
    sources = [replace(s, member=s.ref.name in members) for s in sources]
    project = model.project
    simrun = project.get("tool", {}).get("simrun", {})
    system_packages = simrun.get("system-packages", simrun.get("system_packages", []))
    if not isinstance(system_packages, list) or not all(isinstance(p, str) for p in system_packages):
        raise InvalidArgument(f"{model.ref.name}/pyproject.toml: [tool.simrun] system-packages must be a list of names")
    for name in system_packages:
        if not _DEBIAN_PACKAGE.fullmatch(name):
            raise InvalidArgument(f"[tool.simrun] system-packages: {name!r} is not a Debian package name")
    build_requires: list[str] = []
    per_snapshot: list[str] = []
    for source in sources:
        data = source.project
        check_requirements(source)
        # Only a package is built; one without [build-system] (`[tool.uv] package = true`) by setuptools' legacy
        # backend, as uv builds it (PEP 517's default).
        default = {"requires": ["setuptools>=40.8.0"]}
        for requirement in data.get("build-system", default).get("requires", []) if source.is_package else []:
            if requirement not in build_requires:
                build_requires.append(str(requirement))
        dynamic = set(data.get("project", {}).get("dynamic", []))
        if dynamic & {"dependencies", "optional-dependencies"}:
            per_snapshot.append(f"{source.ref.name}/{source.ref.snapshot_id}")
    return ModelInputs(
        sources=sources,
        project_name=str(model.project_name),
        requires_python=str(project["project"].get("requires-python", "")),
        system_packages=sorted(set(system_packages)),
        build_requires=build_requires,
        model_lock=_read(roots[0] / "uv.lock"),
        per_snapshot=per_snapshot,
    )


def _workspace_sources(source: Source) -> list[str]:
    """The names a source depends on as uv workspace members (`name = { workspace = true }`)."""
    sources = source.project.get("tool", {}).get("uv", {}).get("sources", {})
    return [
        entry
        for entry, value in sources.items()
        for item in (value if isinstance(value, list) else [value])
        if isinstance(item, dict) and item.get("workspace") is True
    ]


def _member(name: str, source: Source, by_name: dict[str, tuple[SnapshotRef, Path]], sources: list[Source]) -> Source:
    """The workspace member `name`: a source already, or the run's snapshot of a project of that name (the client
    snapshots each member it uses, by its folder's name), placed beside the model.

    Raises:
        InvalidArgument: the run has no snapshot of a project of that name.
    """
    wanted = _NORMALIZE.sub("-", name).lower()
    for known in sources:
        if known.project_name and _NORMALIZE.sub("-", known.project_name).lower() == wanted:
            return known
    for ref, root in by_name.values():
        candidate = Source(ref, root, PurePosixPath("..", ref.name), _read(root / "pyproject.toml"))
        if candidate.project_name and _NORMALIZE.sub("-", candidate.project_name).lower() == wanted:
            return candidate
    raise InvalidArgument(
        f"{source.ref.name}/pyproject.toml: [tool.uv.sources] {name} = {{ workspace = true }}, and the run has no "
        "snapshot of that workspace member: submit with the simrun client, which snapshots the members it uses"
    )


_NORMALIZE = re.compile(r"[-_.]+")


def check_requirements(source: Source) -> None:
    """Refuses a `[project]` whose dependencies are not a list of PEP 508 requirements, naming the first bad one,
    before uv builds the project's metadata (where the build backend's traceback would hide the reason).

    Raises:
        InvalidArgument: dependencies or optional-dependencies of the wrong type, or a requirement that does not parse.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    project = source.project.get("project", {})
    prefix = f"the model's dependencies cannot be locked: {source.ref.name}/pyproject.toml"
    groups: list[tuple[str, Any]] = [("dependencies", project.get("dependencies", []))]
    optional = project.get("optional-dependencies", {})
    if not isinstance(optional, dict):
        raise InvalidArgument(f"{prefix}: [project] optional-dependencies must be a table of lists of requirements")
    groups += [(f"optional-dependencies.{name}", value) for name, value in optional.items()]
    for field_name, requirements in groups:
        if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
            raise InvalidArgument(
                f'{prefix}: [project] {field_name} must be a list of requirements, e.g. ["numpy>=2", "scipy"]'
            )
        for requirement in requirements:
            try:
                Requirement(requirement)
            except InvalidRequirement as exc:
                reason = str(exc).splitlines()[0]
                raise InvalidArgument(
                    f"{prefix}: [project] {field_name}: {requirement!r} is not a requirement ({reason})"
                ) from None


def tree_places(inputs: ModelInputs) -> dict[PurePosixPath, Source]:
    """Each source's folder inside a lock project's `tree/`: the model deep enough that every `..` stays inside."""
    depth = max((_ups(s.place) for s in inputs.sources), default=0)
    model = PurePosixPath("tree", *(["_"] * max(depth, 1)))
    return {_normalize(model / s.place): s for s in inputs.sources}


def _path_sources(source: Source) -> list[tuple[str, PurePosixPath]]:
    sources = source.project.get("tool", {}).get("uv", {}).get("sources", {})
    found = []
    for entry, value in sources.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and "path" in item:
                path = PurePosixPath(str(item["path"]))
                if path.is_absolute():
                    raise InvalidArgument(
                        f"{source.ref.name}/pyproject.toml: [tool.uv.sources] {entry} has the absolute path {path}: "
                        "make it relative to the project so simrun can snapshot it"
                    )
                found.append((entry, path))
    return found


def _normalize(path: PurePosixPath) -> PurePosixPath:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            else:
                parts.append("..")
        elif part != ".":
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _leaves(place: PurePosixPath, base: PurePosixPath) -> bool:
    """Whether `place` is outside the folder `base` (both relative to the model)."""
    if base == PurePosixPath("."):
        return bool(place.parts) and place.parts[0] == ".."
    return place != base and base not in place.parents


def _ups(place: PurePosixPath) -> int:
    return sum(1 for part in place.parts if part == "..")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _parse(data: bytes, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{name}/pyproject.toml is not valid TOML: {exc}") from None
