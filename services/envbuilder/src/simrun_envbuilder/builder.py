"""The environment builder: resolves a run's snapshots to an environment, locking once per inputs, building once
per lock, and the per-run overlays and the removal of old environments on this machine.

Its folder (on local disk, never NFS) holds:

| path | content |
|---|---|
| `inputs/<digest>.json` | the environment and lock of one inputs digest: an unchanged pyproject never locks again |
| `locks/<lock sha256>/` | a lock project: generated pyproject.toml, uv.lock, the runtime wheel, the snapshots' tree |
| `models/<name>.lock` | the last lock of a model, the seed of its next one |
| `envs/<id>/` | an environment: `venv/`, `project/`, `environment.json`, `build.log`, `venv.log` (images), `ready` |
| `failed/<id>.json` | why the last build of an environment failed |
| `readers/<id>.json` | the model snapshots an environment was resolved for: who may list it (`readers`) |
| `envs/<id>/overlays/<key>/` | the overlay of one set of snapshots on it, with `runs/<run id>` of the runs using it |
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef

from simrun_envbuilder import pythons
from simrun_envbuilder.image import (
    ImageSettings,
    RegistryClient,
    RegistryError,
    image_builder,
    image_tag,
    render_dockerfile,
    write_context,
)
from simrun_envbuilder.inputs import ModelInputs, read_inputs
from simrun_envbuilder.lock import (
    UvSettings,
    default_uv_command,
    local_git_repositories,
    read_lock,
    run_lock,
    write_project,
)
from simrun_envbuilder.overlays import Overlays
from simrun_envbuilder.readers import EnvironmentReaders
from simrun_envbuilder.system import check_packages
from simrun_envbuilder.venv import (
    BuildError,
    VenvBuild,
    compile_bytecode,
    file_lock,
    folder_size,
    is_locked,
    is_ready,
    mark_ready,
    python_of,
    remove,
    tail,
)
from simrun_envbuilder.wheels import runtime_version, write_runtime_wheel

log = logging.getLogger(__name__)

DEFAULT_ENVIRONMENT = "default"
"""The environment of a model without pyproject.toml: the server's own interpreter."""

_FINAL_RUN_STATES = {"succeeded", "failed", "cancelled"}
_DESCRIBE_OVERLAY_AGE_S = 3600.0
_RECORD_KEYS = {
    "dockerfile",
    "note",
    "environment_id",
    "lock_sha256",
    "inputs_digest",
    "interpreter",
    "python_version",
    "python_full_version",
    "packages",
    "system_packages",
    "model",
}
RECENT_USE_S = 3600.0
"""An environment used this recently is never removed, whatever the total size."""
_DEFAULT_CONSTRAINTS = Path(__file__).with_name("constraints.txt")


class EnvironmentState(StrEnum):
    """The lifecycle of an environment."""

    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class Environment:
    """An environment as the builder reports it.

    Attributes:
        environment_id: a hash of the lock's third-party packages and manifest, the Python version, the runtime's
            version and the kind of environment; `default` for a model without pyproject.toml.
        interpreter: the shared venv's interpreter (empty until it is built).
        message: while building, its last step; once failed, the reason and the log's tail.
    """

    environment_id: str
    state: EnvironmentState
    python_version: str = ""
    lock_sha256: str = ""
    inputs_digest: str = ""
    interpreter: str = ""
    image: str = ""
    message: str = ""
    create_time: datetime | None = None
    last_use_time: datetime | None = None
    packages: list[str] = field(default_factory=list)
    size_bytes: int = 0
    system_packages: list[str] = field(default_factory=list)
    note: str = ""
    """What its lock decided that the submitter should know (the model's uv.lock was out of date)."""


@dataclass(frozen=True)
class BuilderSettings:
    """How the builder works: its folder, uv, the index, the constraints, and when old environments go.

    Attributes:
        root: the builder's folder on local disk.
        store: the run store (snapshots, and run records to tell live runs).
        uv: how uv is run.
        constraints: the constraints file for build backends; None for the builder's own.
        interpreters: interpreters to consider besides those found on the machine.
        max_age_s: an environment unused this long is removed (never one a live run uses).
        max_total_bytes: beyond this many bytes, the least recently used environments are removed.
        compile_bytecode: compile each new venv's packages to bytecode after it is ready.
    """

    root: Path
    store: Path
    uv: UvSettings = field(default_factory=lambda: UvSettings(default_uv_command()))
    constraints: Path | None = None
    interpreters: tuple[str, ...] = ()
    max_age_s: float = 30 * 86400.0
    max_total_bytes: int = 50 * 2**30
    compile_bytecode: bool = True
    images: ImageSettings | None = None
    """Build images for a cluster instead of venvs on this machine."""

    @property
    def kind(self) -> str:
        return "image" if self.images is not None else "venv"


@dataclass
class _Build:
    """A build under way in this process: its thread and the lines it logged, for watchers."""

    lines: list[str] = field(default_factory=list)
    done: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, line: str) -> None:
        with self.cond:
            self.lines.append(line)
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()


class EnvironmentBuilder:
    """Resolves snapshots to environments and builds them in background threads, once per environment."""

    def __init__(self, settings: BuilderSettings) -> None:
        self.settings = settings
        self.root = Path(settings.root)
        self.store = StoreLayout(Path(settings.store))
        for name in ("inputs", "locks", "models", "envs", "failed", "tmp", "runtime"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self._constraints_path = settings.constraints or _DEFAULT_CONSTRAINTS
        try:
            text = self._constraints_path.read_text()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the constraints file {self._constraints_path}: {exc}") from None
        self._constraints = [
            line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()
        ]
        self._runtime_version = runtime_version()
        self._runtime_wheel = write_runtime_wheel(self.root / "runtime")
        self.overlays = Overlays(self.store)
        self.readers = EnvironmentReaders(self.root / "readers")
        self._lock = threading.Lock()
        self._builds: dict[str, _Build] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        try:
            self.collect()  # what a stopped server left: overlays of ended runs, environments too old
        except OSError:
            log.exception("removing old environments failed")

    # resolving

    def resolve(self, snapshots: list[SnapshotRef], python_version: str = "") -> Environment:
        """The environment of a run's snapshots (the model first), locking them when their inputs are new and
        starting its build when it is not built; answers at once otherwise.

        Raises:
            InvalidArgument: a pyproject that cannot be locked (with uv's reason), a Python no installed
                interpreter satisfies, an unknown Debian package.
            NotFound: a snapshot not in the store.
        """
        inputs = read_inputs(self.store, snapshots)
        if inputs is None:
            return self._default()
        digest = inputs.digest(
            python_version,
            self._runtime_version,
            hashlib.sha256("\n".join(self._constraints).encode()).hexdigest(),
            self.settings.uv.describe(),
            self.settings.kind,
            json.dumps(asdict(self.settings.images), default=str) if self.settings.images else "",
        )
        record = self._inputs_record(digest)
        if record is None:
            record = self._lock_inputs(inputs, digest, python_version)
        environment_id = record["environment_id"]
        self.readers.note(environment_id, snapshots[0])
        folder = self._env(environment_id)
        if is_ready(folder):
            self._touch(environment_id)
            return self.get(environment_id)
        self._start_build(environment_id, record)
        return self.get(environment_id)

    def get(self, environment_id: str) -> Environment:
        """An environment now; `NotFound` for one this builder never locked."""
        if environment_id == DEFAULT_ENVIRONMENT:
            return self._default()
        folder = self._env(environment_id)
        meta = _read_json(folder / "environment.json")
        with self._lock:
            build = self._builds.get(environment_id)
        if build is not None and not build.done:  # READY once this process's build has let go of its folder
            message = build.lines[-1] if build.lines else "waiting for its build to start"
            return self._from_meta(meta or self._pending_meta(environment_id), EnvironmentState.BUILDING, message)
        if meta is not None and is_ready(folder):
            return self._from_meta(meta, EnvironmentState.READY)
        failed = _read_json(self.root / "failed" / f"{environment_id}.json")
        if failed is not None:
            return self._from_meta(failed, EnvironmentState.FAILED, failed.get("message", ""))
        if meta is not None or (self.root / "envs" / f"{environment_id}.pending").exists():
            record = self._pending_meta(environment_id) if meta is None else meta
            if not is_locked(self.root / "envs" / f"{environment_id}.lock") and "lock_sha256" in record:
                # Nobody builds it: the build died with its server. Build it again here (a half-built one is removed).
                self._start_build(environment_id, {k: v for k, v in record.items() if k in _RECORD_KEYS})
                return self.get(environment_id)
            # Built by another process of this machine, under the environment's file lock.
            return self._from_meta(record, EnvironmentState.BUILDING, "building")
        raise NotFound(f"no environment {environment_id!r}: `simrun envs` lists them")

    def list_environments(self) -> list[Environment]:
        """Every environment this builder knows, newest first."""
        ids = {p.name for p in (self.root / "envs").iterdir() if p.is_dir()}
        ids |= {p.stem for p in (self.root / "failed").glob("*.json")}
        ids |= {p.name.removesuffix(".pending") for p in (self.root / "envs").glob("*.pending")}
        found = []
        for environment_id in ids:
            with contextlib.suppress(NotFound):
                found.append(self.get(environment_id))
        epoch = datetime.fromtimestamp(0, UTC)
        return sorted(found, key=lambda e: (e.create_time or epoch, e.environment_id), reverse=True)

    def watch(self, environment_id: str, poll_s: float = 0.5) -> Iterator[tuple[Environment, list[str]]]:
        """The environment and its build's new log lines whenever they change, until it is READY or FAILED."""
        environment = self.get(environment_id)
        sent = 0
        while True:
            with self._lock:
                build = self._builds.get(environment_id)
            lines: list[str] = []
            if build is not None:
                with build.cond:
                    if len(build.lines) <= sent and not build.done:
                        build.cond.wait(poll_s)
                    lines = build.lines[sent:]
                    sent = len(build.lines)
            environment = self.get(environment_id)
            yield environment, lines
            if environment.state is not EnvironmentState.BUILDING:
                return
            if build is None:
                time.sleep(poll_s)

    def lock_of(self, environment_id: str) -> bytes:
        """The `uv.lock` of an environment, which a run keeps as its `environment.lock`; empty for the default."""
        if environment_id == DEFAULT_ENVIRONMENT:
            return b""
        meta = _read_json(self._env(environment_id) / "environment.json") or _read_json(
            self.root / "failed" / f"{environment_id}.json"
        )
        if meta is None:
            raise NotFound(f"no environment {environment_id!r}")
        return (self.root / "locks" / meta["lock_sha256"] / "uv.lock").read_bytes()

    # the local side: interpreters and overlays

    def interpreter(
        self, environment_id: str, run_id: str | None = None, snapshots: list[SnapshotRef] | None = None
    ) -> str:
        """The interpreter of an environment: for a run (its overlay of the run's snapshots), for a set of
        snapshots (describing types before the run exists), or the shared venv's.

        Raises:
            FailedPrecondition: the environment is not ready on this machine.
            NotFound: no such environment, or no record of the run.
        """
        if environment_id == DEFAULT_ENVIRONMENT:
            return sys.executable
        environment = self.get(environment_id)
        if environment.state is not EnvironmentState.READY:
            raise FailedPrecondition(f"environment {environment_id} is {environment.state.value}, not ready")
        if not environment.interpreter:
            raise FailedPrecondition(
                f"environment {environment_id} is the image {environment.image}: its pods run on a cluster"
            )
        self._touch(environment_id)
        if run_id is not None:
            snapshots = self._run_snapshots(run_id)
            self.write_run_lock(run_id, environment_id)
        if not snapshots:
            return environment.interpreter
        return str(self.overlays.interpreter(environment.environment_id, environment.interpreter, snapshots, run_id))

    def write_run_lock(self, run_id: str, environment_id: str) -> None:
        """Writes `runs/<id>/environment.lock`, the run's copy of its environment's lock, once."""
        if environment_id == DEFAULT_ENVIRONMENT:
            return
        run = self.store.run(run_id)
        target = run.environment_lock
        if target.exists() or not run.root.is_dir():
            return
        temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        temp.write_bytes(self.lock_of(environment_id))
        os.replace(temp, target)

    def _run_snapshots(self, run_id: str) -> list[SnapshotRef]:
        try:
            data = json.loads(self.store.run(run_id).record.read_text())
        except FileNotFoundError:
            raise NotFound(f"no run {run_id!r} in the store") from None
        # Only the snapshots are read, so a record written by a newer tracker still gives them.
        return [SnapshotRef.model_validate(s) for s in data.get("snapshots", [])]

    # removing old environments

    def collect(self, now: float | None = None) -> list[str]:
        """Removes overlays of ended runs and environments by age and total size, never one a live run uses or
        one being built; returns the ids of the environments removed."""
        now = time.time() if now is None else now
        in_use: set[str] = set()
        for folder in (self.root / "envs").glob("*/overlays/*"):
            if not folder.is_dir():
                continue
            environment_id = _read_text(folder / "environment")
            runs = [p.name for p in (folder / "runs").iterdir()] if (folder / "runs").is_dir() else []
            live = [r for r in runs if self._run_live(r)]
            age = now - _mtime(folder / "environment", now)
            if live or (not runs and age < _DESCRIBE_OVERLAY_AGE_S) or (not is_ready(folder) and age < 3600):
                if environment_id:
                    in_use.add(environment_id)
                continue
            remove(folder)
            (folder.parent / f"{folder.name}.lock").unlink(missing_ok=True)
        with self._lock:
            building = {i for i, b in self._builds.items() if not b.done}
        candidates = []
        for environment in self.list_environments():
            if environment.state is not EnvironmentState.READY:
                continue
            last = _mtime(self._env(environment.environment_id) / "last_use", now)
            candidates.append((last, environment.size_bytes, environment.environment_id))
        removed: list[str] = []
        total = sum(size for _, size, _ in candidates)
        for last, size, environment_id in sorted(candidates):
            if environment_id in in_use or environment_id in building or now - last < RECENT_USE_S:
                continue  # a run may have just resolved it and not yet made its overlay
            if now - last > self.settings.max_age_s or total > self.settings.max_total_bytes:
                with file_lock(self.root / "envs" / f"{environment_id}.lock"):
                    remove(self._env(environment_id))
                total -= size
                removed.append(environment_id)
                log.info("removed environment %s (unused for %.0f s)", environment_id, now - last)
        return removed

    def _run_live(self, run_id: str) -> bool:
        try:
            data = json.loads(self.store.run(run_id).record.read_text())
        except (FileNotFoundError, ValueError):
            return False
        return data.get("state") not in _FINAL_RUN_STATES

    def close(self) -> None:
        """Waits for the builds under way (a half-built venv would be rebuilt by the next builder anyway)."""
        self._closed = True
        for thread in list(self._threads):
            thread.join(timeout=600)

    # locking

    def _lock_inputs(self, inputs: ModelInputs, digest: str, python_version: str) -> dict[str, Any]:
        with file_lock(self.root / "inputs" / f"{digest}.lock"):
            record = self._inputs_record(digest)
            if record is not None:
                return record
            images = self.settings.images
            check_packages(inputs.system_packages, installed_here=images is None)
            installed = pythons.installed(self.settings.interpreters, list(self.settings.uv.command))
            if images is not None:  # a Python with a base image, installed here too (uv locks with it)
                installed = [i for i in installed if i.minor in images.base_images]
            interpreter = pythons.choose(inputs.requires_python, installed, python_version)
            local_git_repositories(inputs, self.settings.uv.local_git_roots)
            seed = inputs.model_lock or _read_bytes(self._previous_lock(inputs))
            work = self.root / "tmp" / uuid.uuid4().hex
            try:
                write_project(work, inputs, interpreter, self._runtime_wheel, self._constraints, seed)
                locked = run_lock(work, self.settings.uv, interpreter, seeded=seed is not None)
                target = self.root / "locks" / locked.lock_sha256
                if not target.exists():
                    os.rename(work, target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            dockerfile = ""
            if images is not None:
                dockerfile = render_dockerfile(
                    images,
                    interpreter.minor,
                    inputs.system_packages,
                    locked.uses_git,
                    self._runtime_wheel.name,
                    locked.builds_from_source,
                )
                environment_id = image_tag(locked.identity, interpreter.minor, self._runtime_version, dockerfile)
            else:
                environment_id = hashlib.sha256(
                    json.dumps([locked.identity, interpreter.minor, self._runtime_version, "venv"]).encode()
                ).hexdigest()[:32]
            record = {
                "dockerfile": dockerfile,
                "environment_id": environment_id,
                "lock_sha256": locked.lock_sha256,
                "inputs_digest": digest,
                "interpreter": interpreter.path,
                "python_version": interpreter.minor,
                "python_full_version": ".".join(map(str, interpreter.version)),
                "packages": locked.packages,
                "system_packages": inputs.system_packages,
                "model": inputs.model.ref.name,
                "note": _stale_lock_note(inputs.model_lock, locked.packages),
            }
            if record["note"]:
                log.warning("%s: %s", inputs.model.ref.name, record["note"])
            _write_json(self.root / "inputs" / f"{digest}.json", record)
            _atomic_bytes(self._previous_lock(inputs), locked.lock)
            return record

    def _previous_lock(self, inputs: ModelInputs) -> Path:
        """Where the model's last lock is kept, its next lock's seed: by its folder's name and its project's name,
        so another project in a folder of the same name (`model`, `src`) never inherits its versions."""
        project = re.sub(r"[^a-z0-9]+", "-", inputs.project_name.lower()).strip("-") or "project"
        return self.root / "models" / f"{inputs.model.ref.name}.{project}.lock"

    def _inputs_record(self, digest: str) -> dict[str, Any] | None:
        record = _read_json(self.root / "inputs" / f"{digest}.json")
        if record is None:
            return None
        if not is_ready(self._env(record["environment_id"])) and not os.access(record["interpreter"], os.X_OK):
            return None  # the Python it chose is gone: choose again
        return record

    # building

    def _start_build(self, environment_id: str, record: dict[str, Any]) -> None:
        with self._lock:
            build = self._builds.get(environment_id)
            if build is not None and not build.done:
                return
            if self._closed:
                raise FailedPrecondition("the environment builder is shutting down")
            build = _Build()
            self._builds[environment_id] = build
            (self.root / "envs" / f"{environment_id}.pending").write_text(json.dumps(record))
            (self.root / "failed" / f"{environment_id}.json").unlink(missing_ok=True)
            thread = threading.Thread(
                target=self._build,
                args=(environment_id, record, build),
                name=f"build-{environment_id[:8]}",
                daemon=True,
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _build(self, environment_id: str, record: dict[str, Any], build: _Build) -> None:
        folder = self._env(environment_id)
        started = time.monotonic()
        try:
            with file_lock(self.root / "envs" / f"{environment_id}.lock"):
                if is_ready(folder):
                    return
                remove(folder)  # a half-built one from a build that died
                folder.mkdir(parents=True)
                project = folder / "project"
                _copy_project(self.root / "locks" / record["lock_sha256"], project)
                meta = {
                    **record,
                    "create_time": datetime.now(UTC).isoformat(),
                    "interpreter_path": str(python_of(folder / "venv")),
                }
                _write_json(folder / "environment.json", meta)
                build.add(f"building environment {environment_id} ({len(record['packages'])} packages)")
                if record.get("note"):
                    build.add(record["note"])
                # The venv of the lock on this machine: the pods' environment without images, and with them the
                # describer's (the server describes a model's types in the model's own dependencies), built while
                # the image builds.
                wheel = next(project.glob("simrun_runtime-*.whl"))
                interpreter = pythons.Interpreter(_version_of(record), record["interpreter"])
                beside_image = self.settings.images is not None
                venv_log = folder / ("venv.log" if beside_image else "build.log")
                venv = VenvBuild(
                    self.settings.uv, interpreter, project, folder / "venv", wheel, venv_log, 19 if beside_image else 0
                )
                if beside_image:
                    with ThreadPoolExecutor(1, thread_name_prefix=f"venv-{environment_id}") as beside:
                        made = beside.submit(venv.run, build.add)
                        meta.update(self._build_image(environment_id, record, folder, build))
                        made.result()
                    _write_json(folder / "environment.json", meta)
                else:
                    venv.run(build.add)
                if beside_image:
                    mark_ready(folder)
                    build.add(f"ready in {time.monotonic() - started:.1f} s: {meta['image']}")
                    return
                (folder / "last_use").touch()
                mark_ready(folder)
                build.add(f"ready in {time.monotonic() - started:.1f} s")
        except Exception as exc:  # every failure becomes the environment's message; nothing half-made stays
            message = str(exc) if isinstance(exc, BuildError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, BuildError):
                log.exception("building environment %s failed", environment_id)
                message += f"\nlog tail:\n{tail(folder / 'build.log')}"
            remove(folder)
            _write_json(
                self.root / "failed" / f"{environment_id}.json",
                {**record, "message": f"building the environment failed: {message}", "create_time": _now()},
            )
            build.add(f"failed: {message.splitlines()[0]}")
            return
        finally:
            (self.root / "envs" / f"{environment_id}.pending").unlink(missing_ok=True)
            build.finish()
        if self.settings.images is None:
            self._after_build(environment_id, folder)

    def _build_image(self, environment_id: str, record: dict[str, Any], folder: Path, build: _Build) -> dict[str, Any]:
        """The image of an environment by digest and its size: the registry's when it has it, else built and pushed
        by the configured builder (BuildKit or buildah), then asked of the registry again."""
        images = self.settings.images
        assert images is not None
        context = folder / "context"
        write_context(context, record["dockerfile"], folder / "project", images)
        name = f"{images.registry}/{images.repository}"
        registry = RegistryClient(images)
        build.add(f"asking the registry for {name}:{environment_id}")
        try:
            digest = registry.digest(images.repository, environment_id)
        except RegistryError as exc:
            raise BuildError(f"the registry did not say whether it has the image: {exc}") from None
        if digest is None:
            builder = image_builder(images)
            build.add(f"the registry lacks it: building the image with {builder.name}")
            digest = builder.build(context, f"{name}:{environment_id}", folder / "build.log", build.add)
            try:
                found = registry.digest(images.repository, environment_id)
            except RegistryError as exc:
                raise BuildError(f"the registry did not confirm the pushed image: {exc}") from None
            if found != digest:
                raise BuildError(f"{builder.name} pushed {digest} but the registry holds {found} for the tag")
        try:
            size = registry.size(images.repository, digest)
        except RegistryError as exc:
            raise BuildError(f"the registry did not give the image's size: {exc}") from None
        return {"image": f"{name}@{digest}", "size_bytes": size}

    def _after_build(self, environment_id: str, folder: Path) -> None:
        """Compiles bytecode once the venv is usable, records its size, then removes old environments."""
        if self.settings.compile_bytecode:
            compile_bytecode(folder / "venv", folder / "build.log", self.settings.uv.confine)
        meta = _read_json(folder / "environment.json")
        if meta is not None and is_ready(folder):
            meta["size_bytes"] = folder_size(folder)
            _write_json(folder / "environment.json", meta)
        try:
            self.collect()
        except OSError:
            log.exception("removing old environments failed")

    # helpers

    def _env(self, environment_id: str) -> Path:
        if not environment_id or "/" in environment_id or environment_id.startswith("."):
            raise NotFound(f"no environment {environment_id!r}")
        return self.root / "envs" / environment_id

    def _touch(self, environment_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._env(environment_id) / "last_use")

    def _pending_meta(self, environment_id: str) -> dict[str, Any]:
        return _read_json(self.root / "envs" / f"{environment_id}.pending") or {"environment_id": environment_id}

    def _from_meta(self, meta: dict[str, Any], state: EnvironmentState, message: str = "") -> Environment:
        environment_id = meta["environment_id"]
        folder = self._env(environment_id)
        return Environment(
            environment_id=environment_id,
            state=state,
            python_version=meta.get("python_version", ""),
            lock_sha256=meta.get("lock_sha256", ""),
            inputs_digest=meta.get("inputs_digest", ""),
            interpreter=meta.get("interpreter_path", "") if state is EnvironmentState.READY else "",
            image=meta.get("image", "") if state is EnvironmentState.READY else "",
            message=message,
            create_time=datetime.fromisoformat(meta["create_time"]) if meta.get("create_time") else None,
            last_use_time=datetime.fromtimestamp(_mtime(folder / "last_use", 0), UTC)
            if (folder / "last_use").exists()
            else None,
            packages=list(meta.get("packages", [])),
            size_bytes=int(meta.get("size_bytes", 0)),
            system_packages=list(meta.get("system_packages", [])),
            note=str(meta.get("note", "")),
        )

    def _default(self) -> Environment:
        return Environment(
            DEFAULT_ENVIRONMENT,
            EnvironmentState.READY,
            python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
            interpreter=sys.executable,
        )


def _copy_project(source: Path, dest: Path) -> None:
    """Copies a lock project: its files, and its tree's symlinks as symlinks."""
    shutil.copytree(source, dest, symlinks=True)


def _version_of(record: dict[str, Any]) -> tuple[int, int, int]:
    parts = [int(p) for p in str(record.get("python_full_version") or record["python_version"]).split(".")]
    return parts[0], parts[1], parts[2] if len(parts) > 2 else 0


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    _atomic_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def _atomic_bytes(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temp.write_bytes(data)
    os.replace(temp, path)


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return default


__all__ = ["DEFAULT_ENVIRONMENT", "BuilderSettings", "Environment", "EnvironmentBuilder", "EnvironmentState"]


def _stale_lock_note(model_lock: bytes | None, packages: list[str]) -> str:
    """What to tell the submitter when the model's own `uv.lock` did not fit its pyproject.toml: uv locked again,
    and the versions that moved (the packages simrun adds, its runtime's and the backends, are no news)."""
    if model_lock is None:
        return ""
    try:
        seeded = dict(p.split("==", 1) for p in read_lock(model_lock).packages)
    except (ValueError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return "the model's uv.lock could not be read: locked afresh from its pyproject.toml"
    now = dict(p.split("==", 1) for p in packages)
    moved = [
        f"{name} {seeded[name]} -> {now[name]}"
        for name in sorted(now.keys() & seeded.keys())
        if seeded[name] != now[name]
    ]
    if not moved:
        return ""
    return (
        f"the model's uv.lock was out of date with its pyproject.toml: locked again ({', '.join(moved[:6])}); "
        "run `uv lock` in the model and commit it to keep the versions"
    )
