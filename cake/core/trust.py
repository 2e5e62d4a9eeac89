"""What a library file must pass before any of its code runs.

``dlopen`` runs a library's ELF constructors, so a library is checked before it is loaded, not
after: its bytes are read once, hashed and compared with the sha256 recorded for it (the
package's build record, ``lib/libraries.json``, for a prebuilt library; the cache entry's record
for a JIT-compiled one), their ELF header must be this machine's, and the very bytes checked are
what is loaded (through an anonymous in-memory file, so the file cannot change between the check
and the load). The digest and ABI version the library reports stay a second check, after.

A JIT cache is used only when the current user owns every folder of it and nobody else can write
to them, and its parent is not writable by others unless sticky (as ``/tmp`` is): otherwise
another user could plant a library there. Standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import stat
from pathlib import Path

RECORD_NAME = "libraries.json"
RECORD_SCHEMA = 1
# ELF machine numbers (e_machine) of the hosts cake-train builds for.
_MACHINES = {"x86_64": 62, "aarch64": 183}
# Descriptors of the in-memory files libraries were loaded from: kept open for the process, so
# that no later library gets the same /proc/self/fd path (dlopen would take it for the first).
_held: list[int] = []


class Untrusted(RuntimeError):
    """A library file or a cache folder that must not be used; says why and what to do."""


# --------------------------------------------------------------------------- records


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_record(lib_dir: Path, libraries: list[Path]) -> Path:
    """The build's record of its libraries' sha256, ``<lib_dir>/libraries.json``."""
    record = {"schema": RECORD_SCHEMA,
              "libraries": {Path(p).name: sha256_file(p) for p in sorted(libraries)}}
    path = Path(lib_dir) / RECORD_NAME
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path


def read_record(lib_dir: Path) -> dict | None:
    """``{file name: sha256}`` of a package's build record, None when it has none. Raises
    Untrusted for a record that cannot be read as one."""
    path = Path(lib_dir) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        libraries = record["libraries"]
        valid = record.get("schema") == RECORD_SCHEMA and isinstance(libraries, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in libraries.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        valid = False
    if not valid:
        raise Untrusted(f"{path}: not a build record of cake-train libraries; reinstall cake-train")
    return libraries


# --------------------------------------------------------------------------- loading


def elf_problem(data: bytes) -> str | None:
    """Why ``data`` is not a 64-bit little-endian ELF shared library for this machine."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return "it is not an ELF file"
    if data[4] != 2 or data[5] != 1:
        return "it is not a 64-bit little-endian ELF file"
    machine = int.from_bytes(data[18:20], "little")
    wanted = _MACHINES.get(platform.machine())
    if wanted is not None and machine != wanted:
        return f"it is built for ELF machine {machine}, this host is {platform.machine()}"
    if int.from_bytes(data[16:18], "little") != 3:  # ET_DYN
        return "it is not a shared library"
    return None


def load(path: Path, sha256: str, remedy: str) -> ctypes.CDLL:
    """Loads the library at ``path`` if its bytes have ``sha256`` and are a shared library for
    this machine; raises Untrusted naming the file, what is wrong and ``remedy`` otherwise."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Untrusted(f"{path}: cannot read it ({exc.strerror or exc}); {remedy}") from None
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise Untrusted(f"{path}: refused before loading: its sha256 is {found}, the record says "
                        f"{sha256} ({len(data)} bytes); {remedy}")
    problem = elf_problem(data)
    if problem:
        raise Untrusted(f"{path}: refused before loading: {problem}; {remedy}")
    return _load_bytes(data, path)


def _load_bytes(data: bytes, path: Path) -> ctypes.CDLL:
    """dlopen of exactly ``data``: from an anonymous in-memory file where the system has them
    (Linux: memfd and /proc), else from ``path``, which was just read."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None or not os.path.isdir("/proc/self/fd"):
        return ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    descriptor = memfd_create(path.name, getattr(os, "MFD_CLOEXEC", 0))
    try:
        os.write(descriptor, data)
        handle = ctypes.CDLL(f"/proc/self/fd/{descriptor}", mode=ctypes.RTLD_LOCAL)
    except BaseException:
        os.close(descriptor)
        raise
    _held.append(descriptor)
    return handle


# --------------------------------------------------------------------------- cache folders


def check_private(root: Path, inner: Path | None = None) -> None:
    """The JIT cache ``root`` (and each folder from it down to ``inner``) is the current user's
    and writable by nobody else, and root's parent is not writable by others unless sticky.
    Raises Untrusted, as ssh does for keys."""
    root = Path(root)
    uid = os.getuid()
    folders = [root]
    if inner is not None:
        relative = Path(inner).relative_to(root)
        for part in relative.parts:
            folders.append(folders[-1] / part)
    for folder in folders:
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode):
            raise Untrusted(f"JIT cache {folder} is a symbolic link; refusing it. Remedy: remove "
                            "it, or set CAKE_CACHE_DIR to a private folder")
        if info.st_uid != uid:
            raise Untrusted(f"JIT cache {folder} belongs to uid {info.st_uid}, not to this user "
                            f"({uid}); refusing to load or write libraries there. Remedy: set "
                            "CAKE_CACHE_DIR to a folder of your own")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Untrusted(f"JIT cache {folder} is writable by group or others (mode "
                            f"{stat.S_IMODE(info.st_mode):o}); refusing it. Remedy: chmod go-w "
                            f"{folder}, or set CAKE_CACHE_DIR to a private folder")
    parent = root.parent
    try:
        info = os.stat(parent)
    except FileNotFoundError:
        return
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise Untrusted(f"JIT cache {root}: its parent {parent} is writable by others and not "
                        "sticky, so another user could replace the cache. Remedy: set "
                        "CAKE_CACHE_DIR to a folder in a private place")


def make_private(folder: Path) -> None:
    """Creates ``folder`` and its missing parents, each with mode 0700 (whatever the umask)."""
    folder = Path(folder)
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it meanwhile: check_private judges it
        os.chmod(path, 0o700)


def write_durably(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` gets ``data`` all at once: written to a private temporary file, fsynced, renamed."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


if __name__ == "__main__":  # the build's record step: trust.py record LIB_DIR LIBRARY...
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "record":
        sys.exit("usage: trust.py record LIB_DIR LIBRARY...")
    print(f"cake-train: recorded {len(sys.argv) - 3} libraries in "
          f"{write_record(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])}")
