"""Torch-side host code shared by the family packages (imports torch; ``cake`` itself does not).

Family packages validate arguments, pick a program and launch it through these helpers, so
every family reports bad input the same way and none copies another's glue:

* validation: :func:`check_tensor`, :func:`check_same_device`, :func:`check_output`,
  :func:`check_cu_seqlens` raise ``TypeError``/``ValueError`` that name the argument and say
  what was expected and what came; nothing is coerced (no silent ``.contiguous()``);
* launching: :func:`stream_handle`, :func:`is_capturing`, :func:`program_set`;
* routing: :func:`select_program` over the manifest's ``variant``/``route`` fields;
* the fast path: :func:`signature` (or a family's written-out equivalent, as RMSNorm's forward
  key) keys a :class:`Memo` from what a call's static checks read to its :class:`Plan`
  (problem, program entries, workspace size) or what a family keeps with it, so a repeated
  call skips the detailed checks, the routing and the workspace query; what depends on more
  than the signature (overlap, alignment, cu_seqlens' values) is checked on every call;
* autograd: :func:`eager_apply` launches an eager call before recording it in autograd;
  :func:`backward_result` builds a ``backward`` return tuple tied to forward's arity.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

from . import loader
from . import manifest as mf

# --------------------------------------------------------------------------- validation


def describe(tensor: torch.Tensor) -> str:
    """``bfloat16[4096, 512] on cuda:0`` (strides added when not contiguous)."""
    dtype = str(tensor.dtype).replace("torch.", "")
    text = f"{dtype}{list(tensor.shape)} on {tensor.device}"
    if not tensor.is_contiguous():
        text += f" with strides {tuple(tensor.stride())}"
    return text


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(name: str, value: object, *, dtypes: Sequence[torch.dtype],
                 ndims: Sequence[int], shape_hint: str,
                 device_type: str = "cuda") -> torch.Tensor:
    """A contiguous tensor on a ``device_type`` device, of one of ``dtypes``, with one of
    ``ndims`` dimensions.

    ``shape_hint`` (e.g. ``"[S, C] or [B, T, C]"``) goes into the message. Raises
    ``TypeError`` for a non-tensor or a wrong dtype, ``ValueError`` for the rest. Checks run
    in this order: type, dtype, device, rank, contiguity.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {shape_hint}, got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)}, got {describe(value)}")
    if value.device.type != device_type:
        raise ValueError(f"{name}: expected a {device_type.upper()} tensor, got {describe(value)}")
    if value.dim() not in ndims:
        raise ValueError(f"{name}: expected shape {shape_hint}, got {describe(value)}")
    if not value.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor {shape_hint} (innermost stride 1, "
                         f"rows dense), got {describe(value)}; call .contiguous() first if a "
                         "copy is acceptable")
    return value


def check_same_device(reference_name: str, reference: torch.Tensor,
                      others: Mapping[str, torch.Tensor | None]) -> None:
    """Every tensor in ``others`` (None skipped) is on ``reference``'s device."""
    for name, tensor in others.items():
        if tensor is not None and tensor.device != reference.device:
            raise ValueError(f"{name}: expected a tensor on {reference.device} (the device of "
                             f"{reference_name}), got {describe(tensor)}")


def check_output(name: str, value: object, *, shape: Sequence[int], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """A caller-provided output buffer: exactly this shape/dtype/device, contiguous."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(value).__name__}")
    want = f"{str(dtype).replace('torch.', '')}{list(shape)} on {device}"
    if value.dtype != dtype:
        raise TypeError(f"{name}: expected a contiguous {want}, got {describe(value)}")
    if tuple(value.shape) != tuple(shape) or value.device != device or not value.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous {want}, got {describe(value)}")
    return value


def check_workspace(value: object, *, device: torch.device, need: int, query: str) -> torch.Tensor:
    """A caller-provided backward workspace: a contiguous tensor on ``device`` of at least
    ``need`` bytes (as ``query`` reports), 16-byte aligned."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"workspace: expected a torch.Tensor or None, got {type(value).__name__}")
    if value.device != device or not value.is_contiguous():
        raise ValueError(f"workspace: expected a contiguous tensor on {device}, "
                         f"got {describe(value)}")
    have = value.numel() * value.element_size()
    if have < need:
        raise ValueError(f"workspace: needs {need} bytes ({query}), got {have} ({describe(value)})")
    return check_workspace_aligned(value)


def check_workspace_aligned(value: torch.Tensor) -> torch.Tensor:
    """The address part of :func:`check_workspace` (the rest depends only on the signature)."""
    if value.data_ptr() % 16:
        raise ValueError("workspace: must be 16-byte aligned")
    return value


def data_pointer(tensor: torch.Tensor | None) -> int:
    """A tensor's device address for an entry's argument array (0 for None)."""
    return 0 if tensor is None else tensor.data_ptr()


def check_disjoint(outputs: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor | None]) -> None:
    """No output buffer shares memory with an input or another output (kernels read while
    they write). Runs on every call that passes outputs: one address range per tensor."""
    written = _spans(outputs)
    spans = written + _spans(inputs)
    for i, (out_name, out_start, out_end) in enumerate(written):
        for other_name, start, end in spans[i + 1:]:
            if out_start < end and start < out_end:
                raise ValueError(f"{out_name}: must not share memory with {other_name}")


def _spans(tensors: Mapping[str, torch.Tensor | None]) -> list:
    """(name, first byte, end) of each non-empty tensor (None skipped)."""
    spans = []
    for name, tensor in tensors.items():
        if tensor is not None:
            size = tensor.nbytes
            if size:
                start = tensor.data_ptr()
                spans.append((name, start, start + size))
    return spans


def aligned(*tensors: torch.Tensor | None, to: int = 16) -> bool:
    """Every tensor given (None skipped) starts at a multiple of ``to`` bytes; False when a
    value is not a tensor (such a call fails its checks anyway)."""
    for tensor in tensors:
        if tensor is not None and (not isinstance(tensor, torch.Tensor) or tensor.data_ptr() % to):
            return False
    return True


# cu_seqlens tensors whose values were read and found valid: id -> (weakref, version, tokens).
_valid_cu_seqlens: dict[int, tuple[weakref.ref, int, int]] = {}


def check_cu_seqlens(name: str, value: object, *, tokens: int, device: torch.device) -> int:
    """Validates packed-document offsets; returns the number of documents.

    Checked always (no device access): a 1-D contiguous int32 CUDA tensor on ``device`` with at
    least 1 entry (N = 0 documents only for 0 tokens, which the value check enforces). Then
    :func:`check_cu_seqlens_values`.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected an int32 CUDA tensor [N + 1] or None, "
                        f"got {type(value).__name__}")
    if value.dtype != torch.int32:
        raise TypeError(f"{name}: expected dtype int32, got {describe(value)}")
    if value.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor on {device}, got {describe(value)}")
    if value.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {describe(value)}")
    if value.dim() != 1 or value.shape[0] < 1 or not value.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous 1-D tensor [N + 1] (N >= 0), "
                         f"got {describe(value)}")
    check_cu_seqlens_values(name, value, tokens=tokens)
    return value.shape[0] - 1


def check_cu_seqlens_values(name: str, value: torch.Tensor, *, tokens: int) -> None:
    """The values of a cu_seqlens tensor that passed :func:`check_cu_seqlens`' other checks:
    starts at 0, non-decreasing, ends at ``tokens``.

    Reading them is one small device-to-host copy, which waits for the stream, so it happens
    only when the current stream is not capturing a CUDA graph. A tensor that passed is
    remembered (by identity and its version counter), so calling again with the same,
    unmodified tensor reads nothing. Under graph capture the values cannot be read; the
    kernels stay memory-safe for any content.
    """
    known = _valid_cu_seqlens.get(id(value))
    if known is not None and known[0]() is value and known[1] == value._version \
            and known[2] == tokens:
        return
    if is_capturing():
        return
    values = value.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    if values[-1] != tokens:
        raise ValueError(f"{name}: must end at the token count {tokens}, got {values[-1]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name}: must be non-decreasing, but entry {i} ({values[i]}) < "
                             f"entry {i - 1} ({values[i - 1]})")
    key = id(value)
    _valid_cu_seqlens[key] = (weakref.ref(value, lambda _, k=key: _valid_cu_seqlens.pop(k, None)),
                              value._version, tokens)


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}: expected one of {shown}, got {value!r}")


# --------------------------------------------------------------------------- launching


# torch's raw-stream accessor (what Triton launches with) skips building a Stream object,
# a few microseconds per call; torch.cuda.current_stream is the public equivalent.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """The raw ``cudaStream_t`` of the current stream on ``device``."""
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None
                           else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def is_capturing() -> bool:
    """True while the current stream captures a CUDA graph (no device reads allowed)."""
    return torch.cuda.is_current_stream_capturing()


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
    written out in its plan (or call) function rather than passed in as closures: closures and their cells
    were most of the Python objects an eager call made before its launch. Without them RMSNorm's
    eager forward under no_grad took 15.1-15.4 us of host time instead of 18.5 (development
    machine, simulated GPU: tools/bench/results/2026-12-02-cpu-rmsnorm-host-path-ab.txt).
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
    """What a validated problem launches with, resolved once: the entries of the program
    serving it, the backward's workspace size and the device.

    ``sizes`` are the arguments of the program's ``workspace_bytes`` entry but its ``out`` (token
    or row count first; with none there is no work and no workspace).
    """

    __slots__ = ("problem", "device", "forward", "backward", "workspace_bytes")

    def __init__(self, problem, library: loader.Library, sizes: dict):
        self.problem = problem
        self.device = problem.device
        self.forward = library.entry("forward")
        self.backward = library.entry("backward")
        self.workspace_bytes = 0
        if next(iter(sizes.values())):
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

    ``select(manifest, problem, arch)`` routes a problem to a program; ``sizes(problem)`` gives
    the ``workspace_bytes`` entry's arguments but its ``out``, by name.
    """

    __slots__ = ("_package_file", "_select", "_sizes", "_found")

    def __init__(self, package_file: str, select, sizes):
        self._package_file = package_file
        self._select = select
        self._sizes = sizes
        self._found = Memo()

    def __call__(self, problem) -> Plan:
        plan = self._found.get(problem)
        if plan is None:
            programs = program_set(self._package_file)
            program = self._select(programs.manifest, problem, device_arch(problem.device))
            library = programs.library(program, problem.device.index)
            plan = self._found.put(problem, Plan(problem, library, self._sizes(problem)))
        return plan

    def clear(self) -> None:
        self._found.clear()


# --------------------------------------------------------------------------- routing


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


# --------------------------------------------------------------------------- autograd


def op_name(package: str, name: str) -> str:
    """``torch.library`` name of a family op, unique per copy of the family.

    The namespace comes from the owning package (``cake.cake_x`` -> ``cake_cake_x``), so an
    installed cake-train and a vendored copy in one process register distinct ops: a second
    ``custom_op`` of the same name would silently replace the first for both.
    """
    return f"{package.replace('.', '_')}::{name}"


def eager_apply(function: type, launch: Callable[..., object],
                keep: Callable[..., object]) -> Callable[..., object]:
    """The eager functionals' ``function.apply`` (an ``autograd.Function``), with the forward
    launched before autograd is entered.

    ``launch(*args)`` (``args``: what ``function.apply`` takes) validates the call, allocates
    its outputs and launches; ``keep(ctx, *args, launched)`` keeps what the backward needs from
    ``launch``'s result and returns the outputs, so that ``function.forward`` is
    ``keep(ctx, *args, launch(*args))``. The eager path calls ``launch`` first and then applies
    a subclass of ``function`` whose forward is ``keep`` (named as ``function``, so its
    ``grad_fn`` reads the same). So autograd's set-up of the call (its node and context, the
    call of forward) comes after the launch: on the H200 RMSNorm's eager forward reached its
    launch 8.5-15.2 us sooner than through ``function.apply``, within 1 us of the helper
    without autograd (tools/bench/results/2026-12-02-h200-rmsnorm-launch-first-eager-probe.txt).

    While no functorch transform (vmap, grad, ...) is active, the subclass is applied through
    the C ``apply`` that ``Function.apply`` ends in, skipping that method's Python wrapper (its
    unwrapping of tensors left over from a finished transform: such a tensor has no storage,
    and reading its address in the host checks raises). Under a transform, and on a torch
    without that C method, it is ``function.apply(*args)``, which launches inside forward (a
    transform's wrapped tensors must reach the launch through it).
    """
    base = getattr(torch._C, "_FunctionBase", None)
    c_apply = vars(base).get("apply") if base is not None else None
    if c_apply is None:
        return function.apply
    launched = type(function.__name__, (function,), {
        "forward": staticmethod(keep), "__module__": function.__module__,
        "__qualname__": f"{function.__qualname__}.launched",
        "__doc__": f"{function.__name__} for a forward already launched: apply(*args, launched)."})
    bound = c_apply.__get__(None, launched)
    transforms_active = torch._C._are_functorch_transforms_active

    def apply(*args):
        if transforms_active():
            return function.apply(*args)
        return bound(*args, launch(*args))

    return apply


def backward_result(arity: int, grads: Mapping[int, torch.Tensor | None]) -> tuple:
    """A ``backward`` return for a forward of ``arity`` inputs (``len(ctx.needs_input_grad)``:
    :func:`eager_apply`'s subclass takes one more): ``grads[i]`` at position i,
    None elsewhere (so adding a forward argument cannot shift the gradients)."""
    return tuple([grads.get(i) for i in range(arity)])


@functools.lru_cache(maxsize=None)
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- self-test


def selftest_case(name: str, compute, reference: Mapping[str, torch.Tensor], *,
                  tolerance: float) -> tuple[str, str | None]:
    """One self-test case for ``python -m cake selftest``: ``(name, problem or None)``.

    ``compute()`` returns name -> tensor (outputs and gradients) and runs twice: the two runs
    must agree bit for bit, and each tensor must be within ``tolerance`` of the float64
    ``reference`` in norm-wise relative error (finite, every element written).
    """
    first = {k: v.detach().clone() for k, v in compute().items()}
    second = compute()
    for key, expected in reference.items():
        got = first[key]
        if not torch.equal(got, second[key]):
            return name, f"{key} differs between two identical runs"
        if not torch.isfinite(got).all():
            return name, f"{key} has non-finite elements"
        error = ((got.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
        if error > tolerance:
            return name, f"{key}: relative error {error:.2e} > {tolerance:.0e}"
    return name, None
