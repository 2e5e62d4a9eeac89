"""Family table of ``cake.cake_rmsnorm_det_train``: RMSNorm (optionally prenorm) with a
deterministic backward.

Programs per (dtype, load). ``dtype`` is the dtype of x/y/dy/dx; ``load`` is ``vector``
(16-byte loads: D a multiple of 16 / sizeof(dtype) and 16-byte aligned tensors) or ``scalar``
(element loads: any D). Inside every program the weight dtype (x's or fp32), the weight-gradient
dtype, the residual (prenorm) form and the D band of the kernel instances (8 (optional), 16 or
32 elements a thread) are chosen per call. ``cols_min``/``cols_max`` bound D for the router
(``select`` in ``cake/_shared/rmsnorm.py``, shared by both RMSNorm families): one program for D = 1
.. 16384, except the 16-bit vector ones, whose forward (and RMSNorm's backward up to D = 2048)
differs by D band (router bands, ``bands``: D <= 2048, <= 3584, <= 4096, <= 6144, <= 7168,
<= 8192 and above here, D <= 3584, <= 4096, <= 8192 and above in the gated family). 3 dtypes x 2
loads = 6 variants; 18 programs here, 12 in the gated family. The templates are shared with
``cake_gated_rmsnorm_det_train`` (``CAKE_GATED``).

Every program also gets the tuning knobs of ``csrc/templates/rmsnorm/kernel.cu`` (``bands``);
``tools/bench/rmsnorm.py --tune`` sweeps them on a GPU, and its winners go into ``TUNING``.
"""

import itertools

from tools.render import Family, Spec

DTYPES = {"bfloat16": 0, "float16": 1, "float32": 2}
LOADS = {"vector": 1, "scalar": 0}
ROUTE = {"cols_min": 1, "cols_max": 16384}
TEMPLATES = {"kernel": "csrc/templates/rmsnorm/kernel.cu",
             "binding": "csrc/templates/rmsnorm/binding.cu"}

# Knob meanings: csrc/include/cake/rmsnorm/config.h and the Config notes of
# csrc/include/cake/rmsnorm/common.h. Values from H200 tunes of 2026-11-29 to 2026-12-04
# (tools/bench/rmsnorm.py --tune; % of copy bandwidth; docs/families/rmsnorm.md; the runs
# themselves are in git history). Every program starts from TUNING; the dicts below override it
# per family, dtype, load and D band (bands()).
TUNING = {
    "CAKE_FORWARD_STAGES": 2,        # a 2-slot cp.async ring: 3 or 4 slots were no faster
    "CAKE_BACKWARD_STAGES": 2,       # 2 slots: with 64 registers, two 512-thread CTAs share an SM
    "CAKE_FORWARD_MIN_ELEMS_PER_THREAD": 16,   # 8 was behind at every D but one (gated, D = 128)
    "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 16,  # 8 lost: 68-74% of copy at D <= 4096
    "CAKE_FORWARD_MAX_ROW_THREADS": 512,   # rows of up to 512 threads: D <= 8192 at 16
    "CAKE_BACKWARD_MAX_ROW_THREADS": 512,  # the same for the backward
    "CAKE_FORWARD_COMMON_WIDTHS": 3,   # every row width fixed: 1.00-1.33x the run-time one
    "CAKE_BACKWARD_COMMON_WIDTHS": 3,  # the same: 1.00-1.84x
    "CAKE_FORWARD_CTA_THREADS": 512,   # 512-thread ring forward CTAs: +0-4 points against 256
    "CAKE_BACKWARD_CTA_THREADS": 512,  # +0.4..6.7 points against 256-thread CTAs in 1024 bands
    "CAKE_L2_PREFETCH": 0,             # L2 prefetch hints: 128 level, 256 0.3-1.0 points behind
    "CAKE_FORWARD_WEIGHTS": 0,         # staged weights: through L1 lost 3-19 points
    "CAKE_BACKWARD_WEIGHTS": 0,        # staged too: through L1 the backward read 46-57% of copy
    "CAKE_FORWARD_CTA_ROWS": 16,       # ~16 rows a CTA, many waves: ahead of one persistent wave
    "CAKE_BACKWARD_BANDS": 528,        # two whole waves of two CTAs an SM on 132 SMs
    "CAKE_BACKWARD_OVERLAP_STAGING": 1,  # stage weights while the ring fills: -0.1..+2.1 points
    "CAKE_BACKWARD_INTERLEAVE": 1,     # CTAs take row steps in turn: +1.2..3.5 points
    "CAKE_BACKWARD_GUIDED": 0,         # half-regions a wave: -1.2..+0.5 points here
    "CAKE_FORWARD_MIN_BLOCKS": 0,      # no register bound: ahead of 2 or 4 CTAs' at D = 8192
    "CAKE_BACKWARD_MIN_BLOCKS": 2,     # 64 registers: two 512-thread CTAs an SM
}
# The gated backward: its ring slot holds x, g and dy.
GATED_TUNING = {
    "CAKE_BACKWARD_STAGES": 3,         # 3 slots, no register bound: 80-85% of copy against 74-81%
    "CAKE_BACKWARD_MIN_BLOCKS": 0,     # (above); rows in registers instead spill at 128 registers
    "CAKE_BACKWARD_BANDS": 264,        # its CTAs take a whole SM: 264 bands make two waves
    "CAKE_BACKWARD_OVERLAP_STAGING": 0,  # overlapped staging lost 1.9-2.6 points at D = 8192
    "CAKE_BACKWARD_GUIDED": 1,         # each wave takes one half of the row steps: +0.0..4.3 points
}
# RMSNorm's 16-bit vector forward above D = 8192 (the ring's band).
WIDE_FORWARD_TUNING = {
    "CAKE_FORWARD_MAX_ROW_THREADS": 64,  # 32 elements a thread: +0.6..2.2 points in the ring
}
# The 16-bit vector forwards in the shape of FLA's and Liger's: one row step a CTA, the row in
# registers from load to store (no ring).
ONE_ROW_FORWARD_TUNING = {
    "CAKE_FORWARD_STAGES": 0,          # no ring: +3.4..5 points over it at D = 4096
    "CAKE_FORWARD_WEIGHTS": 2,         # weights as 16-byte vectors through L1: no staging a CTA
    "CAKE_FORWARD_MAX_ROW_THREADS": 512,  # rows of up to 512 threads at 16 elements
    "CAKE_FORWARD_CTA_THREADS": 128,   # 128-thread CTAs; a wider row takes a CTA of its own
    "CAKE_FORWARD_CTA_ROWS": 1,        # one row step a CTA
    "CAKE_FORWARD_MIN_BLOCKS": 3,      # 40 registers: 12 CTAs of 128 threads an SM
}
# The gated forward there up to D = 3584: its 128- and 192-thread rows spill at 40 registers.
GATED_ONE_ROW_NARROW_TUNING = {**ONE_ROW_FORWARD_TUNING,
                               "CAKE_FORWARD_MIN_BLOCKS": 2}  # 64 registers: +2.0..4.3 points
# RMSNorm's one-row forward at D = 2049 .. 3584, 4097 .. 6144 and 7169 .. 8192 (rows of 160-224
# and 288-512 threads): 98.2-98.9% of copy at D = 8192 against 91.0-93.8% for the ring.
ONE_ROW_32_REGISTER_FORWARD_TUNING = {**ONE_ROW_FORWARD_TUNING,
                                      "CAKE_FORWARD_MIN_BLOCKS": 4}  # 32 registers: more rows an SM
# RMSNorm's one-row forward at D = 6145 .. 7168 (DeepSeek-V3's 7168): 1.03-1.10x the rows of 16.
ONE_ROW_32_ELEMENT_FORWARD_TUNING = {
    **ONE_ROW_FORWARD_TUNING,
    "CAKE_FORWARD_MAX_ROW_THREADS": 256,  # 32 elements a thread in rows of at most 224 threads
    "CAKE_FORWARD_MIN_BLOCKS": 2}         # 48 registers used, six rows an SM: ahead of 40 (seven)
# The gated forward at D = 3585 .. 4096 (rows of exactly 256 threads).
GATED_ONE_ROW_PAIRED_TUNING = {**ONE_ROW_FORWARD_TUNING,
                               "CAKE_FORWARD_CTA_THREADS": 512}  # two rows a CTA: +0.4..0.6 points
# RMSNorm's 16-bit vector backward at D <= 2048: the registers path (the next row loaded into
# registers while the current one is reduced; no ring). 1.003-1.046x the ring at D = 1024-2048,
# 1.03-1.11x at D = 256-768 (0.985-0.998x at 1536).
NARROW_BACKWARD_TUNING = {
    "CAKE_BACKWARD_STAGES": 0,             # no ring: the registers path
    "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,   # quack's row shape: level with quack at D = 1024
    "CAKE_BACKWARD_MAX_ROW_THREADS": 256,  # a row of D = 2048 takes 256 threads
    "CAKE_BACKWARD_CTA_THREADS": 256,      # four an SM: 512 trailed by 3-9% at D = 256 and 1536
    "CAKE_BACKWARD_BANDS": 528,            # one wave of four CTAs an SM on 132 SMs
}
# Knobs of the 16-bit vector programs by D band, (cols_max, knobs) in D order: the forward's
# one-row shape up to D = 8192, the ring above (the gated family's with the table's knobs);
# RMSNorm's backward its own up to D = 2048.
VECTOR_BANDS = {False: ((2048, {**ONE_ROW_FORWARD_TUNING, **NARROW_BACKWARD_TUNING}),
                        (3584, ONE_ROW_32_REGISTER_FORWARD_TUNING), (4096, ONE_ROW_FORWARD_TUNING),
                        (6144, ONE_ROW_32_REGISTER_FORWARD_TUNING), (7168, ONE_ROW_32_ELEMENT_FORWARD_TUNING),
                        (8192, ONE_ROW_32_REGISTER_FORWARD_TUNING), (16384, WIDE_FORWARD_TUNING)),
                 True: ((3584, GATED_ONE_ROW_NARROW_TUNING), (4096, GATED_ONE_ROW_PAIRED_TUNING),
                        (8192, ONE_ROW_FORWARD_TUNING), (16384, {}))}
# The backward of the scalar route and of fp32 spills at 64 registers a thread.
WIDE_BACKWARD_TUNING = {"CAKE_BACKWARD_MIN_BLOCKS": 1}  # up to 128 registers: no spills


def bands(dtype: str, load: str, gated: bool) -> list:
    """``(route, knobs)`` of each program of one family's dtype and load (``vector`` or
    ``scalar``), in D order; their routes tile ``ROUTE``. Each program's backward workspace and
    partition follow its own knobs (``VECTOR_BANDS``). A program's knobs include its route
    (``CAKE_COLS_MIN``, ``CAKE_COLS_MAX``): it compiles only the instances that serve
    a D in it."""
    base = {**TUNING, **(GATED_TUNING if gated else {}),
            **(WIDE_BACKWARD_TUNING if load == "scalar" or dtype == "float32" else {})}
    if load != "vector" or dtype == "float32":
        by_band = ((ROUTE["cols_max"], {}),)
    else:
        by_band = VECTOR_BANDS[gated]
    out, cols_min = [], ROUTE["cols_min"]
    for cols_max, knobs in by_band:
        route = {"cols_min": cols_min, "cols_max": cols_max}
        out.append((route, {**base, **knobs, "CAKE_COLS_MIN": cols_min, "CAKE_COLS_MAX": cols_max}))
        cols_min = cols_max + 1
    return out


def band(dtype: str, load: str, gated: bool, cols: int) -> tuple:
    """``(route, knobs)`` of the program serving D = ``cols`` (see ``bands``)."""
    return next((route, knobs) for route, knobs in bands(dtype, load, gated)
                if route["cols_min"] <= cols <= route["cols_max"])


def tuning(dtype: str, load: str, gated: bool, cols: int) -> dict:
    """The tuning knobs of the program serving D = ``cols``."""
    return band(dtype, load, gated, cols)[1]


def specs(gated: bool) -> tuple:
    """The programs of either RMSNorm family (the gated one passes ``gated=True``)."""
    return tuple(
        Spec(variant={"dtype": dtype, "load": load}, route=route,
             params={"CAKE_DTYPE": code, "CAKE_VECTOR": vector, "CAKE_GATED": int(gated), **knobs})
        for (dtype, code), (load, vector) in itertools.product(DTYPES.items(), LOADS.items())
        for route, knobs in bands(dtype, load, gated))


# The C entries (csrc/include/cake/rmsnorm/entries.h), shared by both RMSNorm families: pointers
# are device addresses (0 for none) but workspace_bytes' out, a host int64.
_SIZES = (("rows", "i64"), ("cols", "i64"), ("weight_fp32", "i32"))
ENTRIES = {
    "forward": (("x", "pointer"), ("residual", "pointer"), ("gate", "pointer"),
                ("weight", "pointer"), ("y", "pointer"), ("residual_out", "pointer"),
                ("rstd", "pointer"), *_SIZES, ("eps", "f32"), ("weight_offset", "f32")),
    "backward": (("s", "pointer"), ("gate", "pointer"), ("weight", "pointer"), ("dy", "pointer"),
                 ("rstd", "pointer"), ("dsum", "pointer"), ("dx", "pointer"),
                 ("dresidual", "pointer"), ("dgate", "pointer"), ("workspace", "pointer"),
                 ("workspace_bytes", "i64"), ("dweight", "pointer"), *_SIZES,
                 ("dweight_dtype", "i32"), ("weight_offset", "f32")),
    "workspace_bytes": (("rows", "i64"), ("cols", "i64"), ("out", "pointer")),
}

FAMILY = Family(name="cake_rmsnorm_det_train", templates=TEMPLATES, entries=ENTRIES,
                specs=specs(gated=False))
