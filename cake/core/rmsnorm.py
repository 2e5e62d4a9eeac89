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

Host path (as in ``core.host``): a call's signature, with whether its row tensors are 16-byte
aligned, keys a memo of its :class:`host.Plan` (in the forward, of its :class:`ForwardCall`,
which also holds the entry arguments the signature fixes); a call whose signature was seen
before runs only the ``recheck_*`` checks (overlap, the workspace's address) and one entry
call, and the autograd backward reuses the forward's plan.

Vendoring copies ``core`` verbatim: only relative imports, torch imported here directly.
"""

from __future__ import annotations

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
    """What one call computes, as the router and the entries need it (built once per call
    signature: the fast path keeps it with the call's plan)."""

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


_FP32 = struct.Struct("<f")
_INT32 = struct.Struct("<i")


def fp32_bits(value: float) -> int:
    """The bit pattern of ``value`` rounded to fp32, as the entries take float arguments."""
    return _INT32.unpack(_FP32.pack(value))[0]


def _check_number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > 3.0e38:
        raise ValueError(f"{name}: expected a finite fp32 value, got {value!r}")
    if positive and not _FP32.unpack(_FP32.pack(number))[0] > 0.0:
        raise ValueError(f"{name}: expected a value > 0 (in fp32), got {value!r}")
    return number


def _check_like(name: str, value: object, x: torch.Tensor, what: str) -> torch.Tensor:
    host.check_tensor(name, value, dtypes=(x.dtype,), ndims=(x.dim(),), shape_hint=what)
    host.check_same_device("x", x, {name: value})
    if value.shape != x.shape:
        raise ValueError(f"{name}: expected the shape of x {list(x.shape)}, got {host.describe(value)}")
    return value


def _vector_ok(cols: int, element_size: int, tensors) -> bool:
    return cols % (VECTOR_BYTES // element_size) == 0 and host.aligned(*tensors, to=VECTOR_BYTES)


def validate_inputs(*, x, gate, weight, residual, weight_offset, gated: bool,
                    row_tensors: Mapping[str, Optional[torch.Tensor]] = {}) -> Problem:
    """Checks the inputs both entries share (eps is the forward's alone); ``row_tensors`` are
    further [rows, D] tensors of the call (outputs, dy, ...) that decide, with x, whether the
    vector route applies."""
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
    problem = validate_inputs(x=x, gate=gate, weight=weight, residual=residual,
                              weight_offset=weight_offset, gated=gated, row_tensors=outputs)
    _check_number("eps", eps, positive=True)
    if rstd is not None:
        host.check_output("rstd", rstd, shape=x.shape[:-1], dtype=torch.float32, device=x.device)
    recheck_forward(x=x, gate=gate, weight=weight, residual=residual, out=out,
                    residual_out=residual_out, rstd=rstd)
    return problem


def recheck_forward(*, x, gate, weight, residual, out, residual_out, rstd) -> None:
    """What :func:`validate_forward` checks beyond the call's signature: overlap."""
    if out is not None or residual_out is not None or rstd is not None:
        outputs = {name: value for name, value in (("out", out), ("residual_out", residual_out),
                                                   ("rstd", rstd)) if value is not None}
        host.check_disjoint(outputs, {"x": x, "g": gate, "weight": weight, "residual": residual})


def validate_backward(*, dy, x, gate, weight, rstd, dsum, weight_offset, gated: bool,
                      has_residual: bool, grad_dtype, dx, dg, dresidual, dweight, workspace,
                      workspace_need) -> Problem:
    """``workspace_need(problem)`` gives the bytes the routed program needs; it is asked (once,
    as soon as the problem is known) only when a workspace is given."""
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
    problem = validate_inputs(x=x, gate=gate, weight=weight, residual=None,
                              weight_offset=weight_offset, gated=gated,
                              row_tensors={"dy": dy, "dsum": dsum, **outputs})
    problem = dataclasses.replace(problem, has_residual=has_residual)
    need = workspace_need(problem) if workspace is not None else 0
    if grad_dtype not in (torch.float32, weight.dtype):
        raise ValueError(f"grad_dtype: expected torch.float32 or the weight's dtype "
                         f"{weight.dtype}, got {grad_dtype!r}")
    if dweight is not None:
        host.check_output("dweight", dweight, shape=weight.shape, dtype=grad_dtype, device=x.device)
    if workspace is not None:
        host.check_workspace(workspace, device=x.device, need=need, query="backward_workspace_bytes")
    _check_backward_disjoint(dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum, dx=dx,
                             dg=dg, dresidual=dresidual, dweight=dweight, workspace=workspace)
    return problem


def recheck_backward(*, dy, x, gate, weight, rstd, dsum, dx, dg, dresidual, dweight,
                     workspace) -> None:
    """What :func:`validate_backward` checks beyond the call's signature: the workspace's
    address and overlap."""
    if workspace is not None:
        host.check_workspace_aligned(workspace)
    if dx is not None or dg is not None or dresidual is not None or dweight is not None \
            or workspace is not None:
        _check_backward_disjoint(dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum,
                                 dx=dx, dg=dg, dresidual=dresidual, dweight=dweight,
                                 workspace=workspace)


def _check_backward_disjoint(*, dy, x, gate, weight, rstd, dsum, dx, dg, dresidual, dweight,
                             workspace) -> None:
    outputs = {name: value for name, value in (("dx", dx), ("dg", dg), ("dresidual", dresidual),
                                               ("dweight", dweight), ("workspace", workspace))
               if value is not None}
    host.check_disjoint(outputs, {"dy": dy, "x": x, "g": gate, "weight": weight, "rstd": rstd,
                                  "dsum": dsum})


# --------------------------------------------------------------------------- routing


def select(manifest: mf.Manifest, problem: Problem, arch: str | None) -> mf.Program:
    """The program of the family's manifest serving ``problem`` on ``arch`` (None: any arch):
    the one of the call's (dtype, load) variant whose ``cols_min``..``cols_max`` holds D.
    Runs once per problem (``host.Plans`` keeps the result)."""
    return host.select_program(manifest, variant=problem.variant, arch=arch,
                               bands={"cols": problem.cols}, floors={})


# --------------------------------------------------------------------------- launching


def upstream_gradients(s, dy, dsum, has_residual: bool) -> tuple:
    """An autograd backward's ``(dy, dsum)`` as the kernels read them: upstream gradients may
    be broadcast views or absent (an unused output), and the kernels read dense rows."""
    dy = torch.zeros_like(s) if dy is None else dy.contiguous()
    dsum = dsum.contiguous() if has_residual and dsum is not None else None
    return dy, dsum


def _forward_key(x, gate, weight, residual, eps, weight_offset, out, residual_out, rstd) -> tuple:
    """A forward call's memo key: what ``host.signature`` would read from its arguments, and
    whether its row tensors are 16-byte aligned. x and the weight are written out, the gate and
    the other optional tensors go through ``host.signature`` (nested) only when given: every eager
    call computes it, and the generic loop over all nine arguments took three times as long."""
    rest = (None if residual is None and out is None and residual_out is None and rstd is None
            else host.signature(residual, out, residual_out, rstd))
    return (type(x), x.dtype, x.device, x.shape, x.is_contiguous(),
            type(weight), weight.dtype, weight.device, weight.shape, weight.is_contiguous(),
            None if gate is None else host.signature(gate), type(eps), eps,
            type(weight_offset), weight_offset, rest,
            host.aligned(x, gate, residual, out, residual_out, to=VECTOR_BYTES))


class ForwardCall:
    """A validated forward call signature, resolved once: its plan and the entry arguments that
    the signature fixes (rows, cols, the weight's dtype flag, eps's fp32 bits; weight_offset's
    are taken per call, since 0.0 and -0.0 share a signature) and the shape of rstd."""

    __slots__ = ("plan", "rows", "cols", "weight_fp32", "eps", "rstd_shape")

    def __init__(self, plan: host.Plan, x: torch.Tensor, eps: float):
        problem = plan.problem
        self.plan = plan
        self.rows = problem.rows
        self.cols = problem.cols
        self.weight_fp32 = int(problem.weight_fp32)
        self.eps = eps
        # (rows,) for 2-D x; an int size allocates faster than a Size.
        self.rstd_shape = problem.rows if x.dim() == 2 else x.shape[:-1]


class Programs:
    """The programs of one RMSNorm family package (``gated`` or not): validated, memoised
    plans per call signature, and the calls that allocate outputs and launch.

    A plan is made once per problem (route, entries, workspace size) and kept per call
    signature, so a repeated call costs its signature, one dictionary lookup, the per-call
    checks and the entry call.
    """

    def __init__(self, package_file: str, *, gated: bool):
        self._package_file = package_file
        self._gated = gated
        self.plan = host.Plans(package_file, select,
                               lambda problem: {"rows": problem.rows, "cols": problem.cols})
        self._forward_calls = host.Memo()
        self._backward_plans = host.Memo()

    def clear(self) -> None:
        """Forgets every plan (the next call of each signature is validated and routed again)."""
        for memo in (self.plan, self._forward_calls, self._backward_plans):
            memo.clear()

    def supported(self, device: Optional[torch.device | int], dtype: torch.dtype) -> bool:
        """A CUDA device is present and its arch is one the programs are built for."""
        return host.supported(self._package_file, device, dtype, DTYPES)

    def workspace_bytes(self, *, x, gate, weight) -> int:
        """The backward workspace for x and weight (the vector route when x allows it)."""
        problem = validate_inputs(x=x, gate=gate, weight=weight, residual=None,
                                  weight_offset=0.0, gated=self._gated)
        return self.plan(problem).workspace_bytes

    # ----------------------------------------------------------------------- plans

    def forward_call(self, x, gate, weight, residual, eps, weight_offset, out=None,
                     residual_out=None, rstd=None) -> ForwardCall:
        """The :class:`ForwardCall` of a forward call's signature: validated and routed on its
        first call, then looked up (with the overlap checks that outputs given need)."""
        # No closures here: their cells would be made on every call (see host.Memo).
        try:
            key = _forward_key(x, gate, weight, residual, eps, weight_offset, out, residual_out,
                               rstd)
        except (AttributeError, TypeError):  # not tensors: the validation below says which
            key = None
        call = self._forward_calls.get(key)
        if call is None:
            problem = validate_forward(x=x, gate=gate, weight=weight, residual=residual, eps=eps,
                                       weight_offset=weight_offset, gated=self._gated, out=out,
                                       residual_out=residual_out, rstd=rstd)
            call = ForwardCall(self.plan(problem), x, eps)
            return call if key is None else self._forward_calls.put(key, call)
        if out is not None or residual_out is not None or rstd is not None:  # (a call saved)
            recheck_forward(x=x, gate=gate, weight=weight, residual=residual, out=out,
                            residual_out=residual_out, rstd=rstd)
        return call

    def backward_plan(self, *, dy, x, gate, weight, rstd, dsum, weight_offset, has_residual,
                      grad_dtype, dx=None, dg=None, dresidual=None, dweight=None,
                      workspace=None) -> host.Plan:
        key = host.signature(dy, x, gate, weight, rstd, dsum, dx, dg, dresidual, dweight,
                             workspace, weight_offset, has_residual, grad_dtype,
                             host.aligned(x, gate, dy, dsum, dx, dg, dresidual))
        plan = self._backward_plans.get(key)
        if plan is None:
            return self._backward_plans.put(key, self.plan(validate_backward(
                dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum,
                weight_offset=weight_offset, gated=self._gated, has_residual=has_residual,
                grad_dtype=grad_dtype, dx=dx, dg=dg, dresidual=dresidual, dweight=dweight,
                workspace=workspace, workspace_need=self._workspace_need)))
        recheck_backward(dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum, dx=dx,
                         dg=dg, dresidual=dresidual, dweight=dweight, workspace=workspace)
        return plan

    def _workspace_need(self, problem: Problem) -> int:
        return self.plan(problem).workspace_bytes

    def _autograd_backward_plan(self, plan: host.Plan, *, s, gate, dy, dsum) -> host.Plan:
        """The plan of the backward of a forward that ran with ``plan``: the same program
        unless the upstream gradients' addresses rule out the vector route (the forward checked
        the inputs, and autograd gives dy and dsum the outputs' shape, dtype and device)."""
        problem = plan.problem
        vector = _vector_ok(problem.cols, s.element_size(), (s, gate, dy, dsum))
        if vector == problem.vector:
            return plan
        return self.plan(dataclasses.replace(problem, vector=vector))

    # ----------------------------------------------------------------------- launching

    def forward(self, call: ForwardCall, x, gate, weight, residual, weight_offset, out=None,
                residual_out=None, rstd=None) -> tuple:
        """Allocates what the caller did not give, launches ``call`` (from
        :meth:`forward_call` with these arguments); returns (y, residual_out or None, rstd)."""
        y = torch.empty_like(x) if out is None else out
        if residual is not None and residual_out is None:
            residual_out = torch.empty_like(x)
        if rstd is None:
            rstd = x.new_empty(call.rstd_shape, dtype=torch.float32)
        if call.rows:
            call.plan.forward(
                host.stream_handle(call.plan.device), x=x, residual=residual, gate=gate,
                weight=weight, y=y, residual_out=residual_out, rstd=rstd, rows=call.rows,
                cols=call.cols, weight_fp32=call.weight_fp32, eps=call.eps,
                weight_offset=weight_offset)
        return y, residual_out, rstd

    def forward_helper(self, x, gate, weight, residual, eps, weight_offset, out, residual_out,
                       rstd) -> tuple:
        """A forward helper's call: validates (or looks up), allocates what the caller did not
        give, launches; returns (y, residual_out or None, rstd)."""
        call = self.forward_call(x, gate, weight, residual, eps, weight_offset, out, residual_out,
                                 rstd)
        return self.forward(call, x, gate, weight, residual, weight_offset, out, residual_out, rstd)

    def launch(self, x, gate, weight, residual, eps, weight_offset) -> tuple:
        """An autograd forward's launch (outputs allocated here): ``(plan, y, residual_out or
        None, rstd)``, what :meth:`keep` records."""
        call = self.forward_call(x, gate, weight, residual, eps, weight_offset)
        return (call.plan, *self.forward(call, x, gate, weight, residual, weight_offset))

    @staticmethod
    def keep(ctx, launched: tuple, *, x, gate, weight, residual, weight_offset):
        """Records on an autograd ``ctx`` what :meth:`autograd_backward` needs from a forward
        that :meth:`launch` gave ``launched``: the plan, and as saved tensors the normalised input
        (x, or the prenorm sum), the gate (None without), the weight and rstd. Returns the
        forward's outputs: y, or (y, the prenorm sum) with a residual."""
        plan, y, s, rstd = launched
        ctx.set_materialize_grads(False)
        ctx.plan = plan
        ctx.has_residual = residual is not None
        ctx.weight_offset = weight_offset
        ctx.save_for_backward(x if s is None else s, gate, weight, rstd)
        return y if s is None else (y, s)

    def backward(self, plan: host.Plan, *, dy, x, gate, weight, rstd, dsum, weight_offset,
                 grad_dtype, dx=None, dg=None, dresidual=None, dweight=None,
                 workspace=None) -> tuple:
        """Allocates what the caller did not give, launches; returns (dx, dg, dresidual,
        dweight) with dg None without a gate and dresidual None without a residual."""
        problem = plan.problem
        if dx is None:
            dx = torch.empty_like(x)
        if problem.gated and dg is None:
            dg = torch.empty_like(x)
        if problem.has_residual and dresidual is None:
            dresidual = torch.empty_like(x)
        if dweight is None:
            dweight = torch.empty_like(weight, dtype=grad_dtype)
        workspace, size = host.workspace_or_new(plan, workspace, x)
        plan.backward(
            host.stream_handle(plan.device), s=x, gate=gate, weight=weight, dy=dy, rstd=rstd,
            dsum=dsum, dx=dx, dresidual=dresidual, dgate=dg, workspace=workspace,
            workspace_bytes=size, dweight=dweight, rows=problem.rows, cols=problem.cols,
            weight_fp32=int(problem.weight_fp32), dweight_dtype=_DTYPE_CODES[dweight.dtype],
            weight_offset=weight_offset)
        return dx, dg, dresidual, dweight

    def autograd_backward(self, plan: host.Plan, *, s, gate, weight, rstd, dy, dsum,
                          weight_offset, has_residual) -> tuple:
        """The autograd backward of a forward that ran with ``plan`` (s: its normalised input),
        gradients in the inputs' dtypes; returns what :meth:`backward` does."""
        dy, dsum = upstream_gradients(s, dy, dsum, has_residual)
        plan = self._autograd_backward_plan(plan, s=s, gate=gate, dy=dy, dsum=dsum)
        return self.backward(plan, dy=dy, x=s, gate=gate, weight=weight, rstd=rstd, dsum=dsum,
                             weight_offset=weight_offset, grad_dtype=weight.dtype)
