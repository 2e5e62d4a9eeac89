"""Host code shared by the two LM head families (``cake_lm_head_det_train`` and
``cake_lm_head_nondet_train``): validation, routing, split policies, the launch sequences of the
forward and the backward, the intermediate memory, the two autograd entries and the loss
module's body (``LossModule``). Both families
run programs rendered from the same templates (``csrc/templates/lm_head``) and differ only in
the backward's heavy kernels: det ``dh`` + ``dw`` (fixed-order accumulation, no atomics), nondet
``fused`` (fp32 atomics). Their public functions, classes and ``torch.compile`` ops are in their
own packages.

The math (docs/families/lm_head.md), per token t with label y_t::

    z = hidden @ weight^T,  s = softcap(z) / temperature,  softcap(z) = c tanh(z / c) (or z)
    loss_t = logsumexp(s_t) - s_t[y_t],  logprob_t = -loss_t,  entropy_t = -sum_v p log p

never materialising z: the forward keeps per row only the max and the log-sum-exp (the backward
recomputes the logits tile by tile).

Launches: each kernel is one C entry of the dtype's program, ``plan.<kernel>(stream, grid_x,
grid_y, grid_z, *arguments)`` with the arguments of its ``SIGNATURE``
(``lm_head_tiles.ARGUMENTS``), through ``core.plans`` (the library on a GPU, Triton's interpreter
on CPU tensors with ``TRITON_INTERPRET=1``). A pointer a call does not use is None (address 0) on
a GPU and a small CPU tensor under the interpreter; the kernels read it only behind the flag that
says it is there.

Shared by the two families' packages (``cake._shared``): only relative imports of ``core``,
torch imported here directly. The tile sizes come from ``lm_head_tiles`` (standard library only),
which each family passes in (a shared module imports no other shared module).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Optional

import torch

from ..core import autograd, checks, plans

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
REDUCTIONS = ("mean", "sum", "none")
_REDUCTION_CODES = {"none": 0, "sum": 1, "mean": 2}  # lm_head_coef's ``reduction``
MAX_DIM = 16384
MAX_VOCAB = 262144
MAX_TOKENS = 1 << 24
"""At most 2^24 tokens a call: every grid stays below 2^31 CTAs (the nondet backward's
cdiv(T, 64) * cdiv(V, 64) at most 2^30), and the fp32 count of tokens a mean divides by is exact."""
SCALE_RANGE = (2.0**-60, 2.0**60)
"""Softcap and temperature bounds: their reciprocals and products stay finite normal fp32."""
_ANY_RANK = tuple(range(1, 65))
_F32 = torch.float32

# Split policies: shapes only, never the SM count, so the reduction orders (and det's bits) depend
# on the shapes and the program alone.
FWD_MIN_SPLITS = 16
"""Vocabulary splits of the forward at least: a token block's splits run side by side, sharing
its hidden rows in L2."""
FWD_TARGET_PROGRAMS = 264
"""More forward splits when T is small: about two waves of 132 SMs."""
DH_TARGET_PROGRAMS = 264
"""det dhidden: the vocabulary is split only when the token blocks give fewer programs."""
DH_MAX_SPLITS = 16
"""Cap of the det dhidden splits (each holds a (T, D) fp32 partial, summed in order after)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- allocation


def _new(shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """Every intermediate and output the kernels write in full, on ``like``'s device (the tests
    fill them with NaN here, to show that every element is written)."""
    return like.new_empty(shape, dtype=dtype)


def _zeros(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """An fp32 accumulator the nondet backward adds into with atomics."""
    return like.new_zeros(shape, dtype=_F32)


# --------------------------------------------------------------------------- validation


@dataclasses.dataclass(frozen=True)
class Problem:
    """What selects a program (``core.plans.Plans`` keeps its bound entries per problem)."""

    device: torch.device
    dtype: torch.dtype

    @property
    def variant(self) -> dict:
        return {"dtype": checks.dtype_name(self.dtype)}


@dataclasses.dataclass(frozen=True)
class Call:
    """A validated call: hidden (..., D) flattened to (T, D), labels (...) to (T,)."""

    problem: Problem
    tokens: int
    dim: int
    vocab: int
    shape: tuple
    """labels' shape: the shape of the per-token outputs."""


def _scale(name: str, value: object) -> float:
    """A softcap or temperature: a real in SCALE_RANGE."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    number = float(value)
    low, high = SCALE_RANGE
    if not (math.isfinite(number) and low <= number <= high):
        raise ValueError(f"{name}: expected a finite float in [2^-60, 2^60], got {value!r}")
    return number


def check_options(*, ignore_index, logit_softcap, reduction=None, temperature=None,
                  check_labels=False, return_entropy=False) -> None:
    """The non-tensor options of either entry (and of the loss modules)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if not -(2**63) <= int(ignore_index) < 2**63:
        raise ValueError(f"ignore_index: expected an int64 value, got {ignore_index}")
    if logit_softcap is not None:
        _scale("logit_softcap", logit_softcap)
    if reduction is not None:
        checks.check_choice("reduction", reduction, REDUCTIONS)
    if temperature is not None:
        _scale("temperature", temperature)
    checks.check_flag("check_labels", check_labels)
    checks.check_flag("return_entropy", return_entropy)


def _validate_operands(hidden, weight) -> tuple:
    """hidden [..., D] and weight [V, D]: (device type, D, V, leading dims, tokens)."""
    device_type = checks.triton_device_type(hidden)
    checks.check_tensor("hidden", hidden, dtypes=DTYPES, ndims=_ANY_RANK,
                        shape_hint="[..., D] (any leading dims)", device_type=device_type)
    dim = hidden.shape[-1]
    checks.check_tensor("weight", weight, dtypes=(hidden.dtype,), ndims=(2,),
                        shape_hint=f"[V, {dim}] in hidden's dtype", device_type=device_type)
    checks.check_same_device("hidden", hidden, {"weight": weight})
    if dim % 8 or not 8 <= dim <= MAX_DIM:
        raise ValueError(f"hidden: expected D (the last dim) a multiple of 8 in [8, {MAX_DIM}], "
                         f"got {checks.describe(hidden)}")
    if weight.shape[1] != dim:
        raise ValueError(f"weight: expected [V, {dim}] (D of hidden), got "
                         f"{checks.describe(weight)}")
    vocab = weight.shape[0]
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"weight: expected V (the first dim) in [1, {MAX_VOCAB}], got "
                         f"{checks.describe(weight)}")
    lead = tuple(hidden.shape[:-1])
    tokens = math.prod(lead)
    if tokens > MAX_TOKENS:
        raise ValueError(f"hidden: expected at most {MAX_TOKENS} tokens (2^24), got {tokens} "
                         f"({checks.describe(hidden)})")
    return device_type, dim, vocab, lead, tokens


def validate(hidden, weight, labels, accumulator) -> Call:
    """The tensors of a call, before anything is allocated or launched; raises
    TypeError/ValueError naming the argument."""
    device_type, dim, vocab, lead, tokens = _validate_operands(hidden, weight)
    checks.check_tensor("labels", labels, dtypes=(torch.int64,), ndims=(len(lead),),
                        shape_hint=f"{list(lead)} int64 (hidden's leading dims)",
                        device_type=device_type)
    checks.check_same_device("hidden", hidden, {"labels": labels})
    if tuple(labels.shape) != lead:
        raise ValueError(f"labels: expected int64 {list(lead)} (hidden's leading dims), got "
                         f"{checks.describe(labels)}")
    tensors = {"hidden": hidden, "weight": weight}
    if accumulator is not None:
        checks.check_tensor("dweight_accumulator", accumulator, dtypes=(_F32,), ndims=(2,),
                            shape_hint=f"float32 {list(weight.shape)} (weight's shape)",
                            device_type=device_type)
        checks.check_same_device("hidden", hidden, {"dweight_accumulator": accumulator})
        if accumulator.shape != weight.shape:
            raise ValueError(f"dweight_accumulator: expected float32 {list(weight.shape)} "
                             f"(weight's shape), got {checks.describe(accumulator)}")
        tensors["dweight_accumulator"] = accumulator
        if not torch.compiler.is_compiling():
            checks.check_disjoint({"dweight_accumulator": accumulator},
                                  {"hidden": hidden, "weight": weight, "labels": labels})
    checks.check_aligned(tensors)
    return Call(Problem(hidden.device, hidden.dtype), tokens, dim, vocab, lead)


def check_label_values(labels: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every label in [0, V) or ignore_index: one device read (the one host sync of a call), so
    it is refused under CUDA graph capture, where ``check_labels=False`` is the way."""
    if labels.numel() == 0 or torch.compiler.is_compiling():
        return
    if checks.triton_device_type(labels) == "cuda" and plans.is_capturing():
        raise RuntimeError("labels: check_labels=True reads the labels' range on the host, "
                           "which a CUDA graph capture forbids; pass check_labels=False (a "
                           "label outside [0, V) then gives NaN and no gradient)")
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab))
    if bool(bad.any()):
        flat = bad.reshape(-1).nonzero()[0, 0].item()
        raise ValueError(f"labels: expected values in [0, {vocab}) or ignore_index "
                         f"({ignore_index}), got {labels.reshape(-1)[flat].item()} at flat "
                         f"position {flat}")


# --------------------------------------------------------------------------- routing


def bindings(arguments: dict) -> Callable:
    """Every kernel's entry with all arguments per call (grids and tensors change with each
    call): ``plan.<kernel>(stream, grid_x, grid_y, grid_z, *arguments)``."""
    grid = ("grid_x", "grid_y", "grid_z")
    return lambda problem: {name: (grid + tuple(a for a, _ in args), {})
                            for name, args in arguments.items()}


# --------------------------------------------------------------------------- splits


def _split(blocks: int, tiles: int, min_splits: int, max_splits: int, target: int,
           multiple: int) -> tuple:
    """(splits, tiles per split) with no empty split: at least ``min_splits``, or enough for
    ``target`` programs, at most ``max_splits`` and ``tiles``; tiles per split a multiple of
    ``multiple``."""
    want = max(min_splits, _cdiv(target, max(blocks, 1)))
    splits = max(1, min(tiles, want, max_splits))
    per = _cdiv(_cdiv(tiles, splits), multiple) * multiple
    return _cdiv(tiles, per), per


def forward_splits(tokens: int, vocab: int, tiles: dict) -> tuple:
    """(splits, tiles per split) of the forward's statistics kernel."""
    return _split(_cdiv(tokens, tiles["STATS_BT"]), _cdiv(vocab, tiles["STATS_BV"]),
                  FWD_MIN_SPLITS, 1 << 30, FWD_TARGET_PROGRAMS, 1)


def dh_splits(tokens: int, vocab: int, tiles: dict) -> tuple:
    """(splits, tiles per split) of the det dhidden kernel: tiles per split even (two a step)."""
    blocks = _cdiv(tokens, tiles["DH_BT"])
    count = _cdiv(vocab, tiles["DH_BV"])
    if blocks >= DH_TARGET_PROGRAMS // 2:
        return 1, count + count % 2
    return _split(blocks, count, 1, DH_MAX_SPLITS, DH_TARGET_PROGRAMS, 2)


# --------------------------------------------------------------------------- intermediate memory


def workspace(tiles: dict, deterministic: bool, *, tokens: int, dim: int, vocab: int,
              fp32: bool, logprob: bool, reduction: str, entropy: bool,
              accumulate: bool) -> dict:
    """Bytes of device memory a call allocates besides its inputs, outputs and gradients:
    ``forward`` (during the forward), ``saved`` (its part kept for the backward) and
    ``backward`` (during the backward, besides ``saved``); docs/families/lm_head.md.

    forward: the statistics' split partials (3, or 4 with the entropy) x S x T x 4, the row max
    and log-sum-exp 2 T x 4, for the loss with sum or mean the per-token losses T x 4 and the
    count 4. saved: 2 T x 4 (+ 4). backward: the coefficients 3 T x 4, the fp32 copies of the
    upstream gradients (T x 4 each, at most: none when they come fp32 and dense) and the fp32
    accumulators: det dhidden S_h x T x D x 4 with S_h > 1 dhidden splits, else T x D x 4 (none
    for fp32 hidden); nondet T x D x 4 (none for fp32); both dweight V x D x 4 (none for fp32
    weights or with a dweight accumulator)."""
    reduce = not logprob and reduction != "none"
    counted = 4 if reduce else 0
    if tokens == 0:
        return {"forward": counted, "saved": counted, "backward": 0}
    splits = forward_splits(tokens, vocab, tiles)[0]
    forward = (4 if entropy else 3) * splits * tokens * 4 + 2 * tokens * 4
    forward += tokens * 4 + counted if reduce else 0
    upstream = (2 if entropy else 1) * tokens * 4 if logprob else (0 if reduce else tokens * 4)
    backward = 3 * tokens * 4 + upstream
    dh_parts = dh_splits(tokens, vocab, tiles)[0] if deterministic else 1
    if dh_parts > 1:
        backward += dh_parts * tokens * dim * 4
    elif not fp32:
        backward += tokens * dim * 4
    if not (fp32 or accumulate):
        backward += vocab * dim * 4
    return {"forward": forward, "saved": 2 * tokens * 4 + counted, "backward": backward}


# --------------------------------------------------------------------------- the programs


class Programs:
    """The programs of one LM head family package (``deterministic`` or not): validated plans per
    problem and the forward and backward launch sequences.

    ``tiles(dtype_name, deterministic)`` gives the programs' knobs and ``arguments`` each
    kernel's entry arguments (``cake/_shared/lm_head_tiles.py``: the family tables rendered the
    programs from the same); ``family`` is the package name's last part (in messages).
    """

    def __init__(self, package_file: str, *, deterministic: bool, tiles: Callable,
                 arguments: dict, family: str):
        self.deterministic = deterministic
        self.family = family
        self._package_file = package_file
        self._tiles = {dtype: tiles(checks.dtype_name(dtype), deterministic) for dtype in DTYPES}
        self.plan = plans.Plans(package_file, plans.select_variant, bindings(arguments))

    def clear(self) -> None:
        self.plan.clear()

    def supported(self, device, dtype: torch.dtype) -> bool:
        """A CUDA device is present, its arch is one the programs are built for, and ``dtype``
        is bf16, fp16 or fp32. Compiles nothing."""
        return plans.supported(self._package_file, device, dtype, DTYPES)

    def tiles(self, dtype: torch.dtype) -> dict:
        return self._tiles[dtype]

    @staticmethod
    def _scales(logit_softcap: Optional[float], temperature: float) -> tuple:
        """(inv_softcap, tanh_scale, linear_scale, inv_temp): see cake/triton/lm_head.py."""
        inv_temp = 1.0 / temperature
        if logit_softcap is None:
            return 0.0, 0.0, inv_temp, inv_temp
        return 1.0 / logit_softcap, logit_softcap * inv_temp, 0.0, inv_temp

    # ----------------------------------------------------------------------- forward

    def forward(self, plan: plans.Plan, call: Call, hidden, weight, labels, *, logprob: bool,
                reduction: str, ignore_index: int, logit_softcap, temperature: float,
                entropy: bool) -> tuple:
        """Launches stats, finalize and (loss with sum or mean) reduce. Returns (out, entropy or
        None, rmax, logl, count or None): out the loss (a scalar for sum and mean) or the
        per-token values (T,), fp32 like every result here."""
        tokens, dim, vocab = call.tokens, call.dim, call.vocab
        device = hidden.device
        tiles = self._tiles[hidden.dtype]
        splits, per = forward_splits(tokens, vocab, tiles)
        dummy = plans.unused_pointer(device)
        parts = [_new((splits, tokens), _F32, hidden) for _ in range(4 if entropy else 3)]
        rmax, logl = (_new((tokens,), _F32, hidden) for _ in range(2))
        # The per-token outputs in labels' shape (the kernels see T contiguous values): an
        # autograd output that were a view of them could not be modified in place.
        out = _new(call.shape, _F32, hidden)
        ent = _new(call.shape, _F32, hidden) if entropy else None
        stream = plans.stream_handle(device)
        flat = labels.view(tokens)
        plan.stats(stream, splits * _cdiv(tokens, tiles["STATS_BT"]), 1, 1,
                   hidden.view(tokens, dim), weight, flat, parts[0], parts[1],
                   parts[3] if entropy else dummy, parts[2], tokens, vocab, dim, splits, per,
                   *self._scales(logit_softcap, temperature), int(entropy))
        plan.finalize(stream, _cdiv(tokens, tiles["ROWS_BLOCK"]), 1, 1, parts[0], parts[1],
                      parts[3] if entropy else dummy, parts[2], flat, rmax, logl, out,
                      dummy if ent is None else ent, tokens, vocab, splits, ignore_index,
                      int(logprob), int(entropy))
        count = None
        if not logprob and reduction != "none":
            total, count = _new((), _F32, hidden), _new((1,), _F32, hidden)
            plan.reduce(stream, 1, 1, 1, out, flat, total, count, tokens, ignore_index,
                        int(reduction == "mean"))
            out = total
        return out, ent, rmax, logl, count

    # ----------------------------------------------------------------------- backward

    def backward(self, plan: plans.Plan, call: Call, hidden, weight, labels, rmax, logl, count,
                 ent, grad_out, grad_ent, *, logprob: bool, reduction: str, ignore_index: int,
                 logit_softcap, temperature: float, accumulator) -> tuple:
        """(dhidden like hidden, dweight like weight or None with ``accumulator``) from the
        upstream gradients (fp32, dense: ``grad_out`` per token or a scalar, ``grad_ent`` per
        token or None; ``grad_out`` None for a log-prob without a gradient)."""
        tokens, dim, vocab = call.tokens, call.dim, call.vocab
        device = hidden.device
        if tokens == 0:
            dweight = None if accumulator is not None else torch.zeros_like(weight)
            return _new(tuple(hidden.shape), hidden.dtype, hidden), dweight
        tiles = self._tiles[hidden.dtype]
        dummy = plans.unused_pointer(device)
        stream = plans.stream_handle(device)
        flat = labels.view(tokens)
        ca, cb, cg = (_new((tokens,), _F32, hidden) for _ in range(3))
        plan.coef(stream, _cdiv(tokens, tiles["ROWS_BLOCK"]), 1, 1, flat,
                  dummy if ent is None else ent, dummy if grad_out is None else grad_out,
                  dummy if grad_ent is None else grad_ent, dummy if count is None else count,
                  ca, cb, cg, tokens, vocab, ignore_index, int(logprob),
                  _REDUCTION_CODES[reduction],
                  int(grad_out is not None), int(grad_ent is not None))
        h = hidden.view(tokens, dim)
        dhidden = _new((tokens, dim), hidden.dtype, hidden)
        dweight = None if accumulator is not None else _new(tuple(weight.shape), weight.dtype,
                                                             weight)
        rows = (h, weight, flat, rmax, logl, ca, cb, cg)
        scales = self._scales(logit_softcap, temperature)
        gradients = self._det if self.deterministic else self._nondet
        gradients(plan, stream, tiles, rows, scales, dhidden, dweight, accumulator, dummy,
                  tokens, dim, vocab)
        return dhidden.view(hidden.shape), dweight

    def _cast(self, plan, stream, tiles, src, dst, count: int, parts: int) -> None:
        plan.cast(stream, _cdiv(count, tiles["CAST_BLOCK"]), 1, 1, src, dst, count, parts)

    def _det(self, plan, stream, tiles, rows, scales, dhidden, dweight, accumulator, dummy,
             tokens, dim, vocab) -> None:
        """dh (then the ordered sum of its split partials), then dw: no atomics."""
        fp32 = dhidden.dtype == _F32
        splits, per = dh_splits(tokens, vocab, tiles)
        if splits > 1:
            acc = _new((splits, tokens, dim), _F32, dhidden)
        else:  # the last step casts into dhidden (fp32: dhidden is the accumulator)
            acc = dhidden if fp32 else _new((tokens, dim), _F32, dhidden)
        plan.dh(stream, splits * _cdiv(tokens, tiles["DH_BT"]), 1, 1, *rows, acc, dhidden,
                tokens, vocab, dim, splits, per, *scales, int(splits == 1))
        if splits > 1:
            self._cast(plan, stream, tiles, acc, dhidden, tokens * dim, splits)
        if accumulator is not None:
            acc, out = accumulator, dummy
        else:
            acc, out = (dweight if fp32 else _new(tuple(dweight.shape), _F32, dweight)), dweight
        plan.dw(stream, _cdiv(vocab, tiles["DW_BV"]), 1, 1, *rows, acc, out, tokens, vocab, dim,
                *scales, int(accumulator is not None))

    def _nondet(self, plan, stream, tiles, rows, scales, dhidden, dweight, accumulator, dummy,
                tokens, dim, vocab) -> None:
        """fused into zeroed fp32 accumulators (or the caller's), then the casts to 16 bits."""
        fp32 = dhidden.dtype == _F32
        dh_acc = dhidden.zero_() if fp32 else _zeros((tokens, dim), dhidden)
        if accumulator is not None:
            dw_acc = accumulator
        elif fp32:
            dw_acc = dweight.zero_()
        else:
            dw_acc = _zeros(tuple(dweight.shape), dweight)
        grid = _cdiv(tokens, tiles["FUSED_BT"]) * _cdiv(vocab, tiles["FUSED_BV"])
        plan.fused(stream, grid, 1, 1, *rows, dh_acc, dw_acc, tokens, vocab, dim, *scales)
        if not fp32:
            self._cast(plan, stream, tiles, dh_acc, dhidden, tokens * dim, 1)
            if dweight is not None:
                self._cast(plan, stream, tiles, dw_acc, dweight, vocab * dim, 1)

    # ----------------------------------------------------------------------- autograd

    def _resolve(self, plan, hidden, weight, labels, accumulator) -> tuple:
        """(call, plan): the forward's plan, or under torch.compile (no plan at hand) a new
        validation of the saved tensors."""
        call = validate(hidden, weight, labels, accumulator)
        return call, (plan if plan is not None else self.plan(call.problem))

    def _backward_prologue(self, grads_present: bool) -> bool:
        """docs/architecture.md#names: the nondet alert before the backward allocates or launches."""
        if grads_present and not self.deterministic:
            checks.alert_not_deterministic(
                f"{self.family}'s backward",
                why="Its dhidden and dweight are summed with fp32 atomics",
                instead="cake." + self.family.replace("nondet", "det"))
        return grads_present

    def loss_op(self, *, package: str, module: str, function_name: str,
                doc: str) -> autograd.Differentiable:
        """The loss entry's autograd class, functional and custom ops (core.autograd):
        ``(hidden, weight, labels, dweight_accumulator, ignore_index, reduction, logit_softcap,
        check_labels)`` -> the loss (fp32; a scalar for sum and mean, labels' shape for none)."""

        def forward(hidden, weight, labels, accumulator, ignore_index, reduction, logit_softcap,
                    check_labels):
            check_options(ignore_index=ignore_index, logit_softcap=logit_softcap,
                          reduction=reduction, check_labels=check_labels)
            call = validate(hidden, weight, labels, accumulator)
            if check_labels:
                check_label_values(labels, call.vocab, ignore_index)
            plan = self.plan(call.problem)
            out, _, rmax, logl, count = self.forward(
                plan, call, hidden, weight, labels, logprob=False, reduction=reduction,
                ignore_index=ignore_index, logit_softcap=logit_softcap, temperature=1.0,
                entropy=False)
            return (out, rmax, logl, count), plan  # out: per token for none, else a scalar

        def fake(hidden, weight, labels, accumulator, ignore_index, reduction, logit_softcap,
                 check_labels):
            tokens = labels.numel()
            stat = hidden.new_empty((tokens,), dtype=_F32)
            if reduction == "none":
                return labels.new_empty(labels.shape, dtype=_F32), stat, stat.clone(), None
            return (hidden.new_empty((), dtype=_F32), stat, stat.clone(),
                    hidden.new_empty((1,), dtype=_F32))

        def backward(plan, constants, saved, grads):
            hidden, weight, labels, accumulator, rmax, logl, count = saved
            grad = grads[0]
            if not self._backward_prologue(grad is not None):
                return {}
            call, plan = self._resolve(plan, hidden, weight, labels, accumulator)
            reduction = constants["reduction"]
            dhidden, dweight = self.backward(
                plan, call, hidden, weight, labels, rmax, logl,
                count if count is not None and count.numel() else None, None, _dense(grad),
                None, logprob=False, reduction=reduction, ignore_index=constants["ignore_index"],
                logit_softcap=constants["logit_softcap"], temperature=1.0,
                accumulator=accumulator)
            return {"hidden": dhidden, "weight": dweight}

        return autograd.Differentiable(
            package=package, name="loss", function_name=function_name, module=module, doc=doc,
            arguments="Tensor hidden, Tensor weight, Tensor labels, Tensor? dweight_accumulator, "
                      "int ignore_index, str reduction, float? logit_softcap, bool check_labels",
            forward=forward, fake=fake, outputs=lambda args: (0,),
            save=lambda args, results: (*args[:4], *results[1:]),
            backward=backward, grad_like={"hidden": 0, "weight": 1})

    def logprob_op(self, *, package: str, module: str, function_name: str,
                   doc: str) -> autograd.Differentiable:
        """The log-prob entry's autograd class, functional and custom ops:
        ``(hidden, weight, labels, dweight_accumulator, ignore_index, temperature,
        logit_softcap, return_entropy, check_labels)`` -> logprob, or (logprob, entropy) with
        return_entropy; both fp32, labels' shape."""

        def forward(hidden, weight, labels, accumulator, ignore_index, temperature,
                    logit_softcap, return_entropy, check_labels):
            check_options(ignore_index=ignore_index, logit_softcap=logit_softcap,
                          temperature=temperature, check_labels=check_labels,
                          return_entropy=return_entropy)
            call = validate(hidden, weight, labels, accumulator)
            if check_labels:
                check_label_values(labels, call.vocab, ignore_index)
            plan = self.plan(call.problem)
            out, ent, rmax, logl, _ = self.forward(
                plan, call, hidden, weight, labels, logprob=True, reduction="none",
                ignore_index=ignore_index, logit_softcap=logit_softcap,
                temperature=temperature, entropy=return_entropy)
            return (out, ent, rmax, logl), plan

        def fake(hidden, weight, labels, accumulator, ignore_index, temperature, logit_softcap,
                 return_entropy, check_labels):
            stat = hidden.new_empty((labels.numel(),), dtype=_F32)
            value = labels.new_empty(labels.shape, dtype=_F32)
            return value, (value.clone() if return_entropy else None), stat, stat.clone()

        def backward(plan, constants, saved, grads):
            hidden, weight, labels, accumulator, rmax, logl, ent = saved
            grad_lp, grad_ent = grads[0], grads[1]
            # Under torch.compile an absent tensor travels as an empty one.
            ent = ent if ent is not None and ent.numel() else None
            grad_ent = grad_ent if grad_ent is not None and ent is not None else None
            if not self._backward_prologue(grad_lp is not None or grad_ent is not None):
                return {}
            call, plan = self._resolve(plan, hidden, weight, labels, accumulator)
            dhidden, dweight = self.backward(
                plan, call, hidden, weight, labels, rmax, logl, None, ent,
                None if grad_lp is None else _dense(grad_lp),
                None if grad_ent is None else _dense(grad_ent), logprob=True, reduction="none",
                ignore_index=constants["ignore_index"], logit_softcap=constants["logit_softcap"],
                temperature=constants["temperature"], accumulator=accumulator)
            return {"hidden": dhidden, "weight": dweight}

        return autograd.Differentiable(
            package=package, name="logprob", function_name=function_name, module=module,
            doc=doc,
            arguments="Tensor hidden, Tensor weight, Tensor labels, Tensor? dweight_accumulator, "
                      "int ignore_index, float temperature, float? logit_softcap, "
                      "bool return_entropy, bool check_labels",
            forward=forward, fake=fake,
            outputs=lambda args: (0, 1) if args[7] else (0,),
            save=lambda args, results: (*args[:4], results[2], results[3], results[1]),
            backward=backward, grad_like={"hidden": 0, "weight": 1})

    # ----------------------------------------------------------------------- public helpers

    def run_entry(self, op: autograd.Differentiable, *args, accumulator):
        """An entry's functional: refuses a dweight accumulator under torch.compile (its
        backward writes the accumulator, which the opaque ops do not declare)."""
        if accumulator is not None and torch.compiler.is_compiling():
            raise RuntimeError("dweight_accumulator: not supported under torch.compile (the "
                               "backward adds into it in place, which the opaque custom op "
                               "does not declare); call the entry eagerly, or accumulate "
                               "weight.grad instead")
        return op.functional(*args)

    def workspace_bytes(self, hidden, weight, *, entry: str, reduction: str,
                        return_entropy: bool, accumulate_dweight: bool) -> int:
        """The public ``_bytes`` query: the peak of the intermediate memory,
        max(forward, saved + backward) (:func:`workspace`)."""
        checks.check_choice("entry", entry, ("loss", "logprob"))
        checks.check_choice("reduction", reduction, REDUCTIONS)
        checks.check_flag("return_entropy", return_entropy)
        checks.check_flag("accumulate_dweight", accumulate_dweight)
        if entry == "loss" and return_entropy:
            raise ValueError("return_entropy: the loss entry has no entropy (entry='logprob')")
        _, dim, vocab, _, tokens = _validate_operands(hidden, weight)
        parts = workspace(self._tiles[hidden.dtype], self.deterministic, tokens=tokens, dim=dim,
                          vocab=vocab, fp32=hidden.dtype == _F32,
                          logprob=entry == "logprob", reduction=reduction,
                          entropy=return_entropy, accumulate=accumulate_dweight)
        return max(parts["forward"], parts["saved"] + parts["backward"])


class LossModule(torch.nn.Module):
    """What each family's loss module (``CakeLMHead<Mode>Loss``) is: the loss entry's options
    only, checked at construction, and ``module(hidden, weight, labels)`` calling the family's
    loss entry (``entry``, set by the subclass) with them."""

    entry: Callable

    def __init__(self, *, ignore_index: int = -100, reduction: str = "mean",
                 logit_softcap: Optional[float] = None, check_labels: bool = True):
        super().__init__()
        check_options(ignore_index=ignore_index, logit_softcap=logit_softcap,
                      reduction=reduction, check_labels=check_labels)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.logit_softcap = logit_softcap
        self.check_labels = check_labels

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        return type(self).entry(hidden, weight, labels, ignore_index=self.ignore_index,
                                reduction=self.reduction, logit_softcap=self.logit_softcap,
                                check_labels=self.check_labels)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"logit_softcap={self.logit_softcap}, check_labels={self.check_labels}")


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """An upstream gradient as the coefficient kernel reads it: fp32 and contiguous (a broadcast
    view from .sum() costs one copy of T x 4 bytes)."""
    if grad.dtype == _F32 and grad.is_contiguous():
        return grad
    dense = _new(tuple(grad.shape), _F32, grad)
    return dense.copy_(grad)
