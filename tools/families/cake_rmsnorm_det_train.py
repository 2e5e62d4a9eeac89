"""Family table of ``cake.cake_rmsnorm_det_train``: RMSNorm (optionally prenorm) with a
deterministic backward.

Programs per (dtype, load). ``dtype`` is the dtype of x/y/dy/dx; ``load`` is ``vector``
(16-byte loads: D a multiple of 16 / sizeof(dtype) and 16-byte aligned tensors) or ``scalar``
(element loads: any D). Inside every program the weight dtype (x's or fp32), the weight-gradient
dtype, the residual (prenorm) form and the D band of the kernel instances (8 (optional), 16 or
32 elements a thread) are chosen per call. ``cols_min``/``cols_max`` bound D for the router
(``select`` in ``cake/core/rmsnorm.py``, shared by both RMSNorm families): one program for D = 1
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

# Pipeline and launch shape of every program (meanings in the kernel template and
# csrc/include/cake/rmsnorm_common.cuh): 16 elements a thread up to 512 threads a row, weights in
# shared memory (the 16-bit vector programs differ by D band: VECTOR_BANDS).
# Forward: 512-thread CTAs, rows through a 2-slot shared-memory ring, no register bound, CTAs of
# about 16 rows (many waves: the block scheduler evens out the SMs). Backward: 512-thread CTAs,
# a 2-slot ring and 64 registers a thread, so that 2 CTAs share an SM, and 528 bands: two whole
# waves of 264 CTAs on 132 SMs (the gated backward, one CTA an SM: 264 bands, GATED_TUNING).
# Against 256-thread CTAs in 1024 bands (1.9 waves at 4 an SM; at D = 8192, where a row
# takes 512 threads, 3.9 at 2), in two H200 tunes of 2026-12-01
# (tools/bench/results/2026-12-01-h200-rmsnorm-backward-bands-*.json): +2.6..5.8 points at
# D = 2048-8192 and +0.4..3.6 at 1024 for RMSNorm, +2.9..6.7 and +1.4..3.4 for the gated one.
# One wave of RMSNorm's (264 bands) was 0.4-1.9 points behind two at most shapes and 1.4 ahead
# at 65536 x 8192; four of the gated one's (528) trailed two by 0.6-1.9 at T = 65536 and were
# within 0.6 at 262144.
# From the H200 sweeps of 2026-11-29 (tools/bench/results/, % of copy bandwidth at the 8
# shapes): the 26-variant sweep (2026-11-29-h200-rmsnorm-tune.json) for the backward knobs; the
# forward's CTA rows (-forward-rows-sweep.json: 84-91% RMSNorm, 88-99% gated, against 81-85% and
# 81-93% for one persistent wave) and its ring depth (-forward-ring-sweep.json: the 2-slot ring
# with 16-row CTAs 83-93% against 84-91% for the next row in registers with 8-row CTAs); the
# night's CTA-size sweeps (-forward-cta-sweep.json, -forward-cta-confirm.json): 512-thread
# forward CTAs gain 2-4 points for the gated forward and 0-2 for RMSNorm's at D = 2048-4096; with
# the fixed-width row loops of 2026-12-01 (-rmsnorm-fixed-width-sweep.json) they gain RMSNorm's
# forward 2-4 points at every shape but 65536 x 8192 and 262144 x 8192 (level), D = 1024
# included (it lost 4-6 there before).
# The plain backward stages its weights a pack at a time while its ring's first copies are in flight
# (CAKE_BACKWARD_OVERLAP_STAGING): -0.1..+2.1 points of copy at T = 65536 (mean +0.8) in four A/B
# pairs of two H200 calls of 2026-12-02, level at 262144 (-1.5..+1.5; tools/bench/results/
# 2026-12-02-h200-rmsnorm-backward-staging-ab.txt); the gated backward lost 1.9-2.6 at D = 8192
# with pack staging and keeps the serial one.
# Both backwards deal the row steps to their CTAs in turn (CAKE_BACKWARD_INTERLEAVE) instead of
# giving each CTA a band of consecutive rows, so that all CTAs stream through one window of the
# tensors: in two H200 calls of 2026-12-02 (tools/bench/results/2026-12-02-h200-rmsnorm-backward-
# interleave-tune-{1,2}.json) +1.2..3.5 points of copy for RMSNorm's backward and +0.8..3.6 for
# the gated one at every shape; only dweight's bits change (the row outputs' digests are main's).
# Both directions fix the rows of 192, 320, 384 and 448 threads (D = 3072, 5120, 6144, 7168 at 16
# elements a thread, common model widths) as they do the powers of two, rather than read the
# width at run time: in two H200 tunes of 2026-12-03 the backward 1.08-1.14x at those D (87-94%
# of copy, from 77-85%), the gated backward 1.06-1.34x (tools/bench/results/2026-12-03-h200-
# rmsnorm-backward-common-widths-tune{1,2}.json); the forwards' since that day's A/B (below).
# Value 2 fixes the rows of every multiple of 32 threads (96, 160, 224, 288, 352, 416, 480: D =
# 1536, 2560, 3584, 4608, ... at 16 elements a thread) too: in one H200 tune of 2026-12-03
# against value 1 (tools/bench/results/2026-12-03-h200-rmsnorm-common-widths-32-tune.json) at
# D = 1536, 2560, 3584, 4608, RMSNorm's forward 1.05-1.16x, its backward 1.08-1.13x, the gated
# forward 1.07-1.25x and the gated backward 1.04-1.43x; D = 2048 and 4096 level.
# Value 3 also fixes the rows of a warp or less (1 to 32 threads: D <= 512 at 16 elements a thread,
# the heads of 64, 128 and 256 that GDN's and KDA's gated output norm normalises), so that the
# vector route compiles no run-time-width instance at all. In one H200 tune of 2026-12-04 against
# value 2 at D = 64 .. 512 (tools/bench/results/2026-12-04-h200-rmsnorm-narrow-rows-tune.json) the
# gated forward 1.012-1.027x (96.3-102.4% of copy); RMSNorm's forward (0.992-1.002x) and both
# backwards (0.997-1.007x) level: D = 1024, whose instances are the same in both, moved by up to
# 0.8%. Outputs bitwise the same (the 192 digests at D = 16 .. 1000 match the reference).
# The widest instances (32 elements a thread: D > 8192, and RMSNorm's forward at 6145 .. 7168) fix
# those widths too since 2026-12-03: against their run-time rows (RMSNorm's backward read 37.5-41.6%
# of copy in them) in an H200 A/B at D = 10240, 12288 and 14336, RMSNorm's backward 1.63-1.84x, its
# forward 0.998-1.044x, the gated forward 1.03-1.08x and the gated backward 1.04-1.06x; D = 16384
# (512-thread rows, fixed before) level (tools/bench/results/2026-12-03-h200-rmsnorm-
# forward-32-elements-ab.json).
# The backward's bands are for its 512-thread CTAs, two an SM; where a row of 288 or 320 threads
# takes a CTA of its own (D = 4097 .. 5120), three fit an SM under the 64-register bound, and the
# bands grow to 792 (backward_bands in csrc/include/cake/rmsnorm_common.cuh): 1.05-1.06x at
# D = 4608 and 1.02-1.04x at 5120 in an H200 A/B of 2026-12-03 (tools/bench/results/2026-12-03-
# h200-rmsnorm-backward-bands-by-width-checks.txt). The gated backward (no register bound, one CTA
# an SM) and the fp32 and scalar programs (a 1-CTA bound) keep theirs.
TUNING = {"CAKE_FORWARD_STAGES": 2, "CAKE_BACKWARD_STAGES": 2, "CAKE_FORWARD_MIN_ELEMS_PER_THREAD": 16,
          "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 16,
          "CAKE_FORWARD_MAX_ROW_THREADS": 512, "CAKE_BACKWARD_MAX_ROW_THREADS": 512,
          "CAKE_FORWARD_COMMON_WIDTHS": 3, "CAKE_BACKWARD_COMMON_WIDTHS": 3,
          "CAKE_FORWARD_CTA_THREADS": 512,
          "CAKE_BACKWARD_CTA_THREADS": 512, "CAKE_L2_PREFETCH": 0,
          "CAKE_FORWARD_WEIGHTS": 0, "CAKE_BACKWARD_WEIGHTS": 0, "CAKE_FORWARD_CTA_ROWS": 16,
          "CAKE_BACKWARD_BANDS": 528, "CAKE_BACKWARD_OVERLAP_STAGING": 1,
          "CAKE_BACKWARD_INTERLEAVE": 1, "CAKE_BACKWARD_GUIDED": 0, "CAKE_FORWARD_MIN_BLOCKS": 0,
          "CAKE_BACKWARD_MIN_BLOCKS": 2}
# The gated backward, whose ring slot holds three tensors, keeps a 3-slot ring without the
# register bound (80-85% against 74-81%; its rows in registers measured 81-86% but spill 16
# bytes at the 128 registers a 512-thread row allows). Its 512-thread CTAs then take an SM
# each, so 264 bands make its two waves; each wave takes one half of the row steps in turn
# (CAKE_BACKWARD_GUIDED 1) rather than every other 132 of them: in two H200 tunes of 2026-12-02
# on two machines, two runs each (tools/bench/results/2026-12-02-h200-rmsnorm-backward-guided-
# tune-{1,2}{a,b}.json), 0.0-4.3 points of copy ahead at every shape and run (3.2-4.3 at 65536 x
# 4096). RMSNorm's backward (two CTAs an SM) gained nothing from it (-1.2..+0.5) or from more,
# shorter regions (up to 6.4 behind at T = 65536).
GATED_TUNING = {"CAKE_BACKWARD_STAGES": 3, "CAKE_BACKWARD_MIN_BLOCKS": 0,
                "CAKE_BACKWARD_BANDS": 264, "CAKE_BACKWARD_OVERLAP_STAGING": 0,
                "CAKE_BACKWARD_GUIDED": 1}
# RMSNorm's 16-bit vector forward above D = 8192 (its ring band): rows of at most 64 threads
# below 32 elements a thread, so 32 elements a thread from D = 1025 up (row groups of 64-512
# threads), where 512 threads a row kept 16 up to D = 8192; measured when the ring served every
# D. A row step's fixed instructions then cover twice the data: 0.6-2.2
# points of copy bandwidth at D = 2048-8192 in three H200 runs of 2026-12-01, level at 1024
# (tools/bench/results/2026-12-01-h200-rmsnorm-forward-width-*.json). Not the gated forward, whose
# ring slot of x and g then takes 64 KiB a 512-thread CTA (1 CTA an SM at D = 2048: 88.6% against
# 95.6%), nor fp32 or the scalar route (not measured).
WIDE_FORWARD_TUNING = {"CAKE_FORWARD_MAX_ROW_THREADS": 64}
# The 16-bit vector forwards in the FLA and Liger forwards' shape: rows of up to 128 threads in
# 128-thread CTAs (a row of more threads takes a CTA of its own), one row step a CTA, each row in
# registers (no ring, no next row), the weights read as 16-byte vectors through L1 (no staging a
# CTA), 40 registers (3 CTAs' launch bound: 12 CTAs an SM). With the ring's 32 elements a thread
# (WIDE_FORWARD_TUNING) in H200 tunes of 2026-12-02 before the loads lost their evict-first hint,
# it was +2.3..4.1 points of copy bandwidth at T = 65536 and D = 1024, 2048, level or behind at
# D = 4096, 8192 (tools/bench/results/2026-12-02-h200-rmsnorm-one-row-forward-candidate-tune.json);
# with the default cache policy (-cache-hints-tune.json, -plain-loads-bands-tune.json) it gains
# 3.4..5 points over the ring at D = 4096, but is level to 1.2 behind it at D = 8192. Its rows of
# 192 threads (D = 2561 .. 3072) fixed rather than run-time: 1.06x at D = 3072 at 40 registers
# (tools/bench/results/2026-12-03-h200-rmsnorm-common-widths-ab.txt), before the 32-register band
# below took them.
ONE_ROW_FORWARD_TUNING = {"CAKE_FORWARD_STAGES": 0, "CAKE_FORWARD_WEIGHTS": 2,
                          "CAKE_FORWARD_MAX_ROW_THREADS": 512, "CAKE_FORWARD_CTA_THREADS": 128,
                          "CAKE_FORWARD_CTA_ROWS": 1, "CAKE_FORWARD_MIN_BLOCKS": 3}
# The gated forward in that shape: its 128- and 192-thread rows (D = 2048, 3072) spill at 40
# registers, so up to D = 3584 it takes 64 (2 CTAs' bound: +2.0..4.3 points over the gated ring
# at D = 1024, 2048; the fixed 192-thread rows 1.13x the run-time ones at D = 3072, 101% of copy,
# tools/bench/results/2026-12-03-h200-rmsnorm-backward-common-widths-tune{1,2}.json); above, at
# 40 (rows of 256 to 512 threads), where a 512-thread row's CTAs fit 3 an SM instead of 2:
# +4.3..5.7 points over the ring at D = 8192 (the H200 tunes above had 20 bytes spilled there,
# since gone).
GATED_ONE_ROW_NARROW_TUNING = {**ONE_ROW_FORWARD_TUNING, "CAKE_FORWARD_MIN_BLOCKS": 2}
# RMSNorm's one-row forward at 32 registers (4 CTAs' bound: four 512-thread rows an SM), at D = 2049
# .. 3584, 4097 .. 6144 and 7169 .. 8192: its bands have rows of 160 to 224 and 288 to 512 threads
# only (the 128-thread rows spill at 32, the 256-thread ones measured 2% slower than at 40). At D =
# 8192 98.2 / 98.9% of copy at T = 65536 / 262144 against the ring's 91.0 / 93.8 and 92.5 / 93.4 at
# 40 registers (tools/bench/results/2026-12-02-h200-rmsnorm-one-row-8192-tune.json). The rows of
# 320, 384 and 448 threads (D = 4609 .. 5120, 5633 .. 6144, 6657 .. 7168) fixed rather than
# run-time: 1.26-1.27x at D = 5120 and 7168 (7168 since served by
# ONE_ROW_32_ELEMENT_FORWARD_TUNING), 1.03x at 6144 in an H200 A/B
# (2026-12-03-h200-rmsnorm-common-widths-ab.txt); the rows of 288 threads (D = 4097 .. 4608) too,
# with the other odd multiples of 32 (TUNING's CAKE_FORWARD_COMMON_WIDTHS 2): 1.16x at D = 4608. At
# D = 3584 nine rows of 224 threads fit an SM instead of seven at 40 registers: 1.057-1.068x
# (96.8-99.3% of copy), 1.009-1.013x at 2560 and 1.008-1.012x at 3072, in two H200 tunes of
# 2026-12-03 (tools/bench/results/2026-12-03-h200-rmsnorm-forward-32-registers-tune{1,2}.json).
ONE_ROW_32_REGISTER_FORWARD_TUNING = {**ONE_ROW_FORWARD_TUNING, "CAKE_FORWARD_MIN_BLOCKS": 4}
# Where its rows take 385 to 448 threads (D = 6145 .. 7168: DeepSeek-V3's 7168), 4 fit an SM
# (the threads' limit); at 32 elements a thread in fixed 224-thread rows (48 registers) 6 do:
# 1.085-1.096x at D = 6152 (its 224-thread rows with 31 lanes idle), 1.046-1.061x at 6400 and
# 6656 (97.6-99.1% of copy) and 1.031-1.033x at 7168 (97.7-98.9%) in three H200 tunes of
# 2026-12-03 (tools/bench/results/2026-12-03-h200-rmsnorm-forward-32-elements-tune{1,2}.json and
# -checks.txt), 0.2-1.0% ahead of the same rows at 40 registers (7 an
# SM); at D = 5120, 6144 and 8192 the rows of 32 elements trailed the table's by 0.7-1.6%.
ONE_ROW_32_ELEMENT_FORWARD_TUNING = {**ONE_ROW_FORWARD_TUNING, "CAKE_FORWARD_MAX_ROW_THREADS": 256,
                                     "CAKE_FORWARD_MIN_BLOCKS": 2}
# Where its rows are exactly 256 threads (D = 3585 .. 4096, the fixed-width instance), two a
# 512-thread CTA (at 40 registers still six rows an SM): 0.4-0.6 points of copy over one a CTA
# at D = 3840 and 4096 in H200 tunes (tools/bench/results/2026-12-03-h200-rmsnorm-gated-paired-
# rows-tune*.json); at 64 registers (four rows an SM) 9 points behind; RMSNorm's own lost 4.3-4.7
# (...-forward-4096-weights-first-tune1.json). Not below: at D = 3072 the run-time-width
# instance that served it then fitted four such rows an SM instead of five, 16% slower (pairs of
# the fixed 192-thread rows are not measured).
GATED_ONE_ROW_PAIRED_TUNING = {**ONE_ROW_FORWARD_TUNING, "CAKE_FORWARD_CTA_THREADS": 512}
# RMSNorm's 16-bit vector backward at D <= 2048 on the registers path (the next row loaded into
# registers while the current one is reduced; no ring, no CTA barrier between row steps) in
# 256-thread CTAs of 8 elements a thread (a 128-thread row of D = 1024 is two row groups a CTA),
# four an SM at 64 registers: 528 bands, one wave. In an H200 probe of 2026-12-03 (minimal
# kernels beside quack 0.6.5's in one process, tools/bench/results/2026-12-04-h200-rmsnorm-
# backward-registers-probe.txt) the registers path in quack's row shape ran level with quack's
# kernel at D = 1024 and 3% ahead at 2048, where the same rows through quack's cp.async ring
# trailed by 10%. Against the ring (TUNING's backward) in one H200 tune (...-backward-registers-
# tune2.json, T = 65536 / 262144): 1.032x / 1.046x at D = 1024, 1.003x / 1.023x at 2048, 1.06-1.11x
# at 65536 x 256 .. 768 and 1.028x at 262144 x 512, but 0.985x / 0.998x at 1536 (192-thread rows,
# one a CTA). In the same tune 512-thread CTAs (264 bands) led it by 0.4-2.7% at 65536 x 512 ..
# 1024, 262144 x 1024 and 65536 x 2048, but trailed by 3-9% at D = 256 and 1536 and by 0.8% at
# 262144 x 2048; 128-thread CTAs (1056 bands, spilling at D = 2048) and 1056 bands of
# 256 threads trailed at nearly every width.
NARROW_BACKWARD_TUNING = {"CAKE_BACKWARD_STAGES": 0, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                          "CAKE_BACKWARD_MAX_ROW_THREADS": 256, "CAKE_BACKWARD_CTA_THREADS": 256,
                          "CAKE_BACKWARD_BANDS": 528}
# Knobs of the 16-bit vector programs by D band, (cols_max, knobs) in D order: the forward's
# one-row shape up to D = 8192, the ring above (the gated family's with the table's knobs);
# RMSNorm's backward its own up to D = 2048.
VECTOR_BANDS = {False: ((2048, {**ONE_ROW_FORWARD_TUNING, **NARROW_BACKWARD_TUNING}),
                        (3584, ONE_ROW_32_REGISTER_FORWARD_TUNING), (4096, ONE_ROW_FORWARD_TUNING),
                        (6144, ONE_ROW_32_REGISTER_FORWARD_TUNING), (7168, ONE_ROW_32_ELEMENT_FORWARD_TUNING),
                        (8192, ONE_ROW_32_REGISTER_FORWARD_TUNING), (16384, WIDE_FORWARD_TUNING)),
                 True: ((3584, GATED_ONE_ROW_NARROW_TUNING), (4096, GATED_ONE_ROW_PAIRED_TUNING),
                        (8192, ONE_ROW_FORWARD_TUNING), (16384, {}))}
# The backward of the scalar route, and of fp32 (four packs of four elements a tensor at 16
# elements a thread, where bf16 has two of eight), needs more than 64 registers a thread (it
# spills at 64).
WIDE_BACKWARD_TUNING = {"CAKE_BACKWARD_MIN_BLOCKS": 1}


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
