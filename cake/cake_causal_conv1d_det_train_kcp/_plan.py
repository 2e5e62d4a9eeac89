"""The per-rank plan of a KCP step (:class:`CakeCausalConv1dDetKcpPlan`): built once per batch
from the global cu_seqlens, agreed on by every rank, its row tables uploaded to the device, so
that a step itself reads nothing back from the device and asks the host nothing."""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..core import checks, plans
from . import _agreement, _buffers, _tables
from ._compute import compute_for
from ._tables import EXCHANGES, LAYOUTS


class DeviceWindows:
    """A :class:`_tables.Windows` on the device: ``x_codes``, ``dy_codes`` and ``targets``
    (int64, one per window row; the last two may be empty), ``cu_seqlens`` (int32) and ``rows``."""

    def __init__(self, windows: _tables.Windows, device: torch.device):
        self.rows = windows.rows
        self.x_codes = _buffers.upload(windows.x_codes, torch.int64, device)
        self.dy_codes = _buffers.upload(windows.dy_codes, torch.int64, device)
        self.targets = _buffers.upload(windows.targets, torch.int64, device)
        self.cu_seqlens = _buffers.upload(windows.cu_seqlens, torch.int32, device)
        # Checked here from the host table: the base family's steps then read nothing back.
        checks.trust_cu_seqlens("window cu_seqlens", self.cu_seqlens, windows.cu_seqlens)


class DeviceExchange:
    """A :class:`_tables.ExchangeTable` with its pack codes on the device (``pack``, int64)."""

    def __init__(self, table: _tables.ExchangeTable, device: torch.device):
        self.pack = _buffers.upload(table.pack, torch.int64, device)
        self.pack_rows = len(table.pack)
        self.sends, self.receives = table.sends, table.receives
        self.received_rows, self.needed = table.received_rows, table.needed


class CakeCausalConv1dDetKcpPlan:
    """One rank's plan of context-parallel causal conv1d steps, for one batch's global
    cu_seqlens; build it with :meth:`build` (a collective).

    Host fields: ``group``, ``rank``, ``world_size``, ``layout``, ``exchange``, ``device``,
    ``dtype`` (x's), ``channels``, ``total_tokens`` (S), ``num_docs``, ``fingerprint`` (hex of
    a blake2b of S and cu_seqlens), ``slots`` (pieces a rank: 1 contiguous, 2 zigzag),
    ``pieces`` (one :class:`CakeCausalConv1dDetKcpPiece` a slot), ``local_tokens``,
    ``local_sizes`` (every rank's), ``exchange_needed`` (False when no document crosses from
    one rank's piece to another's: then no step communicates), ``check_steps``, and ``overlap``
    (settable: False waits for each exchange before the work it could hide behind, to measure
    the overlap; the same bits).

    Device tables (on ``device``; uploaded once): ``local_cu_seqlens`` (the rank's tensor cut at
    piece starts and document boundaries), the exchanges' pack codes, and three stacks of
    windows (``forward_windows``, ``dx_windows``, ``fixup_windows``: :class:`DeviceWindows`).

    Example::

        >>> cu = torch.tensor([0, 1000, 250340 * 2], dtype=torch.int32, device="cuda")
        >>> plan = CakeCausalConv1dDetKcpPlan.build(cu, 250340 * 2, 1024, torch.bfloat16,
        ...                                         layout="zigzag")
        >>> plan.local_tokens, plan.pieces[0].start
    """

    def __init__(self, *, tables: _tables.RankTables, cu: Sequence[int], total_tokens: int,
                 channels: int, dtype: torch.dtype, group, rank: int, world_size: int,
                 layout: str, exchange: str, device: torch.device, check_steps: bool,
                 cu_seqlens: Optional[torch.Tensor] = None):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.layout, self.exchange, self.device = layout, exchange, torch.device(device)
        self.dtype, self.channels, self.total_tokens = dtype, channels, total_tokens
        self.num_docs = len(cu) - 1
        self._digest = _agreement.fingerprint(cu, total_tokens)
        self.fingerprint = self._digest.hex()
        self.check_steps = bool(check_steps)
        self.compute = compute_for(self.device)
        self.slots, self.pieces = tables.slots, tables.pieces
        self.local_tokens, self.local_sizes = tables.local_tokens, tables.local_sizes
        self.exchange_needed = tables.exchanges["x"].needed
        self.overlap = True
        self._cu_ref = weakref.ref(cu_seqlens) if cu_seqlens is not None else None
        self._cu_version = cu_seqlens._version if cu_seqlens is not None else None
        device = self.device
        self.local_cu_seqlens = _buffers.upload(tables.local_cu_seqlens, torch.int32, device)
        checks.trust_cu_seqlens("local cu_seqlens", self.local_cu_seqlens,
                                tables.local_cu_seqlens)
        self.exchanges = {kind: DeviceExchange(table, device)
                          for kind, table in tables.exchanges.items()}
        self.forward_windows = DeviceWindows(tables.forward, device)
        self.dx_windows = DeviceWindows(tables.dx, device)
        self.fixup_windows = DeviceWindows(tables.fixup, device)
        self._unshard_rows = None

    def __repr__(self) -> str:
        return (f"CakeCausalConv1dDetKcpPlan(rank={self.rank}/{self.world_size}, "
                f"layout={self.layout!r}, exchange={self.exchange!r}, S={self.total_tokens}, "
                f"C={self.channels}, dtype={checks.dtype_name(self.dtype)}, "
                f"local_tokens={self.local_tokens}, docs={self.num_docs}, "
                f"fingerprint={self.fingerprint[:12]})")

    @classmethod
    def build(cls, cu_seqlens_global: torch.Tensor, total_tokens: int, channels: int,
              dtype: torch.dtype, group=None, *, layout: str = "contiguous", device=None,
              exchange: str = "all_gather",
              check_steps: bool = False) -> "CakeCausalConv1dDetKcpPlan":
        """This rank's plan; a collective: every rank of ``group`` calls it with the same
        global arguments.

        Args:
            cu_seqlens_global: int32 ``[N + 1]`` document offsets of the whole pack (0,
                non-decreasing, ``total_tokens``), on any device (read once here).
            total_tokens: S, the pack's tokens. channels: C. dtype: x's dtype (bf16 or fp16 on
                CUDA; on the CPU, where the float64 reference computes, also fp32 and fp64).
            group: the process group (None: the default one).
            layout: ``"contiguous"`` or ``"zigzag"``
                (:func:`cake_causal_conv1d_det_train_kcp_token_ranges`).
            device: where the steps' tensors live (default: cu_seqlens' device).
            exchange: ``"all_gather"`` (default) or ``"p2p"`` (docs/families/causal_conv1d_kcp.md).
            check_steps: every step first agrees across ranks (one small all_gather and a host
                read): an argument refused on one rank then raises on every rank. For
                debugging; by default steps never synchronize.

        Raises, on every rank with the same message, when the ranks disagree on the group
        size, dtype, channels, layout, exchange, S or cu_seqlens, or when a rank refused its
        own arguments (that rank raises its own error; the others name it). Host work: one
        read of cu_seqlens, O(N + P) Python per rank, one all_gather of 11 int64 a rank.
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("CakeCausalConv1dDetKcpPlan.build: torch.distributed is not "
                               "initialized (call torch.distributed.init_process_group first)")
        group = group if group is not None else dist.group.WORLD
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise ValueError("CakeCausalConv1dDetKcpPlan.build: this process is not a member "
                             "of group")
        refused, cu, dev = None, [], None
        try:
            cu, dev = _check_build(cu_seqlens_global, total_tokens, channels, dtype, layout,
                                   exchange, device, str(dist.get_backend(group)))
        except _agreement.Refusal as error:
            refused = error
        except Exception as error:  # noqa: BLE001  (anything else still joins the agreement)
            refused = _agreement.Refusal("arguments", error)
        mine = _agreement.row(refused=refused, world=world, dtype=dtype, channels=channels,
                              layout=layout, exchange=exchange, total=total_tokens,
                              digest=bytes(16) if refused else _agreement.fingerprint(
                                  cu, total_tokens), check_steps=check_steps)
        rows = _agreement.gather_rows(mine, group, world, _agreement.device_for(group))
        _agreement.raise_disagreement(rows, refused, "CakeCausalConv1dDetKcpPlan.build")
        return cls(tables=_tables.rank_tables(cu, total_tokens, world, rank, layout, exchange),
                   cu=cu, total_tokens=total_tokens, channels=channels, dtype=dtype,
                   group=group, rank=rank, world_size=world, layout=layout, exchange=exchange,
                   device=dev, check_steps=check_steps, cu_seqlens=cu_seqlens_global)

    @classmethod
    def _for_rank(cls, cu: Sequence[int], total_tokens: int, channels: int,
                  dtype: torch.dtype, world: int, rank: int, layout: str = "contiguous",
                  exchange: str = "all_gather",
                  device="cpu") -> "CakeCausalConv1dDetKcpPlan":
        """Rank ``rank``'s plan without a process group: every rank of a pack simulated in one
        process (the tests). Its steps run only through the step functions, not the public
        entries (which refuse a plan without a group)."""
        cu = [int(c) for c in cu]
        return cls(tables=_tables.rank_tables(cu, total_tokens, world, rank, layout, exchange),
                   cu=cu, total_tokens=total_tokens, channels=channels, dtype=dtype, group=None,
                   rank=rank, world_size=world, layout=layout, exchange=exchange,
                   device=torch.device(device), check_steps=False)

    # ------------------------------------------------------------------------- step checks

    def check_cu_seqlens(self, cu_seqlens: torch.Tensor) -> None:
        """Refuses a step whose global cu_seqlens is not the one this plan was built from.

        The tensor the plan was built from, unmodified, passes with no device access; another
        tensor is read once (a host sync, skipped while a CUDA graph is being captured),
        compared by fingerprint, then remembered."""
        known = self._cu_ref() if self._cu_ref is not None else None
        if known is cu_seqlens and cu_seqlens._version == self._cu_version:
            return
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens: expected an int32 tensor [N + 1] or None, got "
                            f"{type(cu_seqlens).__name__}")
        if self.device.type == "cuda" and plans.is_capturing():
            return
        values = [int(v) for v in cu_seqlens.reshape(-1).tolist()]
        digest = _agreement.fingerprint(values, self.total_tokens)
        if digest != self._digest:
            raise ValueError(
                f"plan: built from other cu_seqlens (plan fingerprint {self.fingerprint[:12]}, "
                f"S = {self.total_tokens}; this step's cu_seqlens {digest.hex()[:12]}, "
                f"{len(values) - 1} documents ending at {values[-1] if values else None}); "
                "build a plan for this batch (CakeCausalConv1dDetKcpPlan.build)")
        self._cu_ref, self._cu_version = weakref.ref(cu_seqlens), cu_seqlens._version

    def check_group(self, group) -> None:
        """Refuses a test plan (no group), another group, and a group that is gone."""
        if self.group is None:
            raise ValueError("plan: built without a process group (a test plan); build one "
                             "with CakeCausalConv1dDetKcpPlan.build")
        if group is not None and group is not self.group:
            raise ValueError("group: the plan was built for another process group")
        try:
            alive = dist.is_initialized() and dist.get_rank(self.group) == self.rank
        except (RuntimeError, ValueError):
            alive = False
        if not alive:
            raise ValueError("plan: its process group is gone or changed (destroyed or "
                             "re-initialized); build a new plan")

    def unshard_rows(self, width: int) -> torch.Tensor:
        """Each global token's row in every rank's rows padded to ``width`` (int64, on the
        device; made once)."""
        if self._unshard_rows is None:
            rows = _tables.global_rows(self.total_tokens, self.world_size, self.layout, width)
            self._unshard_rows = _buffers.upload(rows, torch.int64, self.device)
        return self._unshard_rows


def _refuse(field: str, error: Exception):
    raise _agreement.Refusal(field, error)


def _check_build(cu_seqlens, total_tokens, channels, dtype, layout, exchange, device,
                 backend: str) -> tuple:
    """This rank's own checks of the build arguments: (cu as ints, device), or Refusal."""
    if not isinstance(total_tokens, int) or isinstance(total_tokens, bool) or total_tokens < 0:
        _refuse("total_tokens", ValueError(f"total_tokens: expected an int >= 0, got "
                                           f"{total_tokens!r}"))
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
        _refuse("channels", ValueError(f"channels: expected an int >= 1, got {channels!r}"))
    try:
        checks.check_choice("layout", layout, LAYOUTS)
    except ValueError as error:
        _refuse("layout", error)
    try:
        checks.check_choice("exchange", exchange, EXCHANGES)
    except ValueError as error:
        _refuse("exchange", error)
    cu = _check_cu_seqlens(cu_seqlens, total_tokens)
    dev = _check_device(device, cu_seqlens, backend)
    compute = compute_for(dev)
    if dtype not in compute.x_dtypes:
        names = " or ".join(checks.dtype_name(d) for d in compute.x_dtypes)
        _refuse("dtype", TypeError(f"dtype: expected {names} on {dev}, got {dtype!r}"))
    try:
        compute.load(dev)
    except RuntimeError as error:  # ProgramUnavailable, LibraryRefused: no program for it
        _refuse("device", error)
    return cu, dev


def _check_cu_seqlens(cu_seqlens, total_tokens) -> list:
    if not isinstance(cu_seqlens, torch.Tensor):
        _refuse("cu_seqlens", TypeError(f"cu_seqlens_global: expected an int32 tensor [N + 1], "
                                        f"got {type(cu_seqlens).__name__}"))
    if cu_seqlens.dtype != torch.int32:
        _refuse("cu_seqlens", TypeError(f"cu_seqlens_global: expected dtype int32, got "
                                        f"{checks.describe(cu_seqlens)}"))
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        _refuse("cu_seqlens", ValueError(f"cu_seqlens_global: expected a 1-D tensor [N + 1] "
                                         f"(N >= 0), got {checks.describe(cu_seqlens)}"))
    cu = [int(v) for v in cu_seqlens.tolist()]
    if cu[0] != 0:
        _refuse("cu_seqlens", ValueError(f"cu_seqlens_global: must start at 0, got {cu[0]}"))
    if cu[-1] != total_tokens:
        _refuse("cu_seqlens", ValueError(f"cu_seqlens_global: must end at total_tokens = "
                                         f"{total_tokens}, got {cu[-1]}"))
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            _refuse("cu_seqlens", ValueError(
                f"cu_seqlens_global: must be non-decreasing, but entry {i} ({cu[i]}) < entry "
                f"{i - 1} ({cu[i - 1]})"))
    return cu


def _check_device(device, cu_seqlens: torch.Tensor, backend: str) -> torch.device:
    try:
        dev = torch.device(device) if device is not None else cu_seqlens.device
    except (RuntimeError, TypeError) as error:
        _refuse("device", ValueError(f"device: {error}"))
    if dev.type not in ("cuda", "cpu"):
        _refuse("device", ValueError(f"device: expected a CUDA or CPU device, got {dev}"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "cpu" and backend == "nccl":
        _refuse("device", ValueError("device: the group's backend is nccl, which cannot move "
                                     "CPU tensors; use a CUDA device or a gloo group"))
    return dev
