"""The nvcc flags every program library is built with: one list for CMake and the JIT alike.

A library is one nvcc command (:func:`nvcc_command`)::

    nvcc <base_nvcc_flags(arch)> -I<include dir> -DCAKE_PROGRAM_DIGEST="<digest>"
         <program flags> <kernel.cu> <binding.cu> -o <library>_<arch>.so

The JIT (``jit.py``) runs it at run time; the ahead-of-time build (``CMakeLists.txt``) gets the
very same argv from ``tools/build_plan.py``, so a prebuilt library and a JIT-compiled one are
built identically. Standard library only; no ``cake`` imports, as vendoring copies this folder
verbatim.
"""

from __future__ import annotations

import re
import subprocess
from typing import Sequence

# The arches the ahead-of-time build considers by default (SPEC section 4).
DEFAULT_BUILD_ARCHES = ("sm_90a", "sm_100a", "sm_103a")

_ARCH_RE = re.compile(r"sm_(\d+)a")


def gencode(arch: str) -> str:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (machine code only, no PTX)."""
    if not _ARCH_RE.fullmatch(arch):
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


def digest_define(digest: str) -> str:
    """The define that ``<library>_digest()`` returns, as one argv item (no shell quoting)."""
    if not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"digest must be lowercase hex, got {digest!r}")
    return f'-DCAKE_PROGRAM_DIGEST="{digest}"'


def nvcc_command(nvcc: str, arch: str, digest: str, include_dir: str,
                 flags: Sequence[str], sources: Sequence[str], output: str) -> list[str]:
    """The argv that builds ``output`` (``<library>_<arch>.so``) from a program's sources."""
    return [nvcc, *base_nvcc_flags(arch), f"-I{include_dir}", digest_define(digest),
            *flags, *sources, "-o", output]


def nvcc_supported_arches(nvcc: str, candidates: Sequence[str] = DEFAULT_BUILD_ARCHES) -> list[str]:
    """Which of ``candidates`` ``nvcc`` can compile (``nvcc --list-gpu-code``).

    nvcc lists ``sm_90``, ``sm_100``, ...; an ``sm_<NN>a`` arch is supported when ``sm_<NN>``
    is listed. Raises OSError or subprocess.CalledProcessError when nvcc cannot be run.
    """
    listed = subprocess.run([nvcc, "--list-gpu-code"], check=True, capture_output=True,
                            text=True).stdout.split()
    return [arch for arch in candidates if arch in listed or arch[:-1] in listed]
