"""One-time compiles of shipped program sources into a content-keyed cache (SPEC section 5).

Cache entries live at ``$CAKE_CACHE_DIR/<arch>/nvcc-<version>/<digest>/<library>_<arch>.so``
(default ``~/.cache/cake``). A compile holds an exclusive ``flock`` on the entry's lock file,
which the kernel releases if the process dies, writes to a temporary file and publishes it
with an atomic rename: concurrent processes compile a program once, and a killed compile
leaves nothing that a later call could load.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import manifest as mf
from .compile_flags import nvcc_command



def lock_timeout_s() -> float:
    """Seconds to wait for another process's compile (``CAKE_JIT_LOCK_TIMEOUT``, default 900)."""
    text = os.environ.get("CAKE_JIT_LOCK_TIMEOUT", "900")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"CAKE_JIT_LOCK_TIMEOUT: expected seconds, got {text!r}") from None


def jit_allowed() -> bool:
    return os.environ.get("CAKE_JIT", "1") != "0"


def cache_root() -> Path:
    configured = os.environ.get("CAKE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "cake"


def find_nvcc() -> str | None:
    """nvcc from ``$CUDA_HOME/bin`` first, then from PATH (the CMake build searches the same)."""
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """``13.0.88``-style version of an nvcc binary (part of the cache key)."""
    output = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                            check=True).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", output) or re.search(r"release (\d+\.\d+)", output)
    if not match:
        raise RuntimeError(f"{nvcc} --version printed no version: {output.strip()!r}")
    return match.group(1)


def unavailable_reason() -> str | None:
    """Why a JIT compile cannot happen here, or None when it can."""
    if not jit_allowed():
        return "CAKE_JIT=0 forbids compiling"
    if find_nvcc() is None:
        return "no nvcc was found in $CUDA_HOME/bin or on PATH to compile it"
    return None


def entry_dir(program: mf.Program, arch: str, nvcc: str) -> Path:
    return cache_root() / arch / f"nvcc-{nvcc_version(nvcc)}" / program.digest


def cached_path(program: mf.Program, arch: str) -> Path | None:
    """The cached library for (digest, arch, nvcc version), if one was published."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    path = entry_dir(program, arch, nvcc) / f"{program.library}_{arch}.so"
    return path if path.is_file() else None


def compile_program(tree: mf.PackageTree, manifest: mf.Manifest, program: mf.Program,
                    arch: str) -> tuple[Path, bool]:
    """Compiles ``program`` for ``arch`` into the cache, once across processes.

    Returns the library's path and whether this call compiled it (False when another
    process published it while this one waited for the lock).
    """
    nvcc = find_nvcc()
    directory = entry_dir(program, arch, nvcc)
    target = directory / f"{program.library}_{arch}.so"
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory / "lock"):
        if target.is_file():  # another process published it while we waited
            return target, False
        for stale in directory.glob("*.tmp"):
            stale.unlink()  # left by a compile that was killed
        _verify_sources(tree, manifest, program)
        temporary = directory / f"{target.name}.{os.getpid()}.tmp"
        sys.stderr.write(f"cake: compiling {program.library} for {arch} with {nvcc} "
                         f"(one-time; cached in {directory})\n")
        sys.stderr.flush()
        command = compile_command(nvcc, tree, program, arch, temporary)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            temporary.unlink(missing_ok=True)
            raise RuntimeError(f"nvcc failed ({result.returncode}) compiling {program.library} "
                               f"for {arch}:\n  {' '.join(command)}\n{result.stderr.strip()}")
        os.replace(temporary, target)
    return target, True


def compile_command(nvcc: str, tree: mf.PackageTree, program: mf.Program, arch: str,
                    output: Path) -> list[str]:
    return nvcc_command(nvcc, arch, program.digest, str(tree.include_dir), program.flags,
                        [str(tree.source_path(s)) for s in program.sources], str(output))


def _verify_sources(tree: mf.PackageTree, manifest: mf.Manifest, program: mf.Program) -> None:
    """Refuses to compile bytes that are not the program the manifest names."""
    files = [(tree.source_path(s), s.sha256) for s in program.sources]
    files += [(tree.header_path(h), manifest.header(h).sha256) for h in program.headers]
    for path, sha256 in files:
        if mf.sha256_hex(path.read_bytes()) != sha256:
            raise RuntimeError(f"{path}: refused to compile: its bytes differ from the manifest "
                               f"(program {program.library}); reinstall cake-train")


class _exclusive:
    """An exclusive ``flock`` with a timeout; the kernel drops it if the holder dies."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "a+")
        timeout = lock_timeout_s()
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.file.close()
                    raise TimeoutError(f"waited {timeout:.0f} s for the JIT lock "
                                       f"{self.path} (another process is compiling; set "
                                       "CAKE_JIT_LOCK_TIMEOUT to wait longer)") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()
