"""Shared fixtures for the cluster-sim tests: the location of the Alibaba trace samples."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def alibaba_sample() -> Path:
    """``<repo root>/../shared/data/alibaba-sample``; the tests fail (not skip) without it."""
    folder = REPO_ROOT.parent / "shared" / "data" / "alibaba-sample"
    if not (folder / "v2018_machine_meta.csv").is_file():
        pytest.fail(f"the Alibaba trace samples are missing: expected them in {folder}")
    return folder
