"""Names, labels and the checks the CRD schemas cannot make: DNS-1123 names and label values of 63 characters."""

from __future__ import annotations

import hashlib
import re

RUN_LABEL = "simrun.io/run"
TASK_LABEL = "simrun.io/task"
WORKER_LABEL = "simrun.io/worker"
TASK_ANNOTATION = "simrun.io/task-id"
"""The task's real id, where its label holds the sanitised one."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
RESERVED = "simrun/reserved"
"""The key of a reservation's taint (`simrun/reserved=<run>:NoExecute`) and label (`simrun/reserved=<run>`)."""
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
"""The label Argo puts on every pod of a Workflow."""
NODE_NAME_ANNOTATION = "workflows.argoproj.io/node-name"
"""The annotation Argo puts on a pod: the Workflow node it runs, e.g. `simrun-<run>.fit-extra(1:2)(0)`."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
MAX_LABEL = 63


class InvalidName(ValueError):
    """A name or label value Kubernetes would refuse; raised before anything is submitted."""


def check_dns_label(name: str, what: str) -> str:
    """`name` if it is a DNS-1123 label (lowercase alphanumerics and `-`, at most 63), else `InvalidName`."""
    if len(name) > MAX_LABEL or not _DNS_LABEL.match(name):
        raise InvalidName(f"{what} {name!r} is not a DNS-1123 label (a-z, 0-9, '-', at most {MAX_LABEL})")
    return name


def check_label_value(value: str, what: str) -> str:
    """`value` if Kubernetes accepts it as a label value (at most 63, alphanumeric ends), else `InvalidName`."""
    if len(value) > MAX_LABEL or not _LABEL_VALUE.match(value):
        raise InvalidName(f"{what} {value!r} is not a label value (alphanumerics, '-', '_', '.', at most {MAX_LABEL})")
    return value


def dns_name(text: str, limit: int) -> str:
    """A DNS-1123 label made from `text`, at most `limit` long; a hash suffix keeps shortened names distinct."""
    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    if clean == text and len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    head = clean[: max(1, limit - 7)].rstrip("-") or "x"
    return f"{head}-{digest}"


def workflow_name(run_id: str) -> str:
    """The Workflow of a run: `simrun-<run id>`, a DNS-1123 label so Argo's pod names and labels derive from it."""
    return check_dns_label(f"simrun-{dns_name(run_id, MAX_LABEL - 7)}", "the workflow name")


def task_node(task_id: str) -> str:
    """The DAG node prefix of a task: its id sanitised so that `<prefix>-extra` stays a DNS-1123 label."""
    return dns_name(task_id, 40)


def quantity_gib(gib: float) -> str:
    """A memory quantity as Kubernetes writes it: whole GiB as `6Gi`, else whole MiB (`1536Mi`), never a float."""
    if gib < 0:
        raise ValueError(f"negative memory {gib}")
    mib = round(gib * 1024)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def quantity_cores(cores: float) -> str:
    """A CPU quantity: whole cores as `2`, else millicores (`100m`)."""
    milli = round(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def parse_quantity_gib(text: str | int | float) -> float:
    """GiB of a Kubernetes memory quantity (`64Gi`, `65536Mi`, `68719476736`, `64G`)."""
    return _parse_quantity(text) / 2**30


def parse_quantity_cores(text: str | int | float) -> float:
    """Cores of a Kubernetes CPU quantity (`8`, `7500m`)."""
    return _parse_quantity(text)


_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}  # fmt: skip


def _parse_quantity(text: str | int | float) -> float:
    if isinstance(text, int | float):
        return float(text)
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)", text.strip())
    if not match or match.group(2) not in ("", *_SUFFIXES):
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIXES.get(match.group(2), 1)
