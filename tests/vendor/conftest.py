"""Fixtures of the vendoring tests: a miniature cake-train checkout, a host tree, the toy family
vendored from the one into the other, and the checkout's gate on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from vendor_tree import TOY_FAMILY, gate, host_tree, make_source_repo, vendor


@pytest.fixture
def source(tmp_path) -> Path:
    return make_source_repo(tmp_path / "src")


@pytest.fixture
def into(tmp_path) -> Path:
    return host_tree(tmp_path / "host")


@pytest.fixture
def toy(tmp_path, source, into) -> Path:
    """The toy family vendored into the host tree; returns its package folder."""
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 0, result.stderr
    return into / TOY_FAMILY


@pytest.fixture
def toy_gate(tmp_path, source):
    """Runs the source checkout's gate on the vendored toy family."""
    return lambda: gate(tmp_path, tmp_path / "host", TOY_FAMILY, upstream=source)
