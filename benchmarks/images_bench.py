"""Benchmark of images and container pods, each figure beside a baseline measured in the same run.

Run as root with podman, buildah, runc, debootstrap and Debian's docker-registry installed (scripts/test installs
them): `uv run --frozen python benchmarks/images_bench.py [--repeats 3]` (reaches the package index). Prints medians:

- the cold build of the odescan example's image (numpy, scipy), resolve to READY through the environment builder
  (lock, registry check, `buildah bud`, push, the describer's venv beside it), and the same from the lock's end,
  against `buildah bud` + `buildah push` by hand
  of the same context (goal: at most 1.1 times). Before each build the layers of the last one are removed, so
  neither reuses a layer; uv's download cache (the Dockerfile's cache mount) is warm for both alike;
- the warm check of an image the registry has (the builder's registry client asks for its digest) against one
  bare HTTP HEAD of the manifest (goal: under 100 ms);
- a pod's start to its end through the containers executor (a container of an image whose runtime entry point
  exits at once) against the same pod through the local executor (a process of this machine's Python).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from envbuilder_bench import git_copy, wait  # noqa: E402
from images import (  # noqa: E402
    BASE_PYTHON,
    BUILDAH,
    ULIMITS,
    ensure_base_image,
    image_with_files,
    push_by_digest,
    serve_registry,
)
from simrun_client.snapshots import snapshot_to_store  # noqa: E402
from simrun_core.config import ContainersConfig  # noqa: E402
from simrun_envbuilder.builder import BuilderSettings, EnvironmentBuilder  # noqa: E402
from simrun_envbuilder.image import ImageSettings, RegistryClient  # noqa: E402
from simrun_envbuilder.lock import UvSettings, default_uv_command  # noqa: E402
from simrun_planner import Node  # noqa: E402
from simrun_tracker.containers import ContainerExecutor  # noqa: E402
from simrun_tracker.executor import PodPhase, PodRole, PodSpec  # noqa: E402
from simrun_tracker.local import LocalExecutor  # noqa: E402
from simrun_tracker.local.confinement import PodConfinement  # noqa: E402

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
EXITS = "import sys; sys.exit(0)\n"


def drop_layers(*names: str) -> None:
    """Removes images and every layer no tagged image holds: the next build reuses none of them."""
    subprocess.run(["podman", "rmi", "--force", *names], capture_output=True)
    subprocess.run([*BUILDAH, "rmi", "--prune"], capture_output=True)


def by_hand(context: Path, target: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            *BUILDAH,
            "bud",
            "--runtime",
            "runc",
            "--layers",
            "--tls-verify=false",
            *ULIMITS,
            "--file",
            str(context / "Dockerfile"),
            "--tag",
            target,
            str(context),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*BUILDAH, "push", "--tls-verify=false", target, f"docker://{target}"], check=True, capture_output=True
    )
    return time.perf_counter() - start


def builds(root: Path, registry: str, base: str, repeats: int) -> tuple[list[float], list[float], list[float], str]:
    model = git_copy(root / "odescan")
    simrun_s, hand_s, build_s = [], [], []
    image = ""
    context: Path | None = None
    for repeat in range(repeats):
        order = ("simrun", "hand") if repeat % 2 == 0 or context is None else ("hand", "simrun")
        for who in order:
            if who == "simrun":
                settings = BuilderSettings(
                    root=root / f"environments-{repeat}",
                    store=root / "store",
                    uv=UvSettings(default_uv_command()),
                    compile_bytecode=False,
                    images=ImageSettings(
                        registry=registry,
                        repository=f"bench/simrun-{repeat}",
                        base_images={BASE_PYTHON: base},
                        insecure=True,
                        ca_bundle=CA_BUNDLE,
                        builder="buildah",
                    ),
                )
                snapshots = [snapshot_to_store(model, root / "store", name="odescan").snapshot.to_ref()]
                builder = EnvironmentBuilder(settings)
                start = time.perf_counter()
                environment = builder.resolve(snapshots)  # locks (uv lock, its cache warm) before it answers
                locked = time.perf_counter()
                wait(builder, environment.environment_id)
                simrun_s.append(time.perf_counter() - start)
                build_s.append(time.perf_counter() - locked)
                image = builder.get(environment.environment_id).image
                builder.close()
                kept = root / "context"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(settings.root / "envs" / environment.environment_id / "context", kept)
                context = kept
                drop_layers(f"{registry}/bench/simrun-{repeat}:{environment.environment_id}")
            else:
                assert context is not None
                target = f"{registry}/bench/hand-{repeat}:latest"
                hand_s.append(by_hand(context, target))
                drop_layers(target)
        print(
            f"  repeat {repeat + 1}: simrun {simrun_s[-1]:.1f} s (after its lock {build_s[-1]:.1f} s), "
            f"by hand {hand_s[-1]:.1f} s",
            flush=True,
        )
    return simrun_s, build_s, hand_s, image


def checks(registry: str, image: str, repeats: int) -> tuple[list[float], list[float]]:
    name, _, digest = image.partition("@")
    repository = name.split("/", 1)[1]
    client = RegistryClient(
        ImageSettings(registry=registry, repository=repository, base_images={}, insecure=True, builder="buildah")
    )
    tags = urllib.request.urlopen(f"http://{registry}/v2/{repository}/tags/list", timeout=5).read()
    tag = tags.decode().split('"tags":["')[1].split('"')[0]
    simrun_ms, head_ms = [], []
    for _ in range(repeats * 10):
        start = time.perf_counter()
        assert client.digest(repository, tag) == digest
        simrun_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        request = urllib.request.Request(
            f"http://{registry}/v2/{repository}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
        urllib.request.urlopen(request, timeout=5).close()
        head_ms.append((time.perf_counter() - start) * 1000)
    return simrun_ms, head_ms


def pod(run: str) -> PodSpec:
    return PodSpec(
        run_id=run,
        task_id="t",
        worker="w0",
        role=PodRole.EXECUTE,
        environment_id="default",
        contract={"SIMRUN_RUN_DIR": f"runs/{run}", "SIMRUN_TASK": "t", "SIMRUN_WORKER": "w0"},
        cores=1,
        memory_gb=0.5,
        processes=1,
        retry_memory_gb=0.75,
        priority_class="simrun-standard-base",
    )


def lifetime(executor: LocalExecutor, run: str) -> float:
    spec = pod(run)
    start = time.perf_counter()
    executor.start_pods([spec])
    while (status := executor.pods(run)[0]).phase is not PodPhase.SUCCEEDED:
        if status.phase is PodPhase.FAILED:
            raise SystemExit(f"the pod failed: {status.message}")
        time.sleep(0.005)
    return time.perf_counter() - start


def starts(root: Path, base: str, repeats: int) -> tuple[list[float], list[float]]:
    image = image_with_files(
        base,
        {
            "/usr/lib/python3/dist-packages/simrun_runtime/__init__.py": "",
            "/usr/lib/python3/dist-packages/simrun_runtime/execute.py": EXITS,
        },
        "simrun-bench-exits",
    )
    nodes = [Node("n1", cores=2, memory_gb=2.0)]
    containers = ContainerExecutor(
        root / "c-store", lambda spec: image, ContainersConfig(python="python3"), nodes=nodes, poll_s=0.01
    )
    local = LocalExecutor(
        root / "l-store",
        lambda spec: [sys.executable, "-c", EXITS],
        nodes,
        cgroup_root="auto",
        poll_s=0.01,
        confinement=PodConfinement("off"),
    )
    container_s, local_s = [], []
    try:
        for repeat in range(repeats * 3):
            container_s.append(lifetime(containers, f"c{repeat}"))
            local_s.append(lifetime(local, f"l{repeat}"))
    finally:
        containers.close()
        local.close()
    return container_s, local_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base_local = ensure_base_image()
    with tempfile.TemporaryDirectory(prefix="simrun-images-bench-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        registry, server = serve_registry(root / "registry", root / "registry-data")
        try:
            base = push_by_digest(base_local, f"{registry}/simrun/base:bench")
            print(f"cold builds of odescan's image (numpy, scipy), {args.repeats} repeats:")
            simrun_s, build_s, hand_s, image = builds(root, registry, base, args.repeats)
            ratio = statistics.median(s / h for s, h in zip(simrun_s, hand_s, strict=True))
            built = statistics.median(b / h for b, h in zip(build_s, hand_s, strict=True))
            print(
                f"cold build: simrun {statistics.median(simrun_s):.1f} s with its lock, "
                f"{statistics.median(build_s):.1f} s after it; buildah bud + push by hand "
                f"{statistics.median(hand_s):.1f} s: ratio {ratio:.2f} with the lock, "
                f"{built:.2f} after it (goal <= 1.1)"
            )
            simrun_ms, head_ms = checks(registry, image, args.repeats)
            print(
                f"warm check of an existing image: {statistics.median(simrun_ms):.1f} ms, a bare HEAD "
                f"{statistics.median(head_ms):.1f} ms (goal < 100 ms)"
            )
            container_s, local_s = starts(root, base_local, args.repeats)
            print(
                f"a pod's start to its end: container {statistics.median(container_s) * 1000:.0f} ms, local process "
                f"{statistics.median(local_s) * 1000:.0f} ms: ratio "
                f"{statistics.median(container_s) / statistics.median(local_s):.1f}"
            )
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
