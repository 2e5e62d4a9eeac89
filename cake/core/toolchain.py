"""How a program library is built: one list of commands for the CMake build and the JIT alike.

A library ``<library>_<arch>.so`` is built in two steps:

1. **Device images**, one per kernel source, for the arch:

   - CUDA: ``nvcc -fatbin <device flags> -I<include> -DCAKE_PROGRAM_DIGEST="<digest>" <flags>
     <kernel.cu> -o <library>_<arch>.<role>.fatbin`` (a compressed fatbin holding the SASS);
   - Triton: ``python triton_aot.py ...`` (:mod:`triton_aot`), which writes the cubin and a small
     header with the kernel's launch metadata; then, with the CUDA toolkit's ``fatbinary``, the
     cubin in a fatbin compressed as nvcc compresses its images (the same SASS, about 10% less
     of the wheel; without the toolkit the cubin is embedded as it is).

2. **The host library**: ``<host c++> <host flags> -I<include> -DCAKE_PROGRAM_DIGEST=...
   -DCAKE_IMAGE_COUNT=<n> -DCAKE_IMAGES=CAKE_IMAGE(0,"<image>")... -x c++ <binding.cu>
   -o <library>_<arch>.so``.
   The binding embeds the images (cake/image.h) and launches through the CUDA driver API
   (cake/driver.h), so the library links no CUDA runtime: NEEDED is libc alone.

The ahead-of-time build (``tools/build_plan.py`` -> ``CMakeLists.txt``) and the JIT (``jit.py``)
both run :func:`library_steps`, so a prebuilt library and a JIT-compiled one are built alike.
Standard library only; no ``cake`` imports, as vendoring copies this folder verbatim.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

# The arches the ahead-of-time build considers by default.
DEFAULT_BUILD_ARCHES = ("sm_90a", "sm_100a", "sm_103a")

_ARCH_RE = re.compile(r"sm_(\d+)a")


def gencode(arch: str) -> str:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (machine code only, no PTX)."""
    if not _ARCH_RE.fullmatch(arch):
        raise ValueError(f"arch must look like sm_90a, got {arch!r}")
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def capability(arch: str) -> int:
    """``sm_90a`` -> 90, ``sm_103a`` -> 103 (Triton's target)."""
    if not _ARCH_RE.fullmatch(arch):
        raise ValueError(f"arch must look like sm_90a, got {arch!r}")
    return int(arch[3:-1])


# What nvcc's -Xfatbin=-compress-all --compress-mode=size asks of fatbinary.
FATBINARY_COMPRESSION = ("-compress-all", "--compress-mode=size")


def device_flags(arch: str) -> list[str]:
    """nvcc's flags for one CUDA kernel source's image (sources, defines and -o not included):
    machine code only, in a fatbin compressed for size (the container: the SASS is the same)."""
    return ["-fatbin", "-O3", "-std=c++17", gencode(arch), "-Xfatbin=-compress-all",
            "--compress-mode=size"]


# The host part is plain C++ without exceptions, RTTI or thread-safe statics (a library uses no
# libstdc++ symbol); -z defs makes any symbol outside libc a link error, and the output is
# stripped and carries no build id, so equal inputs give equal bytes. Small: no unwind tables
# (nothing unwinds through it), unused functions dropped, no page padding between code and data.
HOST_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-exceptions",
              "-fno-rtti", "-fno-threadsafe-statics", "-fno-asynchronous-unwind-tables",
              "-fno-unwind-tables", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections",
              "-Wl,-z,noseparate-code", "-Wl,-z,defs", "-Wl,--build-id=none", "-s")


def flags_hash() -> str:
    """A short hash of the flags every library is built with (they are not in the digests, which
    hash what a program is, not how this cake-train builds it): part of the JIT cache key."""
    text = "\n".join([*device_flags("sm_90a"), *FATBINARY_COMPRESSION, *HOST_FLAGS])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def digest_define(digest: str) -> str:
    """The define that ``<library>_digest()`` returns, as one argv item (no shell quoting)."""
    if not re.fullmatch(r"[0-9a-f]+", digest):
        raise ValueError(f"digest must be lowercase hex, got {digest!r}")
    return f'-DCAKE_PROGRAM_DIGEST="{digest}"'


def images_define(images: Sequence[str]) -> str:
    """``-DCAKE_IMAGES=CAKE_IMAGE(0,"<image 0>")CAKE_IMAGE(1,"<image 1>")...`` (cake/image.h),
    one argv item (no shell quoting)."""
    for image in images:
        if any(c in image for c in '"\\\n(),'):
            raise ValueError(f"CAKE_IMAGES: a build path cannot hold a quote, backslash, newline, "
                             f"parenthesis or comma: {image!r}")
    return "-DCAKE_IMAGES=" + "".join(f'CAKE_IMAGE({i},"{image}")'
                                      for i, image in enumerate(images))


@dataclasses.dataclass(frozen=True)
class Tools:
    """The compilers a build uses."""

    nvcc: str | None
    """nvcc, for CUDA programs' images (None: no CUDA program can be built)."""
    cxx: str
    """The host C++ compiler, for every program's host library."""
    python: str = sys.executable
    """The Python that runs the pinned Triton, for Triton programs' images."""
    ptxas: str | None = None
    """The CUDA toolkit's ptxas, for Triton programs' cubins (None: Triton's own)."""
    fatbinary: str | None = None
    """The CUDA toolkit's fatbinary, which compresses Triton programs' cubins (None: embedded
    uncompressed)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of a program as the build sees it."""

    role: str
    path: str


def image_path(work_dir: str, library: str, arch: str, role: str, kind: str) -> str:
    """Where the image of one kernel source is written (a fatbin, or a Triton cubin)."""
    suffix = "cubin" if kind == "triton" else "fatbin"
    return str(Path(work_dir) / f"{library}_{arch}.{role}.{suffix}")


def library_steps(tools: Tools, *, kind: str, library: str, digest: str, arch: str,
                  include_dir: str, flags: Sequence[str], sources: Sequence[Source],
                  work_dir: str, output: str) -> list[list[str]]:
    """The commands that build ``output`` (``<library>_<arch>.so``), in order.

    Intermediate files (images, Triton launch headers) go to ``work_dir``.
    """
    kernels = [s for s in sources if s.role != "binding"]
    binding = [s for s in sources if s.role == "binding"]
    if len(binding) != 1 or not kernels:
        raise ValueError(f"{library}: a program has one binding and at least one kernel source")
    steps, images, includes = [], [], []
    for source in kernels:
        image = image_path(work_dir, library, arch, source.role, kind)
        images.append(image)
        if kind == "triton":
            cubin, stem = image, image[: -len(".cubin")]
            includes += ["-include", stem + ".h"]
            steps.append([tools.python, str(Path(__file__).with_name("triton_aot.py")),
                          "--source", source.path, "--include-dir", include_dir,
                          "--arch", arch, "--role", source.role, "--cubin", cubin,
                          "--header", stem + ".h", *(f"--flag={f}" for f in flags),
                          *(["--ptxas", tools.ptxas] if tools.ptxas else [])])
            if tools.fatbinary:
                images[-1] = stem + ".fatbin"
                steps.append([tools.fatbinary, f"--create={images[-1]}",
                              f"--image3=kind=elf,sm={arch[3:]},file={cubin}",
                              *FATBINARY_COMPRESSION])
        else:
            if tools.nvcc is None:
                raise ValueError(f"{library}: a CUDA program needs nvcc")
            steps.append([tools.nvcc, *device_flags(arch), f"-I{include_dir}",
                          digest_define(digest), *flags, source.path, "-o", image])
    defines = [f"-DCAKE_IMAGE_COUNT={len(images)}", images_define(images)]
    steps.append([tools.cxx, *HOST_FLAGS, f"-I{include_dir}", digest_define(digest), *defines,
                  *includes, "-x", "c++", binding[0].path, "-o", output])
    return steps


# --------------------------------------------------------------------------- finding tools


def find_nvcc() -> str | None:
    """nvcc from ``$CUDA_HOME/bin`` first, then from PATH (the CMake build searches the same)."""
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nvcc")


def _toolkit_tool(name: str) -> str | None:
    """A CUDA toolkit program: ``$CUDA_HOME/bin`` first, then PATH."""
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def find_ptxas() -> str | None:
    """The toolkit's ptxas. Triton programs' cubins come from it, so that the driver the toolkit
    supports loads them (Triton bundles a newer ptxas)."""
    return _toolkit_tool("ptxas")


def find_fatbinary() -> str | None:
    """The toolkit's fatbinary, which compresses Triton programs' cubins."""
    return _toolkit_tool("fatbinary")


def find_cxx() -> str | None:
    """The host C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on PATH."""
    configured = os.environ.get("CXX")
    if configured:
        return shutil.which(configured) or (configured if os.access(configured, os.X_OK) else None)
    return shutil.which("c++") or shutil.which("g++")


def tool_version(tool: str) -> str:
    """The version a compiler prints (``13.0.88`` for nvcc, ``12.2.0`` for g++)."""
    output = subprocess.run([tool, "--version"], capture_output=True, text=True,
                            check=True).stdout
    match = (re.search(r"V(\d+\.\d+\.\d+)", output) or re.search(r"release (\d+\.\d+)", output)
             or re.search(r"(\d+\.\d+\.\d+)", output))
    if not match:
        raise RuntimeError(f"{tool} --version printed no version: {output.strip()!r}")
    return match.group(1)


def record_step(python: str, lib_dir: str, libraries: Sequence[str]) -> list[str]:
    """The command that writes a package's build record (trust.py: ``lib/libraries.json``) once
    its libraries are built: the loader checks each library's bytes against it."""
    return [python, str(Path(__file__).with_name("trust.py")), "record", lib_dir, *libraries]


def nvcc_supported_arches(nvcc: str, candidates: Sequence[str] = DEFAULT_BUILD_ARCHES) -> list[str]:
    """Which of ``candidates`` ``nvcc`` can compile (``nvcc --list-gpu-code``).

    nvcc lists ``sm_90``, ``sm_100``, ...; an ``sm_<NN>a`` arch is supported when ``sm_<NN>``
    is listed. Raises OSError or subprocess.CalledProcessError when nvcc cannot be run.
    """
    listed = subprocess.run([nvcc, "--list-gpu-code"], check=True, capture_output=True,
                            text=True).stdout.split()
    return [arch for arch in candidates if arch in listed or arch[:-1] in listed]
