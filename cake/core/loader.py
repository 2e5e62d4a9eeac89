"""The runtime loader (docs/loader.md): the right, verified library for the GPU in front of us.

For a program and a device the loader uses, in order, the prebuilt library shipped in the
package (``<package>/lib/<library>_<arch>.so``), a library in the JIT cache, or a JIT compile
of the shipped sources. Every library is checked before any of its code runs (trust.py: its
bytes against the sha256 the package's build record or the cache entry holds, its ELF header),
and after loading its embedded digest and ABI version must match the manifest; otherwise it is
refused (a cache entry that fails is compiled again). Loaded libraries and resolved entries are
cached per process, so a call's host path touches no file after the first load.

Standard library only: the device is queried through the CUDA driver with ctypes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import threading
from pathlib import Path
from typing import Sequence

from . import jit
from . import manifest as mf
from . import triton_aot
from . import trust

# Must equal CAKE_ABI_VERSION in csrc/include/cake/program.h (a test keeps them together).
ABI_VERSION = 2
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


_MAX_ARGS = 64  # more than any entry takes


class _ThreadBuffers(threading.local):
    """Each thread's argument array and message buffer for the entries, made once per thread:
    ctypes releases the GIL during a call, so threads must not share them."""

    def __init__(self):
        self.args = (ctypes.c_int64 * _MAX_ARGS)()
        self.args_address = ctypes.addressof(self.args)
        self.error = ctypes.create_string_buffer(_ERROR_BYTES)  # filled only on failure
        self.error_address = ctypes.addressof(self.error)


_buffers = _ThreadBuffers()
_F32 = struct.Struct("<f")
_I32 = struct.Struct("<i")
_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


def _pointer(value) -> int:
    if value is None:
        return 0
    return value if isinstance(value, int) else value.data_ptr()


def _f32_bits(value) -> int:
    return _I32.unpack(_F32.pack(value))[0]


def _f64_bits(value) -> int:
    return _I64.unpack(_F64.pack(value))[0]


# How a declared argument's value becomes its int64 slot (cake/program.h). Pointers take a
# tensor (its data_ptr), None (0) or an address; integers pass as they are (the entry checks an
# i32's range); floats pass as their fp32 or fp64 bits.
_SLOT = {"pointer": _pointer, "i32": int, "i64": int, "f32": _f32_bits, "f64": _f64_bits}


class Entry:
    """One declared C entry of a loaded program: ``entry(stream, **arguments)`` launches or
    raises, the arguments named and converted as the manifest declares them.

    A call site that runs per training step binds it once instead (:meth:`bind`): the values
    fixed per problem go in once, and each call passes only what changes (the tensors).
    """

    __slots__ = ("_function", "_name", "declaration", "names", "_slots")

    def __init__(self, function, name: str, declaration: mf.Entry):
        function.argtypes = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int32)
        function.restype = ctypes.c_int
        self._function = function
        self._name = name
        self.declaration = declaration
        self.names = tuple(a.name for a in declaration.args)
        self._slots = tuple(_SLOT[a.kind] for a in declaration.args)
        if len(self.names) > _MAX_ARGS:
            raise LibraryRefused(f"{name}: declares {len(self.names)} arguments, more than "
                                 f"{_MAX_ARGS}")

    def __call__(self, stream: int, /, **arguments) -> None:
        self.launch(self.pack(arguments), stream)

    def pack(self, arguments) -> list:
        """The int64 slots of a call from its named arguments (every declared one, no other)."""
        if arguments.keys() != set(self.names):
            missing = [n for n in self.names if n not in arguments]
            extra = sorted(set(arguments) - set(self.names))
            raise TypeError(f"{self._name}: missing arguments {missing}, unknown {extra}; it "
                            f"declares {list(self.names)}")
        return [convert(arguments[n]) for n, convert in zip(self.names, self._slots)]

    def bind(self, per_call: tuple, **fixed) -> "BoundEntry":
        """A call with ``fixed`` values in place, taking the ``per_call`` arguments (names)
        positionally: ``bound(stream, *values)``."""
        unknown = [n for n in per_call if n not in self.names]
        if unknown or len(set(per_call)) != len(per_call):
            raise TypeError(f"{self._name}: bind's per-call arguments {list(per_call)} must be "
                            f"distinct declared arguments of {list(self.names)}")
        template = self.pack({**fixed, **{n: 0 for n in per_call}})
        positions = tuple(self.names.index(n) for n in per_call)
        return BoundEntry(self, template, positions,
                          tuple(None if self._slots[p] is _pointer else self._slots[p]
                                for p in positions))

    def launch(self, values: list, stream: int) -> None:
        buffers = _buffers
        count = len(values)
        buffers.args[:count] = values
        status = self._function(buffers.args_address, count, stream, buffers.error_address,
                                _ERROR_BYTES)
        if status != 0:
            message = buffers.error.value.decode("utf-8", "replace") or f"status {status}"
            raise RuntimeError(f"{self._name}: {message}")


class BoundEntry:
    """An :class:`Entry` with its per-problem values fixed: ``bound(stream, *values)``, the
    values of the per-call arguments in the order :meth:`Entry.bind` was given.

    This runs on every launch: a pointer (a tensor, None or an address, the usual per-call
    value) is converted inline, and only other kinds call their conversion (a function call a
    value cost RMSNorm's eager step about a microsecond of host time, docs/benchmarks.md#host-time).
    """

    __slots__ = ("_name", "_launch", "_template", "_positions", "_converts")

    def __init__(self, entry: Entry, template: list, positions: tuple, converts: tuple):
        self._name = entry._name
        self._launch = entry.launch
        self._template = template
        self._positions = positions
        self._converts = converts
        """Per value: None for a pointer, else its kind's conversion."""

    def __call__(self, stream: int, *values) -> None:
        if len(values) != len(self._positions):
            _wrong_count(self._name, len(self._positions), values)
        slots = self._template.copy()
        for position, convert, value in zip(self._positions, self._converts, values):
            if convert is None:
                slots[position] = 0 if value is None else (
                    value if value.__class__ is int else value.data_ptr())
            else:
                slots[position] = convert(value)
        self._launch(slots, stream)


def _wrong_count(name: str, expected: int, values: tuple):
    raise TypeError(f"{name}: expected {expected} per-call values, got {len(values)}")


class Library:
    """A verified, loaded program library: its bytes had ``sha256`` before it was loaded
    (else :class:`LibraryRefused`, with ``remedy``), and it reports the manifest's digest."""

    def __init__(self, program: mf.Program, path: Path, origin: str, sha256: str, remedy: str):
        self.program = program
        self.path = path
        self.origin = origin
        try:
            self._handle = trust.load(path, sha256, remedy)
        except trust.Untrusted as exc:
            raise LibraryRefused(str(exc)) from None
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
        """The declared C entry ``<library>_<name>``, resolved once."""
        found = self._entries.get(name)
        if found is None:
            declaration = self.program.entry(name)
            if declaration is None:
                raise LibraryRefused(f"{self.program.library} declares no entry {name!r} "
                                     f"(it declares {[e.name for e in self.program.entries]})")
            found = self._entries[name] = Entry(self._symbol(name),
                                                f"{self.program.library}_{name}", declaration)
        return found


class InterpretedLibrary:
    """A Triton program run by Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors: the
    same declared entries as its library, each running its kernel function. For tests of a
    Triton family's public API on a machine without a GPU."""

    def __init__(self, program: mf.Program, tree: mf.PackageTree):
        if program.kind != "triton":
            raise ProgramUnavailable(f"{program.library} is a {program.kind} program: only Triton "
                                     "programs run under the interpreter")
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ProgramUnavailable(f"{program.library}: CPU tensors run Triton programs only "
                                     "under Triton's interpreter (set TRITON_INTERPRET=1)")
        self.program = program
        self.origin = "interpreted"
        self._tree = tree
        self._entries: dict[str, InterpretedEntry] = {}

    def entry(self, name: str) -> "InterpretedEntry":
        found = self._entries.get(name)
        if found is None:
            declaration = self.program.entry(name)
            source = self.program.source(f"kernel_{name}")
            if declaration is None or source is None:
                raise LibraryRefused(f"{self.program.library} has no kernel entry {name!r}")
            module = triton_aot.load_source(self._tree.source_path(source), self._tree.include_dir)
            kernel = triton_aot.kernel_of(module, f"kernel_{self.program.library}_{name}")
            found = self._entries[name] = InterpretedEntry(
                kernel, declaration, int(module.NUM_WARPS), int(module.NUM_STAGES))
        return found


class InterpretedEntry:
    """An entry of an :class:`InterpretedLibrary`: the kernel on the grid its first three
    arguments give, with the others passed as they are (tensors, ints, floats)."""

    def __init__(self, kernel, declaration: mf.Entry, num_warps: int, num_stages: int):
        self._kernel = kernel
        self.declaration = declaration
        self.names = tuple(a.name for a in declaration.args)
        self._options = {"num_warps": num_warps, "num_stages": num_stages}

    def __call__(self, stream: int, /, **arguments) -> None:
        if arguments.keys() != set(self.names):
            raise TypeError(f"{self._kernel.__name__}: expected arguments {list(self.names)}, "
                            f"got {sorted(arguments)}")
        values = [arguments[name] for name in self.names]
        grid = tuple(values[:3])
        if 0 in grid:
            return
        self._kernel[grid](*values[3:], **self._options)

    def bind(self, per_call: tuple, **fixed):
        def bound(stream: int, *values) -> None:
            if len(values) != len(per_call):
                _wrong_count(self._kernel.__name__, len(per_call), values)
            self(stream, **fixed, **dict(zip(per_call, values)))
        return bound


def embedded_digest(path: Path, library: str, sha256: str) -> str:
    """The digest a library file embeds (for ``selftest`` and tests); loads the file once its
    bytes have ``sha256``."""
    try:
        handle = trust.load(path, sha256, "reinstall cake-train")
    except trust.Untrusted as exc:
        raise LibraryRefused(str(exc)) from None
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
        self._record: dict | None = None
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

    def record(self) -> dict:
        """The package's build record (``lib/libraries.json``): library file -> sha256."""
        if self._record is None:
            try:
                self._record = trust.read_record(self.package_dir / "lib") or {}
            except trust.Untrusted as exc:
                raise LibraryRefused(str(exc)) from None
        return self._record

    def state(self, program: mf.Program, arch: str | None) -> str:
        """``prebuilt``, ``cached``, ``would compile`` or ``unsupported`` (for ``cake info``)."""
        if arch is None or arch not in program.arches:
            return "unsupported"
        if self.prebuilt_path(program, arch).is_file():
            return "prebuilt"
        try:
            if jit.cached(program, arch) is not None:
                return "cached"
        except trust.Untrusted:
            return "unsupported (untrusted JIT cache)"
        return "would compile" if jit.unavailable_reason(program) is None else "unsupported"

    def interpreted(self, program: mf.Program) -> InterpretedLibrary:
        """``program`` under Triton's interpreter (CPU tensors, ``TRITON_INTERPRET=1``)."""
        key = (program.library, "interpreted")
        found = self._libraries.get(key)
        if found is None:
            with _lock:
                found = self._libraries.setdefault(key, InterpretedLibrary(program, self.tree))
        return found

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
            sha256 = self.record().get(prebuilt.name)
            if sha256 is None:
                raise LibraryRefused(f"{prebuilt}: refused: the package's build record "
                                     f"({trust.RECORD_NAME}) does not list it; reinstall "
                                     "cake-train")
            return Library(program, prebuilt, "prebuilt", sha256, "reinstall cake-train")
        try:
            entry = jit.cached(program, arch)
        except trust.Untrusted as exc:
            raise ProgramUnavailable(str(exc)) from None
        if entry is not None:
            path, sha256 = entry
            try:
                return Library(program, path, "cached", sha256,
                               "remove the cache entry to compile it again")
            except LibraryRefused:
                if not jit.jit_allowed():
                    raise
                jit.discard(path)  # corrupt or tampered with: compile it again below
        reason = jit.unavailable_reason(program)
        if reason is not None:
            compiler = ("the pinned Triton" if program.kind == "triton"
                        else "nvcc on PATH or in $CUDA_HOME/bin")
            raise ProgramUnavailable(
                f"{program.library} (built for {', '.join(program.arches)}): no prebuilt "
                f"library for {arch} on {target.describe()} and {reason}. Remedy: install a "
                f"cake-train wheel built for {arch} (CAKE_CUDA_ARCHS={arch} pip install ...), "
                f"or allow the one-time compile (unset CAKE_JIT; it needs {compiler} and a host "
                "C++ compiler)")
        try:
            path, sha256, compiled = jit.compile_program(self.tree, self.manifest, program, arch)
        except trust.Untrusted as exc:
            raise ProgramUnavailable(str(exc)) from None
        return Library(program, path, "compiled" if compiled else "cached", sha256,
                       "compile it again (remove the cache entry)")


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
