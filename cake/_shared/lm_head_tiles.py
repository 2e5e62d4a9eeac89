"""Tile sizes and C entries of the LM head programs.

One source of truth for two readers: the family tables (``tools/families/cake_lm_head_*.py``)
render these values as the programs' knobs and declare these entries, and the host
(``cake/_shared/lm_head.py``) computes the launch grids and split counts from the same values and
passes each entry's arguments by these names. Standard library only (the tables are
rendered without torch); vendoring copies it with the family (``_shared/``).

Why these values (the ahead-of-time compile report is in docs/families/lm_head.md): they are
the largest tensor-core tiles tried that compile without spills for sm_90a, sm_100a and sm_103a.
The det backward does one fp32 read-modify-write of its accumulator per step of two
``DH_BV``-row vocabulary tiles (dhidden) or one ``DW_BT``-token block (dweight): bigger steps cut
that traffic, registers limit them (16-bit dweight: two 256-token sub-tiles spill on sm_90a, where
wgmma keeps each dz^T sub-tile in registers). fp32 tiles are smaller because IEEE fp32 dots run
on FMA units and spill at 64 x 64 with 4 warps. Not tuned on a GPU yet: one set per dtype class,
the same for all three arches.
"""

DTYPES = ("bfloat16", "float16", "float32")

_P, _I32, _I64, _F32 = "pointer", "i32", "i64", "f32"
_HEAVY = (("h", _P), ("w", _P), ("labels", _P), ("rmax", _P), ("logl", _P), ("ca", _P),
          ("cb", _P), ("cg", _P))
_SCALES = (("inv_softcap", _F32), ("tanh_scale", _F32), ("linear_scale", _F32), ("inv_temp", _F32))
ARGUMENTS = {
    "stats": (("h", _P), ("w", _P), ("labels", _P), ("part_m", _P), ("part_l", _P),
              ("part_a", _P), ("part_y", _P), ("T", _I32), ("V", _I32), ("D", _I32),
              ("num_splits", _I32), ("tiles_per_split", _I32), *_SCALES, ("entropy", _I32)),
    "finalize": (("part_m", _P), ("part_l", _P), ("part_a", _P), ("part_y", _P),
                 ("labels", _P), ("rmax", _P), ("logl", _P), ("out", _P), ("ent", _P),
                 ("T", _I32), ("V", _I32), ("num_splits", _I32), ("ignore_index", _I64),
                 ("logprob", _I32), ("entropy", _I32)),
    "reduce": (("loss", _P), ("labels", _P), ("out", _P), ("count", _P), ("T", _I32),
               ("ignore_index", _I64), ("mean", _I32)),
    "coef": (("labels", _P), ("ent", _P), ("grad_out", _P), ("grad_ent", _P), ("count", _P),
             ("ca", _P), ("cb", _P), ("cg", _P), ("T", _I32), ("V", _I32),
             ("ignore_index", _I64), ("logprob", _I32), ("reduction", _I32),
             ("has_grad_out", _I32), ("has_grad_ent", _I32)),
    "dh": (*_HEAVY, ("acc", _P), ("out", _P), ("T", _I32), ("V", _I32), ("D", _I32),
           ("num_splits", _I32), ("tiles_per_split", _I32), *_SCALES, ("final_cast", _I32)),
    "dw": (*_HEAVY, ("acc", _P), ("out", _P), ("T", _I32), ("V", _I32), ("D", _I32), *_SCALES,
           ("accumulate", _I32)),
    "fused": (*_HEAVY, ("dh_acc", _P), ("dw_acc", _P), ("T", _I32), ("V", _I32), ("D", _I32),
              *_SCALES),
    "cast": (("src", _P), ("dst", _P), ("N", _I64), ("num_parts", _I32)),
}
"""Each kernel's arguments after the grid, in its SIGNATURE's order
(csrc/templates/lm_head/<kernel>.py): the programs' C entries declare the grid and these."""
KERNELS = {True: ("stats", "finalize", "reduce", "coef", "dh", "dw", "cast"),
           False: ("stats", "finalize", "reduce", "coef", "fused", "cast")}
"""The kernels of a det (True) and a nondet (False) program, in the order of their sources."""

_SIXTEEN_BIT = {
    # forward statistics: 128 x 128 logits tiles, 64-column K steps (96 KB shared on sm_90a)
    "STATS_BT": 128, "STATS_BV": 128, "STATS_BK": 64, "STATS_WARPS": 8, "STATS_STAGES": 3,
    # det dhidden: 64 token rows, two 128-row vocabulary tiles a step, 16-column D slices
    "DH_BT": 64, "DH_BV": 128, "DH_BK": 64, "DH_BD": 16, "DH_WARPS": 8, "DH_STAGES": 3,
    # det dweight: 64 vocabulary rows, one 256-token block a step
    "DW_BV": 64, "DW_BT": 256, "DW_BK": 32, "DW_BD": 16, "DW_WARPS": 8, "DW_STAGES": 3,
    # nondet backward: 128 x 128 tiles, 8 token blocks grouped for L2 reuse of the weight tiles
    "FUSED_BT": 128, "FUSED_BV": 128, "FUSED_BK": 32, "FUSED_BD": 16, "FUSED_GROUP": 8,
    "FUSED_WARPS": 8, "FUSED_STAGES": 3,
}
_FP32 = {
    "STATS_BT": 64, "STATS_BV": 64, "STATS_BK": 32, "STATS_WARPS": 4, "STATS_STAGES": 2,
    "DH_BT": 32, "DH_BV": 32, "DH_BK": 16, "DH_BD": 16, "DH_WARPS": 4, "DH_STAGES": 2,
    # 64-token blocks: 32 spill on sm_90a and sm_100a
    "DW_BV": 64, "DW_BT": 64, "DW_BK": 16, "DW_BD": 16, "DW_WARPS": 4, "DW_STAGES": 2,
    "FUSED_BT": 64, "FUSED_BV": 64, "FUSED_BK": 16, "FUSED_BD": 16, "FUSED_GROUP": 8,
    "FUSED_WARPS": 8, "FUSED_STAGES": 2,
}
# Row-wise kernels (finalize, coefficients, the loss reduction, the cast): memory-bound,
# 4 warps, the same for every dtype.
_ROWS = {"ROWS_BLOCK": 512, "ROWS_WARPS": 4, "REDUCE_BLOCK": 1024, "REDUCE_WARPS": 4,
         "CAST_BLOCK": 2048, "CAST_WARPS": 4}
_DET_ONLY = ("DH_", "DW_")
_NONDET_ONLY = ("FUSED_",)


def tiles(dtype: str, deterministic: bool) -> dict:
    """The knobs of the (``dtype``, mode) program, by knob name: the det programs have the
    dhidden and dweight kernels, the nondet programs the fused one."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    skipped = _NONDET_ONLY if deterministic else _DET_ONLY
    heavy = _FP32 if dtype == "float32" else _SIXTEEN_BIT
    return {**{k: v for k, v in heavy.items() if not k.startswith(skipped)}, **_ROWS}
