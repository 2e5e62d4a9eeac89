"""One-time compiles of shipped program sources into a content-keyed cache.

Cache entries live at ``$CAKE_CACHE_DIR/<arch>/<toolchain>/<digest>/<library>_<arch>.so``
(default ``~/.cache/cake``, created with mode 0700), where ``<toolchain>`` names the compilers,
their versions, the host's machine and a hash of the build flags
(``nvcc-13.0.88-x86_64-c++-12.2.0-<hash>``; ``triton-3.9.0-ptxas-13.0.88-aarch64-c++-12.2.0-<hash>``:
x86_64 and Grace nodes sharing a home folder keep apart entries), with the library's sha256 beside it
(``.so.sha256``). The cache is used only when this user owns
it and nobody else can write to it (:func:`trust.check_private`). A compile holds an exclusive
``flock`` on the entry's lock file (opened without following links), which the kernel releases
if the process dies, builds in a private temporary folder with the build's own commands
(:func:`toolchain.library_steps`) and publishes the library, then its sha256, each fsynced and
renamed into place: concurrent processes compile a program once, a killed compile leaves nothing
that a later call could load, and an entry whose bytes differ from its sha256 is compiled again.
"""

from __future__ import annotations

import fcntl
import functools
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import manifest as mf
from . import toolchain as tc
from . import triton_aot
from . import trust


def lock_timeout_s() -> float:
    """Seconds to wait for another process's compile (``CAKE_JIT_LOCK_TIMEOUT``, default 900)."""
    text = os.environ.get("CAKE_JIT_LOCK_TIMEOUT", "900")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"CAKE_JIT_LOCK_TIMEOUT: expected a finite number of seconds >= 0, "
                         f"got {text!r}")
    return value


def jit_allowed() -> bool:
    return os.environ.get("CAKE_JIT", "1") != "0"


def cache_root() -> Path:
    configured = os.environ.get("CAKE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "cake"


find_nvcc = tc.find_nvcc


@functools.lru_cache(maxsize=None)
def compiler_version(tool: str) -> str:
    """A compiler's version (part of the cache key), asked once per process."""
    return tc.tool_version(tool)


def unavailable_reason(program: mf.Program | None = None) -> str | None:
    """Why a JIT compile (of ``program``; None: of a CUDA program) cannot happen here, or None."""
    if not jit_allowed():
        return "CAKE_JIT=0 forbids compiling"
    if tc.find_cxx() is None:
        return "no host C++ compiler ($CXX, c++ or g++) was found to compile it"
    if program is not None and program.kind == "triton":
        return triton_aot.unavailable_reason(program.flags)
    if find_nvcc() is None:
        return "no nvcc was found in $CUDA_HOME/bin or on PATH to compile it"
    return None


def toolchain_key(program: mf.Program) -> str:
    """The compilers a cached library was built with and a hash of the build's flags, as a
    folder name: a cake-train that builds otherwise never loads another's library."""
    cxx = tc.find_cxx()
    host = f"{platform.machine()}-c++-{compiler_version(cxx)}-{tc.flags_hash()}"
    if program.kind == "triton":
        ptxas = tc.find_ptxas()
        assembler = f"ptxas-{compiler_version(ptxas)}" if ptxas else "ptxas-triton"
        if tc.find_fatbinary():  # the same images, compressed
            assembler += "-fatbin"
        return f"triton-{triton_aot.installed_version()}-{assembler}-{host}"
    return f"nvcc-{compiler_version(find_nvcc())}-{host}"


def entry_dir(program: mf.Program, arch: str) -> Path:
    return cache_root() / arch / toolchain_key(program) / program.digest


def cached(program: mf.Program, arch: str) -> tuple[Path, str] | None:
    """The cached library for (digest, arch, toolchain) and its recorded sha256, if one was
    published in a cache this user can trust (else raises trust.Untrusted)."""
    try:
        directory = entry_dir(program, arch)
    except (OSError, subprocess.SubprocessError, RuntimeError, TypeError, ValueError):
        return None  # a compiler is missing or broken: nothing can have been cached with it
    trust.check_private(cache_root(), directory)
    path = directory / f"{program.library}_{arch}.so"
    record = path.with_name(path.name + ".sha256")
    if not path.is_file() or not record.is_file():
        return None
    return path, record.read_text().strip()


def discard(path: Path) -> None:
    """Removes a cache entry's library and its record (they failed the check before loading)."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".sha256").unlink(missing_ok=True)


def compile_program(tree: mf.PackageTree, manifest: mf.Manifest, program: mf.Program,
                    arch: str) -> tuple[Path, str, bool]:
    """Compiles ``program`` for ``arch`` into the cache, once across processes.

    Returns the library's path, its sha256 and whether this call compiled it (False when
    another process published it while this one waited for the lock).
    """
    root = cache_root()
    trust.make_private(root)
    directory = entry_dir(program, arch)
    trust.check_private(root, directory)
    trust.make_private(directory)
    trust.check_private(root, directory)
    target = directory / f"{program.library}_{arch}.so"
    record = target.with_name(target.name + ".sha256")
    with _exclusive(directory / "lock"):
        if target.is_file() and record.is_file():  # published while we waited
            return target, record.read_text().strip(), False
        for stale in directory.glob("*.tmp"):  # left by a compile that was killed
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        _verify_sources(tree, manifest, program)
        sys.stderr.write(f"cake: compiling {program.library} ({program.kind}) for {arch} "
                         f"(one-time; cached in {directory})\n")
        sys.stderr.flush()
        work = Path(tempfile.mkdtemp(prefix=f"build.{os.getpid()}.", suffix=".tmp",
                                     dir=directory))
        try:
            output = work / target.name
            for step in build_steps(tree, program, arch, work, output):
                result = subprocess.run(step, capture_output=True, text=True)
                if result.returncode != 0:
                    raise RuntimeError(
                        f"compiling {program.library} for {arch} failed ({result.returncode}):\n"
                        f"  {' '.join(step)}\n{(result.stderr or result.stdout).strip()}")
            data = output.read_bytes()
            sha256 = mf.sha256_hex(data)
            trust.write_durably(target, data, mode=0o700)
            trust.write_durably(record, f"{sha256}\n".encode())
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target, sha256, True


def build_steps(tree: mf.PackageTree, program: mf.Program, arch: str, work_dir: Path,
                output: Path) -> list[list[str]]:
    """The commands that build ``program`` for ``arch`` into ``output``: the AOT build's own."""
    tools = tc.Tools(nvcc=find_nvcc(), cxx=tc.find_cxx(), python=sys.executable,
                     ptxas=tc.find_ptxas(), fatbinary=tc.find_fatbinary())
    return tc.library_steps(
        tools, kind=program.kind, library=program.library, digest=program.digest, arch=arch,
        include_dir=str(tree.include_dir), flags=program.flags,
        sources=[tc.Source(s.role, str(tree.source_path(s))) for s in program.sources],
        work_dir=str(work_dir), output=str(output))


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
        timeout = lock_timeout_s()
        # Never through a link: another user could point it at a file of ours.
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600)
        self.file = os.fdopen(descriptor, "r+b")
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
