"""Autograd function, chunk plan and public entries of the Gated DeltaNet det family.

The functional and its class come from the family skeleton (``core.autograd.Differentiable``,
made by ``_shared.gdn.Programs.differentiable``): eager calls launch first, then record the call
in autograd through :class:`CakeGDNDetFunction`; under ``torch.compile`` the opaque custom ops
``<package>::gdn`` / ``::gdn_backward`` run instead. Both launch through ``_shared.gdn``: each
kernel is one C entry of the (dtype, K, V) program, ``plan.<kernel>(stream, grid_x, grid_y,
grid_z, *arguments)``.

Deterministic: dq and dk are written per value head and summed over each q/k head's value
heads in a fixed order, chunks and tokens reduce in fixed orders, no atomics: results are
bitwise identical run to run, process to process and stream to stream.

Host syncs and CUDA graphs: with ``plan=`` (a :class:`CakeGDNDetPlan`, built once per
cu_seqlens) or without cu_seqlens, a call reads nothing from the device and can be captured in a
CUDA graph; with ``cu_seqlens`` and no plan, the first call with that tensor reads it to the host
once (the one host sync, cached while the tensor is unmodified). With every output and
``workspace`` given, the backward helper allocates nothing (the forward allocates its fp32
intermediates, one buffer).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._shared import gdn, gdn_tiles


class CakeGDNDetPlan(gdn.ChunkPlan):
    """The chunk plan of packed documents: built once per ``cu_seqlens`` (int32 ``[N + 1]``,
    starting at 0, non-decreasing; its values are read to the host here, the one host sync),
    then passed as ``plan=`` to every call on those documents, which then reads nothing from the
    device (CUDA-graph capturable).

    Attributes: ``documents`` (N), ``chunks`` (64-token chunks, NC), ``tokens`` (T), and the
    int32 tensors ``cu`` (a copy of the offsets), ``chunk_doc``, ``chunk_idx``,
    ``chunk_offsets``; ``tensors()`` gives the four in the order :class:`CakeGDNDetFunction`
    takes them. A plan of either GDN family serves both.

    Example::

        >>> cu = torch.tensor([0, 100, 4096], device="cuda", dtype=torch.int32)
        >>> plan = CakeGDNDetPlan(cu)
        >>> o, _ = cake_gdn_det(q, k, v, g, beta, plan=plan)
    """


_PROGRAMS = gdn.Programs(__file__, deterministic=True, tiles=gdn_tiles.tiles,
                         plan_type=CakeGDNDetPlan, family="cake_gdn_det_train")


# --------------------------------------------------------------------------- public helpers


def cake_gdn_det_train_forward(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
        initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
        qk_l2norm: bool = False, plan: Optional[CakeGDNDetPlan] = None,
        out: Optional[torch.Tensor] = None,
        final_state: Optional[torch.Tensor] = None) -> tuple:
    """Forward only (no autograd): ``(o, final_state)``.

    Args: as :func:`cake_gdn_det`, plus ``out`` (o: v's shape and dtype) and
    ``final_state`` (float32 ``[N, HV, K, V]``, only with ``output_final_state``): optional
    preallocated outputs, written and returned.

    Returns:
        ``(o, final_state)``: o like v; final_state float32 ``[N, HV, K, V]`` or None.

    Example::

        >>> o, ht = cake_gdn_det_train_forward(q, k, v, g, beta, cu, output_final_state=True)
    """
    return _PROGRAMS.forward_helper(q, k, v, g, beta, cu_seqlens, scale=scale,
                                    initial_state=initial_state,
                                    output_final_state=output_final_state, qk_l2norm=qk_l2norm,
                                    plan=plan, out=out, final_state=final_state)


def cake_gdn_det_train_backward(
        do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
        beta: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None, *,
        d_final_state: Optional[torch.Tensor] = None, scale: Optional[float] = None,
        initial_state: Optional[torch.Tensor] = None, qk_l2norm: bool = False,
        plan: Optional[CakeGDNDetPlan] = None, dq: Optional[torch.Tensor] = None,
        dk: Optional[torch.Tensor] = None, dv: Optional[torch.Tensor] = None,
        dg: Optional[torch.Tensor] = None, dbeta: Optional[torch.Tensor] = None,
        d_initial_state: Optional[torch.Tensor] = None,
        workspace: Optional[torch.Tensor] = None) -> tuple:
    """Backward from ``do`` (and ``d_final_state``): recomputes the forward's chunk quantities
    from the inputs (nothing per token was saved) and returns
    ``(dq, dk, dv, dg, dbeta, d_initial_state)``.

    Args:
        do: gradient of o (v's shape and dtype). q, k, v, g, beta, cu_seqlens, scale,
            initial_state, qk_l2norm, plan: as the forward.
        d_final_state: gradient of the final state, float32 ``[N, HV, K, V]``, or None.
        dq, dk, dv, dg, dbeta, d_initial_state: optional preallocated outputs (the shape and
            dtype of q, k, v, g, beta, initial_state).
        workspace: optional uint8 device buffer of at least
            :func:`cake_gdn_det_train_backward_workspace_bytes` bytes, 16-byte aligned; with
            it and every output given, nothing is allocated.

    Returns:
        ``(dq, dk, dv, dg, dbeta, d_initial_state)``: dq/dk in q's dtype (summed over each
        q/k head's value heads), dv in v's, dg float32, dbeta in beta's dtype,
        d_initial_state float32 (None without initial_state); all accumulated in fp32.
        Bitwise identical run to run.

    Example::

        >>> dq, dk, dv, dg, dbeta, dh0 = cake_gdn_det_train_backward(do, q, k, v, g, beta, cu)
    """
    outputs = {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "dbeta": dbeta,
               "d_initial_state": d_initial_state}
    return _PROGRAMS.backward_helper(do, q, k, v, g, beta, cu_seqlens,
                                     d_final_state=d_final_state, scale=scale,
                                     initial_state=initial_state, qk_l2norm=qk_l2norm, plan=plan,
                                     outputs=outputs, workspace=workspace)


def cake_gdn_det_train_backward_workspace_bytes(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: Optional[torch.Tensor] = None, *, qk_l2norm: bool = False,
        plan: Optional[CakeGDNDetPlan] = None) -> int:
    """Bytes of device workspace the backward needs for these inputs (0 without tokens).

    The fp32 intermediates of one backward, each 128-byte aligned: per token and value head
    gc, Tm's row (64), W (K), U / V_new (V, one buffer), dV_new (V), dW (K), the dg partials
    (K / 64), dbeta's partial, dq and dk per value head (2 K); per 64-token chunk and value head
    the state and its gradient (2 K V); per token and q/k head the l2-norm factors (2, with
    qk_l2norm); and a float32 copy of beta and dbeta when beta comes in q's dtype. About 5.4 KB
    per token and value head at K = V = 128 (docs/families/gdn.md).

    With V = m K (m > 1) every "value head" above is one of the kernels' HV m heads of V = K
    columns, and the workspace also holds g, beta, dg and dbeta spread over them (4 each) and
    three states in their layout (N x HV m x K x K each: the initial state, the final state's
    gradient and the initial state's).

    Example::

        >>> n = cake_gdn_det_train_backward_workspace_bytes(q, k, v, g, beta, plan=plan)
        >>> ws = torch.empty(n, dtype=torch.uint8, device="cuda")
    """
    return _PROGRAMS.workspace_helper(q, k, v, g, beta, cu_seqlens, qk_l2norm=qk_l2norm,
                                      plan=plan)


def is_cake_gdn_det_train_supported(device: Optional[torch.device | int] = None, *,
                                    dtype: torch.dtype = torch.bfloat16,
                                    head_dim: int = 128,
                                    head_v: Optional[int] = None) -> bool:
    """True when a CUDA device is present (``device``, default the current one), its arch is
    one the programs are built for, ``dtype`` (q's) is bf16 or fp16, ``head_dim`` (K) is 64,
    128 or 256 and ``head_v`` (V, default K) a multiple of K. Compiles nothing. (fp32 runs
    only under Triton's interpreter.)"""
    return _PROGRAMS.supported(device, dtype, head_dim, head_v)


# --------------------------------------------------------------------------- autograd

_OP = _PROGRAMS.differentiable(package=__package__, module=__name__,
                               function_name="CakeGDNDetFunction", doc="""``apply(q, k, v, g,
    beta, initial_state, cu_seqlens, chunk_doc, chunk_idx, chunk_offsets, scale,
    output_final_state, qk_l2norm)`` over packed inputs ([T, H, K]; the four int32 chunk
    tensors of a :class:`CakeGDNDetPlan`, ``plan.tensors()``), or over uniform documents
    ([B, T, H, K], or one document [T, H, K]; the four chunk tensors None): o, or
    ``(o, final_state)`` with output_final_state. Saves only the inputs and the chunk tensors: the backward
    recomputes the chunk quantities (0 bytes per token and head beyond the inputs).

    Example::

        >>> plan = CakeGDNDetPlan(cu)
        >>> o = CakeGDNDetFunction.apply(q, k, v, g, beta, None, *plan.tensors(),
        ...                              q.shape[-1] ** -0.5, False, False)
    """)
CakeGDNDetFunction = _OP.function


def cake_gdn_det(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None, *,
                 scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                 output_final_state: bool = False, qk_l2norm: bool = False,
                 plan: Optional[CakeGDNDetPlan] = None) -> tuple:
    """Gated DeltaNet (chunked, 64-token chunks) over packed documents, with autograd.

    Per document and value head j (reading q/k head j // (HV / H)), state S (K x V, zero or
    ``initial_state``)::

        S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
        o_t = scale * S_t^T q_t

    with q, k replaced by ``x / sqrt(sum(x^2) + 1e-6)`` under ``qk_l2norm`` (the scale applies
    after the norm). The backward is deterministic (bitwise identical run to run,
    process to process, stream to stream); it saves only the inputs.

    Args:
        q, k: bf16/fp16 ``[T, H, K]`` (packed, with ``cu_seqlens`` or one document) or
            ``[B, T, H, K]`` (B documents of T tokens), contiguous, on a CUDA device; K in
            {64, 128, 256}. (fp32 runs only under Triton's interpreter, for tests.)
        v: q's dtype, ``[T, HV, V]`` (or ``[B, T, HV, V]``), HV a multiple of H, V a
            multiple of K (V = m K runs as m value heads of K columns each).
        g: float32 ``[T, HV]`` log-decay (log of the state's decay per token; not checked:
            values > 0 grow the state, and exp() may overflow).
        beta: ``[T, HV]`` float32 or q's dtype (converted to float32 inside, one copy).
        cu_seqlens: int32 ``[N + 1]`` document offsets on q's device (0, non-decreasing, T),
            or None (one document, or B with 4-D inputs; 4-D inputs with cu_seqlens are
            refused).
        scale: default ``K ** -0.5``.
        initial_state: optional float32 ``[N, HV, K, V]``.
        output_final_state: also return the final state (float32 ``[N, HV, K, V]``).
        qk_l2norm: l2-normalise q and k per head (eps 1e-6 on the squared norm), backward
            included.
        plan: a :class:`CakeGDNDetPlan` of cu_seqlens (no host sync; CUDA-graph
            capturable); without it the first call with a cu_seqlens tensor reads it once.

    Returns:
        ``(o, final_state)``: o like v (v's dtype); final_state float32 or None.

    Example::

        >>> import torch
        >>> from cake.cake_gdn_det_train import cake_gdn_det, CakeGDNDetPlan
        >>> T, H, HV, D = 4096, 2, 4, 128
        >>> q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> k = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> v = torch.randn(T, HV, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(T, HV, device="cuda"))
        >>> beta = torch.rand(T, HV, device="cuda")
        >>> plan = CakeGDNDetPlan(torch.tensor([0, 1000, T], device="cuda", dtype=torch.int32))
        >>> o, _ = cake_gdn_det(q, k, v, g, beta, plan=plan, qk_l2norm=True)
        >>> o.float().square().sum().backward()
    """
    return _PROGRAMS.functional(_OP, q, k, v, g, beta, cu_seqlens, scale=scale,
                                initial_state=initial_state,
                                output_final_state=output_final_state, qk_l2norm=qk_l2norm,
                                plan=plan)
