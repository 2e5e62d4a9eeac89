"""The runtime loader (SPEC section 5): the right, verified library for the GPU in front of us.

For a program and a device the loader uses, in order, the prebuilt library shipped in the
package (``<package>/lib/<library>_<arch>.so``), a library in the JIT cache, or a JIT compile
of the shipped sources. Every library is checked before first use: its embedded digest and
ABI version must match the manifest, otherwise it is refused. Loaded libraries and resolved
entries are cached per process, so a call's host path touches no file after the first load.

Standard library only: the device is queried through the CUDA driver with ctypes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from pathlib import Path
from typing import Sequence

from . import jit
from . import manifest as mf

# Must equal CAKE_ABI_VERSION in csrc/include/cake/program.h (a test keeps them together).
ABI_VERSION = 1
_ERROR_BYTES = 1024


class ProgramUnavailable(RuntimeError):
    """No library of this program can run on this device; raised before any launch."""


class LibraryRefused(RuntimeError):
    """A library file is not the program the manifest names (digest or ABI mismatch)."""


# --------------------------------------------------------------------------- devices


@dataclasses.dataclass(frozen=True)
class Device:
    index: int
    name: str
    capability: tuple[int, int]

    @property
    def arch(self) -> str | None:
        return mf.ARCH_BY_CAPABILITY.get(self.capability)

    def describe(self) -> str:
        major, minor = self.capability
        return f"GPU {self.index} ({self.name}, compute capability {major}.{minor})"


class _Driver:
    """The few CUDA driver calls the loader needs, through ctypes (no torch, no cudart)."""

    _CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ProgramUnavailable(
                f"cannot load the NVIDIA driver (libcuda.so.1): {exc}; "
                "cake-train needs an NVIDIA GPU and its driver") from None
        self._call("cuInit", ctypes.c_uint(0))

    def _call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise ProgramUnavailable(f"CUDA driver call {name} failed with error {status}")

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def device(self, index: int) -> Device:
        handle, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(index))
        self._call("cuDeviceGetAttribute", ctypes.byref(major), self._CC_MAJOR, handle)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), self._CC_MINOR, handle)
        name = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", name, ctypes.c_int(256), handle)
        return Device(index, name.value.decode(), (major.value, minor.value))

    def version(self) -> str:
        version = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(version))
        return f"{version.value // 1000}.{version.value % 1000 // 10}"


_driver: _Driver | None = None
_devices: dict[int, Device] = {}
_lock = threading.RLock()


def driver() -> _Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


def device(index: int) -> Device:
    """The device with this CUDA ordinal (as torch numbers it), cached per process."""
    found = _devices.get(index)
    if found is None:
        with _lock:
            found = _devices.setdefault(index, driver().device(index))
    return found


# --------------------------------------------------------------------------- libraries


_MAX_ARGS = 64  # more than any entry takes (the RMSNorm backward takes 17)


class _ThreadBuffers(threading.local):
    """Each thread's argument array and message buffer for the entries, made once per thread:
    ctypes releases the GIL during a call, so threads must not share them."""

    def __init__(self):
        self.args = (ctypes.c_int64 * _MAX_ARGS)()
        self.args_address = ctypes.addressof(self.args)
        self.error = ctypes.create_string_buffer(_ERROR_BYTES)  # filled only on failure
        self.error_address = ctypes.addressof(self.error)


_buffers = _ThreadBuffers()


class Entry:
    """One C entry of a loaded program: ``entry(args, stream)`` launches or raises.

    This is the hot path of every call: the arguments are copied into the thread's int64 array
    and the array, stream and message buffer pass as plain addresses (``c_void_p``), so a call is
    one slice assignment and one ctypes call, with no ctypes object built per call.
    """

    __slots__ = ("_function", "_name")

    def __init__(self, function, name: str):
        function.argtypes = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int32)
        function.restype = ctypes.c_int
        self._function = function
        self._name = name

    def __call__(self, args: Sequence[int], stream: int) -> None:
        buffers = _buffers
        count = len(args)
        if count > _MAX_ARGS:
            raise ValueError(f"{self._name}: {count} arguments, more than {_MAX_ARGS}")
        buffers.args[:count] = args
        status = self._function(buffers.args_address, count, stream, buffers.error_address,
                                _ERROR_BYTES)
        if status != 0:
            message = buffers.error.value.decode("utf-8", "replace") or f"status {status}"
            raise RuntimeError(f"{self._name}: {message}")


class Library:
    """A verified, loaded program library."""

    def __init__(self, program: mf.Program, path: Path, origin: str):
        self.program = program
        self.path = path
        self.origin = origin
        self._handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        self._entries: dict[str, Entry] = {}
        self._verify()

    def _symbol(self, name: str):
        try:
            return getattr(self._handle, f"{self.program.library}_{name}")
        except AttributeError:
            raise LibraryRefused(f"{self.path}: refused: it does not export "
                                 f"{self.program.library}_{name}, so it is not program "
                                 f"{self.program.library}") from None

    def _verify(self) -> None:
        digest_fn, abi_fn = self._symbol("digest"), self._symbol("abi_version")
        digest_fn.restype, digest_fn.argtypes = ctypes.c_char_p, ()
        abi_fn.restype, abi_fn.argtypes = ctypes.c_int, ()
        embedded = (digest_fn() or b"").decode("ascii", "replace")
        if embedded != self.program.digest:
            raise LibraryRefused(f"{self.path}: refused: it embeds digest {embedded!r} but the "
                                 f"manifest names {self.program.digest}; rebuild or reinstall")
        abi = abi_fn()
        if abi != ABI_VERSION:
            raise LibraryRefused(f"{self.path}: refused: ABI version {abi}, this cake-train "
                                 f"needs {ABI_VERSION}; rebuild or reinstall")

    def entry(self, name: str) -> Entry:
        """The C entry ``<library>_<name>``, resolved once."""
        found = self._entries.get(name)
        if found is None:
            found = self._entries[name] = Entry(self._symbol(name),
                                                f"{self.program.library}_{name}")
        return found


def embedded_digest(path: Path, library: str) -> str:
    """The digest a library file embeds (for ``selftest`` and tests); loads the file."""
    handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    try:
        function = getattr(handle, f"{library}_digest")
    except AttributeError:
        raise LibraryRefused(f"{path}: does not export {library}_digest, so it is not "
                             f"program {library}") from None
    function.restype, function.argtypes = ctypes.c_char_p, ()
    return function().decode("ascii", "replace")


# --------------------------------------------------------------------------- program sets


class ProgramSet:
    """The programs of one family package and the libraries loaded for them."""

    _instances: dict[Path, "ProgramSet"] = {}

    @classmethod
    def for_package(cls, package_dir: Path) -> "ProgramSet":
        package_dir = Path(package_dir)
        found = cls._instances.get(package_dir)
        if found is None:
            with _lock:
                found = cls._instances.setdefault(package_dir, cls(package_dir))
        return found

    def __init__(self, package_dir: Path):
        self.package_dir = Path(package_dir)
        self.tree = _tree_for(self.package_dir)
        self._manifest: mf.Manifest | None = None
        self._libraries: dict[tuple[str, str], Library] = {}

    @property
    def manifest(self) -> mf.Manifest:
        if self._manifest is None:
            try:
                self._manifest = mf.read(self.tree.manifest_path)
            except mf.ManifestError as exc:
                raise RuntimeError(f"unusable manifest: {exc}") from None
        return self._manifest

    def prebuilt_path(self, program: mf.Program, arch: str) -> Path:
        return self.package_dir / "lib" / f"{program.library}_{arch}.so"

    def state(self, program: mf.Program, arch: str | None) -> str:
        """``prebuilt``, ``cached``, ``would compile`` or ``unsupported`` (for ``cake info``)."""
        if arch is None or arch not in program.arches:
            return "unsupported"
        if self.prebuilt_path(program, arch).is_file():
            return "prebuilt"
        if jit.cached_path(program, arch) is not None:
            return "cached"
        return "would compile" if jit.unavailable_reason() is None else "unsupported"

    def library(self, program: mf.Program, device_index: int) -> Library:
        """The verified library of ``program`` for GPU ``device_index``; loads it once."""
        target = device(device_index)
        arch = target.arch
        found = self._libraries.get((program.library, arch))
        if found is not None:
            return found
        with _lock:
            found = self._libraries.get((program.library, arch))
            if found is None:
                found = self._load(program, target)
                self._libraries[(program.library, arch)] = found
        return found

    def _load(self, program: mf.Program, target: Device) -> Library:
        arch = select_arch(target.capability, program.arches)
        if arch is None:
            raise ProgramUnavailable(unsupported_message(program, target))
        prebuilt = self.prebuilt_path(program, arch)
        if prebuilt.is_file():
            return Library(program, prebuilt, "prebuilt")
        cached = jit.cached_path(program, arch)
        if cached is not None:
            return Library(program, cached, "cached")
        reason = jit.unavailable_reason()
        if reason is not None:
            raise ProgramUnavailable(
                f"{program.library} (built for {', '.join(program.arches)}): no prebuilt "
                f"library for {arch} on {target.describe()} and {reason}. Remedy: install a cake-train wheel built for {arch} "
                f"(CAKE_CUDA_ARCHS={arch} pip install ...), or allow the one-time compile "
                "(unset CAKE_JIT, put nvcc on PATH or set CUDA_HOME)")
        path, compiled = jit.compile_program(self.tree, self.manifest, program, arch)
        return Library(program, path, "compiled" if compiled else "cached")


def unsupported_message(program: mf.Program, target: Device) -> str:
    arch = target.arch or "none (no cake-train arch for this capability)"
    known = ", ".join(f"{a} ({c[0]}.{c[1]})" for c, a in mf.ARCH_BY_CAPABILITY.items())
    return (f"{program.library} cannot run on {target.describe()}: its arch is {arch}, and the "
            f"program is built for {', '.join(program.arches)}. Remedy: run on a GPU of one of "
            f"those arches (known arches: {known}), or add {target.arch or 'its arch'} to the "
            "family's table and rebuild cake-train")


def select_arch(capability: tuple[int, int], arches: Sequence[str]) -> str | None:
    """The arch a device of ``capability`` runs among ``arches``: exact match only (``a`` builds)."""
    arch = mf.ARCH_BY_CAPABILITY.get(tuple(capability))
    return arch if arch in arches else None


def _tree_for(package_dir: Path) -> mf.PackageTree:
    """Installed/vendored layout if ``build.json`` is there, else the repository checkout."""
    if (package_dir / mf.MANIFEST_NAME).is_file():
        return mf.package_tree(package_dir)
    root = package_dir.parent.parent
    tree = mf.repository_tree(root, package_dir.name)
    if not tree.manifest_path.is_file():
        raise RuntimeError(f"{package_dir}: no {mf.MANIFEST_NAME} and no "
                           f"{tree.manifest_path}: the package is incomplete; reinstall it")
    return tree
