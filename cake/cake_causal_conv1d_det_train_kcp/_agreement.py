"""How the ranks agree before anything runs: one all_gather of a small int64 row per rank.

A plan build (and, with ``check_steps``, every step) gathers from each rank a row of what must
be the same everywhere (group size, dtype, channels, layout, exchange, S, the fingerprint of
cu_seqlens) and whether the rank refused its own arguments. Every rank then raises the same
error, or none: a rank that refused raises its own error, the others name it.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..core import checks
from ._tables import EXCHANGES, LAYOUTS

_MAGIC = 0x4B4350  # "KCP": a row from another version of this protocol is refused
_DTYPE_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float64: 4}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
# What a refusing rank reports (its position + 1 travels in the row).
FIELDS = ("cu_seqlens", "total_tokens", "channels", "dtype", "layout", "exchange", "device",
          "step", "arguments")
# Column of each agreed field (the fingerprint takes two).
_AGREED = (("group size", (2,)), ("dtype", (3,)), ("channels", (4,)), ("layout", (5,)),
           ("exchange", (6,)), ("total_tokens", (7,)), ("cu_seqlens fingerprint", (8, 9)),
           ("check_steps", (10,)))

# One all_gather into one tensor: all_gather_single where torch has it (it deprecates the
# older name), all_gather_into_tensor before.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Refusal(Exception):
    """One rank's own arguments refused, carried through the agreement (``field``: FIELDS)."""

    def __init__(self, field: str, error: Exception):
        super().__init__(str(error))
        self.field, self.error = field, error


def fingerprint(cu: Sequence[int], total: int) -> bytes:
    """16-byte blake2b of S and the cu_seqlens values (little-endian int64)."""
    values = [total, *cu]
    return hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=16).digest()


def _words(digest: bytes) -> tuple:
    return (int.from_bytes(digest[:8], "little", signed=True),
            int.from_bytes(digest[8:], "little", signed=True))


def row(*, refused: Optional[Refusal], world: int, dtype, channels, layout, exchange, total,
        digest: bytes, check_steps: bool) -> list:
    """This rank's agreement row (the agreed fields are -1 when it refused)."""
    if refused is not None:
        return [_MAGIC, 1 + FIELDS.index(refused.field), world, -1, -1, -1, -1, -1, 0, 0,
                int(check_steps)]
    return [_MAGIC, 0, world, _DTYPE_CODES.get(dtype, -1), channels, LAYOUTS.index(layout),
            EXCHANGES.index(exchange), total, *_words(digest), int(check_steps)]


def gather_rows(mine: list, group, world: int, device: torch.device) -> list:
    """Every rank's row, in rank order (one all_gather and one host read)."""
    sent = torch.tensor(mine, dtype=torch.int64, device=device)
    got = torch.empty(world * len(mine), dtype=torch.int64, device=device)
    all_gather_single(got, sent, group=group)
    return [r.tolist() for r in got.view(world, len(mine)).cpu()]


def device_for(group) -> torch.device:
    """Where the agreement row travels: the current GPU for NCCL, the CPU otherwise."""
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _shown(field: str, values: list):
    if field == "dtype":
        dtype = _CODE_DTYPES.get(values[0])
        return checks.dtype_name(dtype) if dtype is not None else values[0]
    if field == "layout":
        return LAYOUTS[values[0]]
    if field == "exchange":
        return EXCHANGES[values[0]]
    if field == "cu_seqlens fingerprint":
        return b"".join((v & (2**64 - 1)).to_bytes(8, "little") for v in values).hex()[:12]
    return values[0]


def raise_disagreement(rows: list, refused: Optional[Refusal], where: str) -> None:
    """After the gather: raises on every rank when any rank refused its arguments or the rows
    differ (the same message on every rank, built from the gathered rows)."""
    if any(r[0] != _MAGIC for r in rows):
        raise RuntimeError(f"{where}: a rank sent a malformed agreement row (mixed versions of "
                           "cake-train?)")
    refusing = [(i, FIELDS[r[1] - 1]) for i, r in enumerate(rows) if r[1]]
    if refusing:
        if refused is not None:
            raise refused.error
        names = ", ".join(f"rank {i} ({field})" for i, field in refusing)
        raise ValueError(f"{where}: refused on {names}; see that rank's error. Nothing was "
                         "built or computed on any rank")
    for field, columns in _AGREED:
        if len({tuple(r[c] for c in columns) for r in rows}) > 1:
            shown = ", ".join(f"rank {i}: {_shown(field, [r[c] for c in columns])}"
                              for i, r in enumerate(rows))
            raise ValueError(f"{where}: the ranks disagree on {field} ({shown}); every rank "
                             "must build its plan from the same global arguments")
