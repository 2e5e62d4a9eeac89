"""The RMSNorm kernels' launch shape, modelled in Python from a program's knobs (the
``#define CAKE_*`` params of its kernel source, or the family table's ``tuning``), for the tests
that check the C++ against it (csrc/include/cake/rmsnorm_common.cuh, "launch shapes")."""

from __future__ import annotations

MAX_EPT = 32  # kMaxEpt
MAX_CTA_THREADS = 512  # kMaxCtaThreads
MIN_ROWS_PER_BAND = 16  # kMinRowsPerCta: the fewest rows a backward band takes


def elems_per_thread(cols: int, min_ept: int, max_row: int) -> int:
    """The instance's elements a thread: the narrowest whose row group stays within max_row."""
    ept = min_ept
    while ept < MAX_EPT:
        if cols <= ept * max_row:
            return ept
        ept *= 2
    return MAX_EPT


def threads_per_row(cols: int, ept: int) -> int:
    """A row group's threads: a power of two up to 32, else a multiple of 32."""
    need = -(-cols // ept)
    return -(-need // 32) * 32 if need > 32 else 1 << (need - 1).bit_length()


def has_fixed_instance(vector: bool, tpr: int, common_widths: int) -> bool:
    """Whether row groups of tpr threads have instances with that width fixed (has_fixed_instance):
    on the vector route, the powers of two from 64 threads and, with the direction's
    CAKE_*_COMMON_WIDTHS, the other multiples of 64 (1) or of 32 (2), and the row groups of a
    warp or less (3)."""
    if not vector:
        return False
    if tpr <= 32:
        return common_widths >= 3
    return (tpr & (tpr - 1)) == 0 or (common_widths >= 1 and tpr % 64 == 0) or common_widths >= 2


def backward_bands(params: dict, cols: int) -> int:
    """The backward's bands at D = cols: CAKE_BACKWARD_BANDS for CTAs of
    CAKE_BACKWARD_CTA_THREADS, times how many more CTAs of the D's own size an SM holds under the
    instance's launch bound (CAKE_BACKWARD_MIN_BLOCKS CTAs of 512 threads' registers, one at 32
    elements a thread; 0: no bound, one CTA), and never fewer."""
    ept = elems_per_thread(cols, params["CAKE_BACKWARD_MIN_ELEMS_PER_THREAD"],
                           params["CAKE_BACKWARD_MAX_ROW_THREADS"])
    tpr = threads_per_row(cols, ept)
    cta = params["CAKE_BACKWARD_CTA_THREADS"]
    threads = tpr * (1 if tpr >= cta else cta // tpr)
    min_blocks = 1 if ept == MAX_EPT else params["CAKE_BACKWARD_MIN_BLOCKS"]

    def resident(n: int) -> int:
        return max(1, min_blocks * (MAX_CTA_THREADS // 32) // -(-n // 32))

    return max(params["CAKE_BACKWARD_BANDS"], params["CAKE_BACKWARD_BANDS"] * resident(threads) // resident(cta))


def rows_per_band(params: dict, rows: int, cols: int) -> int:
    """The backward's band of ``rows`` at D = cols (backward_partition): the rows a CTA takes
    on average."""
    return max(MIN_ROWS_PER_BAND, -(-rows // backward_bands(params, cols)))
