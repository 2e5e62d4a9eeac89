# Shared Triton code of the Gated DeltaNet families (cake_gdn_det_train, cake_gdn_nondet_train):
# the chunked (64-token, WY/UT) forward and backward, one @triton.jit function a kernel. Each
# program's kernel sources (csrc/templates/gdn/<kernel>.py) are thin wrappers that call these
# with the program's constexprs (K, V, tile sizes, DOT_PREC, DETERMINISTIC).
#
# Layouts (all contiguous, unit innermost stride):
#   q, k           (T, H, K)        input dtype DT (bf16 / fp16; fp32 under the interpreter)
#   v, do, o, dv   (T, HV, V)       DT
#   g, gc          (T, HV)          fp32 (gc = g cumulated inside each 64-token chunk)
#   beta, dbeta    (T, HV)          fp32 (the host converts a beta in q's dtype)
#   rq, rk         (T, H)           fp32  1/sqrt(|x|^2 + 1e-6) (read only with l2norm != 0)
#   tm, de         (T, HV, 64)      fp32  row r of Tm = (I + A)^-1 of the token's chunk / of E
#   w, dw          (T, HV, K)       fp32
#   u, vn, dvn     (T, HV, V)       fp32
#   hs, dhs        (NC, HV, K, V)   fp32  per-chunk state (at chunk start) / its gradient (at end)
#   h0, ht, dht, dh0 (N, HV, K, V)  fp32
# Chunk plan: cu (N+1,), chunk_doc (NC,), chunk_idx (NC,), chunk_off (N+1,), int32.
#
# Per-call choices are runtime i32 flags tested with a scalar `if flag != 0:` (one
# specialization serves every combination): l2norm (qk_l2norm), use_h0 / store_ht (initial
# state read, final state written), use_dht / store_dh0 (final-state gradient read, initial
# state gradient written). Constexprs: K, V, tile sizes, DOT_PREC and, in the two kernels whose
# dq/dk reduction differs between the families, DETERMINISTIC.
#
# Every tl.dot takes operands in DT (fp32 intermediates are cast to DT first), except the three
# 64x64 products that finish the triangular inverse in gdn_prep, which take fp32 operands.
# DOT_PREC is "ieee" for fp32 inputs and "tf32" for 16-bit inputs (it then only affects those
# three products, whose result is rounded to DT before use). No kernel applies tl.trans to a
# dot result (FLA issue #640): transposed products are formed from loaded tiles, or the
# transposed operand is loaded transposed from memory.
#
# Value head hv reads q/k head hv // (HV // H).
import triton
import triton.language as tl


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
@triton.jit
def _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT: tl.constexpr):
    doc = tl.load(chunk_doc + c)
    ci = tl.load(chunk_idx + c)
    bos = tl.load(cu + doc)
    eos = tl.load(cu + doc + 1)
    t0 = bos + ci * BT
    L = tl.minimum(eos - t0, BT)
    return t0, L


@triton.jit
def _norm_factors(r, tt, H, hk, m, l2norm):
    """Per-row factors of q^ or k^ (1/sqrt(|x|^2 + 1e-6) with qk_l2norm, 1 without; 0 on
    masked rows). ``l2norm`` is a runtime flag: one specialization serves both."""
    f = tl.where(m, 1.0, 0.0)
    if l2norm != 0:
        f = tl.load(r + tt * H + hk, mask=m, other=0.0)
    return f


# ------------------------------------------------------------------------------------------
# 0. per-row inverse norms of q and k (only launched with qk_l2norm)
#    grid: (cdiv(R, BR),) with R = T * H rows of length K
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_l2norm_rstd(q, k, rq, rk, R, K: tl.constexpr, BR: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    m = rows < R
    cols = tl.arange(0, K)
    off = rows.to(tl.int64)[:, None] * K + cols[None, :]
    bq = tl.load(q + off, mask=m[:, None], other=0.0).to(tl.float32)
    bk = tl.load(k + off, mask=m[:, None], other=0.0).to(tl.float32)
    tl.store(rq + rows, 1.0 / tl.sqrt_rn(tl.sum(bq * bq, axis=1) + 1e-6), mask=m)
    tl.store(rk + rows, 1.0 / tl.sqrt_rn(tl.sum(bk * bk, axis=1) + 1e-6), mask=m)


# ------------------------------------------------------------------------------------------
# 1. chunk preparation: gc = local cumsum of g, Tm = (I + A)^-1, W = Tm diag(beta e^gc) K^,
#    U = Tm diag(beta) V.   grid: (NC, HV)
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_prep(k, v, g, beta, rk, cu, chunk_doc, chunk_idx, gc, tm, w, u, H, HV, l2norm,
             K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
             DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // H)
    DT = k.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    tt = (t0 + rows).to(tl.int64)
    krow = (tt * H + hk) * K

    # local cumsum of g
    gr = tl.cumsum(tl.load(g + tt * HV + hv, mask=m, other=0.0).to(tl.float32), axis=0)
    tl.store(gc + tt * HV + hv, gr, mask=m)
    b_b = tl.load(beta + tt * HV + hv, mask=m, other=0.0).to(tl.float32)
    nk = _norm_factors(rk, tt, H, hk, m, l2norm)

    # A[r,s] = beta_r e^(gc_r - gc_s) k^_r.k^_s  (s < r)
    b_a = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_k = tl.load(k + krow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_a = tl.dot(b_k, tl.trans(b_k), b_a, input_precision=DOT_PREC)
    lo = (rows[:, None] > rows[None, :]) & m[:, None]
    b_a = tl.where(lo, b_a * (b_b * nk)[:, None] * nk[None, :]
                   * tl.exp(tl.where(lo, gr[:, None] - gr[None, :], 0.0)), 0.0)

    # (I + A)^-1: the four 16x16 diagonal blocks by forward substitution (all four at once:
    # row r of every block per step), then (I + A) = (I + A_bd)(I + N), N = T_bd A_off strictly
    # block-lower (N^4 = 0), so Tm = (I - N)(I + N^2) T_bd.
    same = (rows[:, None] // 16) == (rows[None, :] // 16)
    eye = rows[:, None] == rows[None, :]
    b_abd = tl.where(same, b_a, 0.0)
    b_tbd = tl.where(eye, 1.0, 0.0)
    for r in range(1, 16):
        sel = (rows % 16) == r
        a_r = tl.sum(tl.where(sel[:, None], b_abd, 0.0), axis=0)          # rows r, 16+r, .. combined
        new = -tl.sum(a_r[:, None] * b_tbd, axis=0)
        b_tbd = tl.where(sel[:, None] & same, new[None, :] + tl.where(eye, 1.0, 0.0), b_tbd)
    b_n = tl.dot(b_tbd, tl.where(same, 0.0, b_a), input_precision=DOT_PREC)
    b_p = tl.dot(tl.dot(b_n, b_n, input_precision=DOT_PREC), b_tbd, b_tbd, input_precision=DOT_PREC)
    b_t = b_p - tl.dot(b_n, b_p, input_precision=DOT_PREC)
    trow = (tt * HV + hv) * BT
    tl.store(tm + trow[:, None] + rows[None, :], b_t, mask=m[:, None])

    # W = Tm diag(beta e^gc) K^,  U = Tm diag(beta) V
    b_tc = b_t.to(DT)
    kf = b_b * tl.exp(gr) * nk
    wrow = (tt * HV + hv) * K
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_k = tl.load(k + krow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_w = tl.dot(b_tc, (b_k.to(tl.float32) * kf[:, None]).to(DT), input_precision=DOT_PREC)
        tl.store(w + wrow[:, None] + cols[None, :], b_w, mask=m[:, None])
    vrow = (tt * HV + hv) * V
    for vb in range(0, V, BV):
        cols = vb + tl.arange(0, BV)
        b_v = tl.load(v + vrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_u = tl.dot(b_tc, (b_v.to(tl.float32) * b_b[:, None]).to(DT), input_precision=DOT_PREC)
        tl.store(u + vrow[:, None] + cols[None, :], b_u, mask=m[:, None])


# ------------------------------------------------------------------------------------------
# 2. inter-chunk state recurrence (forward; also re-run in backward).
#    For each chunk: hs[c] = h; vn = U - W h; h = e^gl h + K^T diag(e^(gl - gc)) vn.
#    grid: (N * HV, V // BV); sequential over the document's chunks. use_h0 / store_ht are
#    runtime flags (an initial state is read / the final state is written).
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_fwd_h(k, w, u, gc, rk, h0, cu, chunk_off, hs, vn, ht, H, HV, l2norm, use_h0, store_ht,
              K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
              DOT_PREC: tl.constexpr):
    # the state is held as up to four 64-row blocks b_h1..b_h4 (K = 64 .. 256)
    nh = tl.program_id(0)
    iv = tl.program_id(1)
    n = nh // HV
    hv = nh % HV
    hk = hv // (HV // H)
    DT = k.dtype.element_ty
    bos = tl.load(cu + n)
    eos = tl.load(cu + n + 1)
    cbase = tl.load(chunk_off + n)
    NTn = tl.cdiv(eos - bos, BT)

    o64 = tl.arange(0, 64)
    ov = iv * BV + tl.arange(0, BV)
    rows = tl.arange(0, BT)
    soff = o64[:, None] * V + ov[None, :]
    b_h1 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 64:
        b_h2 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 128:
        b_h3 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 192:
        b_h4 = tl.zeros([64, BV], dtype=tl.float32)
    if use_h0 != 0:
        p0 = h0 + (n.to(tl.int64) * HV + hv) * K * V
        b_h1 = tl.load(p0 + soff)
        if K > 64:
            b_h2 = tl.load(p0 + 64 * V + soff)
        if K > 128:
            b_h3 = tl.load(p0 + 128 * V + soff)
        if K > 192:
            b_h4 = tl.load(p0 + 192 * V + soff)
    for i in range(0, NTn):
        c = (cbase + i).to(tl.int64)
        pc = hs + (c * HV + hv) * K * V
        tl.store(pc + soff, b_h1)
        if K > 64:
            tl.store(pc + 64 * V + soff, b_h2)
        if K > 128:
            tl.store(pc + 128 * V + soff, b_h3)
        if K > 192:
            tl.store(pc + 192 * V + soff, b_h4)
        t0 = bos + i * BT
        m = rows < eos - t0
        tt = (t0 + rows).to(tl.int64)
        pw = w + (tt * HV + hv)[:, None] * K + o64[None, :]
        b_wh = tl.dot(tl.load(pw, mask=m[:, None], other=0.0).to(DT), b_h1.to(DT), input_precision=DOT_PREC)
        if K > 64:
            b_wh = tl.dot(tl.load(pw + 64, mask=m[:, None], other=0.0).to(DT), b_h2.to(DT), b_wh,
                          input_precision=DOT_PREC)
        if K > 128:
            b_wh = tl.dot(tl.load(pw + 128, mask=m[:, None], other=0.0).to(DT), b_h3.to(DT), b_wh,
                          input_precision=DOT_PREC)
        if K > 192:
            b_wh = tl.dot(tl.load(pw + 192, mask=m[:, None], other=0.0).to(DT), b_h4.to(DT), b_wh,
                          input_precision=DOT_PREC)
        voff = (tt * HV + hv)[:, None] * V + ov[None, :]
        b_v = tl.load(u + voff, mask=m[:, None], other=0.0) - b_wh
        tl.store(vn + voff, b_v, mask=m[:, None])
        last = tl.minimum(t0 + BT, eos) - 1
        gl = tl.load(gc + last.to(tl.int64) * HV + hv)
        gr = tl.load(gc + tt * HV + hv, mask=m, other=0.0)
        fac = tl.where(m, tl.exp(gl - gr), 0.0) * _norm_factors(rk, tt, H, hk, m, l2norm)
        b_vf = (b_v * fac[:, None]).to(DT)
        egl = tl.exp(gl)
        pk = k + (tt * H + hk)[:, None] * K + o64[None, :]
        b_h1 = tl.dot(tl.trans(tl.load(pk, mask=m[:, None], other=0.0)), b_vf, b_h1 * egl,
                      input_precision=DOT_PREC)
        if K > 64:
            b_h2 = tl.dot(tl.trans(tl.load(pk + 64, mask=m[:, None], other=0.0)), b_vf, b_h2 * egl,
                          input_precision=DOT_PREC)
        if K > 128:
            b_h3 = tl.dot(tl.trans(tl.load(pk + 128, mask=m[:, None], other=0.0)), b_vf, b_h3 * egl,
                          input_precision=DOT_PREC)
        if K > 192:
            b_h4 = tl.dot(tl.trans(tl.load(pk + 192, mask=m[:, None], other=0.0)), b_vf, b_h4 * egl,
                          input_precision=DOT_PREC)
    if store_ht != 0:
        pt = ht + (n.to(tl.int64) * HV + hv) * K * V
        tl.store(pt + soff, b_h1)
        if K > 64:
            tl.store(pt + 64 * V + soff, b_h2)
        if K > 128:
            tl.store(pt + 128 * V + soff, b_h3)
        if K > 192:
            tl.store(pt + 192 * V + soff, b_h4)


# ------------------------------------------------------------------------------------------
# 3. output: o = scale (diag(e^gc) Q^ h + (Q^ K^^T * M) vn).   grid: (NC, HV, V // BV)
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_fwd_o(q, k, vn, gc, hs, rq, rk, cu, chunk_doc, chunk_idx, o, scale, H, HV, l2norm,
              K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
              DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // (HV // H)
    DT = q.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    tt = (t0 + rows).to(tl.int64)
    ov = iv * BV + tl.arange(0, BV)
    qrow = (tt * H + hk) * K
    hbase = hs + (c.to(tl.int64) * HV + hv) * K * V

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_a = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_q = tl.load(q + qrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_k = tl.load(k + qrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_h = tl.load(hbase + cols[:, None] * V + ov[None, :]).to(DT)
        b_a = tl.dot(b_q, tl.trans(b_k), b_a, input_precision=DOT_PREC)
        b_o = tl.dot(b_q, b_h, b_o, input_precision=DOT_PREC)
    gr = tl.load(gc + tt * HV + hv, mask=m, other=0.0)
    nq = _norm_factors(rq, tt, H, hk, m, l2norm)
    nk = _norm_factors(rk, tt, H, hk, m, l2norm)
    b_a = b_a * nq[:, None] * nk[None, :]
    qf = tl.exp(gr) * nq
    b_o = b_o * qf[:, None]
    incl = (rows[:, None] >= rows[None, :]) & m[:, None]
    b_a = tl.where(incl, b_a * tl.exp(tl.where(incl, gr[:, None] - gr[None, :], 0.0)), 0.0)
    b_v = tl.load(vn + (tt * HV + hv)[:, None] * V + ov[None, :], mask=m[:, None], other=0.0).to(DT)
    b_o = tl.dot(b_a.to(DT), b_v, b_o, input_precision=DOT_PREC)
    tl.store(o + (tt * HV + hv)[:, None] * V + ov[None, :], (b_o * scale).to(o.dtype.element_ty),
             mask=m[:, None])


# ------------------------------------------------------------------------------------------
# 4. backward, intra-chunk part of d(vn): dvn = scale (K^ Q^^T * M^T) dO.   grid: (NC, HV, V // BV)
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_dv_local(q, k, gc, dout, rq, rk, cu, chunk_doc, chunk_idx, dvn, scale, H, HV, l2norm,
                     K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // (HV // H)
    DT = q.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    tt = (t0 + rows).to(tl.int64)
    ov = iv * BV + tl.arange(0, BV)
    qrow = (tt * H + hk) * K

    b_a = tl.zeros([BT, BT], dtype=tl.float32)      # b_a[s, r] = k_s . q_r
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_q = tl.load(q + qrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_k = tl.load(k + qrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_a = tl.dot(b_k, tl.trans(b_q), b_a, input_precision=DOT_PREC)
    gr = tl.load(gc + tt * HV + hv, mask=m, other=0.0)
    nq = _norm_factors(rq, tt, H, hk, m, l2norm)
    nk = _norm_factors(rk, tt, H, hk, m, l2norm)
    b_a = b_a * nk[:, None] * nq[None, :]
    up = (rows[:, None] <= rows[None, :]) & m[None, :]
    b_a = tl.where(up, b_a * tl.exp(tl.where(up, gr[None, :] - gr[:, None], 0.0)) * scale, 0.0)
    b_do = tl.load(dout + (tt * HV + hv)[:, None] * V + ov[None, :], mask=m[:, None], other=0.0)
    b_dv = tl.dot(b_a.to(DT), b_do, input_precision=DOT_PREC)
    tl.store(dvn + (tt * HV + hv)[:, None] * V + ov[None, :], b_dv, mask=m[:, None])


# ------------------------------------------------------------------------------------------
# 5. backward state recurrence, reverse over chunks.   grid: (N * HV, V // BV)
#    use_dht / store_dh0 are runtime flags (a final-state gradient is read / the initial
#    state's gradient is written).
#    dhs[c] = dh (gradient of the state at the end of chunk c)
#    dvn += diag(e^(gl - gc)) K^ dh                       (in place: dvn becomes d(vn))
#    dh  = e^gl dh + scale Q^^T diag(e^gc) dO - W^T dvn
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_dh(q, k, w, gc, dout, dvn, rq, rk, dht, cu, chunk_off, dhs, dh0, scale, H, HV, l2norm, use_dht,
               store_dh0, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
               DOT_PREC: tl.constexpr):
    # the state gradient is held as up to four 64-row blocks b_d1..b_d4 (K = 64 .. 256)
    nh = tl.program_id(0)
    iv = tl.program_id(1)
    n = nh // HV
    hv = nh % HV
    hk = hv // (HV // H)
    DT = q.dtype.element_ty
    bos = tl.load(cu + n)
    eos = tl.load(cu + n + 1)
    cbase = tl.load(chunk_off + n)
    NTn = tl.cdiv(eos - bos, BT)

    o64 = tl.arange(0, 64)
    ov = iv * BV + tl.arange(0, BV)
    rows = tl.arange(0, BT)
    soff = o64[:, None] * V + ov[None, :]
    b_d1 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 64:
        b_d2 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 128:
        b_d3 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 192:
        b_d4 = tl.zeros([64, BV], dtype=tl.float32)
    if use_dht != 0:
        p0 = dht + (n.to(tl.int64) * HV + hv) * K * V
        b_d1 = tl.load(p0 + soff)
        if K > 64:
            b_d2 = tl.load(p0 + 64 * V + soff)
        if K > 128:
            b_d3 = tl.load(p0 + 128 * V + soff)
        if K > 192:
            b_d4 = tl.load(p0 + 192 * V + soff)
    for j in range(0, NTn):
        i = NTn - 1 - j
        c = (cbase + i).to(tl.int64)
        pc = dhs + (c * HV + hv) * K * V
        tl.store(pc + soff, b_d1)
        if K > 64:
            tl.store(pc + 64 * V + soff, b_d2)
        if K > 128:
            tl.store(pc + 128 * V + soff, b_d3)
        if K > 192:
            tl.store(pc + 192 * V + soff, b_d4)
        t0 = bos + i * BT
        m = rows < eos - t0
        tt = (t0 + rows).to(tl.int64)
        last = tl.minimum(t0 + BT, eos) - 1
        gl = tl.load(gc + last.to(tl.int64) * HV + hv)
        gr = tl.load(gc + tt * HV + hv, mask=m, other=0.0)
        kf = tl.where(m, tl.exp(gl - gr), 0.0) * _norm_factors(rk, tt, H, hk, m, l2norm)
        qf = tl.where(m, tl.exp(gr) * scale, 0.0) * _norm_factors(rq, tt, H, hk, m, l2norm)
        pk = k + (tt * H + hk)[:, None] * K + o64[None, :]
        pq = q + (tt * H + hk)[:, None] * K + o64[None, :]
        pw = w + (tt * HV + hv)[:, None] * K + o64[None, :]
        # K^ dh (for d vn)
        b_kd = tl.dot(tl.load(pk, mask=m[:, None], other=0.0), b_d1.to(DT), input_precision=DOT_PREC)
        if K > 64:
            b_kd = tl.dot(tl.load(pk + 64, mask=m[:, None], other=0.0), b_d2.to(DT), b_kd,
                          input_precision=DOT_PREC)
        if K > 128:
            b_kd = tl.dot(tl.load(pk + 128, mask=m[:, None], other=0.0), b_d3.to(DT), b_kd,
                          input_precision=DOT_PREC)
        if K > 192:
            b_kd = tl.dot(tl.load(pk + 192, mask=m[:, None], other=0.0), b_d4.to(DT), b_kd,
                          input_precision=DOT_PREC)
        voff = (tt * HV + hv)[:, None] * V + ov[None, :]
        b_dv = tl.load(dvn + voff, mask=m[:, None], other=0.0) + kf[:, None] * b_kd
        tl.store(dvn + voff, b_dv, mask=m[:, None])
        b_dvc = b_dv.to(DT)
        b_dof = (tl.load(dout + voff, mask=m[:, None], other=0.0).to(tl.float32) * qf[:, None]).to(DT)
        egl = tl.exp(gl)
        # dh = e^gl dh + Q^^T diag(scale e^gc) dO - W^T dvn
        b_d1 = tl.dot(tl.trans(tl.load(pq, mask=m[:, None], other=0.0)), b_dof, b_d1 * egl,
                      input_precision=DOT_PREC)
        b_d1 -= tl.dot(tl.trans(tl.load(pw, mask=m[:, None], other=0.0).to(DT)), b_dvc, input_precision=DOT_PREC)
        if K > 64:
            b_d2 = tl.dot(tl.trans(tl.load(pq + 64, mask=m[:, None], other=0.0)), b_dof, b_d2 * egl,
                          input_precision=DOT_PREC)
            b_d2 -= tl.dot(tl.trans(tl.load(pw + 64, mask=m[:, None], other=0.0).to(DT)), b_dvc,
                           input_precision=DOT_PREC)
        if K > 128:
            b_d3 = tl.dot(tl.trans(tl.load(pq + 128, mask=m[:, None], other=0.0)), b_dof, b_d3 * egl,
                          input_precision=DOT_PREC)
            b_d3 -= tl.dot(tl.trans(tl.load(pw + 128, mask=m[:, None], other=0.0).to(DT)), b_dvc,
                           input_precision=DOT_PREC)
        if K > 192:
            b_d4 = tl.dot(tl.trans(tl.load(pq + 192, mask=m[:, None], other=0.0)), b_dof, b_d4 * egl,
                          input_precision=DOT_PREC)
            b_d4 -= tl.dot(tl.trans(tl.load(pw + 192, mask=m[:, None], other=0.0).to(DT)), b_dvc,
                           input_precision=DOT_PREC)
    if store_dh0 != 0:
        p0 = dh0 + (n.to(tl.int64) * HV + hv) * K * V
        tl.store(p0 + soff, b_d1)
        if K > 64:
            tl.store(p0 + 64 * V + soff, b_d2)
        if K > 128:
            tl.store(p0 + 128 * V + soff, b_d3)
        if K > 192:
            tl.store(p0 + 192 * V + soff, b_d4)


# ------------------------------------------------------------------------------------------
# 6. backward, per chunk and K block: dq^, dk^ (output and state parts), dW = -dvn h^T and the
#    corresponding parts of d(gc).   grid: (NC, HV, K // BK)
#    DETERMINISTIC: dq/dk are (T, HV, K) per value head; else (T, H, K) fp32 atomics.
#    dgp: (K // BK, T, HV) partial d(gc), summed in order by gdn_bwd_wy_dk.
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_dqkwg(q, k, vn, gc, dout, dvn, hs, dhs, rq, rk, cu, chunk_doc, chunk_idx, dq, dk, dw, dgp,
                  scale, T, H, HV, l2norm,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  DETERMINISTIC: tl.constexpr, DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    ik = tl.program_id(2)
    hk = hv // (HV // H)
    DT = q.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    ok = ik * BK + tl.arange(0, BK)
    # scalar int64 bases, int32 tile offsets
    t64 = t0.to(tl.int64)
    p_q = q + (t64 * H + hk) * K
    p_k = k + (t64 * H + hk) * K
    p_v = vn + (t64 * HV + hv) * V
    p_do = dout + (t64 * HV + hv) * V
    p_dv = dvn + (t64 * HV + hv) * V
    p_h = hs + (c.to(tl.int64) * HV + hv) * K * V
    p_dh = dhs + (c.to(tl.int64) * HV + hv) * K * V
    qoff = rows[:, None] * (H * K) + ok[None, :]
    woff = rows[:, None] * (HV * K) + ok[None, :]
    gr = tl.load(gc + (t64 + rows) * HV + hv, mask=m, other=0.0)
    gl = tl.load(gc + (t64 + L - 1) * HV + hv)
    nq = _norm_factors(rq, t64 + rows, H, hk, m, l2norm)
    nk = _norm_factors(rk, t64 + rows, H, hk, m, l2norm)

    # ---- phase 1 (output terms): dP = dO vn^T, dP^T = vn dO^T (formed directly), dO h^T
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)     # [r, s]
    b_dpt = tl.zeros([BT, BT], dtype=tl.float32)    # [s, r]
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    for vb in range(0, V, BV):
        ov = vb + tl.arange(0, BV)
        voff = rows[:, None] * (HV * V) + ov[None, :]
        b_v = tl.load(p_v + voff, mask=m[:, None], other=0.0).to(DT)
        b_do = tl.load(p_do + voff, mask=m[:, None], other=0.0)
        b_ht = tl.load(p_h + ok[None, :] * V + ov[:, None]).to(DT)          # (BV, BK) view of h
        b_dp = tl.dot(b_do, tl.trans(b_v), b_dp, input_precision=DOT_PREC)
        b_dpt = tl.dot(b_v, tl.trans(b_do), b_dpt, input_precision=DOT_PREC)
        b_dq = tl.dot(b_do, b_ht, b_dq, input_precision=DOT_PREC)
    incl = (rows[:, None] >= rows[None, :]) & m[:, None]
    b_dp = tl.where(incl, b_dp * tl.exp(tl.where(incl, gr[:, None] - gr[None, :], 0.0)) * scale, 0.0)
    b_dp = (b_dp * nk[None, :]).to(DT)                   # (dP * M) on raw k rows
    up = (rows[:, None] <= rows[None, :]) & m[None, :]
    b_dpt = tl.where(up, b_dpt * tl.exp(tl.where(up, gr[None, :] - gr[:, None], 0.0)) * scale, 0.0)
    b_dpt = (b_dpt * nq[None, :]).to(DT)                 # (dP * M)^T on raw q rows
    b_q = tl.load(p_q + qoff, mask=m[:, None], other=0.0)
    b_k = tl.load(p_k + qoff, mask=m[:, None], other=0.0)
    # dq^ = scale e^gc dO h^T + (dP * M) K^ ;  dk^(output) = (dP * M)^T Q^
    b_dq = b_dq * (scale * tl.exp(gr))[:, None]
    b_dq = tl.dot(b_dp, b_k, b_dq, input_precision=DOT_PREC)
    b_dko = tl.dot(b_dpt, b_q, input_precision=DOT_PREC)
    b_dg = tl.sum(b_q.to(tl.float32) * b_dq, axis=1) * nq - tl.sum(b_k.to(tl.float32) * b_dko, axis=1) * nk
    if DETERMINISTIC:
        tl.store(dq + (t64 * HV + hv) * K + woff, b_dq, mask=m[:, None])
    else:
        tl.atomic_add(dq + (t64 * H + hk) * K + qoff, b_dq, mask=m[:, None], sem="relaxed")

    # ---- phase 2 (state terms): dk^(state) = diag(e^(gl - gc)) vn dh^T, dW = -dvn h^T, <h, dh>
    b_dkh = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BV, BK], dtype=tl.float32)
    for vb in range(0, V, BV):
        ov = vb + tl.arange(0, BV)
        voff = rows[:, None] * (HV * V) + ov[None, :]
        b_v = tl.load(p_v + voff, mask=m[:, None], other=0.0).to(DT)
        b_dv = tl.load(p_dv + voff, mask=m[:, None], other=0.0).to(DT)
        toff = ok[None, :] * V + ov[:, None]
        b_ht = tl.load(p_h + toff)
        b_dht = tl.load(p_dh + toff)
        b_hdh += b_ht * b_dht
        b_dkh = tl.dot(b_v, b_dht.to(DT), b_dkh, input_precision=DOT_PREC)
        b_dw = tl.dot(b_dv, b_ht.to(DT), b_dw, input_precision=DOT_PREC)
    tl.store(dw + (t64 * HV + hv) * K + woff, -b_dw, mask=m[:, None])
    b_dkh = b_dkh * tl.where(m, tl.exp(gl - gr), 0.0)[:, None]
    skh = tl.sum(b_k.to(tl.float32) * b_dkh, axis=1) * nk
    hdh = tl.sum(tl.sum(b_hdh, axis=1), axis=0)
    # d(gc): rows get -k^.dk^(state); the chunk's last row also gets e^gl <h, dh> + sum of those
    b_dg = b_dg - skh + tl.where(rows == L - 1, tl.exp(gl) * hdh + tl.sum(skh, axis=0), 0.0)
    tl.store(dgp + (ik * T + t64 + rows) * HV + hv, b_dg, mask=m)
    b_dkt = b_dko + b_dkh
    if DETERMINISTIC:
        tl.store(dk + (t64 * HV + hv) * K + woff, b_dkt, mask=m[:, None])
    else:
        tl.atomic_add(dk + (t64 * H + hk) * K + qoff, b_dkt, mask=m[:, None], sem="relaxed")


# ------------------------------------------------------------------------------------------
# 7. backward through the WY/UT transform, part 1, per chunk.   grid: (NC, HV)
#    dT = dW Bk^T + dU Bv^T  (Bk = diag(beta e^gc) K^, Bv = diag(beta) V, dU = dvn)
#    E  = -(Tm^T dT Tm^T) * e^(gc_r - gc_s) on the strict lower triangle  -> de (T, HV, 64) fp32
#    dv = diag(beta) Tm^T dU  (final),  dbp = partial dbeta = rowsum(V * Tm^T dU) (fp32)
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_wy_da(k, v, beta, gc, tm, dw, dvn, rk, cu, chunk_doc, chunk_idx, de, dv, dbp, H, HV, l2norm,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // H)
    DT = k.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    tt = (t0 + rows).to(tl.int64)
    krow = (tt * H + hk) * K
    wrow = (tt * HV + hv) * K
    vrow = (tt * HV + hv) * V

    b_b = tl.load(beta + tt * HV + hv, mask=m, other=0.0).to(tl.float32)
    gr = tl.load(gc + tt * HV + hv, mask=m, other=0.0)
    bkf = b_b * tl.exp(gr) * _norm_factors(rk, tt, H, hk, m, l2norm)      # row factor of Bk
    trow = (tt * HV + hv) * BT
    b_t = tl.load(tm + trow[:, None] + rows[None, :], mask=m[:, None], other=0.0).to(DT)
    b_tt = tl.trans(b_t)                                 # Tm^T (of a loaded tile)

    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_k = tl.load(k + krow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_dw = tl.load(dw + wrow[:, None] + cols[None, :], mask=m[:, None], other=0.0).to(DT)
        b_kb = (b_k.to(tl.float32) * bkf[:, None]).to(DT)
        b_dT = tl.dot(b_dw, tl.trans(b_kb), b_dT, input_precision=DOT_PREC)
    b_db = tl.zeros([BT], dtype=tl.float32)
    for vb in range(0, V, BV):
        cols = vb + tl.arange(0, BV)
        b_v = tl.load(v + vrow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_du = tl.load(dvn + vrow[:, None] + cols[None, :], mask=m[:, None], other=0.0).to(DT)
        b_vb = (b_v.to(tl.float32) * b_b[:, None]).to(DT)
        b_dT = tl.dot(b_du, tl.trans(b_vb), b_dT, input_precision=DOT_PREC)
        b_dbv = tl.dot(b_tt, b_du, input_precision=DOT_PREC)                 # Tm^T dU
        b_db += tl.sum(b_v.to(tl.float32) * b_dbv, axis=1)
        tl.store(dv + vrow[:, None] + cols[None, :], (b_dbv * b_b[:, None]).to(dv.dtype.element_ty),
                 mask=m[:, None])
    tl.store(dbp + tt * HV + hv, b_db, mask=m)

    lo = (rows[:, None] > rows[None, :]) & m[:, None]
    b_e = -tl.dot(tl.dot(b_tt, b_dT.to(DT), input_precision=DOT_PREC).to(DT), b_tt, input_precision=DOT_PREC)
    b_e = tl.where(lo, b_e * tl.exp(tl.where(lo, gr[:, None] - gr[None, :], 0.0)), 0.0)
    tl.store(de + trow[:, None] + rows[None, :], b_e, mask=m[:, None])


# ------------------------------------------------------------------------------------------
# 8. backward through the WY/UT transform, part 2, per chunk.   grid: (NC, HV)
#    With E from part 1, D = diag(beta) E, X = diag(e^gc) Tm^T dW + E K^, Z = D^T K^:
#      dk^ += diag(beta) X + Z,  dbeta_r = dbp_r + k^_r.X_r,
#      dgc_r = (parts from gdn_bwd_dqkwg) + beta_r k^_r.X_r - k^_r.Z_r
#    dg = reverse cumsum of dgc inside the chunk. Tm^T and E^T are loaded transposed from
#    memory (no tl.trans of a dot result).
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_wy_dk(k, beta, gc, tm, dw, de, dbp, rk, dgp, cu, chunk_doc, chunk_idx, dk, dbeta, dg,
                  T, H, HV, l2norm,
                  K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, NKB: tl.constexpr,
                  DETERMINISTIC: tl.constexpr, DOT_PREC: tl.constexpr):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // H)
    DT = k.dtype.element_ty
    t0, L = _chunk_bounds(cu, chunk_doc, chunk_idx, c, BT)
    rows = tl.arange(0, BT)
    m = rows < L
    tt = (t0 + rows).to(tl.int64)
    krow = (tt * H + hk) * K
    wrow = (tt * HV + hv) * K
    trow = (tt * HV + hv) * BT

    b_b = tl.load(beta + tt * HV + hv, mask=m, other=0.0).to(tl.float32)
    eg = tl.exp(tl.load(gc + tt * HV + hv, mask=m, other=0.0))
    nk = _norm_factors(rk, tt, H, hk, m, l2norm)
    # transposed views: element [a, b] = M[b, a]
    b_tt = tl.load(tm + trow[None, :] + rows[:, None], mask=m[None, :], other=0.0).to(DT)
    b_e = tl.load(de + trow[:, None] + rows[None, :], mask=m[:, None], other=0.0)
    b_e = (b_e * nk[None, :]).to(DT)                                        # E, on raw k columns
    b_et = tl.load(de + trow[None, :] + rows[:, None], mask=m[None, :], other=0.0)
    b_et = (b_et * (b_b * nk)[None, :]).to(DT)                              # D^T, on raw k columns

    b_db = tl.load(dbp + tt * HV + hv, mask=m, other=0.0)
    b_dgl = tl.zeros([BT], dtype=tl.float32)
    for ik in range(0, NKB):
        b_dgl += tl.load(dgp + (ik * T + tt) * HV + hv, mask=m, other=0.0)
    for kb in range(0, K, BK):
        cols = kb + tl.arange(0, BK)
        b_k = tl.load(k + krow[:, None] + cols[None, :], mask=m[:, None], other=0.0)
        b_dw = tl.load(dw + wrow[:, None] + cols[None, :], mask=m[:, None], other=0.0).to(DT)
        b_x = tl.dot(b_tt, b_dw, input_precision=DOT_PREC) * eg[:, None]
        b_x = tl.dot(b_e, b_k, b_x, input_precision=DOT_PREC)
        b_z = tl.dot(b_et, b_k, input_precision=DOT_PREC)
        b_kh = b_k.to(tl.float32) * nk[:, None]
        sx = tl.sum(b_kh * b_x, axis=1)
        b_db += sx
        b_dgl += b_b * sx - tl.sum(b_kh * b_z, axis=1)
        b_dkw = b_x * b_b[:, None] + b_z
        if DETERMINISTIC:
            doff = wrow[:, None] + cols[None, :]
            b_dkw += tl.load(dk + doff, mask=m[:, None], other=0.0)
            tl.store(dk + doff, b_dkw, mask=m[:, None])
        else:
            tl.atomic_add(dk + krow[:, None] + cols[None, :], b_dkw, mask=m[:, None], sem="relaxed")

    b_dgl = tl.where(m, b_dgl, 0.0)
    b_dgr = tl.sum(b_dgl, axis=0) - tl.cumsum(b_dgl, axis=0) + b_dgl      # reverse cumsum
    tl.store(dg + tt * HV + hv, b_dgr, mask=m)
    tl.store(dbeta + tt * HV + hv, b_db.to(dbeta.dtype.element_ty), mask=m)


# ------------------------------------------------------------------------------------------
# 9. reduce dq/dk partials over the value heads of each q/k head (in order), apply the l2norm
#    backward and cast.   grid: (cdiv(T, BT), H).  NG = HV // H partials (det) or 1 (atomics).
# ------------------------------------------------------------------------------------------
@triton.jit
def gdn_bwd_qk_finalize(q, k, dqp, dkp, rq, rk, dq, dk, T, H, NG, l2norm,
                        K: tl.constexpr, BT: tl.constexpr):
    it = tl.program_id(0)
    hk = tl.program_id(1)
    rows = it * BT + tl.arange(0, BT)
    m = rows < T
    tt = rows.to(tl.int64)
    ok = tl.arange(0, K)
    b_dq = tl.zeros([BT, K], dtype=tl.float32)
    b_dk = tl.zeros([BT, K], dtype=tl.float32)
    pbase = (tt * H + hk) * NG
    for j in range(0, NG):
        poff = (pbase + j)[:, None] * K + ok[None, :]
        b_dq += tl.load(dqp + poff, mask=m[:, None], other=0.0)
        b_dk += tl.load(dkp + poff, mask=m[:, None], other=0.0)
    off = (tt * H + hk)[:, None] * K + ok[None, :]
    if l2norm != 0:
        nq = tl.load(rq + tt * H + hk, mask=m, other=0.0)
        nk = tl.load(rk + tt * H + hk, mask=m, other=0.0)
        qh = tl.load(q + off, mask=m[:, None], other=0.0).to(tl.float32) * nq[:, None]
        kh = tl.load(k + off, mask=m[:, None], other=0.0).to(tl.float32) * nk[:, None]
        b_dq = (b_dq - qh * tl.sum(qh * b_dq, axis=1)[:, None]) * nq[:, None]
        b_dk = (b_dk - kh * tl.sum(kh * b_dk, axis=1)[:, None]) * nk[:, None]
    tl.store(dq + off, b_dq.to(dq.dtype.element_ty), mask=m[:, None])
    tl.store(dk + off, b_dk.to(dk.dtype.element_ty), mask=m[:, None])
