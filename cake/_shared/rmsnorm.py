"""Host code shared by the two RMSNorm families (``cake_rmsnorm_det_train`` and
``cake_gated_rmsnorm_det_train``): validation, routing, the entries' argument layouts and the
allocation of outputs. Both families run programs rendered from the same templates
(``csrc/templates/rmsnorm``); they differ only in the gate. The families' public functions,
autograd classes and ``torch.compile`` ops are in their own packages.

The C entries' declared arguments are in the family table (tools/families/cake_rmsnorm_det_train.py).

Host path (as in ``core.plans``): a call's signature, with whether its row tensors are 16-byte
aligned, keys a memo of its :class:`plans.Plan` (in the forward, of its :class:`ForwardCall`,
which also holds the forward entry bound to what the signature fixes); a call whose signature
was seen before runs only the ``recheck_*`` checks (overlap, the workspace's address) and one
entry call, and the autograd backward reuses the forward's plan.

Shared by the two families' packages (``cake._shared``): only relative imports of ``core``,
torch imported here directly.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from typing import Mapping, Optional

import torch

from ..core import autograd, checks, plans
from ..core import manifest as mf

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_COLS = 16384
VECTOR_BYTES = 16
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_X_SHAPE = "[..., D] with 1 <= D <= 16384 (leading dims are flattened into rows)"
_ANY_DIMS = tuple(range(1, 17))

_ptr = checks.data_pointer


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
        return {"dtype": checks.dtype_name(self.dtype), "load": "vector" if self.vector else "scalar"}


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
    checks.check_tensor(name, value, dtypes=(x.dtype,), ndims=(x.dim(),), shape_hint=what)
    checks.check_same_device("x", x, {name: value})
    if value.shape != x.shape:
        raise ValueError(f"{name}: expected the shape of x {list(x.shape)}, got {checks.describe(value)}")
    return value


def _vector_ok(cols: int, element_size: int, tensors) -> bool:
    return cols % (VECTOR_BYTES // element_size) == 0 and checks.aligned(*tensors, to=VECTOR_BYTES)


def validate_inputs(*, x, gate, weight, residual, weight_offset, gated: bool,
                    row_tensors: Mapping[str, Optional[torch.Tensor]] = {}) -> Problem:
    """Checks the inputs both entries share (eps is the forward's alone); ``row_tensors`` are
    further [rows, D] tensors of the call (outputs, dy, ...) that decide, with x, whether the
    vector route applies."""
    checks.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    cols = x.shape[-1]
    if not 1 <= cols <= MAX_COLS:
        raise ValueError(f"x: expected shape {_X_SHAPE}, got {checks.describe(x)}")
    if gated:
        _check_like("g", gate, x, "like x")
    checks.check_tensor("weight", weight, dtypes=(x.dtype, torch.float32), ndims=(1,),
                      shape_hint=f"[D] = [{cols}] in x's dtype or float32")
    checks.check_same_device("x", x, {"weight": weight})
    if weight.shape[0] != cols:
        raise ValueError(f"weight: expected [D] = [{cols}] (x's last dim), got {checks.describe(weight)}")
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
    checks.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    outputs = {}
    if out is not None:
        outputs["out"] = checks.check_output("out", out, shape=x.shape, dtype=x.dtype, device=x.device)
    if residual_out is not None:
        if residual is None:
            raise ValueError("residual_out: given, but there is no residual")
        outputs["residual_out"] = checks.check_output("residual_out", residual_out, shape=x.shape,
                                                    dtype=x.dtype, device=x.device)
    problem = validate_inputs(x=x, gate=gate, weight=weight, residual=residual,
                              weight_offset=weight_offset, gated=gated, row_tensors=outputs)
    _check_number("eps", eps, positive=True)
    if rstd is not None:
        checks.check_output("rstd", rstd, shape=x.shape[:-1], dtype=torch.float32, device=x.device)
    recheck_forward(x=x, gate=gate, weight=weight, residual=residual, out=out,
                    residual_out=residual_out, rstd=rstd)
    return problem


def recheck_forward(*, x, gate, weight, residual, out, residual_out, rstd) -> None:
    """What :func:`validate_forward` checks beyond the call's signature: overlap."""
    if out is not None or residual_out is not None or rstd is not None:
        outputs = {name: value for name, value in (("out", out), ("residual_out", residual_out),
                                                   ("rstd", rstd)) if value is not None}
        checks.check_disjoint(outputs, {"x": x, "g": gate, "weight": weight, "residual": residual})


def validate_backward(*, dy, x, gate, weight, rstd, dsum, weight_offset, gated: bool,
                      has_residual: bool, grad_dtype, dx, dg, dresidual, dweight, workspace,
                      workspace_need) -> Problem:
    """``workspace_need(problem)`` gives the bytes the routed program needs; it is asked (once,
    as soon as the problem is known) only when a workspace is given."""
    checks.check_tensor("x", x, dtypes=DTYPES, ndims=_ANY_DIMS, shape_hint=_X_SHAPE)
    _check_like("dy", dy, x, "like x")
    if dsum is not None:
        if not has_residual:
            raise ValueError("dsum: given, but the forward had no residual (residual=False)")
        _check_like("dsum", dsum, x, "like x")
    checks.check_tensor("rstd", rstd, dtypes=(torch.float32,), ndims=(x.dim() - 1,),
                      shape_hint="x.shape[:-1] float32 (from the forward)")
    checks.check_same_device("x", x, {"rstd": rstd})
    if rstd.shape != x.shape[:-1]:
        raise ValueError(f"rstd: expected float32 {list(x.shape[:-1])} (x.shape[:-1]), "
                         f"got {checks.describe(rstd)}")
    outputs = {}
    for name, buffer in (("dx", dx), ("dg", dg), ("dresidual", dresidual)):
        if buffer is not None:
            outputs[name] = checks.check_output(name, buffer, shape=x.shape, dtype=x.dtype, device=x.device)
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
        checks.check_output("dweight", dweight, shape=weight.shape, dtype=grad_dtype, device=x.device)
    if workspace is not None:
        checks.check_workspace(workspace, device=x.device, need=need, query="backward_workspace_bytes")
    _check_backward_disjoint(dy=dy, x=x, gate=gate, weight=weight, rstd=rstd, dsum=dsum, dx=dx,
                             dg=dg, dresidual=dresidual, dweight=dweight, workspace=workspace)
    return problem


def recheck_backward(*, dy, x, gate, weight, rstd, dsum, dx, dg, dresidual, dweight,
                     workspace) -> None:
    """What :func:`validate_backward` checks beyond the call's signature: the workspace's
    address and overlap."""
    if workspace is not None:
        checks.check_workspace_aligned(workspace)
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
    checks.check_disjoint(outputs, {"dy": dy, "x": x, "g": gate, "weight": weight, "rstd": rstd,
                                  "dsum": dsum})


# --------------------------------------------------------------------------- routing


def select(manifest: mf.Manifest, problem: Problem, arch: str | None) -> mf.Program:
    """The program of the family's manifest serving ``problem`` on ``arch`` (None: any arch):
    the one of the call's (dtype, load) variant whose ``cols_min``..``cols_max`` holds D.
    Runs once per problem (``plans.Plans`` keeps the result)."""
    return plans.select_program(manifest, variant=problem.variant, arch=arch,
                               bands={"cols": problem.cols}, floors={})


# --------------------------------------------------------------------------- launching


def upstream_gradients(s, dy, dsum, has_residual: bool) -> tuple:
    """An autograd backward's ``(dy, dsum)`` as the kernels read them: upstream gradients may
    be broadcast views or absent (an unused output), and the kernels read dense rows."""
    dy = torch.zeros_like(s) if dy is None else dy.contiguous()
    dsum = dsum.contiguous() if has_residual and dsum is not None else None
    return dy, dsum


def _forward_key(x, gate, weight, residual, eps, weight_offset, out, residual_out, rstd) -> tuple:
    """A forward call's memo key: what ``plans.signature`` would read from its arguments, and
    whether its row tensors are 16-byte aligned. x and the weight are written out, the gate and
    the other optional tensors go through ``plans.signature`` (nested) only when given: every eager
    call computes it, and the generic loop over all nine arguments took three times as long."""
    rest = (None if residual is None and out is None and residual_out is None and rstd is None
            else plans.signature(residual, out, residual_out, rstd))
    return (type(x), x.dtype, x.device, x.shape, x.is_contiguous(),
            type(weight), weight.dtype, weight.device, weight.shape, weight.is_contiguous(),
            None if gate is None else plans.signature(gate), type(eps), eps,
            type(weight_offset), weight_offset, rest,
            checks.aligned(x, gate, residual, out, residual_out, to=VECTOR_BYTES))


_FORWARD_PER_CALL = ("x", "residual", "gate", "weight", "y", "residual_out", "rstd",
                     "weight_offset")
_BACKWARD_PER_CALL = ("s", "gate", "weight", "dy", "rstd", "dsum", "dx", "dresidual", "dgate",
                      "workspace", "workspace_bytes", "dweight", "dweight_dtype", "weight_offset")


def _bindings(problem: Problem) -> dict:
    """The backward entry bound to a problem (the forward binds per call signature, with eps)."""
    return {"backward": (_BACKWARD_PER_CALL, {"rows": problem.rows, "cols": problem.cols,
                                              "weight_fp32": int(problem.weight_fp32)})}


class ForwardCall:
    """A validated forward call signature, resolved once: its plan, the forward entry bound to
    what the signature fixes (rows, cols, the weight's dtype flag, eps; weight_offset is taken
    per call, since 0.0 and -0.0 share a signature) and the shape of rstd."""

    __slots__ = ("plan", "rows", "launch", "rstd_shape")

    def __init__(self, plan: plans.Plan, x: torch.Tensor, eps: float):
        problem = plan.problem
        self.plan = plan
        self.rows = problem.rows
        self.launch = plan.library.entry("forward").bind(
            _FORWARD_PER_CALL, rows=problem.rows, cols=problem.cols,
            weight_fp32=int(problem.weight_fp32), eps=eps)
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
        self.plan = plans.Plans(package_file, select, _bindings,
                                lambda problem: {"rows": problem.rows, "cols": problem.cols})
        self._forward_calls = plans.Memo()
        self._backward_plans = plans.Memo()

    def clear(self) -> None:
        """Forgets every plan (the next call of each signature is validated and routed again)."""
        for memo in (self.plan, self._forward_calls, self._backward_plans):
            memo.clear()

    def supported(self, device: Optional[torch.device | int], dtype: torch.dtype) -> bool:
        """A CUDA device is present and its arch is one the programs are built for."""
        return plans.supported(self._package_file, device, dtype, DTYPES)

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
        # No closures here: their cells would be made on every call (see plans.Memo).
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
                      workspace=None) -> plans.Plan:
        key = plans.signature(dy, x, gate, weight, rstd, dsum, dx, dg, dresidual, dweight,
                             workspace, weight_offset, has_residual, grad_dtype,
                             checks.aligned(x, gate, dy, dsum, dx, dg, dresidual))
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

    def _autograd_backward_plan(self, plan: plans.Plan, *, s, gate, dy, dsum) -> plans.Plan:
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
            call.launch(plans.stream_handle(call.plan.device), x, residual, gate, weight, y,
                        residual_out, rstd, weight_offset)
        return y, residual_out, rstd

    def forward_helper(self, x, gate, weight, residual, eps, weight_offset, out, residual_out,
                       rstd) -> tuple:
        """A forward helper's call: validates (or looks up), allocates what the caller did not
        give, launches; returns (y, residual_out or None, rstd)."""
        call = self.forward_call(x, gate, weight, residual, eps, weight_offset, out, residual_out,
                                 rstd)
        return self.forward(call, x, gate, weight, residual, weight_offset, out, residual_out, rstd)

    def backward(self, plan: plans.Plan, *, dy, x, gate, weight, rstd, dsum, weight_offset,
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
        workspace, size = plans.workspace_or_new(plan, workspace, x)
        plan.backward(plans.stream_handle(plan.device), x, gate, weight, dy, rstd, dsum, dx,
                      dresidual, dg, workspace, size, dweight, _DTYPE_CODES[dweight.dtype],
                      weight_offset)
        return dx, dg, dresidual, dweight

    # ----------------------------------------------------------------------- autograd

    def differentiable(self, *, package: str, module: str, function_name: str,
                       doc: str) -> autograd.Differentiable:
        """The family's functional and autograd class (core.autograd's skeleton):
        ``(x, [g,] weight, residual, eps, weight_offset)`` -> y, or ``(y, x + residual)``.

        The forward's results are (y, the prenorm sum or None, rstd); the backward gets the
        normalised input (x, or the sum), the gate, the weight, rstd and the sum again when
        there is a residual (which tells the backward there was one)."""
        gated = self._gated
        residual_at = 3 if gated else 2
        names = "Tensor x, Tensor g, " if gated else "Tensor x, "

        # The eager forward and save run every step: written per form, not through a generic
        # unpacking of the arguments (a frame and a tuple less, docs/benchmarks.md#host-time).
        def forward_gated(x, gate, weight, residual, eps, weight_offset):
            call = self.forward_call(x, gate, weight, residual, eps, weight_offset)
            return self.forward(call, x, gate, weight, residual, weight_offset), call.plan

        def forward_plain(x, weight, residual, eps, weight_offset):
            call = self.forward_call(x, None, weight, residual, eps, weight_offset)
            return self.forward(call, x, None, weight, residual, weight_offset), call.plan

        def fake(*args):
            x, residual = args[0], args[residual_at]
            return (torch.empty_like(x), None if residual is None else torch.empty_like(x),
                    x.new_empty(x.shape[:-1], dtype=torch.float32))

        def save(args, results):
            if args[residual_at] is None:
                return args[0], args[1] if gated else None, args[residual_at - 1], results[2], None
            s = results[1]
            return s, args[1] if gated else None, args[residual_at - 1], results[2], s

        def backward(plan, constants, saved, grads):
            s, gate, weight, rstd, sum_marker = saved
            dy, dsum, _ = grads
            if dy is None and dsum is None:
                return {}
            has_residual = sum_marker is not None
            weight_offset = constants["weight_offset"]
            dy, dsum = upstream_gradients(s, dy, dsum, has_residual)
            if plan is None:  # under torch.compile: validate the backward's own call
                plan = self.backward_plan(dy=dy, x=s, gate=gate, weight=weight, rstd=rstd,
                                          dsum=dsum, weight_offset=weight_offset,
                                          has_residual=has_residual, grad_dtype=weight.dtype)
            else:
                plan = self._autograd_backward_plan(plan, s=s, gate=gate, dy=dy, dsum=dsum)
            dx, dg, dresidual, dweight = self.backward(
                plan, dy=dy, x=s, gate=gate, weight=weight, rstd=rstd, dsum=dsum,
                weight_offset=weight_offset, grad_dtype=weight.dtype)
            return {"x": dx, "g": dg, "weight": dweight, "residual": dresidual}

        return autograd.Differentiable(
            package=package, name="rmsnorm", function_name=function_name, module=module, doc=doc,
            arguments=f"{names}Tensor weight, Tensor? residual, float eps, float weight_offset",
            forward=forward_gated if gated else forward_plain, fake=fake,
            outputs=lambda args: (0,) if args[residual_at] is None else (0, 1),
            save=save, backward=backward,
            grad_like={"x": 0, "weight": 2, "residual": 4, **({"g": 1} if gated else {})})
