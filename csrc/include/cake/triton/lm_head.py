# Shared Triton code of the LM head families (cake_lm_head_det_train, cake_lm_head_nondet_train):
# cross-entropy and log-probabilities of softcap(hidden @ weight^T), forward and backward, never
# materialising the (T, V) logits. One @triton.jit function a kernel; each program's kernel
# sources (csrc/templates/lm_head/<kernel>.py) are thin wrappers that call these with the
# program's constexprs (tile sizes).
#
# Notation (token row t, vocabulary column v):
#   z[t, v] = hidden[t, :] . weight[v, :]                         fp32 accumulation, never stored
#   s[t, v] = softcap(z) * inv_temp, softcap(z) = c tanh(z / c)   (or z)
#   m[t] = max_v s,  logl[t] = log sum_v exp(s - m),  p = exp((s - m) - logl)
# The row statistics are kept as (m, logl), not lse = m + logl: at |s| ~ 100s an fp32 lse is off by
# ~ulp(lse), which scales every recomputed p of the row alike; the gradients of ill-conditioned rows
# amplify that. The backward needs, per row, three coefficients (lm_head_coef):
#   ds = p (ca + cb log p) + cg [v == label],   dz = ds inv_temp (1 - tanh(z / c)^2)
# so one set of heavy kernels serves the loss (cb = 0) and the log-prob + entropy entry.
#
# Layouts (contiguous): hidden (T, D) and weight (V, D) in the program's dtype DT; labels (T,)
# int64 (any 8-byte aligned view); row statistics and coefficients (T,) fp32; forward partials
# (S, T) fp32, split-major; accumulators fp32.
#
# Per-call choices are runtime values (one specialization serves every combination): i32 flags
# tested as scalars (entropy, logprob (the entry: 0 loss, 1 log-prob), mean, reduction,
# has_grad_out, has_grad_ent), or turned into the heavy kernels' accumulator limits (final_cast,
# accumulate). The softcap comes as three scales, (1 / c, c inv_temp, 0) with a softcap and
# (0, 0, inv_temp) without (_scaled): the backward kernels blend with them, without a branch
# (a runtime branch in their tile code costs them their spill-free registers), while the
# forward's statistics kernel branches on inv_softcap (the blend costs it its spill-free
# registers on sm_100a); both are exact either way. Without a softcap t = tanh(z / c) is exactly
# 0 and the derivative 1 - t^2 exactly 1. cb is always written (0 without an entropy gradient),
# so ca + cb log p is exactly ca then.
# Constexprs: the tile sizes only. fp32 inputs compute every tl.dot in IEEE fp32
# (input_precision="ieee": the interpreter and the GPU agree); 16-bit inputs ignore it.
#
# Rules kept: no autotune, heuristics, block pointers, tensor descriptors, inline asm or
# libdevice (tanh is written with tl.exp); no global scratch; every offset that can pass 2^31
# (T * D, V * D, split-major partials) is int64; the kernels never index weight by a label (label
# logits are picked out of the logits tiles by comparing column ids), so a label outside [0, V)
# cannot make a kernel read out of bounds. "First / last step" conditions are column limits
# (ds < tl.where(cond, D, 0)) rather than a scalar bool in a tensor mask, which the interpreter
# mishandles.
import triton
import triton.language as tl

DOT_PREC: tl.constexpr = tl.constexpr("ieee")


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
@triton.jit
def _tanh(x):
    """2 / (1 + exp(-2x)) - 1: saturates correctly at +-inf; absolute error ~2e-7, so c tanh(z / c)
    carries ~2e-7 c, far below the logits' own fp32 rounding for any useful cap."""
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _label_cols(labels, rows, row_mask, V):
    """Labels as int32 column ids, -1 for masked rows and labels outside [0, V): compared with
    the tiles' int32 column ids (an int64 compare per tile element costs twice the registers)."""
    label = tl.load(labels + rows, mask=row_mask, other=-1)
    return tl.where((label >= 0) & (label < V), label, -1).to(tl.int32)


@triton.jit
def _logits(a, a_rows, a_mask, b, b_rows, b_mask, D, BA: tl.constexpr, BB: tl.constexpr,
            BK: tl.constexpr):
    """(BA, BB) fp32 tile of A[a_rows] @ B[b_rows]^T over the whole D, BK columns a step in a
    fixed order; A and B are row-major with row stride D, masked rows read 0."""
    a_off = a_rows.to(tl.int64) * D
    b_off = b_rows.to(tl.int64) * D
    acc = tl.zeros((BA, BB), dtype=tl.float32)
    for k0 in range(0, D, BK):
        ks = k0 + tl.arange(0, BK)
        km = ks < D
        ta = tl.load(a + (a_off[:, None] + ks[None, :]), mask=a_mask[:, None] & km[None, :],
                     other=0.0)
        tb = tl.load(b + (b_off[:, None] + ks[None, :]), mask=b_mask[:, None] & km[None, :],
                     other=0.0)
        acc = tl.dot(ta, tl.trans(tb), acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def _scaled(z, inv_softcap, tanh_scale, linear_scale):
    """s = softcap(z) inv_temp = tanh(z / c) tanh_scale + z linear_scale without a branch (the
    backward kernels' form, see the header): with (inv_softcap, tanh_scale, linear_scale) =
    (1 / c, c inv_temp, 0) or (0, 0, inv_temp) one term is exactly 0."""
    return _tanh(z * inv_softcap) * tanh_scale + z * linear_scale


@triton.jit
def _row_coefs(labels, rmax, logl, ca, cb, cg, rows, row_mask, V):
    """What the backward reads per token row: label columns, statistics, coefficients."""
    label = _label_cols(labels, rows, row_mask, V)
    m = tl.load(rmax + rows, mask=row_mask, other=0.0)
    lg = tl.load(logl + rows, mask=row_mask, other=0.0)
    a = tl.load(ca + rows, mask=row_mask, other=0.0)
    b = tl.load(cb + rows, mask=row_mask, other=0.0)
    g = tl.load(cg + rows, mask=row_mask, other=0.0)
    return label, m, lg, a, b, g


@triton.jit
def _dlogits(z, cols, col_mask, label, m, lg, a, b, g, inv_softcap, tanh_scale, linear_scale,
             inv_temp):
    """dL/dz of a (token, vocabulary) logits tile, per-row arguments as (BT,) vectors. tanh(z / c)
    is recovered from s rather than kept (registers). Padding columns are zeroed (their
    exp(0 - lse) could overflow); padding rows need no mask (their coefficients are 0)."""
    s = _scaled(z, inv_softcap, tanh_scale, linear_scale)
    d = (s - m[:, None]) - lg[:, None]                    # log p
    ds = tl.exp(d) * (a[:, None] + b[:, None] * d)
    ds += tl.where(cols[None, :] == label[:, None], g[:, None], 0.0)
    t = s * (inv_softcap / inv_temp)                      # tanh(z / c); 0 without a softcap
    dz = ds * (inv_temp - inv_temp * t * t)
    return tl.where(col_mask[None, :], dz, 0.0)


# ------------------------------------------------------------------------------------------
# forward.  stats: grid (num_splits * cdiv(T, BT),); program id = token_block * num_splits +
# split, so the splits of one token block run side by side and share its hidden rows in L2.
# ------------------------------------------------------------------------------------------
@triton.jit
def lm_head_stats(h, w, labels, part_m, part_l, part_a, part_y, T, V, D, num_splits,
                  tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp, entropy,
                  BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    """Statistics of one (token block, vocabulary split): online max m, sum-exp l, with
    ``entropy`` a = sum exp(s - m) (s - m), and the label's scaled logit y (0 when the label is
    not in this split); each a (num_splits, T) fp32 array."""
    pid = tl.program_id(0)
    pid_s = pid % num_splits
    rows = (pid // num_splits) * BT + tl.arange(0, BT)
    row_mask = rows < T
    label = _label_cols(labels, rows, row_mask, V)
    m = tl.full((BT,), -1.0e38, dtype=tl.float32)       # finite: (m_old - m_new) * 0 stays 0
    l = tl.zeros((BT,), dtype=tl.float32)
    a = tl.zeros((BT,), dtype=tl.float32)
    y = tl.zeros((BT,), dtype=tl.float32)
    vt0 = pid_s * tiles_per_split
    vt1 = tl.minimum(vt0 + tiles_per_split, tl.cdiv(V, BV))
    for vt in range(vt0, vt1):
        cols = vt * BV + tl.arange(0, BV)
        col_mask = cols < V
        z = _logits(h, rows, row_mask, w, cols, col_mask, D, BT, BV, BK)
        if inv_softcap != 0.0:
            s = _tanh(z * inv_softcap) * tanh_scale
        else:
            s = z * linear_scale
        y += tl.sum(tl.where(cols[None, :] == label[:, None], s, 0.0), axis=1)
        # Padding columns get -1e30 (finite, so that e * d is 0 there, not 0 * -inf).
        s = tl.where(col_mask[None, :], s, -1.0e30)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        d = s - m_new[:, None]
        e = tl.exp(d)
        if entropy != 0:
            a = alpha * (a + (m - m_new) * l) + tl.sum(e * d, axis=1)
        l = l * alpha + tl.sum(e, axis=1)
        m = m_new
    off = pid_s.to(tl.int64) * T + rows
    tl.store(part_m + off, m, mask=row_mask)
    tl.store(part_l + off, l, mask=row_mask)
    tl.store(part_y + off, y, mask=row_mask)
    if entropy != 0:
        tl.store(part_a + off, a, mask=row_mask)


@triton.jit
def lm_head_finalize(part_m, part_l, part_a, part_y, labels, rmax, logl, out, ent, T, V,
                     num_splits, ignore_index, logprob, entropy, BLOCK: tl.constexpr):
    """Combines the splits in split order; writes rmax = m and logl = log l (the backward reads
    them) and per token out = logl - (y - m) (loss) or (y - m) - logl (``logprob``), and with
    ``entropy`` ent = logl - a / l. Ignored tokens give 0, a label outside [0, V) NaN.
    Grid (cdiv(T, BLOCK),)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < T
    label = tl.load(labels + rows, mask=mask, other=0)
    m = tl.full((BLOCK,), -1.0e38, dtype=tl.float32)
    off = rows.to(tl.int64)
    for sp in range(0, num_splits):
        m = tl.maximum(m, tl.load(part_m + off, mask=mask, other=-1.0e38))
        off += T
    l = tl.zeros((BLOCK,), dtype=tl.float32)
    a = tl.zeros((BLOCK,), dtype=tl.float32)
    y = tl.zeros((BLOCK,), dtype=tl.float32)
    off = rows.to(tl.int64)
    for sp in range(0, num_splits):
        ms = tl.load(part_m + off, mask=mask, other=-1.0e38)
        ls = tl.load(part_l + off, mask=mask, other=0.0)
        sc = tl.exp(ms - m)
        l += ls * sc
        if entropy != 0:
            a += sc * (tl.load(part_a + off, mask=mask, other=0.0) + (ms - m) * ls)
        y += tl.load(part_y + off, mask=mask, other=0.0)
        off += T
    l_safe = tl.where(l > 0.0, l, 1.0)
    lg = tl.log(l_safe)
    tl.store(rmax + rows, m, mask=mask)
    tl.store(logl + rows, lg, mask=mask)
    ignored = label == ignore_index
    bad = (label < 0) | (label >= V)
    value = lg - (y - m)
    if logprob != 0:
        value = -value
    tl.store(out + rows, tl.where(ignored, 0.0, tl.where(bad, float("nan"), value)), mask=mask)
    if entropy != 0:
        h = lg - a / l_safe
        tl.store(ent + rows, tl.where(ignored, 0.0, tl.where(bad, float("nan"), h)), mask=mask)


@triton.jit
def lm_head_reduce(loss, labels, out, count, T, ignore_index, mean, BLOCK: tl.constexpr):
    """One program: the per-token losses summed in a fixed order (lane i takes tokens i,
    i + BLOCK, ...; then one tl.sum), the non-ignored tokens counted; out = the sum, or with
    ``mean`` the sum / count (NaN when nothing counts, as torch); count (fp32) is what the
    backward divides by. Grid (1,)."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    cnt = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, T, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        mask = rows < T
        acc += tl.load(loss + rows, mask=mask, other=0.0)
        label = tl.load(labels + rows, mask=mask, other=ignore_index)
        cnt += (label != ignore_index).to(tl.int32)
    total = tl.sum(acc, axis=0)
    n = tl.sum(cnt, axis=0).to(tl.float32)
    if mean != 0:
        total = total / n
    tl.store(out, total)
    tl.store(count, n)


# ------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------
@triton.jit
def lm_head_coef(labels, ent, grad_out, grad_ent, count, ca, cb, cg, T, V, ignore_index,
                 logprob, reduction, has_grad_out, has_grad_ent, BLOCK: tl.constexpr):
    """Per-row coefficients of ds = p (ca + cb log p) + cg [v == label]:
      loss (g = the upstream gradient, per token for reduction 0 (none), else one scalar,
            divided by count for 2 (mean)):  ca = g, cb = 0, cg = -g;
      log-prob (upstream gl, entropy H with upstream gh): ca = -gl - gh H, cb = -gh, cg = gl
            (dH/ds_v = -p_v (log p_v + H), written with log p: no term carries the logits'
            magnitude, which would cancel at |s| ~ 100s).
    Ignored tokens and labels outside [0, V) get all-zero coefficients. Grid (cdiv(T, BLOCK),)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < T
    label = tl.load(labels + rows, mask=mask, other=ignore_index)
    ok = (label != ignore_index) & (label >= 0) & (label < V) & mask
    zero = tl.zeros((BLOCK,), dtype=tl.float32)
    a = zero
    b = zero
    g = zero
    if logprob == 0:
        if reduction == 0:
            g = tl.load(grad_out + rows, mask=mask, other=0.0)
        else:
            g = zero + tl.load(grad_out)
            if reduction == 2:
                g = g / tl.load(count)
        a = g
        g = -g
    else:
        if has_grad_out != 0:
            g = tl.load(grad_out + rows, mask=mask, other=0.0)
        a = -g
        if has_grad_ent != 0:
            gh = tl.load(grad_ent + rows, mask=mask, other=0.0)
            a = a - gh * tl.load(ent + rows, mask=mask, other=0.0)
            b = -gh
    tl.store(ca + rows, tl.where(ok, a, 0.0), mask=mask)
    tl.store(cb + rows, tl.where(ok, b, 0.0), mask=mask)
    tl.store(cg + rows, tl.where(ok, g, 0.0), mask=mask)


@triton.jit
def _dz_tile(h, w, rows, row_mask, label, m, lg, a, b, g, vt, vt_end, V, D, inv_softcap,
             tanh_scale, linear_scale, inv_temp, BT: tl.constexpr, BV: tl.constexpr,
             BK: tl.constexpr):
    """(dz in weight's dtype, W row pointers, W row mask) of vocabulary tile ``vt``; a tile at or
    past ``vt_end`` is all padding (dz 0, its W rows read 0)."""
    cols = vt * BV + tl.arange(0, BV)
    col_mask = cols < tl.where(vt < vt_end, V, 0)
    z = _logits(h, rows, row_mask, w, cols, col_mask, D, BT, BV, BK)
    dz = _dlogits(z, cols, col_mask, label, m, lg, a, b, g, inv_softcap, tanh_scale,
                  linear_scale, inv_temp)
    return dz.to(w.dtype.element_ty), w + cols.to(tl.int64) * D, col_mask


@triton.jit
def lm_head_dh(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, num_splits,
               tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp, final_cast,
               BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """Deterministic dhidden. A program owns BT token rows and one vocabulary split and walks the
    split's tiles in order, two a step: it recomputes each logits tile (full D), forms dz, then
    per BD-column slice adds dz_0 @ W[tile_0] + dz_1 @ W[tile_1] into its own rows of the fp32
    accumulator ``acc`` ((num_splits, T, D), split-major): nobody else writes them, so no atomics
    and a fixed order, one read-modify-write a step. The first step writes instead of adding;
    with ``final_cast`` (num_splits == 1) the last step stores to ``out`` (hidden's dtype; it may
    alias acc for fp32) instead. The host makes tiles_per_split even. Grid
    (num_splits * cdiv(T, BT),), id = token_block * num_splits + split."""
    pid = tl.program_id(0)
    pid_s = pid % num_splits
    rows = (pid // num_splits) * BT + tl.arange(0, BT)
    row_mask = rows < T
    label, m, lg, a, b, g = _row_coefs(labels, rmax, logl, ca, cb, cg, rows, row_mask, V)
    acc_rows = acc + (pid_s.to(tl.int64) * T + rows) * D
    out_rows = out + rows.to(tl.int64) * D
    ar = tl.arange(0, BD)
    vt0 = pid_s * tiles_per_split
    vt1 = tl.minimum(vt0 + tiles_per_split, tl.cdiv(V, BV))
    for vt in range(vt0, vt1, 2):
        dz0, w0, m0 = _dz_tile(h, w, rows, row_mask, label, m, lg, a, b, g, vt, vt1, V, D,
                               inv_softcap, tanh_scale, linear_scale, inv_temp, BT, BV, BK)
        dz1, w1, m1 = _dz_tile(h, w, rows, row_mask, label, m, lg, a, b, g, vt + 1, vt1, V, D,
                               inv_softcap, tanh_scale, linear_scale, inv_temp, BT, BV, BK)
        d_load = tl.where(vt > vt0, D, 0)
        d_acc = tl.where((final_cast == 0) | (vt + 2 < vt1), D, 0)
        d_out = tl.where((final_cast != 0) & (vt + 2 >= vt1), D, 0)
        # The accumulator slice is prefetched one slice ahead by hand: its latency hides behind
        # the current slice's MMAs (Hopper's pipeliner does not pipeline an MMA accumulator).
        nxt = tl.load(acc_rows[:, None] + ar[None, :],
                      mask=row_mask[:, None] & (ar < d_load)[None, :], other=0.0)
        for d0 in range(0, D, BD):
            ds = d0 + ar
            dmask = ds < D
            ptrs = acc_rows[:, None] + ds[None, :]
            part = nxt
            nxt = tl.load(ptrs + BD, mask=row_mask[:, None] & ((ds + BD) < d_load)[None, :],
                          other=0.0)
            wt = tl.load(w0[:, None] + ds[None, :], mask=m0[:, None] & dmask[None, :], other=0.0)
            part = tl.dot(dz0, wt, part, input_precision=DOT_PREC)
            wt = tl.load(w1[:, None] + ds[None, :], mask=m1[:, None] & dmask[None, :], other=0.0)
            part = tl.dot(dz1, wt, part, input_precision=DOT_PREC)
            tl.store(ptrs, part, mask=row_mask[:, None] & (ds < d_acc)[None, :])
            tl.store(out_rows[:, None] + ds[None, :], part.to(out.dtype.element_ty),
                     mask=row_mask[:, None] & (ds < d_out)[None, :])


@triton.jit
def _dzt_tile(h, w, labels, rmax, logl, ca, cb, cg, cols, col_mask, tb, T, V, D, inv_softcap,
              tanh_scale, linear_scale, inv_temp, BT: tl.constexpr, BV: tl.constexpr,
              BK: tl.constexpr):
    """(dz^T in hidden's dtype (BV, BT), hidden row pointers, row mask) of token block ``tb``
    against the vocabulary tile ``cols``. The logits are formed (token, vocabulary) as everywhere
    (per-token vectors then cost a few registers a thread) and dz is transposed in 16 bits."""
    rows = tb * BT + tl.arange(0, BT)
    row_mask = rows < T
    label, m, lg, a, b, g = _row_coefs(labels, rmax, logl, ca, cb, cg, rows, row_mask, V)
    z = _logits(h, rows, row_mask, w, cols, col_mask, D, BT, BV, BK)
    dz = _dlogits(z, cols, col_mask, label, m, lg, a, b, g, inv_softcap, tanh_scale,
                  linear_scale, inv_temp)
    return tl.trans(dz.to(h.dtype.element_ty)), h + rows.to(tl.int64) * D, row_mask


@triton.jit
def lm_head_dw(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, inv_softcap,
               tanh_scale, linear_scale, inv_temp, accumulate, BV: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr):
    """Deterministic dweight. A program owns BV vocabulary rows and walks all token blocks in
    order: it recomputes each logits tile, forms dz, then per BD slice adds dz^T @ h[block] into
    its rows of the fp32 accumulator ``acc`` (V, D): no atomics, a fixed order, one
    read-modify-write a block. With ``accumulate`` acc is the caller's dweight accumulator: read
    on the first step, the sum left there (out unused); otherwise the first step writes instead
    of adding and the last stores to ``out`` (weight's dtype; it may alias acc for fp32). Needs
    T > 0. Grid (cdiv(V, BV),)."""
    cols = tl.program_id(0) * BV + tl.arange(0, BV)
    col_mask = cols < V
    acc_rows = acc + cols.to(tl.int64) * D
    out_rows = out + cols.to(tl.int64) * D
    ar = tl.arange(0, BD)
    num_tb = tl.cdiv(T, BT)
    keep = accumulate != 0
    for tb in range(0, num_tb):
        dzt, h_rows, h_mask = _dzt_tile(h, w, labels, rmax, logl, ca, cb, cg, cols, col_mask, tb,
                                        T, V, D, inv_softcap, tanh_scale, linear_scale, inv_temp,
                                        BT, BV, BK)
        d_load = tl.where(keep | (tb > 0), D, 0)
        d_acc = tl.where(keep | (tb + 1 < num_tb), D, 0)
        d_out = tl.where((accumulate == 0) & (tb + 1 == num_tb), D, 0)
        nxt = tl.load(acc_rows[:, None] + ar[None, :],
                      mask=col_mask[:, None] & (ar < d_load)[None, :], other=0.0)
        for d0 in range(0, D, BD):
            ds = d0 + ar
            ptrs = acc_rows[:, None] + ds[None, :]
            part = nxt  # prefetched one slice ahead (see lm_head_dh)
            nxt = tl.load(ptrs + BD, mask=col_mask[:, None] & ((ds + BD) < d_load)[None, :],
                          other=0.0)
            ht = tl.load(h_rows[:, None] + ds[None, :],
                         mask=h_mask[:, None] & (ds < D)[None, :], other=0.0)
            part = tl.dot(dzt, ht, part, input_precision=DOT_PREC)
            tl.store(ptrs, part, mask=col_mask[:, None] & (ds < d_acc)[None, :])
            tl.store(out_rows[:, None] + ds[None, :], part.to(out.dtype.element_ty),
                     mask=col_mask[:, None] & (ds < d_out)[None, :])


@triton.jit
def lm_head_fused(h, w, labels, rmax, logl, ca, cb, cg, dh_acc, dw_acc, T, V, D, inv_softcap,
                  tanh_scale, linear_scale, inv_temp, BT: tl.constexpr, BV: tl.constexpr,
                  BK: tl.constexpr, BD: tl.constexpr, GROUP_T: tl.constexpr):
    """Non-deterministic backward: one program per (token block, vocabulary tile), GROUP_T token
    blocks at a time for L2 reuse. It recomputes the logits tile once, forms dz and per BD slice
    adds dz @ W[tile] into the fp32 ``dh_acc`` (T, D) and dz^T @ h[block] into the fp32
    ``dw_acc`` (V, D) with relaxed fp32 atomics (both zeroed by the host, or dw_acc is the
    caller's accumulator). Grid (cdiv(T, BT) * cdiv(V, BV),)."""
    pid = tl.program_id(0)
    num_tb = tl.cdiv(T, BT)
    in_group = GROUP_T * tl.cdiv(V, BV)
    first_tb = (pid // in_group) * GROUP_T
    group_size = tl.minimum(num_tb - first_tb, GROUP_T)
    rows = (first_tb + (pid % in_group) % group_size) * BT + tl.arange(0, BT)
    row_mask = rows < T
    cols = ((pid % in_group) // group_size) * BV + tl.arange(0, BV)
    col_mask = cols < V
    label, m, lg, a, b, g = _row_coefs(labels, rmax, logl, ca, cb, cg, rows, row_mask, V)
    z = _logits(h, rows, row_mask, w, cols, col_mask, D, BT, BV, BK)
    dz = _dlogits(z, cols, col_mask, label, m, lg, a, b, g, inv_softcap, tanh_scale,
                  linear_scale, inv_temp).to(w.dtype.element_ty)
    dzt = tl.trans(dz)
    h_rows = h + rows.to(tl.int64) * D
    w_rows = w + cols.to(tl.int64) * D
    dh_rows = dh_acc + rows.to(tl.int64) * D
    dw_rows = dw_acc + cols.to(tl.int64) * D
    for d0 in range(0, D, BD):
        ds = d0 + tl.arange(0, BD)
        dmask = ds < D
        mh = row_mask[:, None] & dmask[None, :]
        mw = col_mask[:, None] & dmask[None, :]
        wt = tl.load(w_rows[:, None] + ds[None, :], mask=mw, other=0.0)
        ht = tl.load(h_rows[:, None] + ds[None, :], mask=mh, other=0.0)
        tl.atomic_add(dh_rows[:, None] + ds[None, :], tl.dot(dz, wt, input_precision=DOT_PREC),
                      mask=mh, sem="relaxed")
        tl.atomic_add(dw_rows[:, None] + ds[None, :], tl.dot(dzt, ht, input_precision=DOT_PREC),
                      mask=mw, sem="relaxed")


@triton.jit
def lm_head_cast(src, dst, N, num_parts, BLOCK: tl.constexpr):
    """dst[i] = sum over parts p, in order, of src[p * N + i], cast to dst's dtype: the det
    dhidden split partials, and the nondet fp32 accumulators into 16-bit gradients.
    Grid (cdiv(N, BLOCK),)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.load(src + offs, mask=mask, other=0.0)
    for p in range(1, num_parts):
        acc += tl.load(src + (p * N + offs), mask=mask, other=0.0)
    tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)
