"""The nvcc flags every program library is built with: one list for CMake and the JIT alike."""

from __future__ import annotations


def gencode(arch: str) -> str:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (machine code only, no PTX)."""
    if not arch.startswith("sm_"):
        raise ValueError(f"arch must look like sm_90a, got {arch!r}")
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def base_nvcc_flags(arch: str) -> list[str]:
    """Flags for one shared library of one program for ``arch`` (sources and -o not included)."""
    return [
        "-O3",
        "-std=c++17",
        "-shared",
        "-Xcompiler", "-fPIC",
        # Only the C entry points marked CAKE_EXPORT are visible.
        "-Xcompiler", "-fvisibility=hidden",
        gencode(arch),
        "-Xfatbin=-compress-all",
        # The static CUDA runtime makes each library ~1 MB; its symbol table is a third of
        # that and nothing needs it (exports live in the dynamic table).
        "-Xlinker", "--strip-all",
    ]
