"""Argument checks shared by the family packages (imports torch; ``cake`` itself does not).

Each raises ``TypeError``/``ValueError`` that names the argument and says what was expected and
what came; nothing is coerced (no silent ``.contiguous()``): :func:`check_tensor`,
:func:`check_same_device`, :func:`check_output`, :func:`check_workspace`,
:func:`check_cu_seqlens`, :func:`check_disjoint`, :func:`check_choice`. And
:func:`alert_not_deterministic`, the determinism alert of a ``nondet`` family's step.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

import functools
import os
import warnings
import weakref
from typing import Iterable, Mapping, Sequence

import torch

from . import plans

def describe(tensor: torch.Tensor) -> str:
    """``bfloat16[4096, 512] on cuda:0`` (strides added when not contiguous)."""
    dtype = str(tensor.dtype).replace("torch.", "")
    text = f"{dtype}{list(tensor.shape)} on {tensor.device}"
    if not tensor.is_contiguous():
        text += f" with strides {tuple(tensor.stride())}"
    return text


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(dict.fromkeys(str(d).replace("torch.", "") for d in dtypes))


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
    if value.device.type != device.type:
        raise ValueError(f"{name}: expected a {device.type.upper()} tensor on {device}, "
                         f"got {describe(value)}")
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
    if plans.is_capturing():
        return
    values = value.tolist()
    _check_offsets(name, values, tokens)
    _remember_cu_seqlens(value, tokens)


def trust_cu_seqlens(name: str, value: torch.Tensor, values: Sequence[int]) -> None:
    """Remembers ``value``, a cu_seqlens tensor the caller made from the host list ``values``
    (a plan's table), as checked: ``values`` are checked here, so that the families'
    :func:`check_cu_seqlens_values` reads nothing back from the device for it."""
    _check_offsets(name, values, values[-1])
    _remember_cu_seqlens(value, values[-1])


def _check_offsets(name: str, values: Sequence[int], tokens: int) -> None:
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    if values[-1] != tokens:
        raise ValueError(f"{name}: must end at the token count {tokens}, got {values[-1]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name}: must be non-decreasing, but entry {i} ({values[i]}) < "
                             f"entry {i - 1} ({values[i - 1]})")


def _remember_cu_seqlens(value: torch.Tensor, tokens: int) -> None:
    key = id(value)
    _valid_cu_seqlens[key] = (weakref.ref(value, lambda _, k=key: _valid_cu_seqlens.pop(k, None)),
                              value._version, tokens)


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is a bool (a truthy int or None is refused, not coerced)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_aligned(tensors: Mapping[str, torch.Tensor | None], to: int = 16) -> None:
    """Every tensor given (None skipped) starts at a ``to``-byte boundary, as a Triton program's
    compile assumed; a view into another tensor may not, and the message names the remedy.
    While torch.compile traces (fake tensors) nothing is checked: the op checks for real."""
    if torch.compiler.is_compiling():
        return
    for name, tensor in tensors.items():
        if tensor is not None and tensor.numel() and tensor.data_ptr() % to:
            raise ValueError(f"{name}: expected a {to}-byte aligned data pointer (the kernels "
                             f"assume it), got {describe(tensor)} at an offset of "
                             f"{tensor.data_ptr() % to} bytes; call .clone() to realign")


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}: expected one of {shown}, got {value!r}")


def triton_device_type(tensor: object) -> str:
    """The device type a Triton family takes ``tensor`` on: ``cpu`` when it is a CPU tensor and
    Triton's interpreter is on (``TRITON_INTERPRET=1``: the family's programs then run in it),
    else ``cuda``."""
    if os.environ.get("TRITON_INTERPRET") == "1" and isinstance(tensor, torch.Tensor) \
            and tensor.device.type == "cpu":
        return "cpu"
    return "cuda"


@functools.lru_cache(maxsize=None)
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def alert_not_deterministic(caller: str, *, why: str, instead: str) -> None:
    """PyTorch's determinism alert for the non-deterministic step of a ``nondet`` family
    (docs/architecture.md#names), worded as torch's own operators word it: under
    ``torch.use_deterministic_algorithms(True)`` a RuntimeError, with ``warn_only=True`` a
    UserWarning (one per call, pointing at the caller of the function that calls this), else
    nothing. ``why`` says what is not deterministic, ``instead`` names the ``det`` family's
    equivalent. Call it before allocating or launching anything."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    what = (f"{caller} does not have a deterministic implementation, but you set "
            f"'torch.use_deterministic_algorithms(True{', warn_only=True' if warn_only else ''})'. "
            f"{why}; ")
    if warn_only:
        warnings.warn(what + f"{instead} is the deterministic family.", UserWarning, stacklevel=3)
        return
    raise RuntimeError(what + f"use {instead} (the deterministic family), or turn determinism "
                       "off for this step, or set warn_only=True.")
