"""The host side of KCP plans: the split rules, the pieces, the row tables (hand-checked
examples, and invariants over random packs: every code names the token its window row holds,
every target is written once), the row-code constants against the program's header, and the
cu_seqlens fingerprint."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import kcp_testlib as tl  # noqa: E402

from cake.cake_causal_conv1d_det_train_kcp import _tables  # noqa: E402
from cake.cake_causal_conv1d_det_train_kcp._tables import (EXCHANGED_BIT, NEGATE_BIT,  # noqa: E402
                                                          PACK_ROWS, ROW_MASK, ZERO_ROW)

SEED = int(os.environ.get("KCP_TEST_SEED", random.SystemRandom().randrange(2**31)))
REPO = Path(__file__).resolve().parents[2]
EX, NEG = EXCHANGED_BIT, NEGATE_BIT


def test_split_rules():
    r = _tables.token_ranges
    assert [r(10, 3, q, "contiguous") for q in range(3)] == [[(0, 3)], [(3, 6)], [(6, 10)]]
    assert [r(10, 2, q, "zigzag") for q in range(2)] == [[(0, 2), (7, 10)], [(2, 5), (5, 7)]]
    assert [r(2, 4, q, "contiguous") for q in range(4)] == [[(0, 0)], [(0, 1)], [(1, 1)],
                                                            [(1, 2)]]
    for s in range(40):
        for p in range(1, 6):
            for layout in tl.LAYOUTS:
                got = sorted(x for q in range(p) for x in r(s, p, q, layout))
                assert got[0][0] == 0 and got[-1][1] == s
                assert all(a[1] == b[0] for a, b in zip(got, got[1:]))


def test_row_codes_are_the_programs():
    """The Python constants spell csrc/include/cake/causal_conv1d/kcp_config.h's."""
    header = (REPO / "csrc/include/cake/causal_conv1d/kcp_config.h").read_text()
    assert re.search(r"kZeroRow = (-\d+);", header).group(1) == str(ZERO_ROW)
    assert re.search(r"kRowBits = (\d+);", header).group(1) == str(_tables.ROW_BITS)
    assert re.search(r"kExchangedBit = int64_t\{1\} << (\d+);", header).group(1) == \
        str(EXCHANGED_BIT.bit_length() - 1)
    assert re.search(r"kNegateBit = int64_t\{1\} << (\d+);", header).group(1) == \
        str(NEGATE_BIT.bit_length() - 1)
    assert ROW_MASK == (1 << _tables.ROW_BITS) - 1


def _plans(cu, total, world, layout="contiguous", exchange="all_gather"):
    return [tl.Plan._for_rank(cu, total, 2, torch.float64, world, r, layout, exchange)
            for r in range(world)]


def _host(windows) -> tuple:
    return (windows.x_codes.tolist(), windows.dy_codes.tolist(), windows.targets.tolist(),
            windows.cu_seqlens.tolist())


def test_a_halo_from_three_ranks():
    """P = 4, S = 4, one document: the last rank's edge reads one token of each other rank,
    from each one's x tail (all_gather rows 2, 8, 14 of the 4 x 6 gathered rows)."""
    plans = _plans([0, 4], 4, 4)
    last = plans[3].pieces[0]
    assert (last.start, last.end, last.halo_len, last.edge_len, last.dz_halo_len,
            last.tail_len) == (3, 4, 3, 1, 0, 0)
    assert plans[3].exchanges["x"].pack.tolist() == [-1, -1, 0, 0, -1, -1]  # tail, then head
    x = [EX | 2, EX | 8, EX | 14, 0]
    assert _host(plans[3].forward_windows) == (x, [], [-1, -1, -1, 0], [0, 4])
    assert _host(plans[3].dx_windows) == (x, [-1, -1, -1, 0], [-1, -1, -1, 0], [0, 4])
    assert _host(plans[3].fixup_windows) == (x + [0], [-1, -1, -1, 0, NEG | 0], [], [0, 4, 5])
    first = plans[0].pieces[0]  # its dx needs the dz of tokens 1, 2, 3: x and dy heads
    assert (first.dz_halo_len, first.tail_len) == (3, 1)
    assert _host(plans[0].dx_windows) == ([0, EX | 8, EX | 14, EX | 20],
                                          [0, EX | 3, EX | 6, EX | 9], [0, -1, -1, -1], [0, 4])
    assert plans[0].forward_windows.rows == 0 and plans[0].fixup_windows.rows == 0
    p2p = _plans([0, 4], 4, 4, exchange="p2p")
    assert p2p[3].exchanges["x"].receives == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]
    assert p2p[0].exchanges["x"].sends == [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
    assert p2p[3].forward_windows.x_codes.tolist() == [EX | 0, EX | 1, EX | 2, 0]


def test_front_and_tail_windows_merge_on_short_pieces():
    """Zigzag P = 2 over 7 tokens of one document: pieces of 1 and 2 tokens; each piece's dx
    targets (front and tail) lie in one window that spans its halos on both sides."""
    plans = _plans([0, 7], 7, 2, "zigzag")
    piece = plans[1].pieces[0]  # rank 1, slot 0: chunk 1 = [1, 3)
    assert (piece.start, piece.end, piece.edge_len, piece.tail_len, piece.halo_len,
            piece.dz_halo_len) == (1, 3, 2, 2, 1, 3)
    x, dy, targets, cu = _host(plans[1].dx_windows)
    assert cu[:2] == [0, 6]  # tokens 0 .. 5 in one window
    assert targets[:6] == [-1, 0, 1, -1, -1, -1]
    assert dy[0] == ZERO_ROW


def test_an_aligned_pack_exchanges_nothing():
    plans = _plans([0, 2, 4], 4, 2)
    assert not plans[0].exchange_needed and not plans[1].exchange_needed
    assert all(p.forward_windows.rows == p.dx_windows.rows == 0 for p in plans)


def test_local_cu_seqlens_and_fingerprint():
    p = tl.Plan._for_rank([0, 3, 3, 10, 20], 20, 2, torch.float64, 2, 1, "zigzag")
    assert [(q.start, q.end) for q in p.pieces] == [(5, 10), (10, 15)]
    assert p.local_cu_seqlens.tolist() == [0, 5, 10]
    q = tl.Plan._for_rank([0, 3, 10, 20], 20, 2, torch.float64, 2, 1, "zigzag")
    assert p.fingerprint != q.fingerprint


# --------------------------------------------------------------------------- invariants


def _token_of_local_row(plan, row: int) -> int:
    piece = next(p for p in plan.pieces if p.offset <= row < p.offset + p.length)
    return piece.start + row - piece.offset


def _token(plans, rank: int, kind: str, code: int):
    """The global token whose ``kind`` row a code of rank ``rank`` names (None: zero row)."""
    if code == ZERO_ROW:
        return None
    plan, row = plans[rank], code & ROW_MASK
    if not code & EX:
        return _token_of_local_row(plan, row)
    if plan.exchange == "all_gather":
        per_rank = plan.slots * PACK_ROWS[kind]
        sender, at = divmod(row, per_rank)
    else:
        sender, first, _ = next(r for r in plan.exchanges[kind].receives
                                if r[1] <= row < r[1] + r[2])
        start = next(f for peer, f, _ in plans[sender].exchanges[kind].sends if peer == rank)
        at = start + row - first
    local = plans[sender].exchanges[kind].pack.tolist()[at]
    assert local != ZERO_ROW, "an exchanged row that no rank packed"
    return _token_of_local_row(plans[sender], local)


def _window_tokens(plans, rank, windows) -> list:
    """The tokens of a stack of windows, row by row."""
    tokens = [_token(plans, rank, "x", c) for c in windows.x_codes.tolist()]
    assert None not in tokens
    return tokens


def _check_windows(plans, rank, windows, kind_of_dy) -> None:
    cu = windows.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == windows.rows and cu == sorted(set(cu))
    tokens = _window_tokens(plans, rank, windows)
    breaks = [i for i in range(1, len(tokens)) if tokens[i] != tokens[i - 1] + 1]
    assert set(breaks) <= set(cu), "a window's tokens are not consecutive"
    for i, code in enumerate(windows.dy_codes.tolist()):
        assert kind_of_dy(tokens[i], code), (i, tokens[i], code)


def _piece_of(plan, t):
    return next(p for p in plan.pieces if p.start <= t < p.end)


def test_tables_invariants_over_random_packs():
    """Every code names the token of its row (x and dy alike, through the other ranks' packs);
    a window's tokens are consecutive; the fix-up's negated rows are the edge tokens; targets
    are exactly each piece's edge and tail tokens, once each."""
    rng = random.Random(SEED)
    for _ in range(60):
        world, layout, exchange = rng.randint(1, 5), rng.choice(tl.LAYOUTS), rng.choice(
            tl.EXCHANGES)
        total = rng.randint(0, 40)
        cu = tl.random_cu(total, rng, 0 if rng.random() < 0.2 else 1, 7) if total else [0]
        plans = _plans(cu, total, world, layout, exchange)
        for rank, plan in enumerate(plans):
            where = f"seed {SEED}, P={world} {layout} {exchange} S={total} cu={cu} rank {rank}"
            for windows in (plan.forward_windows, plan.dx_windows, plan.fixup_windows):
                _check_windows(plans, rank, windows, lambda t, code: code == ZERO_ROW
                               or _token(plans, rank, "dy", code) == t)
            edges = {p.offset + i for p in plan.pieces for i in range(p.edge_len)}
            tails = {p.offset + p.length - 1 - i for p in plan.pieces for i in range(p.tail_len)}
            forward = [t for t in plan.forward_windows.targets.tolist() if t >= 0]
            dx = [t for t in plan.dx_windows.targets.tolist() if t >= 0]
            assert sorted(forward) == sorted(edges), where
            assert sorted(dx) == sorted(edges | tails), where
            negated = [c for c in plan.fixup_windows.dy_codes.tolist() if c >= 0 and c & NEG]
            assert len(negated) == sum(p.edge_len for p in plan.pieces), where
