"""The nvcc flags every program library is built with: one list for CMake and the JIT alike.

The JIT (``loader``) runs one command per library::

    nvcc <base_nvcc_flags(arch)> -I<include dir> <digest_define(digest)> <program flags>
         <kernel.cu> <binding.cu> -o <library>_<arch>.so

The ahead-of-time build (``CMakeLists.txt``) gets the same flags through ``tools/build_plan.py``:
:func:`compile_only_flags` on each compile (CMake links the shared library itself, with the
static CUDA runtime, as ``nvcc -shared`` does). Standard library only; no ``cake`` imports, as
vendoring copies this folder verbatim.
"""

from __future__ import annotations

import re
import subprocess

# The arches the ahead-of-time build considers by default (SPEC section 4), newest last.
DEFAULT_BUILD_ARCHES = ("sm_90a", "sm_100a", "sm_103a")
# Only in a link: nvcc links the host objects (and the static CUDA runtime) into one library.
LINK_FLAG = "-shared"

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
        LINK_FLAG,
        "-Xcompiler", "-fPIC",
        # Only the C entry points marked CAKE_EXPORT are visible.
        "-Xcompiler", "-fvisibility=hidden",
        gencode(arch),
        "-Xfatbin=-compress-all",
    ]


def compile_only_flags(arch: str) -> list[str]:
    """:func:`base_nvcc_flags` without the link flag: what CMake passes to each ``nvcc -c``."""
    return [flag for flag in base_nvcc_flags(arch) if flag != LINK_FLAG]


def digest_define(digest: str) -> str:
    """The define that ``<library>_digest()`` returns, as one argv item (no shell quoting)."""
    if not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"digest must be lowercase hex, got {digest!r}")
    return f'-DCAKE_PROGRAM_DIGEST="{digest}"'


def nvcc_supported_arches(nvcc: str) -> list[str]:
    """Which of :data:`DEFAULT_BUILD_ARCHES` ``nvcc`` can compile (``nvcc --list-gpu-code``).

    nvcc lists ``sm_90``, ``sm_100``, ...; an ``sm_<NN>a`` arch is supported when ``sm_<NN>``
    is listed. Raises OSError or subprocess.CalledProcessError when nvcc cannot be run.
    """
    listed = subprocess.run([nvcc, "--list-gpu-code"], check=True, capture_output=True,
                            text=True).stdout.split()
    return [arch for arch in DEFAULT_BUILD_ARCHES if arch[:-1] in listed or arch in listed]
