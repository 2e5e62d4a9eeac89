"""The host side of a KCP plan: the split rules, each rank's pieces, and the row tables a step
runs on (docs/families/causal_conv1d_kcp.md). Pure Python over ints; every rank computes every
rank's tables the same way, so the two ends of an exchange agree without talking.

A *row code* names a row for the ``_kcp`` program's gather (and for its CPU twin): a local row, a
row of the exchanged buffer, a zero row, or a row negated. The constants are those of
``csrc/include/cake/causal_conv1d/kcp_config.h`` (a test keeps them together).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, Sequence

WIDTH = 4
HALO = WIDTH - 1  # a token reads the 3 tokens before it (forward) and after it (dx)
LAYOUTS = ("contiguous", "zigzag")
EXCHANGES = ("all_gather", "p2p")
KINDS = ("x", "dy")  # what an exchange moves: x tails and heads (forward), dy heads (backward)
# Rows a slot packs for an all_gather: x its last 3 and first 3 rows, dy its first 3.
PACK_ROWS = {"x": 2 * HALO, "dy": HALO}

ZERO_ROW = -1
ROW_BITS = 40
ROW_MASK = (1 << ROW_BITS) - 1
EXCHANGED_BIT = 1 << 40
NEGATE_BIT = 1 << 41
CODE_BITS = ROW_MASK | EXCHANGED_BIT | NEGATE_BIT


def token_ranges(total: int, world: int, rank: int, layout: str) -> list:
    """The global token ranges ``[(start, end), ...]`` rank ``rank`` holds, in local order.

    contiguous: ``[(floor(r*S/P), floor((r+1)*S/P))]``; zigzag: chunks r and 2P-1-r of the 2P
    chunks ``[floor(k*S/(2P)), floor((k+1)*S/(2P)))``. Ranges may be empty (S < P or S < 2P).
    """
    if layout == "contiguous":
        return [(rank * total // world, (rank + 1) * total // world)]
    chunks = 2 * world
    return [(k * total // chunks, (k + 1) * total // chunks) for k in (rank, chunks - 1 - rank)]


@dataclasses.dataclass(frozen=True)
class CakeCausalConv1dDetKcpPiece:
    """One contiguous global token range ``[start, end)`` a rank holds, at local rows
    ``[offset, offset + length)``; ``slot`` is its place on the rank (zigzag: 0 or 1).

    ``halo_len``: tokens of its first token's document before it that its first tokens read
    (``min(3, start - document start)``); ``edge_len``: leading tokens whose taps reach before
    the piece (0..3); ``dz_halo_len``: tokens of its last token's document after it whose dz its
    last tokens' dx needs (``min(3, document end - end)``); ``tail_len``: trailing tokens whose dx
    needs them (0..3); ``inner``: document boundaries strictly inside, relative to ``start``.
    """

    slot: int
    start: int
    end: int
    offset: int
    halo_len: int = 0
    edge_len: int = 0
    dz_halo_len: int = 0
    tail_len: int = 0
    inner: tuple = ()

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class _Held:
    """A piece in the global order: its range, owner rank, slot and local offset."""

    start: int
    end: int
    owner: int
    slot: int
    offset: int


@dataclasses.dataclass
class Windows:
    """Stacked windows of global tokens that one run of the single-rank op computes: per row a
    code for x and for dy (empty for forward windows), the destination row of its result in the
    local tensor (``-1``: none; empty for the weight-gradient fix-up) and the windows' cu_seqlens
    (each window's start and end, and every document boundary inside it)."""

    x_codes: list = dataclasses.field(default_factory=list)
    dy_codes: list = dataclasses.field(default_factory=list)
    targets: list = dataclasses.field(default_factory=list)
    cu_seqlens: list = dataclasses.field(default_factory=lambda: [0])

    @property
    def rows(self) -> int:
        return len(self.x_codes)


@dataclasses.dataclass
class ExchangeTable:
    """One direction of a rank's exchange (``kind`` x or dy). ``pack``: codes of the rows it
    sends, gathered from its local tensor (all_gather: ``PACK_ROWS`` rows a slot, zero rows
    where a piece is shorter; p2p: its sends, receiver by receiver); ``sends``/``receives``
    (p2p): ``(peer, first row, rows)`` of the pack and of the receive buffer; ``received_rows``:
    rows of the exchanged buffer; ``needed``: whether any rank needs a row of another (else no
    rank exchanges)."""

    pack: list
    sends: list
    receives: list
    received_rows: int
    needed: bool


@dataclasses.dataclass
class RankTables:
    """Everything a rank's plan holds on the host, before the upload."""

    slots: int
    pieces: tuple
    local_tokens: int
    local_sizes: tuple
    local_cu_seqlens: list
    exchanges: dict
    forward: Windows
    dx: Windows
    fixup: Windows


class _Pack:
    """The global view of one split: documents, every rank's pieces, who holds a token."""

    def __init__(self, cu: Sequence[int], total: int, world: int, layout: str):
        self.cu, self.total, self.world = list(cu), total, world
        self.slots = 1 if layout == "contiguous" else 2
        self.held = []
        for owner in range(world):
            offset = 0
            for slot, (a, b) in enumerate(token_ranges(total, world, owner, layout)):
                self.held.append(_Held(a, b, owner, slot, offset))
                offset += b - a
        self._nonempty = sorted((h for h in self.held if h.end > h.start), key=lambda h: h.start)
        self._starts = [h.start for h in self._nonempty]

    def document(self, t: int) -> tuple:
        d = bisect.bisect_right(self.cu, t) - 1
        return self.cu[d], self.cu[d + 1]

    def holder(self, t: int) -> _Held:
        return self._nonempty[bisect.bisect_right(self._starts, t) - 1]

    def piece(self, held: _Held) -> CakeCausalConv1dDetKcpPiece:
        a, b = held.start, held.end
        if b == a:
            return CakeCausalConv1dDetKcpPiece(held.slot, a, b, held.offset)
        ds, de = self.document(a)
        ls, le = self.document(b - 1)
        return CakeCausalConv1dDetKcpPiece(
            held.slot, a, b, held.offset,
            halo_len=min(HALO, a - ds),
            edge_len=min(HALO, b - a, de - a) if ds < a else 0,
            dz_halo_len=min(HALO, le - b),
            tail_len=min(HALO, b - a, b - ls) if le > b else 0,
            inner=self.boundaries(a, b, relative=True))

    def boundaries(self, a: int, b: int, relative: bool = False) -> tuple:
        """Distinct document boundaries strictly inside ``(a, b)``."""
        lo, hi = bisect.bisect_right(self.cu, a), bisect.bisect_left(self.cu, b)
        return tuple(sorted({c - a if relative else c for c in self.cu[lo:hi] if a < c < b}))

    def pieces_of(self, rank: int) -> tuple:
        return tuple(self.piece(h) for h in self.held if h.owner == rank)

    def size_of(self, rank: int) -> int:
        return sum(h.end - h.start for h in self.held if h.owner == rank)


def _needed(pack: _Pack, rank: int, kind: str) -> list:
    """Tokens outside its pieces whose ``kind`` rows the rank's windows read: x the halo before
    each piece and the dz halo after it (the next pieces' x heads), dy the dz halo only."""
    tokens = set()
    for p in pack.pieces_of(rank):
        if kind == "x":
            tokens.update(range(p.start - p.halo_len, p.start))
        tokens.update(range(p.end, p.end + p.dz_halo_len))
    return sorted(tokens)


def _from_others(pack: _Pack, rank: int, kind: str) -> dict:
    """sender -> the sorted tokens ``rank`` needs of it (``kind`` rows; itself excluded)."""
    found: dict = {}
    for t in _needed(pack, rank, kind):
        owner = pack.holder(t).owner
        if owner != rank:
            found.setdefault(owner, []).append(t)
    return found


def _local_row(held: _Held, t: int) -> int:
    return held.offset + t - held.start


def _all_gather_row(pack: _Pack, kind: str, t: int) -> int:
    """Row of token t in the gathered buffer: its holder's block, then its tail or head row."""
    held = pack.holder(t)
    base = (held.owner * pack.slots + held.slot) * PACK_ROWS[kind]
    if kind == "x" and t >= held.end - HALO:
        return base + t - (held.end - HALO)
    return base + (HALO if kind == "x" else 0) + t - held.start


def _all_gather_pack(pack: _Pack, rank: int, kind: str) -> list:
    """Codes of the rank's all_gather block: per slot x its last 3 then first 3 rows, dy its
    first 3; zero rows where the piece is shorter."""
    codes = []
    for held in (h for h in pack.held if h.owner == rank):
        tail = list(range(held.end - HALO, held.end)) if kind == "x" else []
        head = list(range(held.start, held.start + HALO))
        codes += [_local_row(held, t) if held.start <= t < held.end else ZERO_ROW
                  for t in tail + head]
    return codes


def _exchange_table(pack: _Pack, rank: int, kind: str, exchange: str) -> tuple:
    """(the rank's :class:`ExchangeTable`, token -> row of its exchanged buffer)."""
    needed = any(_from_others(pack, r, kind) for r in range(pack.world))
    mine = _from_others(pack, rank, kind)
    if exchange == "all_gather":
        rows = {t: _all_gather_row(pack, kind, t) for ts in mine.values() for t in ts}
        block = _all_gather_pack(pack, rank, kind)
        return ExchangeTable(block, [], [], pack.world * len(block), needed), rows
    rows, receives = {}, []
    for sender in sorted(mine):
        first = len(rows)
        receives.append((sender, first, len(mine[sender])))
        rows.update({t: first + i for i, t in enumerate(mine[sender])})
    codes, sends = [], []
    for receiver in range(pack.world):
        wanted = _from_others(pack, receiver, kind).get(rank, []) if receiver != rank else []
        if wanted:
            sends.append((receiver, len(codes), len(wanted)))
            codes += [_local_row(pack.holder(t), t) for t in wanted]
    return ExchangeTable(codes, sends, receives, len(rows), needed), rows


class _Sources:
    """Row codes of one rank's tokens: local rows for its own, exchanged rows for the others'."""

    def __init__(self, pack: _Pack, rank: int, received: dict):
        self._pack, self._rank, self._received = pack, rank, received

    def code(self, kind: str, t: int) -> int:
        held = self._pack.holder(t)
        if held.owner == self._rank:
            return _local_row(held, t)
        return EXCHANGED_BIT | self._received[kind][t]


class _WindowBuilder:
    """Appends windows of global tokens to a :class:`Windows`."""

    def __init__(self, pack: _Pack):
        self._pack = pack
        self.windows = Windows()

    def add(self, first: int, end: int, x_code: Callable, dy_code: Callable | None = None,
            target: Callable | None = None) -> None:
        w = self.windows
        base = w.rows
        for t in range(first, end):
            w.x_codes.append(x_code(t))
            if dy_code is not None:
                w.dy_codes.append(dy_code(t))
            if target is not None:
                w.targets.append(target(t))
        w.cu_seqlens += [base + c - first for c in self._pack.boundaries(first, end)]
        w.cu_seqlens.append(base + end - first)


def _forward_windows(pack: _Pack, pieces: tuple, src: _Sources) -> Windows:
    """Per piece with edge tokens: ``[start - halo_len, start + edge_len)``, one document; y of
    the edge tokens goes back to their local rows."""
    build = _WindowBuilder(pack)
    for p in pieces:
        if p.edge_len:
            build.add(p.start - p.halo_len, p.start + p.edge_len, lambda t: src.code("x", t),
                      target=lambda t, p=p: p.offset + t - p.start if t >= p.start else -1)
    return build.windows


def _dx_spans(p: CakeCausalConv1dDetKcpPiece) -> list:
    """The dx windows of a piece: one around its front targets (the edge tokens, whose dz the
    main pass took from a truncated context), one around its tail targets (whose dx needs dz
    past the piece), merged when they overlap or touch."""
    front = tail = None
    if p.edge_len:
        front = (p.start - p.halo_len, min(p.end, p.start + p.edge_len + HALO))
    if p.tail_len:
        tail = (max(p.start - p.halo_len, p.end - p.tail_len - HALO), p.end + p.dz_halo_len)
    if front and tail and front[1] >= tail[0]:
        return [(front[0], tail[1])]
    return [span for span in (front, tail) if span]


def _dx_windows(pack: _Pack, pieces: tuple, src: _Sources) -> Windows:
    """dx windows: x from the rank's rows and the exchanged ones, dy zero before the piece (those
    tokens' dx belongs to other ranks), dx of the targets back to their local rows."""
    build = _WindowBuilder(pack)
    for p in pieces:
        targets = set(range(p.start, p.start + p.edge_len)) | set(range(p.end - p.tail_len, p.end))
        for first, end in _dx_spans(p):
            build.add(first, end, lambda t: src.code("x", t),
                      lambda t, p=p: ZERO_ROW if t < p.start else src.code("dy", t),
                      lambda t, p=p, targets=targets: (p.offset + t - p.start if t in targets
                                                       else -1))
    return build.windows


def _fixup_windows(pack: _Pack, pieces: tuple, src: _Sources) -> Windows:
    """Per piece with edge tokens, two windows for the weight gradient: the edge tokens in their
    full context (dy zero on the halo), then as the main pass saw them (the piece's start as a
    document start) with dy negated, so that their dz, negated exactly, cancels the main pass's
    contribution of theirs."""
    build = _WindowBuilder(pack)
    for p in pieces:
        if p.edge_len:
            edge_end = p.start + p.edge_len
            build.add(p.start - p.halo_len, edge_end, lambda t: src.code("x", t),
                      lambda t, p=p: ZERO_ROW if t < p.start else src.code("dy", t))
            build.add(p.start, edge_end, lambda t: src.code("x", t),
                      lambda t: NEGATE_BIT | src.code("dy", t))
    return build.windows


def _local_cu_seqlens(pieces: tuple) -> list:
    """The rank's tensor cut at every piece start and document boundary (empty pieces add
    nothing): the single-rank op on it is right for every token but the edges and tails."""
    cu = [0]
    for p in pieces:
        if p.length:
            cu += [p.offset + c for c in p.inner]
            cu.append(p.offset + p.length)
    return cu


def rank_tables(cu: Sequence[int], total: int, world: int, rank: int, layout: str,
                exchange: str) -> RankTables:
    """Rank ``rank``'s tables for the pack ``cu`` (global cu_seqlens, host ints) of ``total``
    tokens split over ``world`` ranks."""
    pack = _Pack(cu, total, world, layout)
    pieces = pack.pieces_of(rank)
    exchanges, received = {}, {}
    for kind in KINDS:
        exchanges[kind], received[kind] = _exchange_table(pack, rank, kind, exchange)
    src = _Sources(pack, rank, received)
    return RankTables(
        slots=pack.slots, pieces=pieces, local_tokens=pack.size_of(rank),
        local_sizes=tuple(pack.size_of(r) for r in range(world)),
        local_cu_seqlens=_local_cu_seqlens(pieces), exchanges=exchanges,
        forward=_forward_windows(pack, pieces, src), dx=_dx_windows(pack, pieces, src),
        fixup=_fixup_windows(pack, pieces, src))


def global_rows(total: int, world: int, layout: str, width: int) -> list:
    """For each global token, its row in every rank's rows padded to ``width`` and stacked in
    rank order (what an all_gather for unsharding gives)."""
    rows = [0] * total
    for owner in range(world):
        offset = 0
        for a, b in token_ranges(total, world, owner, layout):
            rows[a:b] = range(owner * width + offset, owner * width + offset + b - a)
            offset += b - a
    return rows
