"""Float64 references of Gated DeltaNet, shared by the two GDN families (their ``reference``
modules re-export these).

* :func:`gdn_reference`: the definition, token by token (differentiable by autograd);
* :func:`gdn_reference_backward`: its gradients by autograd in float64;
* :func:`gdn_chunked_reference`: the chunked WY/UT form (64-token chunks) the kernels compute,
  in plain torch, written for reading (it agrees with the recurrence to ~1e-12 in float64).

Layout: q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu_seqlens ``[N + 1]`` or None
(one document); initial_state ``[N, HV, K, V]``; or the 4-D forms ``[B, T, ...]`` (B documents,
no cu_seqlens). Value head j reads q/k head j // (HV / H). Per document and value head, state S
(K x V)::

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,   o_t = scale S_t^T q_t

with q, k replaced by ``x / sqrt(sum(x^2) + 1e-6)`` under qk_l2norm (scale after the norm).
"""

from __future__ import annotations

import torch

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dimension."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _packed(q, k, v, g, beta, cu_seqlens):
    """4-D inputs as B packed documents; returns (q, k, v, g, beta, cu_seqlens, batch shape)."""
    if q.dim() != 4:
        return q, k, v, g, beta, cu_seqlens, None
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: must be None for 4-D inputs")
    b, t = q.shape[:2]
    cu = torch.arange(b + 1, dtype=torch.int64) * t
    flat = [x.reshape(b * t, *x.shape[2:]) for x in (q, k, v, g, beta)]
    return (*flat, cu, (b, t))


def _bounds(tokens: int, cu_seqlens) -> list:
    if cu_seqlens is None:
        return [(0, tokens)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def gdn_reference(q, k, v, g, beta, cu_seqlens=None, *, scale=None, initial_state=None,
                  output_final_state=False, qk_l2norm=False) -> tuple:
    """The recurrence, token by token, in float64 (inputs are converted). Returns
    ``(o, final_state or None)``, o float64 shaped like v. Differentiable."""
    q, k, v, g, beta, cu_seqlens, batch = _packed(q, k, v, g, beta, cu_seqlens)
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    tokens, heads, head_k = q.shape
    value_heads, head_v = v.shape[1], v.shape[2]
    group = value_heads // heads
    scale = head_k ** -0.5 if scale is None else scale
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    qe = q.repeat_interleave(group, dim=1)
    ke = k.repeat_interleave(group, dim=1)
    outs, finals = [], []
    for n, (bos, eos) in enumerate(_bounds(tokens, cu_seqlens)):
        if initial_state is not None:
            state = initial_state[n].double()
        else:
            state = v.new_zeros(value_heads, head_k, head_v)
        for t in range(bos, eos):
            decayed = torch.exp(g[t])[:, None, None] * state
            predicted = torch.einsum("hk,hkv->hv", ke[t], decayed)
            delta = beta[t][:, None] * (v[t] - predicted)
            state = decayed + ke[t][:, :, None] * delta[:, None, :]
            outs.append(scale * torch.einsum("hk,hkv->hv", qe[t], state))
        finals.append(state)
    o = torch.stack(outs, 0) if outs else v.new_zeros(0, value_heads, head_v)
    if batch is not None:
        o = o.reshape(*batch, value_heads, head_v)
    return o, (torch.stack(finals, 0) if output_final_state else None)


def gdn_reference_backward(do, q, k, v, g, beta, cu_seqlens=None, *, d_final_state=None,
                           scale=None, initial_state=None, qk_l2norm=False) -> tuple:
    """Gradients of ``sum(o * do) + sum(final_state * d_final_state)`` by autograd of
    :func:`gdn_reference` in float64: ``(dq, dk, dv, dg, dbeta, d_initial_state or None)``."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, g, beta)]
    h0 = None if initial_state is None else initial_state.detach().double().requires_grad_()
    o, ht = gdn_reference(*leaves, cu_seqlens, scale=scale, initial_state=h0,
                          output_final_state=d_final_state is not None, qk_l2norm=qk_l2norm)
    loss = (o * do.double()).sum()
    if d_final_state is not None:
        loss = loss + (ht * d_final_state.double()).sum()
    inputs = leaves + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if grad is None else grad for x, grad in zip(inputs, grads)]
    return (*grads[:5], grads[5] if h0 is not None else None)


def gdn_chunked_reference(q, k, v, g, beta, cu_seqlens=None, *, scale=None, initial_state=None,
                          output_final_state=False, qk_l2norm=False, chunk_size=64) -> tuple:
    """The chunked WY/UT form in float64. Per chunk (local cumulative decay gamma, state h at
    the chunk's start)::

        A[r, s] = beta_r exp(gamma_r - gamma_s) k_r.k_s  (s < r),   Tm = (I + A)^-1
        W = Tm diag(beta exp(gamma)) K,   U = Tm diag(beta) V,   delta = U - W h
        O = scale (diag(exp(gamma)) Q h + (Q K^T * M) delta),  M[r, s] = exp(gamma_r - gamma_s)
        h' = exp(gamma_last) h + K^T diag(exp(gamma_last - gamma)) delta
    """
    q, k, v, g, beta, cu_seqlens, batch = _packed(q, k, v, g, beta, cu_seqlens)
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    tokens, heads, head_k = q.shape
    value_heads, head_v = v.shape[1], v.shape[2]
    group = value_heads // heads
    scale = head_k ** -0.5 if scale is None else scale
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    qe = q.repeat_interleave(group, dim=1)
    ke = k.repeat_interleave(group, dim=1)
    o = v.new_zeros(tokens, value_heads, head_v)
    finals = []
    for n, (bos, eos) in enumerate(_bounds(tokens, cu_seqlens)):
        h = (initial_state[n].double().clone() if initial_state is not None
             else v.new_zeros(value_heads, head_k, head_v))
        for s0 in range(bos, eos, chunk_size):
            s1 = min(s0 + chunk_size, eos)
            length = s1 - s0
            qc, kc, vc = (x[s0:s1].transpose(0, 1) for x in (qe, ke, v))
            gam = torch.cumsum(g[s0:s1].transpose(0, 1), dim=-1)
            bc = beta[s0:s1].transpose(0, 1)
            diff = gam[:, :, None] - gam[:, None, :]
            strict = torch.tril(torch.ones(length, length, dtype=torch.bool), -1)
            incl = torch.tril(torch.ones(length, length, dtype=torch.bool), 0)
            decay_strict = torch.where(strict, torch.exp(torch.where(strict, diff, 0.0)), 0.0)
            decay_incl = torch.where(incl, torch.exp(torch.where(incl, diff, 0.0)), 0.0)
            a = bc[:, :, None] * decay_strict * (kc @ kc.transpose(1, 2))
            eye = torch.eye(length, dtype=v.dtype).expand(value_heads, length, length)
            tm = torch.linalg.solve_triangular(eye + a, eye, upper=False, unitriangular=True)
            w = tm @ ((bc * torch.exp(gam))[:, :, None] * kc)
            u = tm @ (bc[:, :, None] * vc)
            delta = u - w @ h
            p = (qc @ kc.transpose(1, 2)) * decay_incl
            o[s0:s1] = (scale * (torch.exp(gam)[:, :, None] * (qc @ h) + p @ delta)).transpose(0, 1)
            gl = gam[:, -1]
            h = torch.exp(gl)[:, None, None] * h + \
                kc.transpose(1, 2) @ (torch.exp(gl[:, None] - gam)[:, :, None] * delta)
        finals.append(h)
    if batch is not None:
        o = o.reshape(*batch, value_heads, head_v)
    return o, (torch.stack(finals, 0) if output_final_state else None)
