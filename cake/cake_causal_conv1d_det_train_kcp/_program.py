"""This package's ``_kcp`` program (csrc/include/cake/causal_conv1d/kcp_config.h): its
``gather`` and ``scatter`` entries, loaded once per device, and the host checks of a call.

Rows are C elements of 2 bytes (bf16 and fp16 move as their bits); a table holds one int64 per
row: a row code (gather) or a destination row (scatter; < 0 skips the row).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core import checks, plans

_ROW_DTYPES = (torch.bfloat16, torch.float16)
_entries: dict = {}  # device index -> (gather, scatter) entries of the loaded library


def entries(device: torch.device) -> tuple:
    """The program's (gather, scatter) entries for ``device``; loads its library (prebuilt,
    cached or compiled once) on first use, raising ProgramUnavailable where none can run."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    found = _entries.get(index)
    if found is None:
        programs = plans.program_set(__file__)
        program = next(p for p in programs.manifest.programs if p.kcp)
        library = programs.library(program, index)
        found = _entries[index] = (library.entry("gather"), library.entry("scatter"))
    return found


def _check_rows(name: str, value: torch.Tensor, channels: int, dtype: torch.dtype) -> None:
    checks.check_tensor(name, value, dtypes=(dtype,), ndims=(2,), shape_hint="[rows, C]")
    if value.shape[1] != channels:
        raise ValueError(f"{name}: expected {channels} channels, got {checks.describe(value)}")


def _check_table(name: str, table: torch.Tensor, rows: int) -> None:
    checks.check_tensor(name, table, dtypes=(torch.int64,), ndims=(1,), shape_hint="[rows]")
    if table.shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} entries, got {checks.describe(table)}")


def gather(codes: torch.Tensor, local: torch.Tensor, exchanged: Optional[torch.Tensor],
           out: torch.Tensor) -> None:
    """``out[i] = `` the row ``codes[i]`` names in ``local`` / ``exchanged`` (zero, negated)."""
    checks.check_tensor("out", out, dtypes=_ROW_DTYPES, ndims=(2,), shape_hint="[rows, C]")
    channels = out.shape[1]
    _check_rows("local", local, channels, out.dtype)
    if exchanged is not None:
        _check_rows("exchanged", exchanged, channels, out.dtype)
    _check_table("codes", codes, out.shape[0])
    checks.check_same_device("out", out, {"local": local, "exchanged": exchanged,
                                          "codes": codes})
    gather_entry = entries(out.device)[0]
    gather_entry(plans.stream_handle(out.device), table=codes, rows=out.shape[0], local=local,
                 local_rows=local.shape[0], exchanged=exchanged,
                 exchanged_rows=0 if exchanged is None else exchanged.shape[0],
                 channels=channels, out=out)


def scatter(src: torch.Tensor, targets: torch.Tensor, out: torch.Tensor) -> None:
    """``out[targets[i]] = src[i]`` where ``0 <= targets[i] < rows of out``."""
    checks.check_tensor("out", out, dtypes=_ROW_DTYPES, ndims=(2,), shape_hint="[rows, C]")
    channels = out.shape[1]
    _check_rows("src", src, channels, out.dtype)
    _check_table("targets", targets, src.shape[0])
    checks.check_same_device("out", out, {"src": src, "targets": targets})
    scatter_entry = entries(out.device)[1]
    scatter_entry(plans.stream_handle(out.device), table=targets, rows=src.shape[0], src=src,
                  out=out, out_rows=out.shape[0], channels=channels)
