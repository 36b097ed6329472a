"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dist.store import JobStore


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs")
