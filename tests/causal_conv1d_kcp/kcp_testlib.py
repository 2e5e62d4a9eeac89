"""What the KCP tests share: the packs, the inputs, the single-rank runs, the partials' bound,
and every rank of a pack run in one process through the real step functions, with the exchange
simulated from the plans' own tables (``simulate``; CPU or CUDA)."""

from __future__ import annotations

import random

import torch

from cake.cake_causal_conv1d_det_train import reference
from cake.cake_causal_conv1d_det_train_kcp import _buffers, _compute, _exchange, _step, _tables
from cake.cake_causal_conv1d_det_train_kcp import (CakeCausalConv1dDetKcpPlan,
                                                   cake_causal_conv1d_det_train_kcp_shard)

Plan = CakeCausalConv1dDetKcpPlan
LAYOUTS, EXCHANGES = _tables.LAYOUTS, _tables.EXCHANGES

# --------------------------------------------------------------------------- packs


def boundaries(total: int, world: int, layout: str) -> list:
    """Piece boundaries strictly inside (0, S)."""
    cuts = set()
    for r in range(world):
        for a, b in _tables.token_ranges(total, world, r, layout):
            cuts.update((a, b))
    return sorted(c for c in cuts if 0 < c < total)


def _cu(total: int, cuts) -> list:
    return [0, *sorted({c for c in cuts if 0 < c < total}), total]


def random_cu(total: int, rng: random.Random, lo: int, hi: int) -> list:
    cu = [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(lo, hi)))
    return cu


PACK_NAMES = ("one_doc", "aligned_docs", "cross_one_each", "tiny_pieces_1_2", "tiny_pieces_1",
              "short_docs_at_boundaries", "doc_starts_at_boundary", "doc_ends_at_piece_end",
              "empty_ranks", "single_token", "empty_docs", "not_multiple_random", "random_a",
              "random_b", "zero_tokens")


def pack(name: str, world: int, layout: str, rng: random.Random) -> tuple:
    """(S, cu_seqlens list) of the named pack for this P and layout (random ones from rng)."""
    chunks = world if layout == "contiguous" else 2 * world
    if name == "one_doc":  # one document crosses every boundary
        return 37, [0, 37]
    if name == "aligned_docs":  # every document starts exactly at a piece boundary
        return 40, _cu(40, boundaries(40, world, layout))
    if name == "cross_one_each":  # each document crosses exactly one boundary
        b = [0, *boundaries(41, world, layout), 41]
        return 41, _cu(41, [(b[i] + b[i + 1]) // 2 for i in range(len(b) - 1)])
    if name == "tiny_pieces_1_2":  # pieces of 1-2 tokens in one document: windows merge
        s = chunks + chunks // 2 + 1
        return s, [0, s]
    if name == "tiny_pieces_1":  # pieces of 1 token: a halo from 3 ranks (P >= 4)
        return chunks, [0, chunks]
    if name == "short_docs_at_boundaries":  # documents of 1-3 tokens around each boundary
        s = 12 * chunks
        cuts = []
        for b in boundaries(s, world, layout):
            cuts += [b - 3, b - 1, b + 1, b + 2, b + 5]
        return s, _cu(s, cuts)
    if name == "doc_starts_at_boundary":  # first boundary aligned, a 2-token document after it
        b = boundaries(38, world, layout) or [19]
        return 38, _cu(38, [b[0], b[0] + 2, b[-1] - 1])
    if name == "doc_ends_at_piece_end":  # documents end at every other piece end, others cross
        s = 45
        return s, _cu(s, boundaries(s, world, layout)[::2] + [s // 3])
    if name == "empty_ranks":  # S < P (contiguous) / S < 2P (zigzag): some pieces empty
        s = max(world - 1, 1) if layout == "contiguous" else world + 1
        return s, [0, s]
    if name == "single_token":
        return 1, [0, 1]
    if name == "empty_docs":  # zero-length documents, also at boundaries
        b = boundaries(30, world, layout) or [15]
        return 30, sorted([0, 0, 4, 4, *b, *b, b[0] + 1, 30, 30])
    if name == "not_multiple_random":  # S not a multiple of 2P
        s = 2 * world * 5 + rng.randint(1, 2 * world - 1)
        return s, random_cu(s, rng, 1, 9)
    if name in ("random_a", "random_b"):
        s = rng.randint(20, 60)
        return s, random_cu(s, rng, 1, 12 if name == "random_a" else 4)
    if name == "zero_tokens":
        return 0, [0]
    raise KeyError(name)


# (activation, bias, x dtype, weight dtype): every one is drawn somewhere.
VARIANTS = (("silu", True, torch.float64, torch.float64),
            (None, False, torch.float64, torch.float64),
            ("silu", False, torch.float64, torch.float64),
            (None, True, torch.float64, torch.float64),
            ("silu", True, torch.bfloat16, torch.float32),
            (None, False, torch.float16, torch.float16),
            ("silu", False, torch.float32, torch.float32))


def inputs(total: int, channels: int, x_dtype, w_dtype, with_bias: bool, seed: int,
           device="cpu") -> tuple:
    """Global (x, weight, bias, dy), drawn on the CPU from one seed (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(total, channels, generator=g, dtype=torch.float64).to(device, x_dtype)
    w = (torch.randn(channels, 4, generator=g, dtype=torch.float64) * 0.7).to(device, w_dtype)
    b = ((torch.randn(channels, generator=g, dtype=torch.float64) * 0.3).to(device, w_dtype)
         if with_bias else None)
    dy = torch.randn(total, channels, generator=g, dtype=torch.float64).to(device, x_dtype)
    return x, w, b, dy


# --------------------------------------------------------------------------- single rank


def single_rank(cu: list, x, w, b, dy, activation) -> tuple:
    """y, dx, dweight, dbias of the single-rank op on the whole pack: the family's programs on
    CUDA (grads fp32), the KCP's CPU compute (the family's reference, the same exp) on the CPU."""
    cu_t = torch.tensor(cu, dtype=torch.int32, device=x.device)
    compute = _compute.compute_for(x.device)
    y = torch.empty_like(x)
    compute.forward(x, w, b, cu_t, activation, y)
    dx = torch.empty_like(x)
    dw, db = compute.backward(dy, x, w, b, cu_t, activation, dx)
    return y, dx, dw, db


def abs_products(cu: list, x, w, b, dy, activation) -> tuple:
    """Per (channel, tap) and per channel the sums over tokens of |dz| |x tap| and |dz|: the
    scale of the partials' rounding bound (float64 reference)."""
    cu_t = torch.tensor(cu, dtype=torch.int32)
    x64, w64 = x.cpu().double(), w.cpu().double()
    b64 = None if b is None else b.cpu().double()
    dz = dy.cpu().double()
    if activation == "silu":
        z = reference.pre_activation(x64, w64, b64, cu_t)
        s = torch.sigmoid(z)
        dz = dz * s * (1 + z * (1 - s))
    _, dw_abs, db_abs = reference.causal_conv1d_reference_backward(
        dz.abs(), x64.abs(), w64, b64, cu_t, activation=None)
    return dw_abs, db_abs


def partials_errors(dw, db, cu, x, w, b, dy, activation, unit: float, terms: int) -> list:
    """The ranks' summed partials against the float64 reference: within
    ``3 * terms * unit * sum|products|`` (+ the same of 1 for the rounding of the result),
    elementwise. ``unit``: the accumulation's unit roundoff; ``terms``: the longest chain of
    additions a product passes through, in the single-rank sum and the KCP's (docs:
    Determinism)."""
    errors = []
    _, _, rdw, rdb = reference_run(cu, x, w, b, dy, activation)
    dw_abs, db_abs = abs_products(cu, x, w, b, dy, activation)
    for name, got, want, scale in (("dweight", dw, rdw, dw_abs), ("dbias", db, rdb, db_abs)):
        if want is None:
            if got is not None:
                errors.append(f"{name} given without bias")
            continue
        err = (got.cpu().double() - want).abs()
        limit = 3 * terms * unit * (scale + want.abs() + 1)
        if bool((err > limit).any()):
            errors.append(f"{name} summed partials off the reference by {err.max().item():.3g} "
                          f"(limit {limit.min().item():.3g} at the tightest)")
    return errors


def reference_run(cu: list, x, w, b, dy, activation) -> tuple:
    """The family's float64 reference (its own exp): y, dx, dweight, dbias on the CPU."""
    cu_t = torch.tensor(cu, dtype=torch.int32)
    x, w, dy = x.cpu(), w.cpu(), dy.cpu()
    b = None if b is None else b.cpu()
    y = reference.causal_conv1d_reference(x, w, b, cu_t, activation=activation)
    dx, dw, db = reference.causal_conv1d_reference_backward(dy, x, w, b, cu_t,
                                                            activation=activation)
    return y, dx, dw, db


def output_errors(y, dx, cu, x, w, b, dy, activation) -> list:
    """y and dx (global, layout order restored) against the single-rank run bitwise, and, on
    the CPU with float64 x, against the family's reference within 1e-13 (its torch sigmoid
    differs from the KCP's position-independent exp by ulps; without activation bitwise)."""
    errors = []
    sy, sdx, _, _ = single_rank(cu, x, w, b, dy, activation)
    for name, got, want in (("y", y, sy), ("dx", dx, sdx)):
        if got.dtype != want.dtype or not torch.equal(got, want):
            rows = ((got != want) & ~(got.isnan() & want.isnan())).any(1).nonzero().flatten()
            errors.append(f"{name} differs from the single-rank run at tokens {rows[:6].tolist()}")
    if x.device.type == "cpu" and x.dtype == torch.float64:
        ry, rdx, _, _ = reference_run(cu, x, w, b, dy, activation)
        for name, got, want in (("y", y, ry), ("dx", dx, rdx)):
            tol = 0.0 if activation is None else 1e-13
            err = (got - want).abs().max().item() if got.numel() else 0.0
            if err > tol * max(1.0, want.abs().max().item() if got.numel() else 0.0):
                errors.append(f"{name} off the family's reference by {err:.3g}")
    return errors


# --------------------------------------------------------------------------- in one process


def _nan_empty(shape, dtype, device):
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


class SimulatedExchange:
    """``_exchange.start`` for every rank of a pack in one process: each rank's exchanged rows
    come from the other ranks' packs, made by their plans' own pack codes and sliced by their
    own send/receive tables, as the collectives would."""

    def __init__(self, plans: list, sources: dict):
        self.plans, self.sources = plans, sources

    def _packed(self, rank: int, kind: str, source) -> torch.Tensor:
        plan = self.plans[rank]
        table = plan.exchanges[kind]
        out = _nan_empty((table.pack_rows, source.shape[1]), source.dtype, source.device)
        plan.compute.gather(table.pack, source, None, out)
        return out

    def start(self, plan, source, kind) -> _exchange.Pending:
        table = plan.exchanges[kind]
        if not table.needed:
            return _exchange.Pending([], source.new_empty((0, source.shape[1])))
        packs = [self._packed(q, kind, source if q == plan.rank else self.sources[kind][q])
                 for q in range(len(self.plans))]
        if plan.exchange == "all_gather":
            return _exchange.Pending([], torch.cat(packs))
        received = _nan_empty((table.received_rows, source.shape[1]), source.dtype,
                              source.device)
        for sender, first, rows in table.receives:
            sent = [(f, n) for peer, f, n in self.plans[sender].exchanges[kind].sends
                    if peer == plan.rank]
            assert sent and sent[0][1] == rows, (sender, plan.rank, sent, rows)
            received[first:first + rows] = packs[sender][sent[0][0]:sent[0][0] + rows]
        return _exchange.Pending([], received)


def simulate(monkeypatch, cu: list, total: int, world: int, layout: str, exchange: str,
             x, w, b, dy, activation, grad_dtype=None) -> dict:
    """Every rank's forward and backward step in one process, NaN-poisoned (every tensor the
    step makes starts as NaN) and exchanging through :class:`SimulatedExchange`. Returns the
    global y and dx (layout order restored), the partials in rank order, the plans."""
    plans = [Plan._for_rank(cu, total, x.shape[1], x.dtype, world, r, layout, exchange,
                            device=x.device) for r in range(world)]
    xs = [cake_causal_conv1d_det_train_kcp_shard(x, p) for p in plans]
    dys = [cake_causal_conv1d_det_train_kcp_shard(dy, p) for p in plans]
    monkeypatch.setattr(_buffers, "empty", _nan_empty)
    monkeypatch.setattr(_exchange, "start", SimulatedExchange(plans, {"x": xs, "dy": dys}).start)
    y_global, dx_global = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    partials = []
    for plan, x_local, dy_local in zip(plans, xs, dys):
        y, x_halo = _step.forward(plan, x_local, w, b, activation)
        dx, dw, db = _step.backward(plan, dy_local, x_local, w, b, activation, x_halo,
                                    grad_dtype or w.dtype)
        for p in plan.pieces:
            y_global[p.start:p.end] = y[p.offset:p.offset + p.length]
            dx_global[p.start:p.end] = dx[p.offset:p.offset + p.length]
        partials.append((dw, db))
    return {"y": y_global, "dx": dx_global, "partials": partials, "plans": plans}


def rank_order_sum(partials: list, index: int):
    """The partials' sum in rank order 0..P-1, in fp32 (float64 for float64 partials): what
    cake_causal_conv1d_det_train_kcp_reduce_weight_grads computes."""
    parts = [p[index] for p in partials]
    if parts[0] is None:
        return None
    accumulate = torch.float64 if parts[0].dtype == torch.float64 else torch.float32
    total = parts[0].to(accumulate)
    for part in parts[1:]:
        total = total + part.to(accumulate)
    return total


UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24,
                 torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def gpu_partial_terms(total: int, world: int) -> int:
    """The same on the GPU path, fp32 sums: a thread's span (<= 128 tokens), a block's token
    threads (<= 16), the tiles' reduction (<= 32 + tiles / 32), the fix-up and the ranks."""
    return 128 + 16 + 32 + total // 4096 + world + 8


def partial_terms(total: int, world: int, grad_dtype) -> int:
    """The longest chain of roundings a product passes through on the CPU path: float64
    partials add every token (S), the fix-up and the ranks; narrower partials are dominated by
    their own rounding and the rank sum."""
    return total + world + 8 if grad_dtype == torch.float64 else world + 2
