"""What a family package needs before it can be imported: PyTorch (the rest of cake-train, the
manifest tools and ``python -m cake``, runs without it)."""

from __future__ import annotations

import importlib.util

TORCH = "torch>=2.4"


def require_torch(package: str) -> None:
    """Raises ModuleNotFoundError naming the fix when torch is not installed (a family package's
    first statement, before anything imports torch)."""
    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError(
            f"{package} runs on PyTorch, which is not installed here. Remedy: pip install "
            f"'{TORCH}' (a CUDA build of torch for GPUs; its CPU build runs the tests and the "
            "Triton families' interpreter mode)", name="torch")
