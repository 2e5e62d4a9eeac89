"""Shared pytest configuration: the `gpu` marker and its clean skip on machines without one."""

import importlib.util
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped where none is present)")
    config.addinivalue_line("markers", "nvcc: needs the CUDA compiler nvcc on PATH or CUDA_HOME")


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def toy_jit_cache(tmp_path_factory) -> Path:
    """A JIT cache folder (for CAKE_CACHE_DIR) shared by the session's tests that compile the toy
    programs of tests/toy_programs.py: entries are keyed by digest, arch and toolchain, so each
    toy program compiles once per session whichever test asks first."""
    return tmp_path_factory.mktemp("toy-jit-cache")
