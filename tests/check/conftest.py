"""Fixtures for tests/check: a rendered toy repository (see toy_tree.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_tree import ToyRepo


@pytest.fixture
def toy(tmp_path: Path) -> ToyRepo:
    """A rendered toy repository that checks clean."""
    repo = ToyRepo(tmp_path / "repo")
    repo.render()
    return repo
