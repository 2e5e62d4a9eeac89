"""How a family call reaches its program: the device and stream, the memoised plan of a
problem (route, program entries, workspace size), and the routing over the manifest.

* launching: :func:`stream_handle`, :func:`is_capturing`, :func:`program_set`, :func:`supported`;
* the fast path: :func:`signature` (or a family's written-out equivalent) keys a :class:`Memo`
  from what a call's static checks read to its :class:`Plan`, so a repeated call skips the
  detailed checks, the routing and the workspace query; what depends on more than the signature
  (overlap, alignment, cu_seqlens' values) is checked on every call;
* routing: :func:`select_program` over the manifest's ``variant``/``route`` fields.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Mapping, Sequence

import torch

from . import loader
from . import manifest as mf

# --------------------------------------------------------------------------- launching


# torch's raw-stream accessor (what Triton launches with) skips building a Stream object,
# a few microseconds per call; torch.cuda.current_stream is the public equivalent.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# And its current-device query, without torch.cuda.current_device's Python wrapper (a launch's
# tensors are on a CUDA device, so CUDA is initialised).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def stream_handle(device: torch.device) -> int:
    """The raw ``cudaStream_t`` of the current stream on ``device`` (0 for the CPU, where a
    Triton family runs under the interpreter). ``device`` must be the current CUDA device: a
    program launches in the thread's current context, so tensors of another device would be
    read there (an illegal address, or another GPU's memory through peer access)."""
    if device.type == "cpu":
        return 0
    current = _current_device()
    if device.index is not None and device.index != current:
        raise RuntimeError(
            f"the tensors are on {device} but the current CUDA device is cuda:{current}: call "
            f"under 'with torch.cuda.device({device.index}):' (programs launch on the current "
            "device)")
    if _raw_stream is not None:
        return _raw_stream(current)
    return torch.cuda.current_stream(device).cuda_stream


def is_capturing() -> bool:
    """True while the current stream captures a CUDA graph (no device reads allowed)."""
    # Not initialised (a CPU-only torch, or no CUDA call yet): nothing can be capturing.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


_program_sets: dict[str, loader.ProgramSet] = {}


def program_set(package_file: str) -> loader.ProgramSet:
    """The :class:`~cake.core.loader.ProgramSet` of the family package holding ``package_file``.

    Cached by the file name: resolving the path touches the file system, which costs tens of
    microseconds per call on some machines, and this runs on every launch.
    """
    found = _program_sets.get(package_file)
    if found is None:
        found = loader.ProgramSet.for_package(Path(package_file).resolve().parent)
        _program_sets[package_file] = found
    return found


def supported_device(device: torch.device | int | None) -> torch.device | None:
    """The CUDA device a support query is about (None: the current one), or None when it is
    not a visible CUDA device (a CPU device, an index past the device count, no CUDA)."""
    if not torch.cuda.is_available():
        return None
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.device("cuda", index) if 0 <= index < torch.cuda.device_count() else None


def device_arch(device: torch.device) -> str | None:
    return loader.device(device.index if device.index is not None else
                         torch.cuda.current_device()).arch


# --------------------------------------------------------------------------- fast path


def signature(*values: object) -> tuple:
    """What a call's static checks read from its arguments, as a hashable key.

    A tensor gives its type, dtype, device, shape and contiguity; None gives None; any other
    value (a flag, eps, a dtype, the activation) gives its type and itself. Two calls with equal
    signatures pass or fail the same static checks and resolve to the same problem, so the
    first one's validation, routing and workspace size can serve the second (:class:`Memo`).
    Addresses (overlap, alignment) and cu_seqlens' values are not in it: those are checked
    on every call.
    """
    # Flat, built by appends: no tuple per value (fewer objects a call, as in Memo). The types
    # mark where each value starts.
    key = []
    add = key.append
    for v in values:
        if v is None:
            add(None)
        elif isinstance(v, torch.Tensor):
            add(type(v))
            add(v.dtype)
            add(v.device)
            add(v.shape)
            add(v.is_contiguous())
        else:
            add(type(v))
            add(v)
    return tuple(key)


class Memo:
    """A bounded map from a key (a :func:`signature`, or a problem) to what resolving it gave.

    Only successful validations are stored, so a signature that once failed is checked in full
    again (and raises the same error). When full, the oldest entry goes. Lookups are one
    dictionary read; stores (the slow path) take a lock.

    A family's lookup (``get``, then ``put`` of a validated plan, or the per-call rechecks) is
    written out in its plan (or call) function rather than passed in as closures: closures and
    their cells were most of the Python objects an eager call made before its launch. Without
    them RMSNorm's eager forward under no_grad took 15.1-15.4 us of host time instead of 18.5
    (development machine, simulated GPU, 2026-12-02).
    """

    __slots__ = ("_found", "_limit", "_lock")

    def __init__(self, limit: int = 1024):
        self._found: dict = {}
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, key):
        try:
            return self._found.get(key)
        except TypeError:  # an unhashable argument (a list for a tensor): never stored
            return None

    def put(self, key, value):
        """Stores ``value`` under ``key`` (if hashable) and returns it."""
        try:
            hash(key)
        except TypeError:
            return value
        with self._lock:
            if len(self._found) >= self._limit:
                del self._found[next(iter(self._found))]
            self._found[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._found.clear()

    def __len__(self) -> int:
        return len(self._found)


class Plan:
    """What a validated problem launches with, resolved once: the program's library, its entries
    bound to the problem (``plan.forward(stream, *per-call values)``, ...), the backward's
    workspace size and the device.

    ``bindings`` maps each entry to bind to ``(per-call argument names, fixed values)``
    (:meth:`loader.Entry.bind`); ``sizes`` are the arguments of the program's
    ``workspace_bytes`` entry but its ``out`` (token or row count first; with none there is no
    work and no workspace), or None for a program without that entry.
    """

    # The bound entries are instance attributes (the __dict__), found by the first lookup: a
    # __getattr__ fallback cost each launch about a microsecond on the H200's host.
    __slots__ = ("problem", "device", "library", "workspace_bytes", "__dict__")

    def __init__(self, problem, library, bindings: Mapping[str, tuple], sizes: dict | None):
        self.problem = problem
        self.device = problem.device
        self.library = library
        for name, (per_call, fixed) in bindings.items():
            if hasattr(Plan, name):
                raise ValueError(f"{library.program.library}: an entry named {name!r} would "
                                 "hide the plan's own attribute")
            setattr(self, name, library.entry(name).bind(per_call, **fixed))
        self.workspace_bytes = 0
        if sizes and next(iter(sizes.values())):
            out = ctypes.c_int64(-1)
            library.entry("workspace_bytes")(0, **sizes, out=ctypes.addressof(out))
            self.workspace_bytes = out.value


def workspace_or_new(plan: Plan, workspace: torch.Tensor | None,
                     like: torch.Tensor) -> tuple[torch.Tensor | None, int]:
    """The backward's workspace and its size in bytes: the caller's (checked already), or a
    new one of the plan's size on ``like``'s device (None when the problem needs none)."""
    if workspace is not None:
        return workspace, workspace.nbytes
    size = plan.workspace_bytes
    return (like.new_empty(size, dtype=torch.uint8) if size else None), size


def supported(package_file: str, device: torch.device | int | None, dtype: torch.dtype,
              dtypes: Sequence[torch.dtype]) -> bool:
    """A family's ``is_*_supported``: ``dtype`` is one of ``dtypes``, ``device`` (None: the
    current one) is a visible CUDA device, and its arch is one the package's programs are built
    for. Compiles nothing."""
    device = supported_device(device)
    if dtype not in dtypes or device is None:
        return False
    arch = device_arch(device)
    return any(arch in p.arches for p in program_set(package_file).manifest.programs)


class Plans:
    """The :class:`Plan` of each problem of one family package, made on first use.

    ``select(manifest, problem, arch)`` routes a problem to a program; ``bindings(problem)``
    gives the :class:`Plan`'s bindings and ``sizes(problem)`` the ``workspace_bytes`` entry's
    arguments but its ``out`` (None: no workspace query).
    """

    __slots__ = ("_package_file", "_select", "_bindings", "_sizes", "_found")

    def __init__(self, package_file: str, select, bindings, sizes=None):
        self._package_file = package_file
        self._select = select
        self._bindings = bindings
        self._sizes = sizes
        self._found = Memo()

    def __call__(self, problem) -> Plan:
        plan = self._found.get(problem)
        if plan is None:
            programs = program_set(self._package_file)
            if problem.device.type == "cpu":  # a Triton family's call under the interpreter
                program = self._select(programs.manifest, problem, None)
                library = programs.interpreted(program)
            else:
                program = self._route(programs, problem)
                library = programs.library(program, problem.device.index)
            plan = self._found.put(problem, Plan(
                problem, library, self._bindings(problem),
                None if self._sizes is None else self._sizes(problem)))
        return plan

    def _route(self, programs: loader.ProgramSet, problem):
        """The program for the problem on its device's arch; when the route exists but no
        program of it is built for that arch, ProgramUnavailable names the device and the
        remedy (before any launch), not a missing route."""
        arch = device_arch(problem.device)
        try:
            return self._select(programs.manifest, problem, arch)
        except NoRoute:
            anywhere = self._select(programs.manifest, problem, None)  # NoRoute: no such route
            raise loader.ProgramUnavailable(loader.unsupported_message(
                anywhere, loader.device(problem.device.index))) from None

    def clear(self) -> None:
        self._found.clear()


# --------------------------------------------------------------------------- routing


def select_variant(manifest: mf.Manifest, problem, arch: str | None) -> mf.Program:
    """The program of ``problem.variant`` built for ``arch`` (None: any), for a family whose
    programs differ by variant alone (no size bands or floors)."""
    return select_program(manifest, variant=problem.variant, arch=arch, bands={}, floors={})


_unused_pointers: dict = {}


def unused_pointer(device: torch.device):
    """What a Triton program's unused pointer argument gets: None (address 0) on a GPU; under
    the interpreter (CPU tensors), which runs the kernel function with tensors, a small one."""
    if device.type != "cpu":
        return None
    found = _unused_pointers.get(device)
    if found is None:
        found = _unused_pointers[device] = torch.zeros(4, dtype=torch.float32, device=device)
    return found


class NoRoute(ValueError):
    """No program of the manifest serves this variant and problem size."""


def select_program(manifest: mf.Manifest, *, variant: Mapping[str, object], arch: str | None,
                   bands: Mapping[str, int], floors: Mapping[str, int]) -> mf.Program:
    """The program for one call, from the manifest's ``variant`` and ``route`` fields.

    Candidates: programs whose ``variant`` equals ``variant`` on its keys, built for ``arch``
    (when given), and, for each ``name -> value`` in ``bands``, with
    ``route[name_min] <= value <= route[name_max]``, and for each in ``floors`` with
    ``route[name_min] <= value``. Among them the one with the highest floors (compared in
    ``floors`` order) wins. Raises :class:`NoRoute` naming what was asked.
    """
    best, best_key = None, None
    for program in manifest.programs:
        if program.kcp or any(program.variant.get(k) != v for k, v in variant.items()):
            continue
        if arch is not None and arch not in program.arches:
            continue
        route = program.route
        if any(not route[f"{n}_min"] <= v <= route[f"{n}_max"] for n, v in bands.items()):
            continue
        if any(route[f"{n}_min"] > v for n, v in floors.items()):
            continue
        key = tuple(route[f"{n}_min"] for n in floors)
        if best_key is None or key > best_key:
            best, best_key = program, key
    if best is None:
        asked = ", ".join(f"{k}={v!r}" for k, v in {**variant, **bands, **floors}.items())
        raise NoRoute(f"no program of {manifest.package} serves {asked}"
                      + (f" on {arch}" if arch else ""))
    return best

