"""Fixtures of the family's CPU tests that compile its real programs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def family_jit_cache(tmp_path_factory) -> Path:
    """One JIT cache (``CAKE_CACHE_DIR``) for every test of the session that compiles a family's
    real programs (each family folder's conftest names the same folder), so that a program
    compiles once per session whichever test asks first: entries are keyed by digest, arch and
    toolchain."""
    path = tmp_path_factory.getbasetemp() / "cake-family-jit-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path
