"""Host code shared by the two Gated DeltaNet families (``cake_gdn_det_train`` and
``cake_gdn_nondet_train``): validation, the chunk plan, routing, the workspace layout and the
launch sequences of the forward and the backward. Both families run programs rendered from the
same templates (``csrc/templates/gdn``) and differ only in how the backward reduces dq and dk
over a group's value heads (``DETERMINISTIC``: per value head, then summed in a fixed order; or
fp32 atomics). Their public functions, plan types, autograd classes and ``torch.compile`` ops
are in their own packages.

The math (per document and value head, state S of K x V; docs/families/gdn.md)::

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,   o_t = scale S_t^T q_t

computed in 64-token chunks (WY/UT form) by the ten kernels of each program: ``rstd`` (q/k
l2-norm factors), ``prep`` (chunk-local cumulative decay, the 64x64 inverse, W and U), ``fwd_h``
(the state recurrence across chunks), ``fwd_o`` (the output), and in the backward ``prep`` and
``fwd_h`` again (nothing per token is saved), ``dv_local``, ``dh`` (the reverse recurrence),
``dqkwg``, ``wy_da``, ``wy_dk`` and ``finalize``.

Launches: each kernel is one C entry of the program, ``plan.<kernel>(stream, grid_x, grid_y,
grid_z, *arguments)`` with the arguments of its ``SIGNATURE`` (:data:`ARGUMENTS`), through
``core.plans`` (the library on a GPU, Triton's interpreter on CPU tensors with
``TRITON_INTERPRET=1``). A pointer a call does not use is None (address 0) on a GPU and a small
CPU tensor under the interpreter; the kernels read it only behind the runtime flag that says it
is there.

Shared by the two families' packages (``cake._shared``): only relative imports of ``core``,
torch imported here directly. The tile sizes come from ``gdn_tiles`` (standard library only),
which each family passes in (a shared module imports no other shared module).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref
from typing import Callable, Optional

import torch

from ..core import autograd, checks, plans

# CHUNK and HEAD_DIMS repeat gdn_tiles' (a shared module imports only core; the families pass
# the tiles in): tests/gdn/test_gdn_programs.py checks that the two agree.
CHUNK = 64
GPU_DTYPES = (torch.bfloat16, torch.float16)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
HEAD_DIMS = (64, 128, 256)
ALIGN = 16
_WORKSPACE_ALIGN = 128
_MAX_I32 = 2**31 - 1
_MAX_GRID_Y = 65535
_Q_SHAPE = "[T, H, K] (packed documents, with cu_seqlens or one document) or [B, T, H, K]"

# Each kernel's arguments after the grid, in its SIGNATURE's order (csrc/templates/gdn/<name>.py;
# the family tables declare the same, and a test checks the manifests against this).
ARGUMENTS = {
    "rstd": ("q", "k", "rq", "rk", "R"),
    "prep": ("k", "v", "g", "beta", "rk", "cu", "chunk_doc", "chunk_idx", "gc", "tm", "w", "u",
             "H", "HV", "l2norm"),
    "fwd_h": ("k", "w", "u", "gc", "rk", "h0", "cu", "chunk_off", "hs", "vn", "ht", "H", "HV",
              "l2norm", "use_h0", "store_ht"),
    "fwd_o": ("q", "k", "vn", "gc", "hs", "rq", "rk", "cu", "chunk_doc", "chunk_idx", "o", "scale",
              "H", "HV", "l2norm"),
    "dv_local": ("q", "k", "gc", "dout", "rq", "rk", "cu", "chunk_doc", "chunk_idx", "dvn", "scale",
                 "H", "HV", "l2norm"),
    "dh": ("q", "k", "w", "gc", "dout", "dvn", "rq", "rk", "dht", "cu", "chunk_off", "dhs", "dh0",
           "scale", "H", "HV", "l2norm", "use_dht", "store_dh0"),
    "dqkwg": ("q", "k", "vn", "gc", "dout", "dvn", "hs", "dhs", "rq", "rk", "cu", "chunk_doc",
              "chunk_idx", "dq", "dk", "dw", "dgp", "scale", "T", "H", "HV", "l2norm"),
    "wy_da": ("k", "v", "beta", "gc", "tm", "dw", "dvn", "rk", "cu", "chunk_doc", "chunk_idx",
              "de", "dv", "dbp", "H", "HV", "l2norm"),
    "wy_dk": ("k", "beta", "gc", "tm", "dw", "de", "dbp", "rk", "dgp", "cu", "chunk_doc",
              "chunk_idx", "dk", "dbeta", "dg", "T", "H", "HV", "l2norm"),
    "finalize": ("q", "k", "dqp", "dkp", "rq", "rk", "dq", "dk", "T", "H", "NG", "l2norm"),
}
_GRID = ("grid_x", "grid_y", "grid_z")


# --------------------------------------------------------------------------- small checks


def _check_scale(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale: expected a float or None, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > 3.0e38:
        raise ValueError(f"scale: expected a finite fp32 value, got {value!r}")
    return number


# --------------------------------------------------------------------------- the chunk plan


class ChunkPlan:
    """Per-chunk indices of packed documents, made once per ``cu_seqlens`` and read by every
    launch: ``cu`` (int32 [N + 1], the plan's own copy of the offsets), ``chunk_doc`` and
    ``chunk_idx`` (int32 [NC]: each 64-token chunk's document and its index inside it) and
    ``chunk_offsets`` (int32 [N + 1]: each document's first chunk); ``documents`` (N),
    ``chunks`` (NC) and ``tokens`` (T) as Python ints.

    Made from ``cu_seqlens`` it reads the offsets to the host once (the one host sync; the
    values are checked there: int32, start at 0, non-decreasing); a forward or backward given
    the plan reads nothing from the device, so a step can be captured in a CUDA graph. The
    families' public types (``CakeGDNDetPlan``, ``CakeGDNNondetPlan``) are this class; either
    family takes a plan of the other.
    """

    def __init__(self, cu_seqlens: torch.Tensor):
        device_type = checks.triton_device_type(cu_seqlens)
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens: expected an int32 tensor [N + 1], got "
                            f"{type(cu_seqlens).__name__}")
        if cu_seqlens.dtype != torch.int32:
            raise TypeError(f"cu_seqlens: expected dtype int32, got {checks.describe(cu_seqlens)}")
        if cu_seqlens.device.type != device_type:
            raise ValueError(f"cu_seqlens: expected a {device_type.upper()} tensor, got "
                             f"{checks.describe(cu_seqlens)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2 or not cu_seqlens.is_contiguous():
            raise ValueError(f"cu_seqlens: expected a contiguous 1-D tensor [N + 1] with N >= 1 "
                             f"documents, got {checks.describe(cu_seqlens)}")
        if checks.triton_device_type(cu_seqlens) == "cuda" and plans.is_capturing():
            raise RuntimeError("cu_seqlens: a chunk plan reads the offsets to the host, which a "
                               "CUDA graph capture forbids; build the plan before the capture "
                               "and pass it as plan=")
        offsets = cu_seqlens.tolist()  # the one host sync
        _check_offsets("cu_seqlens", offsets)
        self._source = weakref.ref(cu_seqlens)
        self._build(offsets, cu_seqlens.device)
        _remember(self)

    @property
    def cu_seqlens(self) -> Optional[torch.Tensor]:
        """The tensor the plan was made from (held weakly: the plan keeps its own copy, ``cu``),
        None for a uniform plan."""
        return None if self._source is None else self._source()

    @classmethod
    def uniform(cls, documents: int, length: int, device: torch.device) -> "ChunkPlan":
        """The plan of ``documents`` documents of ``length`` tokens each (inputs [B, T, ...], or
        one document): made from the shapes alone, without reading the device."""
        plan = cls.__new__(cls)
        plan._source = None
        per = -(-length // CHUNK)
        plan.documents, plan.chunks, plan.tokens = documents, documents * per, documents * length
        plan.device = device
        # One int32 buffer, each piece 16-byte aligned: cu, chunk_offsets, chunk_doc, chunk_idx.
        n1 = _pad4(documents + 1)
        nc = _pad4(plan.chunks)
        base = torch.arange(max(documents + 1, plan.chunks), dtype=torch.int32, device=device)
        buffer = torch.empty(2 * n1 + 2 * nc, dtype=torch.int32, device=device)
        plan.cu = buffer[:documents + 1]
        plan.cu.copy_(base[:documents + 1] * length)
        plan.chunk_offsets = buffer[n1:n1 + documents + 1]
        plan.chunk_offsets.copy_(base[:documents + 1] * per)
        plan.chunk_doc = buffer[2 * n1:2 * n1 + plan.chunks]
        plan.chunk_idx = buffer[2 * n1 + nc:2 * n1 + nc + plan.chunks]
        if plan.chunks:
            plan.chunk_doc.copy_(torch.div(base[:plan.chunks], per, rounding_mode="floor"))
            plan.chunk_idx.copy_(torch.remainder(base[:plan.chunks], per))
        return plan if torch.compiler.is_compiling() else _remember(plan)

    def _build(self, offsets: list, device: torch.device) -> None:
        documents = len(offsets) - 1
        per_doc = [-(-(offsets[i + 1] - offsets[i]) // CHUNK) for i in range(documents)]
        first = [0]
        for count in per_doc:
            first.append(first[-1] + count)
        chunk_doc = [d for d, count in enumerate(per_doc) for _ in range(count)]
        chunk_idx = [i for count in per_doc for i in range(count)]
        self.documents, self.chunks, self.tokens = documents, first[-1], offsets[-1]
        self.device = device
        n1, nc = _pad4(documents + 1), _pad4(self.chunks)
        host = torch.zeros(2 * n1 + 2 * nc, dtype=torch.int32)
        host[:documents + 1] = torch.tensor(offsets, dtype=torch.int32)
        host[n1:n1 + documents + 1] = torch.tensor(first, dtype=torch.int32)
        if self.chunks:
            host[2 * n1:2 * n1 + self.chunks] = torch.tensor(chunk_doc, dtype=torch.int32)
            host[2 * n1 + nc:2 * n1 + nc + self.chunks] = torch.tensor(chunk_idx,
                                                                        dtype=torch.int32)
        if device.type == "cpu":
            buffer = host
        else:  # one host-to-device copy, into memory allocated like cu_seqlens
            source = self.cu_seqlens
            buffer = source.new_empty(host.shape) if source is not None else host.to(device)
            buffer.copy_(host)
        self.cu = buffer[:documents + 1]
        self.chunk_offsets = buffer[n1:n1 + documents + 1]
        self.chunk_doc = buffer[2 * n1:2 * n1 + self.chunks]
        self.chunk_idx = buffer[2 * n1 + nc:2 * n1 + nc + self.chunks]

    def tensors(self) -> tuple:
        """(cu, chunk_doc, chunk_idx, chunk_offsets): what the autograd class and the
        ``torch.compile`` ops take for the plan."""
        return self.cu, self.chunk_doc, self.chunk_idx, self.chunk_offsets

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(documents={self.documents}, chunks={self.chunks}, "
                f"tokens={self.tokens}, device={self.device})")


def _pad4(count: int) -> int:
    """int32 elements up to the next 16-byte boundary."""
    return -(-count // 4) * 4


def _check_offsets(name: str, values: list) -> None:
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name}: must be non-decreasing, but entry {i} ({values[i]}) < "
                             f"entry {i - 1} ({values[i - 1]})")


@dataclasses.dataclass(frozen=True)
class Chunks:
    """The chunk plan as a launch reads it (from a :class:`ChunkPlan`, or from the four tensors
    the autograd class and the custom ops take)."""

    cu: torch.Tensor
    chunk_doc: torch.Tensor
    chunk_idx: torch.Tensor
    chunk_offsets: torch.Tensor

    @property
    def documents(self) -> int:
        return self.cu.shape[0] - 1

    @property
    def chunks(self) -> int:
        return self.chunk_doc.shape[0]


# Plans made here (from cu_seqlens without plan=, or for [B, T, ...] inputs), and the chunk
# tensors known to come from a ChunkPlan (so the ops need not read them again).
_cu_plans: dict = {}
_uniform_plans = plans.Memo(256)
_trusted: dict = {}


def _remember(plan: ChunkPlan) -> ChunkPlan:
    """Marks ``plan``'s tensors as checked (until one of them is modified: the four are views
    of one buffer, so they share one version counter)."""
    key = id(plan.chunk_doc)
    _trusted[key] = (weakref.ref(plan.chunk_doc, lambda _, k=key, d=_trusted: d.pop(k, None)),
                     weakref.ref(plan), plan.chunk_doc._version)
    return plan


_side_streams: dict = {}


def _lasting(make: Callable, documents: int, length: int, device: torch.device) -> ChunkPlan:
    """``make(documents, length, device)`` for a plan kept across calls, made in memory no CUDA
    graph owns: torch.compile's ``mode="reduce-overhead"`` runs its warm-up calls with the
    current stream's allocations routed to a graph's private pool, whose blocks later replays
    reuse. A stream of the plan's own is in no pool; the current stream waits for it."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return make(documents, length, device)
    side = _side_streams.get(device)
    if side is None:
        side = _side_streams[device] = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    with torch.cuda.stream(side):
        plan = make(documents, length, device)
    current.wait_stream(side)
    plan.cu.record_stream(current)  # the buffer is read there (and freed once evicted)
    return plan


def plan_for(plan_type: type, cu_seqlens: Optional[torch.Tensor], documents: int, length: int,
             device: torch.device) -> ChunkPlan:
    """The chunk plan of a call without ``plan=``: from ``cu_seqlens`` (one host sync, then
    remembered for that tensor while it is unmodified), or uniform documents."""
    compiling = torch.compiler.is_compiling()
    if cu_seqlens is None:
        # Under a CUDA graph capture the plan's values are written only when the graph
        # replays, so such a plan serves that call alone and is not remembered.
        if compiling or plans.is_capturing():
            return plan_type.uniform(documents, length, device)
        key = (plan_type, device, documents, length)
        found = _uniform_plans.get(key)
        if found is None:
            found = _uniform_plans.put(key, _lasting(plan_type.uniform, documents, length, device))
        return found
    known = _cu_plans.get(id(cu_seqlens))
    if known is not None and known[0]() is cu_seqlens and known[1] == cu_seqlens._version:
        return known[2]
    plan = plan_type(cu_seqlens)
    if not compiling:
        key = id(cu_seqlens)
        _cu_plans[key] = (weakref.ref(cu_seqlens, lambda _, k=key, d=_cu_plans: d.pop(k, None)),
                          cu_seqlens._version, plan)
    return plan


def check_chunks(chunks: Chunks, tokens: int, device: torch.device) -> None:
    """The four chunk tensors an op got: shapes, dtypes and device always; their values (one
    host read) only when they are not a :class:`ChunkPlan`'s, unmodified (the kernels trust the
    values, so hand-made tensors are checked against the plan their offsets give)."""
    for name in ("cu", "chunk_doc", "chunk_idx", "chunk_offsets"):
        tensor = getattr(chunks, name)
        label = "cu_seqlens" if name == "cu" else name
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32 \
                or tensor.dim() != 1 or not tensor.is_contiguous() or tensor.device != device:
            raise ValueError(f"{label}: expected a contiguous int32 1-D tensor on {device} "
                             "(from a chunk plan), got "
                             + (checks.describe(tensor) if isinstance(tensor, torch.Tensor)
                                else type(tensor).__name__))
    if chunks.cu.shape[0] < 2 or chunks.chunk_offsets.shape != chunks.cu.shape:
        raise ValueError(f"cu_seqlens: expected [N + 1] with N >= 1 and chunk_offsets of the "
                         f"same shape, got {checks.describe(chunks.cu)} and "
                         f"{checks.describe(chunks.chunk_offsets)}")
    if chunks.chunk_idx.shape != chunks.chunk_doc.shape:
        raise ValueError("chunk_idx: expected the shape of chunk_doc, got "
                         f"{checks.describe(chunks.chunk_idx)}")
    if torch.compiler.is_compiling():
        return
    known = _trusted.get(id(chunks.chunk_doc))
    plan = known[1]() if known is not None and known[0]() is chunks.chunk_doc else None
    if plan is not None and plan.cu is chunks.cu and plan.chunk_idx is chunks.chunk_idx \
            and plan.chunk_offsets is chunks.chunk_offsets and plan.tokens == tokens \
            and chunks.chunk_doc._version == known[2]:
        return
    if plans.is_capturing():
        raise RuntimeError("cu_seqlens: chunk tensors that do not come from a chunk plan are "
                           "checked on the host, which a CUDA graph capture forbids; pass the "
                           "plan's tensors (plan.tensors())")
    offsets = chunks.cu.tolist()
    _check_offsets("cu_seqlens", offsets)
    if offsets[-1] != tokens:
        raise ValueError(f"cu_seqlens: must end at the token count {tokens}, got {offsets[-1]}")
    reference = ChunkPlan.__new__(ChunkPlan)
    reference._source = None
    reference._build(offsets, torch.device("cpu"))
    for name in ("chunk_doc", "chunk_idx", "chunk_offsets"):
        if not torch.equal(getattr(chunks, name).cpu(), getattr(reference, name)):
            raise ValueError(f"{name}: does not match cu_seqlens (build the chunk tensors with "
                             "the family's plan type)")


# --------------------------------------------------------------------------- validation


@dataclasses.dataclass(frozen=True)
class Problem:
    """What selects a program (built once per call signature: ``core.plans.Plans`` keeps the
    program's bound entries per problem)."""

    device: torch.device
    dtype: torch.dtype
    head_k: int
    head_v: int

    @property
    def variant(self) -> dict:
        return {"dtype": checks.dtype_name(self.dtype), "head_k": self.head_k,
                "head_v": self.head_v}


@dataclasses.dataclass(frozen=True)
class Call:
    """A validated call in packed form (3-D tensors)."""

    problem: Problem
    tokens: int
    heads: int
    value_heads: int
    documents: int
    batched: Optional[tuple]
    """(B, T) for [B, T, ...] inputs, else None."""
    pieces: int = 1
    """V / K: the kernels run each value head as this many heads of K columns (:func:`split`)."""

    @property
    def head_v(self) -> int:
        """The caller's V (the program's is K)."""
        return self.problem.head_v * self.pieces

    @property
    def state_shape(self) -> tuple:
        """[N, HV, K, V] of the initial and final states (the caller's V)."""
        return (self.documents, self.value_heads, self.problem.head_k, self.head_v)


def validate(q, k, v, g, beta, initial_state, cu_seqlens, plan) -> Call:
    """Checks the inputs of a forward or backward call (before any allocation or launch);
    raises TypeError/ValueError naming the argument."""
    device_type = checks.triton_device_type(q)
    checks.check_tensor("q", q, dtypes=DTYPES, ndims=(3, 4), shape_hint=_Q_SHAPE,
                        device_type=device_type)
    if device_type == "cuda" and q.dtype == torch.float32:
        raise TypeError(f"q: float32 inputs run only under Triton's interpreter (the CPU "
                        f"tests); on a GPU pass bfloat16 or float16 q, k, v (the kernels "
                        f"accumulate in fp32 either way), got {checks.describe(q)}")
    batched = q.dim() == 4
    lead = tuple(q.shape[:-2])
    heads, head_k = q.shape[-2], q.shape[-1]
    shape_v = "[T, HV, V]" if not batched else "[B, T, HV, V]"
    checks.check_tensor("k", k, dtypes=(q.dtype,), ndims=(q.dim(),), shape_hint="like q",
                        device_type=device_type)
    if k.shape != q.shape:
        raise ValueError(f"k: expected the shape of q {list(q.shape)}, got {checks.describe(k)}")
    checks.check_tensor("v", v, dtypes=(q.dtype,), ndims=(q.dim(),),
                        shape_hint=f"{shape_v} in q's dtype", device_type=device_type)
    if tuple(v.shape[:-2]) != lead:
        raise ValueError(f"v: expected {shape_v} with the leading dims of q {list(lead)}, got "
                         f"{checks.describe(v)}")
    value_heads, head_v = v.shape[-2], v.shape[-1]
    if head_k not in HEAD_DIMS:
        raise ValueError(f"q: expected K (the last dim) in {HEAD_DIMS}, got {checks.describe(q)}")
    if head_v < head_k or head_v % head_k:
        raise ValueError(f"v: expected V (the last dim) a multiple of K = {head_k} (V = m K runs "
                         f"as m value heads of K columns; otherwise zero-pad v and "
                         f"initial_state to the next multiple of K and keep o[..., :V]: exact, "
                         f"at that V's cost), got {checks.describe(v)}")
    pieces = head_v // head_k
    if heads < 1 or value_heads < heads or value_heads % heads:
        raise ValueError(f"v: expected HV (value heads) a positive multiple of H = {heads} (q's "
                         f"heads; value head j reads q/k head j // (HV / H)), got "
                         f"{checks.describe(v)}")
    if value_heads * pieces > _MAX_GRID_Y:
        raise ValueError(f"v: expected HV x V / K at most {_MAX_GRID_Y} (the kernels' value "
                         f"heads), got {checks.describe(v)}")
    gate_shape = [*lead, value_heads]
    checks.check_tensor("g", g, dtypes=(torch.float32,), ndims=(q.dim() - 1,),
                        shape_hint=f"{gate_shape} float32 (log-decay)", device_type=device_type)
    if list(g.shape) != gate_shape:
        raise ValueError(f"g: expected float32 {gate_shape}, got {checks.describe(g)}")
    checks.check_tensor("beta", beta, dtypes=(torch.float32, q.dtype), ndims=(q.dim() - 1,),
                        shape_hint=f"{gate_shape} in float32 or q's dtype",
                        device_type=device_type)
    if list(beta.shape) != gate_shape:
        raise ValueError(f"beta: expected {gate_shape}, got {checks.describe(beta)}")
    checks.check_same_device("q", q, {"k": k, "v": v, "g": g, "beta": beta})
    tokens = lead[0] * lead[1] if batched else lead[0]
    if batched:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: must be None for 4-D inputs [B, T, H, K] (B documents "
                             f"of T tokens; got q {checks.describe(q)}); pass [T, H, K] to pack "
                             "documents of other lengths")
        if plan is not None:
            raise ValueError("plan: must be None for 4-D inputs [B, T, H, K]; pass [T, H, K] "
                             "with the plan of their cu_seqlens")
        documents = lead[0]
    elif plan is not None:
        if not isinstance(plan, ChunkPlan):
            raise TypeError(f"plan: expected a chunk plan (the family's plan type) or None, "
                            f"got {type(plan).__name__}")
        if cu_seqlens is not None and cu_seqlens is not plan.cu_seqlens:
            raise ValueError("cu_seqlens: given with a plan made from another tensor; pass one "
                             "of them")
        if plan.device != q.device:
            raise ValueError(f"plan: made on {plan.device}, but q is on {q.device}")
        if plan.tokens != tokens:
            raise ValueError(f"plan: made for {plan.tokens} tokens, but q has {tokens} "
                             f"({checks.describe(q)})")
        documents = plan.documents
    elif cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens: expected an int32 tensor [N + 1] or None, got "
                            f"{type(cu_seqlens).__name__}")
        if cu_seqlens.dtype != torch.int32:
            raise TypeError(f"cu_seqlens: expected dtype int32, got {checks.describe(cu_seqlens)}")
        if cu_seqlens.device != q.device:
            raise ValueError(f"cu_seqlens: expected a tensor on {q.device} (the device of q), "
                             f"got {checks.describe(cu_seqlens)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2 or not cu_seqlens.is_contiguous():
            raise ValueError(f"cu_seqlens: expected a contiguous 1-D tensor [N + 1] with N >= 1 "
                             f"documents, got {checks.describe(cu_seqlens)}")
        documents = cu_seqlens.shape[0] - 1
    else:
        documents = 1
    if tokens * heads > _MAX_I32 or tokens * value_heads * pieces > _MAX_I32:
        raise ValueError(f"q: expected T x HV x V / K < 2^31 (tokens x the kernels' value "
                         f"heads), got T = {tokens}, HV = {value_heads}, V / K = {pieces}")
    if initial_state is not None:
        state = [documents, value_heads, head_k, head_v]
        checks.check_tensor("initial_state", initial_state, dtypes=(torch.float32,), ndims=(4,),
                            shape_hint=f"{state} float32 [N, HV, K, V]", device_type=device_type)
        checks.check_same_device("q", q, {"initial_state": initial_state})
        if list(initial_state.shape) != state:
            raise ValueError(f"initial_state: expected float32 [N, HV, K, V] = {state} (N "
                             f"documents), got {checks.describe(initial_state)}")
    checks.check_aligned({"q": q, "k": k, "v": v, "g": g, "beta": beta,
                    "initial_state": initial_state})
    return Call(Problem(q.device, q.dtype, head_k, head_k), tokens, heads, value_heads,
                documents, tuple(lead) if batched else None, pieces)


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """An upstream gradient as the kernels read it: contiguous and 16-byte aligned."""
    tensor = tensor.contiguous()
    if not torch.compiler.is_compiling() and tensor.data_ptr() % ALIGN:
        tensor = tensor.clone()
    return tensor


def check_output(name: str, value, shape, dtype, device) -> Optional[torch.Tensor]:
    if value is None:
        return None
    checks.check_output(name, value, shape=shape, dtype=dtype, device=device)
    checks.check_aligned({name: value})
    return value


# --------------------------------------------------------------------------- routing


def bindings(problem: Problem) -> dict:
    """Every kernel's entry, all arguments per call (the grid and the tensors change with the
    call and the chunk plan): ``plan.<kernel>(stream, grid_x, grid_y, grid_z, *arguments)``."""
    return {name: (_GRID + arguments, {}) for name, arguments in ARGUMENTS.items()}


# --------------------------------------------------------------------------- V = m K


def split(tensor: torch.Tensor, pieces: int) -> torch.Tensor:
    """[T, HV, m K] -> [T, HV m, K], a view: the kernels' value heads, each of K columns.

    The recurrence never mixes V columns (column c of S evolves from column c of v alone, and
    column c of o reads only it), so V = m K is m independent problems of K columns that share
    q, k, g and beta. Column block j of value head i becomes head i m + j, which reads q/k head
    (i m + j) // (HV m / H) = i // (HV / H), the caller's; dq and dk sum over the group as
    before, dg and dbeta over the pieces (:func:`gather`). The K-side work of a chunk (A, the
    inverse, W, Q K^T) runs once per piece (docs/families/gdn.md#head-dimensions)."""
    tokens, heads, columns = tensor.shape
    return tensor.view(tokens, heads * pieces, columns // pieces)


def spread(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """g or beta [T, HV] -> ``out`` fp32 [T, HV m]: each value head's value for each piece."""
    out.view(*gate.shape, -1).copy_(gate.unsqueeze(-1))
    return out


def gather(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """dg or dbeta fp32 [T, HV m] -> ``out`` [T, HV] (its dtype): the pieces summed in order
    in fp32, in place in ``grad``'s first piece (no allocation), then written once."""
    pieces = grad.view(*out.shape, -1)
    total = pieces[..., 0]
    for piece in range(1, pieces.shape[-1]):
        total.add_(pieces[..., piece])
    out.copy_(total)
    return out


def copy_state(state: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A state copied between the caller's layout [N, HV, K, m K] and the kernels' [N, HV m,
    K, K], either way (the shapes say which)."""
    wide, narrow = (state, out) if state.shape[-1] > state.shape[-2] else (out, state)
    documents, heads, rows, columns = wide.shape
    pieces = columns // rows
    by_piece = wide.view(documents, heads, rows, pieces, rows).transpose(2, 3)
    kernels = narrow.view(documents, heads, pieces, rows, rows)
    if out is narrow:
        kernels.copy_(by_piece)
    else:
        by_piece.copy_(kernels)
    return out


# --------------------------------------------------------------------------- workspace


def _round(nbytes: int) -> int:
    return -(-nbytes // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN


def layout(*, tokens: int, heads: int, value_heads: int, head_k: int, chunks: int,
           l2norm: bool, beta_fp32: bool, backward: bool, deterministic: bool, nkb: int,
           pieces: int = 1, documents: int = 0, states: tuple = ()) -> dict:
    """Byte offsets of the fp32 intermediates of one forward or backward in one buffer:
    name -> (offset, shape). Nothing here lives past the call (nothing per token is saved
    for the backward: it recomputes them). ``value_heads`` are the kernels' (the caller's
    times ``pieces``, :func:`split`), each of K = V columns.

    ``u`` and ``vn`` share their bytes (fwd_h reads each element of U and writes V_new at the
    same place, in the same program); in the backward ``de`` reuses ``hs`` (hs is last read by
    dqkwg, de first written by wy_da). With ``pieces`` > 1 the caller's g and beta (and their
    gradients) are spread over the pieces here, and the states named in ``states`` (each
    ``[documents, value_heads, K, K]``) are the caller's in the kernels' layout."""
    t, h, hv, k, nc = tokens, heads, value_heads, head_k, chunks
    spread = pieces > 1
    buffers = []
    if not beta_fp32 or spread:
        buffers.append(("beta", (t, hv)))
    if spread:
        buffers.append(("g", (t, hv)))
        buffers += [(name, (documents, hv, k, k)) for name in states]
    if l2norm:
        buffers += [("rq", (t, h)), ("rk", (t, h))]
    buffers += [("gc", (t, hv)), ("tm", (t, hv, CHUNK)), ("w", (t, hv, k)), ("u", (t, hv, k)),
                ("hs", (nc, hv, k, k))]
    if backward:
        partials = (t, hv, k) if deterministic else (t, h, k)
        buffers += [("dvn", (t, hv, k)), ("dhs", (nc, hv, k, k)), ("dqp", partials),
                    ("dkp", partials), ("dw", (t, hv, k)), ("dgp", (nkb, t, hv)),
                    ("dbp", (t, hv))]
        if not beta_fp32 or spread:
            buffers.append(("dbeta", (t, hv)))
        if spread:
            buffers.append(("dg", (t, hv)))
    found, offset = {}, 0
    for name, shape in buffers:
        found[name] = (offset, shape)
        offset += _round(4 * math.prod(shape))
    found["vn"] = found["u"]
    if backward:
        found["de"] = (found["hs"][0], (t, hv, CHUNK))
    found["_bytes"] = (offset, ())
    return found


def carve(buffer: torch.Tensor, places: dict) -> dict:
    """The fp32 views of ``layout``'s pieces in a uint8 ``buffer``."""
    views = {}
    for name, (offset, shape) in places.items():
        if name == "_bytes":
            continue
        size = 4 * math.prod(shape)
        views[name] = buffer[offset:offset + size].view(torch.float32).view(shape)
    return views


# --------------------------------------------------------------------------- the programs


class Programs:
    """The programs of one GDN family package (``deterministic`` or not): validated plans per
    problem, the chunk plans, and the forward and backward launch sequences.

    ``tiles(K, V)`` gives the programs' tile sizes (``cake/_shared/gdn_tiles.py``: the family
    tables rendered the programs from the same function); ``plan_type`` is the family's public
    chunk plan class; ``family`` its package name's last part (in messages).
    """

    def __init__(self, package_file: str, *, deterministic: bool, tiles: Callable,
                 plan_type: type, family: str):
        self._package_file = package_file
        self.deterministic = deterministic
        self.tiles = tiles
        self.plan_type = plan_type
        self.family = family
        self.plan = plans.Plans(package_file, plans.select_variant, bindings)

    def clear(self) -> None:
        self.plan.clear()

    def _alert(self) -> None:
        """The nondet backward's determinism alert (docs/architecture.md#names), before it allocates or
        launches anything."""
        checks.alert_not_deterministic(
            f"{self.family}_backward",
            why="Its dq and dk are summed over each group's value heads with fp32 atomics",
            instead=f"{self.family.replace('nondet', 'det')}_backward")

    def supported(self, device, dtype: torch.dtype, head_dim: int,
                  head_v: Optional[int] = None) -> bool:
        """A CUDA device is present, its arch is one the programs of (dtype, K = V =
        ``head_dim``) are built for, dtype is bf16 or fp16, and ``head_v`` (V, default K) is
        a multiple of K (:func:`split`). Compiles nothing."""
        head_v = head_dim if head_v is None else head_v
        if dtype not in GPU_DTYPES or head_dim not in HEAD_DIMS:
            return False
        if not isinstance(head_v, numbers.Integral) or head_v < head_dim or head_v % head_dim:
            return False
        device = plans.supported_device(device)
        if device is None:
            return False
        arch = plans.device_arch(device)
        variant = Problem(device, dtype, head_dim, head_dim).variant
        return any(arch in p.arches and p.variant == variant
                   for p in plans.program_set(self._package_file).manifest.programs)

    # ----------------------------------------------------------------------- calls

    def chunk_plan(self, call: Call, cu_seqlens, plan) -> ChunkPlan:
        if plan is not None:
            return plan
        if call.batched is not None:
            return plan_for(self.plan_type, None, call.batched[0], call.batched[1],
                            call.problem.device)
        found = plan_for(self.plan_type, cu_seqlens, 1, call.tokens, call.problem.device)
        if found.tokens != call.tokens:
            raise ValueError(f"cu_seqlens: must end at the token count {call.tokens}, got "
                             f"{found.tokens}")
        return found

    def workspace_bytes(self, call: Call, chunks: int, *, qk_l2norm: bool, beta_fp32: bool) -> int:
        if chunks == 0:  # no tokens: the backward launches nothing and carves nothing
            return 0
        return self._layout(call.tokens, call.heads, call.value_heads, call.problem.head_k,
                            call.pieces, call.documents, chunks, qk_l2norm=qk_l2norm,
                            beta_fp32=beta_fp32, backward=True)["_bytes"][0]

    def _layout(self, tokens: int, heads: int, value_heads: int, head_k: int, pieces: int,
                documents: int, chunks: int, *, qk_l2norm: bool, beta_fp32: bool,
                backward: bool, states: tuple = ("h0", "dht", "dh0")) -> dict:
        """:func:`layout` of a call (the caller's value heads and their pieces)."""
        return layout(tokens=tokens, heads=heads, value_heads=value_heads * pieces,
                      head_k=head_k, chunks=chunks, l2norm=qk_l2norm, beta_fp32=beta_fp32,
                      backward=backward, deterministic=self.deterministic,
                      nkb=head_k // self.tiles(head_k, head_k)["DQKWG_BK"], pieces=pieces,
                      documents=documents, states=states)

    @staticmethod
    def _launch(plan: plans.Plan, stream: int, name: str, grid: tuple, *arguments) -> None:
        """One kernel: its program's entry with the grid and the kernel's arguments."""
        getattr(plan, name)(stream, *grid, *arguments)

    def forward(self, plan: plans.Plan, q, k, v, g, beta, initial_state, chunks: Chunks,
                scale: float, output_final_state: bool, qk_l2norm: bool, *, out=None,
                final_state=None) -> tuple:
        """Packed (3-D) inputs, validated: allocates what is not given and launches
        rstd (with qk_l2norm), prep, fwd_h, fwd_o over the kernels' value heads (:func:`split`).
        Returns (o, final_state or None)."""
        t, h, kd = q.shape
        n, nc = chunks.documents, chunks.chunks
        o = torch.empty_like(v) if out is None else out
        ht = None
        if output_final_state:
            ht = final_state if final_state is not None else \
                q.new_empty((n, v.shape[1], kd, v.shape[2]), dtype=torch.float32)
        if nc == 0:  # no tokens: the final state is the initial one
            if ht is not None:
                ht.copy_(initial_state) if initial_state is not None else ht.zero_()
            return o, ht
        pieces = v.shape[2] // kd
        states = tuple(name for name, state in (("h0", initial_state), ("ht", ht))
                       if state is not None)
        places = self._layout(t, h, v.shape[1], kd, pieces, n, nc, qk_l2norm=qk_l2norm,
                              beta_fp32=beta.dtype == torch.float32, backward=False,
                              states=states)
        scratch = carve(q.new_empty(places["_bytes"][0], dtype=torch.uint8), places)
        tiles = self.tiles(kd, kd)
        stream = plans.stream_handle(q.device)
        dummy = plans.unused_pointer(q.device)
        v, g, beta, h0 = self._kernel_inputs(scratch, pieces, v, g, beta, initial_state)
        ht_k = scratch.get("ht", ht)
        self._forward_core(plan, stream, q, k, v, g, beta, h0, chunks, scratch, ht_k, qk_l2norm,
                           tiles, dummy)
        hv = v.shape[1]
        rq, rk = scratch.get("rq", dummy), scratch.get("rk", dummy)
        self._launch(plan, stream, "fwd_o", (nc, hv, kd // tiles["FWD_O_BV"]), q, k,
                     scratch["vn"], scratch["gc"], scratch["hs"], rq, rk, chunks.cu,
                     chunks.chunk_doc, chunks.chunk_idx, split(o, pieces), scale, h, hv,
                     int(qk_l2norm))
        if ht_k is not ht:
            copy_state(ht_k, ht)
        return o, ht

    @staticmethod
    def _kernel_inputs(scratch: dict, pieces: int, v, g, beta, initial_state) -> tuple:
        """(v, g, beta, initial_state) as the kernels read them: the value heads split into
        pieces (:func:`split`; g, beta and the state copied into ``scratch`` when there are
        several), beta in fp32 (a beta in q's dtype is converted: one specialization)."""
        if "beta" in scratch:
            beta = spread(beta, scratch["beta"])
        if "g" in scratch:
            g = spread(g, scratch["g"])
        if initial_state is not None and "h0" in scratch:
            initial_state = copy_state(initial_state, scratch["h0"])
        return split(v, pieces), g, beta, initial_state

    def _forward_core(self, plan, stream, q, k, v, g, beta, initial_state, chunks, scratch, ht,
                      qk_l2norm, tiles, dummy) -> None:
        """rstd, prep and fwd_h on the kernels' inputs (:meth:`_kernel_inputs`): gc, Tm, W,
        U, the per-chunk states and V_new (into ``scratch``), and the final state into ``ht``
        when given."""
        t, h, kd = q.shape
        hv, vd = v.shape[1], v.shape[2]
        rq, rk = scratch.get("rq", dummy), scratch.get("rk", dummy)
        if qk_l2norm:
            rows = t * h
            self._launch(plan, stream, "rstd", (-(-rows // tiles["RSTD_BR"]), 1, 1), q, k, rq,
                         rk, rows)
        self._launch(plan, stream, "prep", (chunks.chunks, hv, 1), k, v, g, beta, rk, chunks.cu,
                     chunks.chunk_doc, chunks.chunk_idx, scratch["gc"], scratch["tm"],
                     scratch["w"], scratch["u"], h, hv, int(qk_l2norm))
        self._launch(plan, stream, "fwd_h", (chunks.documents * hv, vd // tiles["FWD_H_BV"], 1),
                     k, scratch["w"], scratch["u"], scratch["gc"], rk,
                     dummy if initial_state is None else initial_state, chunks.cu,
                     chunks.chunk_offsets, scratch["hs"], scratch["vn"],
                     dummy if ht is None else ht, h, hv, int(qk_l2norm),
                     int(initial_state is not None), int(ht is not None))

    def backward(self, plan: plans.Plan, do, dht, q, k, v, g, beta, initial_state,
                 chunks: Chunks, scale: float, qk_l2norm: bool, *, dq=None, dk=None, dv=None,
                 dg=None, dbeta=None, dh0=None, workspace=None) -> tuple:
        """Packed (3-D) inputs, validated (the non-determinism alert, if any, already
        raised): allocates what is not given and launches the forward's rstd, prep and fwd_h
        again, then dv_local, dh, dqkwg, wy_da, wy_dk, finalize, over the kernels' value heads
        (:func:`split`). Returns (dq, dk, dv, dg, dbeta, d_initial_state or None)."""
        t, h, kd = q.shape
        n, nc = chunks.documents, chunks.chunks
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        dg = torch.empty_like(g) if dg is None else dg
        dbeta = torch.empty_like(beta) if dbeta is None else dbeta
        if initial_state is not None and dh0 is None:
            dh0 = torch.empty_like(initial_state)
        if nc == 0:  # no tokens: only the state gradient passes through
            for tensor in (dq, dk, dv, dg, dbeta):
                tensor.zero_()
            if dh0 is not None:
                dh0.copy_(dht) if dht is not None else dh0.zero_()
            return dq, dk, dv, dg, dbeta, dh0
        pieces = v.shape[2] // kd
        places = self._layout(t, h, v.shape[1], kd, pieces, n, nc, qk_l2norm=qk_l2norm,
                              beta_fp32=beta.dtype == torch.float32, backward=True)
        if workspace is None:
            workspace = q.new_empty(places["_bytes"][0], dtype=torch.uint8)
        scratch = carve(workspace.view(torch.uint8).view(-1), places)
        tiles = self.tiles(kd, kd)
        nkb = kd // tiles["DQKWG_BK"]
        stream = plans.stream_handle(q.device)
        dummy = plans.unused_pointer(q.device)
        v, g, beta, h0 = self._kernel_inputs(scratch, pieces, v, g, beta, initial_state)
        if dht is not None and "dht" in scratch:
            dht = copy_state(dht, scratch["dht"])
        dh0_k = scratch["dh0"] if dh0 is not None and "dh0" in scratch else dh0
        dg_k, dbeta_k = scratch.get("dg", dg), scratch.get("dbeta", dbeta)
        do, dv_k = split(do, pieces), split(dv, pieces)
        hv = v.shape[1]
        self._forward_core(plan, stream, q, k, v, g, beta, h0, chunks, scratch, None,
                           qk_l2norm, tiles, dummy)
        rq, rk = scratch.get("rq", dummy), scratch.get("rk", dummy)
        l2 = int(qk_l2norm)
        cu, doc, idx = chunks.cu, chunks.chunk_doc, chunks.chunk_idx
        self._launch(plan, stream, "dv_local", (nc, hv, kd // tiles["DV_LOCAL_BV"]), q, k,
                     scratch["gc"], do, rq, rk, cu, doc, idx, scratch["dvn"], scale, h, hv, l2)
        self._launch(plan, stream, "dh", (n * hv, kd // tiles["DH_BV"], 1), q, k, scratch["w"],
                     scratch["gc"], do, scratch["dvn"], rq, rk, dummy if dht is None else dht,
                     cu, chunks.chunk_offsets, scratch["dhs"],
                     dummy if dh0_k is None else dh0_k, scale, h, hv, l2, int(dht is not None),
                     int(dh0_k is not None))
        if not self.deterministic:  # fp32 atomics accumulate into (T, H, K)
            scratch["dqp"].zero_()
            scratch["dkp"].zero_()
        self._launch(plan, stream, "dqkwg", (nc, hv, nkb), q, k, scratch["vn"], scratch["gc"],
                     do, scratch["dvn"], scratch["hs"], scratch["dhs"], rq, rk, cu, doc, idx,
                     scratch["dqp"], scratch["dkp"], scratch["dw"], scratch["dgp"], scale, t, h,
                     hv, l2)
        self._launch(plan, stream, "wy_da", (nc, hv, 1), k, v, beta, scratch["gc"],
                     scratch["tm"], scratch["dw"], scratch["dvn"], rk, cu, doc, idx,
                     scratch["de"], dv_k, scratch["dbp"], h, hv, l2)
        self._launch(plan, stream, "wy_dk", (nc, hv, 1), k, beta, scratch["gc"],
                     scratch["tm"], scratch["dw"], scratch["de"], scratch["dbp"], rk,
                     scratch["dgp"], cu, doc, idx, scratch["dkp"], dbeta_k, dg_k, t, h, hv, l2)
        groups = hv // h if self.deterministic else 1
        self._launch(plan, stream, "finalize", (-(-t // tiles["FINALIZE_BT"]), h, 1), q, k,
                     scratch["dqp"], scratch["dkp"], rq, rk, dq, dk, t, h, groups, l2)
        for part, whole in ((dbeta_k, dbeta), (dg_k, dg)):
            if part is not whole:
                gather(part, whole)
        if dh0_k is not dh0:
            copy_state(dh0_k, dh0)
        return dq, dk, dv, dg, dbeta, dh0

    # ----------------------------------------------------------------------- autograd

    def differentiable(self, *, package: str, module: str, function_name: str,
                       doc: str) -> autograd.Differentiable:
        """The family's autograd class and functional (core.autograd's skeleton): ``(q, k, v,
        g, beta, initial_state, cu_seqlens, chunk_doc, chunk_idx, chunk_offsets, scale,
        output_final_state, qk_l2norm)`` -> o, or (o, final_state) with output_final_state.

        Packed inputs ``[T, ...]`` take a chunk plan's four tensors; uniform documents (inputs
        ``[B, T, ...]``, or one document ``[T, ...]``) take four None, and the call gets the
        plan of their shapes itself (cached, made without reading the device), so a compiled
        step over ``[B, T, ...]`` inputs neither syncs nor checks chunk tensors on the host. The
        backward gets only the inputs (and the chunk tensors): it recomputes everything per
        chunk."""

        def forward(q, k, v, g, beta, initial_state, cu, chunk_doc, chunk_idx, chunk_offsets,
                    scale, output_final_state, qk_l2norm):
            call, chunks = self.check_packed(q, k, v, g, beta, initial_state,
                                             (cu, chunk_doc, chunk_idx, chunk_offsets), scale,
                                             output_final_state, qk_l2norm)
            plan = self.plan(call.problem)
            pack = self.packed
            # o is allocated in v's shape (the kernels write its packed view): an output that
            # is a view could not be modified in place by the caller.
            o = torch.empty_like(v)
            _, ht = self.forward(plan, pack(q, call), pack(k, call), pack(v, call),
                                 pack(g, call), pack(beta, call), initial_state, chunks, scale,
                                 output_final_state, qk_l2norm, out=pack(o, call))
            # The eager backward reuses the checked call and its chunks with the program.
            return (o, ht), (plan, call, chunks)

        def fake(q, k, v, g, beta, initial_state, cu, chunk_doc, chunk_idx, chunk_offsets,
                 scale, output_final_state, qk_l2norm):
            ht = None
            if output_final_state:
                documents = (cu.shape[0] - 1 if cu is not None
                             else q.shape[0] if q.dim() == 4 else 1)
                ht = q.new_empty((documents, v.shape[-2], q.shape[-1], v.shape[-1]),
                                 dtype=torch.float32)
            return torch.empty_like(v), ht

        def save(args, results):
            return tuple(args[:10])

        def backward(plan, constants, saved, grads):
            q, k, v, g, beta, initial_state, *chunk_tensors = saved
            do, dht = grads
            if do is None and dht is None:
                return {}
            if not self.deterministic:
                self._alert()
            scale, qk_l2norm = constants["scale"], constants["qk_l2norm"]
            if plan is None:  # under torch.compile: the forward's plan is not at hand
                call, chunks = self.check_packed(q, k, v, g, beta, initial_state, chunk_tensors,
                                                 scale, constants["output_final_state"],
                                                 qk_l2norm)
                plan = self.plan(call.problem)
            else:
                plan, call, chunks = plan
            # Upstream gradients may be broadcast views or absent; the kernels read dense rows.
            do = torch.zeros_like(v) if do is None else _dense(do)
            dht = None if dht is None or dht.numel() == 0 else _dense(dht)
            pack = self.packed
            found = self.backward(plan, pack(do, call), dht, pack(q, call), pack(k, call),
                                  pack(v, call), pack(g, call), pack(beta, call), initial_state,
                                  chunks, scale, qk_l2norm)
            names = ("q", "k", "v", "g", "beta")
            grads = {n: grad.view(like.shape)
                     for n, grad, like in zip(names, found, (q, k, v, g, beta))}
            return {**grads, "initial_state": found[5]}

        return autograd.Differentiable(
            package=package, name="gdn", function_name=function_name, module=module, doc=doc,
            arguments="Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
                      "Tensor? initial_state, Tensor? cu_seqlens, Tensor? chunk_doc, "
                      "Tensor? chunk_idx, Tensor? chunk_offsets, float scale, "
                      "bool output_final_state, bool qk_l2norm",
            forward=forward, fake=fake,
            outputs=lambda args: (0, 1) if args[11] else (0,),
            save=save, backward=backward,
            grad_like={"q": 0, "k": 1, "v": 2, "g": 3, "beta": 4, "initial_state": 5})

    def check_packed(self, q, k, v, g, beta, initial_state, chunk_tensors: tuple, scale,
                     output_final_state, qk_l2norm) -> tuple:
        """The checks of the autograd class and the ops: (call, chunks). Four chunk tensors
        (a plan's) with packed inputs [T, ...], or four None with uniform documents (inputs
        [B, T, ...], or one document [T, ...]), whose plan comes from the shapes here."""
        given = [t is not None for t in chunk_tensors]
        if any(given) and not all(given):
            raise ValueError("cu_seqlens, chunk_doc, chunk_idx, chunk_offsets: pass all four "
                             "(a chunk plan's tensors, plan.tensors()) or none (uniform "
                             "documents)")
        if all(given) and isinstance(q, torch.Tensor) and q.dim() != 3:
            raise ValueError(f"q: packed inputs [T, H, K] go with chunk tensors; [B, T, H, K] "
                             f"take none (B documents of T tokens), got {checks.describe(q)}")
        call = validate(q, k, v, g, beta, None, None, None)
        if all(given):
            chunks = Chunks(*chunk_tensors)
            check_chunks(chunks, call.tokens, q.device)
        else:
            documents, length = call.batched if call.batched is not None else (1, call.tokens)
            chunks = Chunks(*plan_for(self.plan_type, None, documents, length,
                                      q.device).tensors())
        if initial_state is not None:
            call = dataclasses.replace(call, documents=chunks.documents)
            state = list(call.state_shape)
            checks.check_tensor("initial_state", initial_state, dtypes=(torch.float32,),
                                ndims=(4,), shape_hint=f"{state} float32",
                                device_type=checks.triton_device_type(q))
            checks.check_same_device("q", q, {"initial_state": initial_state})
            if list(initial_state.shape) != state:
                raise ValueError(f"initial_state: expected float32 [N, HV, K, V] = {state}, "
                                 f"got {checks.describe(initial_state)}")
            checks.check_aligned({"initial_state": initial_state})
        _check_scale(scale)
        checks.check_flag("output_final_state", output_final_state)
        checks.check_flag("qk_l2norm", qk_l2norm)
        return call, chunks

    # ----------------------------------------------------------------------- public helpers

    def resolve(self, q, k, v, g, beta, cu_seqlens, plan, initial_state, scale, flags: dict):
        """A public call's checks, then its chunk plan: (call, chunk plan, scale)."""
        call = validate(q, k, v, g, beta, initial_state, cu_seqlens, plan)
        scale = q.shape[-1] ** -0.5 if scale is None else _check_scale(scale)
        for name, value in flags.items():
            checks.check_flag(name, value)
        return call, scale

    @staticmethod
    def packed(tensor: Optional[torch.Tensor], call: Call) -> Optional[torch.Tensor]:
        """[B, T, ...] -> [B * T, ...] (a view: the inputs are contiguous)."""
        if tensor is None or call.batched is None:
            return tensor
        return tensor.reshape(call.tokens, *tensor.shape[2:])

    def functional(self, op: autograd.Differentiable, q, k, v, g, beta, cu_seqlens, *, scale,
                   initial_state, output_final_state, qk_l2norm, plan) -> tuple:
        """The autograd functional: checks, then ``op`` with the chunk plan's tensors (packed
        documents), or with none (uniform documents: ``op`` gets their plan from the shapes);
        returns (o, final_state or None), o shaped like v."""
        call, scale = self.resolve(q, k, v, g, beta, cu_seqlens, plan, initial_state, scale,
                                   {"output_final_state": output_final_state,
                                    "qk_l2norm": qk_l2norm})
        chunk_tensors = (None,) * 4
        if plan is not None or cu_seqlens is not None:
            chunk_tensors = self.chunk_plan(call, cu_seqlens, plan).tensors()
        result = op.functional(q, k, v, g, beta, initial_state, *chunk_tensors, scale,
                               output_final_state, qk_l2norm)
        return result if output_final_state else (result, None)

    def forward_helper(self, q, k, v, g, beta, cu_seqlens, *, scale, initial_state,
                       output_final_state, qk_l2norm, plan, out, final_state) -> tuple:
        """The forward helper (no autograd): (o, final_state or None)."""
        call, scale = self.resolve(q, k, v, g, beta, cu_seqlens, plan, initial_state, scale,
                                   {"output_final_state": output_final_state,
                                    "qk_l2norm": qk_l2norm})
        check_output("out", out, v.shape, v.dtype, v.device)
        state = call.state_shape
        if final_state is not None and not output_final_state:
            raise ValueError("final_state: given, but output_final_state is False")
        check_output("final_state", final_state, state, torch.float32, q.device)
        outputs = {"out": out, "final_state": final_state}
        if out is not None or final_state is not None:
            checks.check_disjoint({n: t for n, t in outputs.items() if t is not None},
                                  {"q": q, "k": k, "v": v, "g": g, "beta": beta,
                                   "initial_state": initial_state})
        chunk_plan = self.chunk_plan(call, cu_seqlens, plan)
        pack = self.packed
        o, ht = self.forward(self.plan(call.problem), pack(q, call), pack(k, call),
                             pack(v, call), pack(g, call), pack(beta, call), initial_state,
                             Chunks(*chunk_plan.tensors()), scale, output_final_state,
                             qk_l2norm, out=pack(out, call), final_state=final_state)
        return (o.view(v.shape) if out is None else out), ht

    def backward_helper(self, do, q, k, v, g, beta, cu_seqlens, *, d_final_state, scale,
                        initial_state, qk_l2norm, plan, outputs: dict, workspace) -> tuple:
        """The backward helper (no autograd): (dq, dk, dv, dg, dbeta, d_initial_state)."""
        call, scale = self.resolve(q, k, v, g, beta, cu_seqlens, plan, initial_state, scale,
                                   {"qk_l2norm": qk_l2norm})
        device_type = checks.triton_device_type(q)
        checks.check_tensor("do", do, dtypes=(v.dtype,), ndims=(v.dim(),),
                            shape_hint="like v (the gradient of o)", device_type=device_type)
        checks.check_same_device("q", q, {"do": do})
        if do.shape != v.shape:
            raise ValueError(f"do: expected the shape of v {list(v.shape)}, got "
                             f"{checks.describe(do)}")
        state = call.state_shape
        if d_final_state is not None:
            checks.check_tensor("d_final_state", d_final_state, dtypes=(torch.float32,),
                                ndims=(4,), shape_hint=f"{list(state)} float32",
                                device_type=device_type)
            checks.check_same_device("q", q, {"d_final_state": d_final_state})
            if tuple(d_final_state.shape) != state:
                raise ValueError(f"d_final_state: expected float32 [N, HV, K, V] = "
                                 f"{list(state)}, got {checks.describe(d_final_state)}")
        checks.check_aligned({"do": do, "d_final_state": d_final_state})
        likes = {"dq": q, "dk": k, "dv": v, "dg": g, "dbeta": beta,
                 "d_initial_state": initial_state}
        for name, value in outputs.items():
            if value is not None:
                if likes[name] is None:
                    raise ValueError(f"{name}: given, but there is no initial_state")
                check_output(name, value, likes[name].shape, likes[name].dtype, q.device)
        if workspace is not None:
            checks.check_tensor("workspace", workspace, dtypes=(torch.uint8,), ndims=(1,),
                                shape_hint="[bytes] uint8", device_type=device_type)
            checks.check_same_device("q", q, {"workspace": workspace})
        given = {n: t for n, t in {**outputs, "workspace": workspace}.items() if t is not None}
        if given:
            checks.check_disjoint(given, {"do": do, "q": q, "k": k, "v": v, "g": g,
                                          "beta": beta, "initial_state": initial_state,
                                          "d_final_state": d_final_state})
        if not self.deterministic:  # before anything is allocated or launched
            self._alert()
        chunk_plan = self.chunk_plan(call, cu_seqlens, plan)
        if workspace is not None:
            need = self.workspace_bytes(call, chunk_plan.chunks, qk_l2norm=qk_l2norm,
                                        beta_fp32=beta.dtype == torch.float32)
            checks.check_workspace(workspace, device=q.device, need=need,
                                   query=f"{self.family}_backward_workspace_bytes")
        pack = self.packed
        found = self.backward(
            self.plan(call.problem), pack(do, call), d_final_state, pack(q, call),
            pack(k, call), pack(v, call), pack(g, call), pack(beta, call), initial_state,
            Chunks(*chunk_plan.tensors()), scale, qk_l2norm,
            dq=pack(outputs["dq"], call), dk=pack(outputs["dk"], call),
            dv=pack(outputs["dv"], call), dg=pack(outputs["dg"], call),
            dbeta=pack(outputs["dbeta"], call), dh0=outputs["d_initial_state"],
            workspace=workspace)
        likes = (q, k, v, g, beta)
        return (*(outputs[name] if outputs[name] is not None else value.view(like.shape)
                  for name, value, like in zip(("dq", "dk", "dv", "dg", "dbeta"), found, likes)),
                found[5])

    def workspace_helper(self, q, k, v, g, beta, cu_seqlens, *, qk_l2norm, plan) -> int:
        call, _ = self.resolve(q, k, v, g, beta, cu_seqlens, plan, None, None,
                               {"qk_l2norm": qk_l2norm})
        chunk_plan = self.chunk_plan(call, cu_seqlens, plan)
        return self.workspace_bytes(call, chunk_plan.chunks, qk_l2norm=qk_l2norm,
                                    beta_fp32=beta.dtype == torch.float32)
