"""The RMSNorm kernels' launch shape, modelled in Python from a program's knobs (the
``#define CAKE_*`` params of its kernel source, or the family table's ``tuning``), for the tests
that check the C++ against it (csrc/include/cake/rmsnorm/common.h, "launch shapes"; the launches
of csrc/include/cake/rmsnorm/entries.h below)."""

from __future__ import annotations

import struct

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


# --------------------------------------------------------------------------- launches
# The launches of the C entries (csrc/include/cake/rmsnorm/entries.h: launch_forward,
# launch_backward, launch_dweight; common.h: the shapes they use), from a program's knobs.

MAX_STAGES = 4  # kMaxStages
DEFAULT_STAGES = 2  # kDefaultStages
STAGE_BUDGET = 112 * 1024  # kStageBudget
MAX_SMEM = 227 * 1024 - 1024  # kMaxSmem
STATIC_SMEM = 1024  # kStaticSmem: what a launch adds to its dynamic bytes against the default
DEFAULT_SMEM = 48 * 1024  # above it (with STATIC_SMEM) a launch raises the kernel's limit first
COL_LANES, COL_SEGMENTS = 2, 128  # kColLanes, kColSegments
ELEM_BYTES = {0: 2, 1: 2, 2: 4}  # CAKE_DTYPE -> bytes of x, y, dy, dx


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _direction(backward: bool) -> str:
    return "BACKWARD" if backward else "FORWARD"


def instance(params: dict, cols: int, backward: bool) -> tuple:
    """(elements a thread, row group threads, the instance's fixed width or 0) serving D = cols
    in a direction (with_instance)."""
    d = _direction(backward)
    ept = elems_per_thread(cols, params[f"CAKE_{d}_MIN_ELEMS_PER_THREAD"],
                           params[f"CAKE_{d}_MAX_ROW_THREADS"])
    tpr = threads_per_row(cols, ept)
    fixed = has_fixed_instance(bool(params["CAKE_VECTOR"]), tpr, params[f"CAKE_{d}_COMMON_WIDTHS"])
    return ept, tpr, tpr if fixed else 0


def row_groups(params: dict, tpr: int, backward: bool) -> int:
    """Row groups a CTA of the direction holds (row_groups_per_cta)."""
    cta = params[f"CAKE_{_direction(backward)}_CTA_THREADS"]
    return 1 if tpr >= cta else cta // tpr


def uses_registers(params: dict, ept: int, backward: bool) -> bool:
    """Whether an instance takes the registers path (uses_registers)."""
    elem = ELEM_BYTES[params["CAKE_DTYPE"]]
    return (params[f"CAKE_{_direction(backward)}_STAGES"] == 0 and bool(params["CAKE_VECTOR"])
            and (ept < MAX_EPT or not backward) and not (params["CAKE_GATED"] and elem == 4))


def weights_in_shared(params: dict, ept: int, backward: bool) -> bool:
    """Whether an instance stages weight + weight_offset in shared memory (weight_source)."""
    registers = uses_registers(params, ept, backward)
    if backward and registers:
        return True
    if ept == MAX_EPT and not registers:
        return ELEM_BYTES[params["CAKE_DTYPE"]] != 4
    return params[f"CAKE_{_direction(backward)}_WEIGHTS"] == 0


def ring_stages(knob: int, slot: int, fixed: int, async_copies: bool) -> int:
    """Ring slots (ring_stages)."""
    if not async_copies:
        return 1
    want = knob if knob > 0 else DEFAULT_STAGES

    def fit(limit: int) -> int:
        return (limit - fixed) // slot if fixed < limit else 0

    budget = min(fit(STAGE_BUDGET), want)
    overlap = min(fit(MAX_SMEM), 2)
    stages = budget if budget > overlap else min(overlap, want)
    return max(stages, 1)


def instance_symbol(library: str, kernel: str, ept: int, tpr: int) -> str:
    """The mangled name of the template kernel instance kernel_<library>_<kernel><ept, tpr>
    (instance_symbol: the Itanium C++ ABI, as nvcc mangles it)."""
    name = f"kernel_{library}_{kernel}"
    params = "ForwardParams" if kernel == "forward" else "BackwardParams"
    return f"_Z{len(name)}{name}ILi{ept}ELi{tpr}EEvN4cake7rmsnorm{len(params)}{params}E"


def fake_wave(threads: int, smem: int, sms: int = 132) -> int:
    """The CTAs a persistent forward grid launches on the fake driver (tests/fake_cuda.c: its
    occupancy model, 2048 threads and 228 KiB of shared memory an SM; wave_size)."""
    by_threads = 2048 // threads if threads > 0 else 0
    by_smem = (228 * 1024) // (smem + 1024) if smem > 0 else 32
    return sms * max(min(by_threads, by_smem), 1)


def forward_launch(params: dict, library: str, rows: int, cols: int, *, residual: bool,
                   wave=fake_wave) -> dict | None:
    """The forward's launch (None without rows): kernel, grid, block, smem, and the row group's
    threads and ring slots it passes in its parameters (tpr, stages)."""
    if rows == 0:
        return None
    elem = ELEM_BYTES[params["CAKE_DTYPE"]]
    ept, tpr, fixed = instance(params, cols, backward=False)
    groups = row_groups(params, tpr, backward=False)
    threads = tpr * groups
    weights = tpr * ept * 4 if weights_in_shared(params, ept, backward=False) else 0
    if uses_registers(params, ept, backward=False):
        stages, smem = 0, weights
    else:
        tensors = (2 if params["CAKE_GATED"] else 1) + (1 if residual else 0)
        slot = tensors * ept * threads * elem
        stages = ring_stages(params["CAKE_FORWARD_STAGES"], slot, weights,
                             bool(params["CAKE_VECTOR"]) or elem == 4)
        smem = weights + stages * slot
    needed = _ceil(rows, groups)
    cta_rows = params["CAKE_FORWARD_CTA_ROWS"]
    if cta_rows > 0:
        steps = cta_rows // groups if cta_rows > groups else 1
        grid = min(_ceil(needed, steps), 1 << 30)
    else:
        grid = min(needed, wave(threads, smem))
    return {"kernel": instance_symbol(library, "forward", ept, fixed), "grid": (grid, 1, 1),
            "block": (threads, 1, 1), "smem": smem, "tpr": tpr, "stages": stages}


def dweight_in_shared(params: dict, ept: int) -> bool:
    """Whether a staged backward instance keeps its weight-gradient sums in shared memory."""
    return ept == MAX_EPT and (ELEM_BYTES[params["CAKE_DTYPE"]] == 2 or not params["CAKE_GATED"])


def backward_partition(params: dict, rows: int, cols: int) -> tuple:
    """(rows a band takes, backward CTAs = weight-gradient partial rows) at (rows, D)
    (backward_partition)."""
    per = rows_per_band(params, rows, cols)
    count = _ceil(rows, per)
    guided = params["CAKE_BACKWARD_GUIDED"]
    return per, (count + 1) // 2 * (guided + 1) if guided else count


def backward_launch(params: dict, library: str, rows: int, cols: int) -> dict | None:
    """The backward kernel's launch (None without rows), with its tpr and stages."""
    if rows == 0:
        return None
    elem = ELEM_BYTES[params["CAKE_DTYPE"]]
    ept, tpr, fixed = instance(params, cols, backward=True)
    groups = row_groups(params, tpr, backward=True)
    threads = tpr * groups
    if uses_registers(params, ept, backward=True):
        stages, smem = 0, (tpr + (threads if groups > 1 else 0)) * ept * 4
    else:
        weights = tpr * ept * 4 if weights_in_shared(params, ept, backward=True) else 0
        tensors = 3 if params["CAKE_GATED"] else 2
        slot = tensors * ept * threads * elem + threads * 4
        sums = threads * ept * 4 if dweight_in_shared(params, ept) else 0
        stages = ring_stages(params["CAKE_BACKWARD_STAGES"], slot, weights + sums,
                             bool(params["CAKE_VECTOR"]) or elem == 4)
        smem = weights + stages * slot + sums
    _, ctas = backward_partition(params, rows, cols)
    return {"kernel": instance_symbol(library, "backward", ept, fixed), "grid": (ctas, 1, 1),
            "block": (threads, 1, 1), "smem": smem, "tpr": tpr, "stages": stages}


def dweight_launch(library: str, cols: int) -> dict:
    """The weight-gradient reduction's launch (after the backward, with or without rows)."""
    padded = _ceil(cols, 4) * 4
    return {"kernel": f"kernel_{library}_dweight", "grid": (_ceil(padded, COL_LANES * 4), 1, 1),
            "block": (COL_LANES, COL_SEGMENTS, 1), "smem": 0}


def raises_limit(smem: int) -> bool:
    """Whether a launch with ``smem`` dynamic bytes raises its kernel's shared-memory limit."""
    return smem + STATIC_SMEM > DEFAULT_SMEM


# The kernels' parameters (common.h: ForwardParams, BackwardParams, DweightParams), as the fake
# CUDA driver records a launch's first parameter.
FORWARD_PARAMS = (struct.Struct("<7Qq4i3f"),
                  ("x", "residual", "gate", "weight", "y", "residual_out", "rstd", "rows", "cols",
                   "tpr", "stages", "weight_fp32", "eps", "weight_offset", "inv_cols"))
BACKWARD_PARAMS = (struct.Struct("<10Q2q5i2f"),
                   ("s", "gate", "weight", "dy", "rstd", "dsum", "dx", "dresidual", "dgate",
                    "partials", "rows", "rows_per_cta", "cols", "cols_padded", "tpr", "stages",
                    "weight_fp32", "weight_offset", "inv_cols"))
DWEIGHT_PARAMS = (struct.Struct("<2Qq3i"),
                  ("partials", "dweight", "chunks", "cols", "cols_padded", "out_dtype"))


def params(layout, data: bytes) -> dict:
    layout_struct, fields = layout
    return dict(zip(fields, layout_struct.unpack_from(data)))


def fp32(value: float) -> float:
    """``value`` rounded to fp32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def inv_cols(cols: int) -> float:
    """1 / cols in fp32 arithmetic, as the entries compute it (1.0f / float(cols))."""
    import numpy

    return float(numpy.float32(1.0) / numpy.float32(cols))
