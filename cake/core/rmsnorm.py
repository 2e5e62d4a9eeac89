"""Host code shared by the two RMSNorm families (``cake_rmsnorm_det_train`` and
``cake_gated_rmsnorm_det_train``): validation, routing, the entries' argument layouts and the
allocation of outputs. Both families run programs rendered from the same templates
(``csrc/templates/rmsnorm``); they differ only in the gate. The families' public functions,
autograd classes and ``torch.compile`` ops are in their own packages.

Argument layouts of the C entries (``csrc/include/cake/rmsnorm_binding.cuh``):

* forward: x, residual, gate, weight, y, residual_out, rstd, rows, cols, weight_fp32,
  eps (fp32 bits), weight_offset (fp32 bits);
* backward: s, gate, weight, dy, rstd, dsum, dx, dresidual, dgate, workspace, workspace bytes,
  dweight, rows, cols, weight_fp32, dweight dtype code, weight_offset (fp32 bits);
* workspace_bytes: rows, cols, address of a host int64.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import numbers
import struct
from typing import Mapping, Optional

import torch

from . import host
from . import manifest as mf

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_COLS = 16384
VECTOR_BYTES = 16
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_X_SHAPE = "[..., D] with 1 <= D <= 16384 (leading dims are flattened into rows)"
_ANY_DIMS = tuple(range(1, 17))

_ptr = host.data_pointer


@dataclasses.dataclass(frozen=True)
class Problem:
    """What one call computes, as the router and the entries need it."""

    device: torch.device
    dtype: torch.dtype
    rows: int
    cols: int
    weight_fp32: bool
    gated: bool
    has_residual: bool
    vector: bool
    """True when every row tensor allows 16-byte loads (D and the addresses fit)."""

    @property
    def variant(self) -> dict:
        return {"dtype": host.dtype_name(self.dtype), "load": "vector" if self.vector else "scalar"}

    @property
    def rstd_shape(self) -> tuple:
        return (self.rows,)


def fp32_bits(value: float) -> int:
    """The bit pattern of ``value`` rounded to fp32, as the entries take float arguments."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _check_number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > 3.0e38:
        raise ValueError(f"{name}: expected a finite fp32 value, got {value!r}")
    if positive and not struct.unpack("<f", struct.pack("<f", number))[0] > 0.0:
        raise ValueError(f"{name}: expected a value > 0 (in fp32), got {value!r}")
    return number


def _check_like(name: str, value: object, x: torch.Tensor, what: str) -> torch.Tensor:
    host.check_tensor(name, value, dtypes=(x.dtype,), ndims=(x.dim(),), shape_hint=what)
    host.check_same_device("x", x, {name: value})
    if value.shape != x.shape:
        raise ValueError(f"{name}: expected the shape of x {list(x.shape)}, got {host.describe(value)}")
    return value


def _vector_ok(cols: int, element_size: int, tensors) -> bool:
    width = VECTOR_BYTES // element_size
    return cols % width == 0 and all(t.data_ptr() % VECTOR_BYTES == 0 for t in tensors if t is not None)


def validate_inputs(*, x, gate, weight, residual, eps, weight_offset, gated: bool,
                    row_tensors: Mapping[str, Optional[torch.Tensor]] = {}) -> Problem:
    """Checks the inputs both entries share; ``row_tensors`` are further [rows, D] tensors of
    the call (outputs, dy, ...) that decide, with x, whether the vector route applies."""
    host.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    cols = x.shape[-1]
    if not 1 <= cols <= MAX_COLS:
        raise ValueError(f"x: expected shape {_X_SHAPE}, got {host.describe(x)}")
    if gated:
        _check_like("g", gate, x, "like x")
    host.check_tensor("weight", weight, dtypes=(x.dtype, torch.float32), ndims=(1,),
                      shape_hint=f"[D] = [{cols}] in x's dtype or float32")
    host.check_same_device("x", x, {"weight": weight})
    if weight.shape[0] != cols:
        raise ValueError(f"weight: expected [D] = [{cols}] (x's last dim), got {host.describe(weight)}")
    if residual is not None:
        _check_like("residual", residual, x, "like x")
    if eps is not None:
        _check_number("eps", eps, positive=True)
    _check_number("weight_offset", weight_offset, positive=False)
    rows = x.numel() // cols
    vector = _vector_ok(cols, x.element_size(), [x, gate, residual, *row_tensors.values()])
    return Problem(device=x.device, dtype=x.dtype, rows=rows, cols=cols,
                   weight_fp32=weight.dtype == torch.float32, gated=gated,
                   has_residual=residual is not None, vector=vector)


def validate_forward(*, x, gate, weight, residual, eps, weight_offset, gated: bool, out,
                     residual_out, rstd) -> Problem:
    # x first: the output checks below compare against its shape and device.
    host.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    outputs = {}
    if out is not None:
        outputs["out"] = host.check_output("out", out, shape=x.shape, dtype=x.dtype, device=x.device)
    if residual_out is not None:
        if residual is None:
            raise ValueError("residual_out: given, but there is no residual")
        outputs["residual_out"] = host.check_output("residual_out", residual_out, shape=x.shape,
                                                    dtype=x.dtype, device=x.device)
    problem = validate_inputs(x=x, gate=gate, weight=weight, residual=residual, eps=eps,
                              weight_offset=weight_offset, gated=gated, row_tensors=outputs)
    if rstd is not None:
        outputs["rstd"] = host.check_output("rstd", rstd, shape=x.shape[:-1], dtype=torch.float32,
                                            device=x.device)
    host.check_disjoint(outputs, {"x": x, "g": gate, "weight": weight, "residual": residual})
    return problem


def validate_backward(*, dy, x, gate, weight, rstd, dsum, weight_offset, gated: bool,
                      has_residual: bool, grad_dtype, dx, dg, dresidual, dweight, workspace,
                      workspace_bytes) -> Problem:
    """``workspace_bytes`` is what this problem needs (checked when ``workspace`` is given)."""
    host.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    _check_like("dy", dy, x, "like x")
    if dsum is not None:
        if not has_residual:
            raise ValueError("dsum: given, but the forward had no residual (residual=False)")
        _check_like("dsum", dsum, x, "like x")
    host.check_tensor("rstd", rstd, dtypes=(torch.float32,), ndims=(x.dim() - 1,),
                      shape_hint="x.shape[:-1] float32 (from the forward)")
    host.check_same_device("x", x, {"rstd": rstd})
    if rstd.shape != x.shape[:-1]:
        raise ValueError(f"rstd: expected float32 {list(x.shape[:-1])} (x.shape[:-1]), "
                         f"got {host.describe(rstd)}")
    outputs = {}
    for name, buffer in (("dx", dx), ("dg", dg), ("dresidual", dresidual)):
        if buffer is not None:
            outputs[name] = host.check_output(name, buffer, shape=x.shape, dtype=x.dtype, device=x.device)
    if dg is not None and not gated:
        raise ValueError("dg: given to a family without a gate")
    if dresidual is not None and not has_residual:
        raise ValueError("dresidual: given, but the forward had no residual (residual=False)")
    problem = validate_inputs(x=x, gate=gate, weight=weight, residual=None, eps=None,
                              weight_offset=weight_offset, gated=gated,
                              row_tensors={"dy": dy, "dsum": dsum, **outputs})
    problem = dataclasses.replace(problem, has_residual=has_residual)
    if grad_dtype not in (torch.float32, weight.dtype):
        raise ValueError(f"grad_dtype: expected torch.float32 or the weight's dtype "
                         f"{weight.dtype}, got {grad_dtype!r}")
    if dweight is not None:
        outputs["dweight"] = host.check_output("dweight", dweight, shape=weight.shape, dtype=grad_dtype,
                                               device=x.device)
    if workspace is not None:
        outputs["workspace"] = host.check_workspace(
            workspace, device=x.device, need=workspace_bytes, query="backward_workspace_bytes")
    host.check_disjoint(outputs, {"dy": dy, "x": x, "g": gate, "weight": weight, "rstd": rstd,
                                  "dsum": dsum})
    return problem


# --------------------------------------------------------------------------- routing


# (id(manifest), variant items, arch, D) -> program; D takes at most 16384 values.
_chosen: dict[tuple, tuple[mf.Manifest, mf.Program]] = {}


def select(manifest: mf.Manifest, problem: Problem, arch: str | None) -> mf.Program:
    """The program of the family's manifest serving ``problem`` on ``arch`` (None: any arch):
    the one of the call's (dtype, load) variant whose ``cols_min``..``cols_max`` holds D."""
    key = (id(manifest), problem.dtype, problem.vector, arch, problem.cols)
    found = _chosen.get(key)
    if found is not None and found[0] is manifest:
        return found[1]
    program = host.select_program(manifest, variant=problem.variant, arch=arch,
                                  bands={"cols": problem.cols}, floors={})
    _chosen[key] = (manifest, program)
    return program


# --------------------------------------------------------------------------- launching



class Programs:
    """The programs of one RMSNorm family package and its three entries.

    The entries of each (device, dtype, route, D) are resolved once and kept, so a call costs
    one dictionary lookup on top of its checks (no path resolution or routing per call).
    """

    def __init__(self, package_file: str):
        self._package_file = package_file
        self._set = None
        self._entries: dict[tuple, tuple] = {}

    def _programs(self):
        if self._set is None:
            self._set = host.program_set(self._package_file)
        return self._set

    def library(self, problem: Problem):
        programs = self._programs()
        program = select(programs.manifest, problem, host.device_arch(problem.device))
        return programs.library(program, problem.device.index)

    def entries(self, problem: Problem) -> tuple:
        """``(forward, backward, workspace_bytes)`` entries of the program serving ``problem``."""
        key = (problem.device.index, problem.dtype, problem.vector, problem.cols)
        found = self._entries.get(key)
        if found is None:
            library = self.library(problem)
            found = self._entries[key] = (library.entry("forward"), library.entry("backward"),
                                          library.entry("workspace_bytes"))
        return found

    def supported(self, device: Optional[torch.device | int], dtype: torch.dtype) -> bool:
        """A CUDA device is present and its arch is one the programs are built for."""
        device = host.supported_device(device)
        if dtype not in DTYPES or device is None:
            return False
        arch = host.device_arch(device)
        return any(arch in p.arches for p in self._programs().manifest.programs)

    def workspace_bytes(self, problem: Problem) -> int:
        if problem.rows == 0:
            return 0
        out = ctypes.c_int64(-1)
        self.entries(problem)[2]([problem.rows, problem.cols, ctypes.addressof(out)], 0)
        return out.value

    def forward_into(self, problem: Problem, *, x, gate, weight, residual, eps, weight_offset,
                     y, residual_out, rstd) -> None:
        if problem.rows == 0:
            return
        self.entries(problem)[0](
            [_ptr(x), _ptr(residual), _ptr(gate), _ptr(weight), _ptr(y), _ptr(residual_out),
             _ptr(rstd), problem.rows, problem.cols, int(problem.weight_fp32), fp32_bits(eps),
             fp32_bits(weight_offset)],
            host.stream_handle(problem.device))

    def backward_into(self, problem: Problem, *, dy, x, gate, weight, rstd, dsum, weight_offset,
                      dx, dg, dresidual, dweight, workspace) -> None:
        size = 0 if workspace is None else workspace.numel() * workspace.element_size()
        self.entries(problem)[1](
            [_ptr(x), _ptr(gate), _ptr(weight), _ptr(dy), _ptr(rstd), _ptr(dsum), _ptr(dx),
             _ptr(dresidual), _ptr(dg), _ptr(workspace), size, _ptr(dweight), problem.rows,
             problem.cols, int(problem.weight_fp32), _DTYPE_CODES[dweight.dtype],
             fp32_bits(weight_offset)],
            host.stream_handle(problem.device))

    # ----------------------------------------------------------------------- allocating calls

    def forward(self, problem: Problem, *, x, gate, weight, residual, eps, weight_offset,
                out=None, residual_out=None, rstd=None) -> tuple:
        """Allocates what the caller did not give; returns (y, residual_out or None, rstd)."""
        y = torch.empty_like(x) if out is None else out
        if residual is not None and residual_out is None:
            residual_out = torch.empty_like(x)
        if rstd is None:
            rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        self.forward_into(problem, x=x, gate=gate, weight=weight, residual=residual, eps=eps,
                          weight_offset=weight_offset, y=y, residual_out=residual_out, rstd=rstd)
        return y, residual_out, rstd

    def backward(self, problem: Problem, *, dy, x, gate, weight, rstd, dsum, weight_offset,
                 grad_dtype, dx=None, dg=None, dresidual=None, dweight=None, workspace=None) -> tuple:
        """Allocates what the caller did not give; returns (dx, dg, dresidual, dweight) with
        dg None without a gate and dresidual None without a residual."""
        if dx is None:
            dx = torch.empty_like(x)
        if problem.gated and dg is None:
            dg = torch.empty_like(x)
        if problem.has_residual and dresidual is None:
            dresidual = torch.empty_like(x)
        if dweight is None:
            dweight = torch.empty(weight.shape, dtype=grad_dtype, device=x.device)
        if workspace is None:
            need = self.workspace_bytes(problem)
            workspace = torch.empty(need, dtype=torch.uint8, device=x.device) if need else None
        self.backward_into(problem, dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum,
                           weight_offset=weight_offset, dx=dx, dg=dg, dresidual=dresidual,
                           dweight=dweight, workspace=workspace)
        return dx, dg, dresidual, dweight
