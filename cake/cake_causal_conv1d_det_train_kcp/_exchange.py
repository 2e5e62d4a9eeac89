"""A step's exchange over torch.distributed: each rank packs the rows the others may need (one
gather of the ``_kcp`` program) and sends them, either as one all_gather of every rank's pack
(the default: a fixed shape, the same call every step) or point to point, exactly the rows each
peer needs. Started before the main pass and finished after it, so the main pass hides it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _buffers
from ._agreement import all_gather_single


class Pending:
    """An exchange in flight: :meth:`finish` waits for it and returns the exchanged rows (the
    buffer the plan's row codes with bit 40 index). ``keep``: the tensors the communication
    reads or writes, alive until it is waited for."""

    def __init__(self, works: list, received: torch.Tensor, keep: tuple = ()):
        self._works, self._received, self._keep = works, received, keep

    def finish(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        self._works, self._keep = [], ()
        return self._received


def start(plan, source: torch.Tensor, kind: str) -> Pending:
    """Starts moving the ``kind`` rows (``"x"``: x tails and heads; ``"dy"``: dy heads) of this
    rank's ``source`` to the ranks that need them. A collective over ``plan.group``: every rank
    calls it, in the same order. On NCCL, waiting only makes the current stream wait for the
    communication's, so the host queues the main pass right behind it."""
    table = plan.exchanges[kind]
    channels, device = source.shape[1], source.device
    if not table.needed:  # no document crosses a boundary between ranks: no rank sends
        return Pending([], _buffers.empty((0, channels), source.dtype, device))
    packed = _buffers.empty((table.pack_rows, channels), source.dtype, device)
    plan.compute.gather(table.pack, source, None, packed)
    if plan.exchange == "all_gather":
        gathered = _buffers.empty((plan.world_size * table.pack_rows, channels), source.dtype,
                                  device)
        work = all_gather_single(gathered, packed, group=plan.group, async_op=True)
        return Pending([work], gathered, keep=(packed,))
    received = _buffers.empty((table.received_rows, channels), source.dtype, device)
    ops = [_op(dist.isend, packed, first, rows, peer, plan.group)
           for peer, first, rows in table.sends]
    ops += [_op(dist.irecv, received, first, rows, peer, plan.group)
            for peer, first, rows in table.receives]
    works = dist.batch_isend_irecv(ops) if ops else []
    return Pending(works, received, keep=(packed, ops))


def _op(function, rows: torch.Tensor, first: int, count: int, peer: int, group) -> dist.P2POp:
    """A send or receive of ``rows[first:first + count]`` with group rank ``peer``."""
    return dist.P2POp(function, rows[first:first + count], dist.get_global_rank(group, peer),
                      group)
