"""What a family package needs before it can be imported: PyTorch (the rest of cake-train, the
manifest tools and ``python -m cake``, runs without it)."""

from __future__ import annotations

TORCH = "torch>=2.4"


def require_torch(package: str) -> None:
    """Raises ModuleNotFoundError naming the fix when torch is not installed (a family package's
    first statement: the family imports torch right after, so importing it here costs nothing).
    A plain import, not importlib: vendored code may reach modules only by import statements."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise  # torch is there but broken: its own error says how
        raise ModuleNotFoundError(
            f"{package} runs on PyTorch, which is not installed here. Remedy: pip install "
            f"'{TORCH}' (a CUDA build of torch for GPUs; its CPU build runs the tests and the "
            "Triton families' interpreter mode)", name="torch") from None
