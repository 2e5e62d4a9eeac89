#!/usr/bin/env python3
"""SHA-256 of every output of both RMSNorm families over a grid of cases, one line a case:
the row outputs (y, the prenorm sum, rstd, dx, dg, dresidual), then the weight gradient apart,
whose bits alone depend on how the backward partitions the rows.

    python tests/rmsnorm/output_digest.py [--first N] [--cols D,...] > digest.txt

(``--first N``: from the N-th case on, 0-based, with the same seeds: the rest of a run that ran
out of time. ``--cols``: only the cases of those widths, with the same seeds: a change that
touches a few widths.)

Run in two checkouts (e.g. main in ``.baseline``) and ``diff`` the files: a kernel change that
claims to keep the math must leave every line identical. The grid: both families; bf16, fp16,
fp32; every D band and fixed-width instance of the GPU tests; plain and residual/offset/fp32
weight options; 67 rows (19 above D = 8192) and 4097 rows (several backward bands); then, in
bf16, 20000 rows at D = 1024, 4096, 4608 and 5120: past 16 rows a band at either family's band
count, so a change of the band count (which sets the backward's rows a CTA there) shows. Each
group of widths added later comes after the cases before it (``cases``).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from launch_model import MIN_ROWS_PER_BAND  # noqa: E402
from rmsnorm_families import (DTYPES, EARLIER_DIMS, FAMILIES, LATER_DIMS, LATER_WIDEST_DIMS,  # noqa: E402
                             NARROW_DIMS, SUBWARP_DIMS, WIDEST_DIMS, case_rows)


# Rows past the fewest a band takes at every family's band count, where the bands set the rows
# a backward CTA takes (fixed, so that two revisions digest the same cases; main() checks it).
BAND_ROWS = 20000


def case_digest(family, rows, cols, dtype, options: bool, seed: int) -> str:
    # Inputs drawn on the GPU: the same for the same GPU model and torch version.
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (rows, cols)

    def randn():
        return torch.randn(shape, generator=gen, device="cuda").to(dtype)

    x, g, dy = randn(), randn(), randn()
    w = (torch.rand(cols, generator=gen, device="cuda") + 0.5).to(
        torch.float32 if options else dtype)
    r = randn() if options else None
    offset = 1.0 if options else 0.0
    y, s, rstd = family.forward(x, g, w, r, weight_offset=offset)
    dsum = randn() if options else None
    grads = family.backward(dy, s if options else x, g, w, rstd, dsum=dsum, has_residual=options,
                            weight_offset=offset, grad_dtype=torch.float32)
    *row_outputs, dweight = (y, s, rstd, *grads)
    return f"{tensors_digest(row_outputs)} dweight {tensors_digest([dweight])}"


def tensors_digest(tensors) -> str:
    """SHA-256 of the tensors' bytes (None skipped), 16 hex digits."""
    digest = hashlib.sha256()
    for tensor in tensors:
        if tensor is not None:
            digest.update(tensor.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def cases():
    """(name, family, rows, cols, dtype, options) of every case, in order (its index + 1 is its
    seed). Cases added later come after every earlier one, so that those keep their seeds."""
    yield from row_cases(EARLIER_DIMS)
    yield from band_cases((1024, 4096))
    yield from band_cases((5120,))  # RMSNorm's 16-bit backward: 792 bands
    yield from row_cases(LATER_DIMS)
    yield from band_cases((4608,))  # fixed 288-thread rows; RMSNorm's 16-bit backward: 792 bands
    yield from row_cases(WIDEST_DIMS)
    yield from row_cases(LATER_WIDEST_DIMS)
    yield from row_cases(NARROW_DIMS)
    yield from row_cases(SUBWARP_DIMS)


def row_cases(dims):
    """Each family's cases of 67 (19 above D = 8192) and 4097 rows at the widths ``dims``."""
    for family in FAMILIES:
        for dtype in DTYPES:
            for cols in dims:
                for rows in (case_rows(cols), 4097):
                    for options in (False, True):
                        yield (f"{family.name} {str(dtype)[6:]} {rows}x{cols} options={options}",
                               family, rows, cols, dtype, options)


def band_cases(dims):
    """The BAND_ROWS cases of each family at the widths ``dims``."""
    for family in FAMILIES:
        for cols in dims:
            if family.rows_per_band(BAND_ROWS, cols) == MIN_ROWS_PER_BAND:
                raise SystemExit(f"{family.name}: {BAND_ROWS} rows fill no more than {MIN_ROWS_PER_BAND} rows a "
                                 f"band at D = {cols}: raise BAND_ROWS")
            for options in (False, True):
                yield (f"{family.name} bfloat16 {BAND_ROWS}x{cols} options={options}",
                       family, BAND_ROWS, cols, torch.bfloat16, options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first case to digest (0-based)")
    parser.add_argument("--cols", type=lambda text: {int(d) for d in text.split(",")},
                        help="only the cases of these widths (comma-separated)")
    args = parser.parse_args(argv)
    for index, (name, family, rows, cols, dtype, options) in enumerate(cases()):
        if index >= args.first and (args.cols is None or cols in args.cols):
            print(name, case_digest(family, rows, cols, dtype, options, index + 1), flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
