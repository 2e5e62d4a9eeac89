"""Tile sizes and launch shapes of the Gated DeltaNet programs, by head dimensions (K, V).

One source of truth for two readers: the family tables (``tools/families/cake_gdn_*.py``) render
these values as the programs' knobs, and the host (``cake/_shared/gdn.py``) computes the launch
grids and intermediate shapes from the same values. Standard library only (the tables are
rendered without torch); vendoring copies it with the family (``_shared/``).

Why these values (the ahead-of-time compile report is in docs/families/gdn.md): every kernel
with a ``tl.dot`` runs 8 warps (the 4-warp, 64-token wgmma layouts are where FLA's issue #640
lives); V blocks of the sequential state kernels shrink for K = 256 so that the 64-row state
blocks stay in registers without spills; 2 pipeline stages where the shared memory allows, 1
where K = 256 would push the state-gradient kernel near the 227 KB limit.
"""

CHUNK = 64
"""Tokens per chunk (the kernels are written for 64)."""

HEAD_DIMS = (64, 128, 256)
"""Head dimensions K and V the kernels are written for."""


def tiles(k: int, v: int) -> dict:
    """The knobs of the programs for head dimensions (k, v), by knob name."""
    if k not in HEAD_DIMS or v not in HEAD_DIMS:
        raise ValueError(f"head dimensions K = {k}, V = {v}: each must be one of {HEAD_DIMS}")
    return {
        # rows of q/k per CTA in the l2-norm pass: one K-wide row per warp lane group
        "RSTD_BR": 32 if k <= 128 else 16, "RSTD_WARPS": 4, "RSTD_STAGES": 1,
        # chunk preparation: K and V in 64-wide blocks against the 64x64 inverse
        "PREP_BK": 64, "PREP_BV": 64, "PREP_WARPS": 8, "PREP_STAGES": 1,
        # forward state recurrence: the state as 64-row register blocks of V/BV columns
        "FWD_H_BV": 64 if k <= 128 else 32, "FWD_H_WARPS": 8, "FWD_H_STAGES": 2,
        # output: a whole 128-wide V block per CTA (QK^T computed once per V block)
        "FWD_O_BK": 64, "FWD_O_BV": min(v, 128), "FWD_O_WARPS": 8, "FWD_O_STAGES": 2,
        "DV_LOCAL_BK": 64, "DV_LOCAL_BV": min(v, 128), "DV_LOCAL_WARPS": 8,
        "DV_LOCAL_STAGES": 2,
        # backward state recurrence: 32-column blocks (two state blocks live at once)
        "DH_BV": 32, "DH_WARPS": 8, "DH_STAGES": 2 if k <= 128 else 1,
        # dq/dk/dw per 64-wide K block; DQKWG_BK also fixes the dg partials (K / BK of them)
        "DQKWG_BK": 64, "DQKWG_BV": 32, "DQKWG_WARPS": 8, "DQKWG_STAGES": 2,
        "WY_DA_BK": 64, "WY_DA_BV": 64, "WY_DA_WARPS": 8, "WY_DA_STAGES": 1,
        "WY_DK_BK": 64, "WY_DK_WARPS": 8, "WY_DK_STAGES": 1,
        # value-head reduction of dq/dk and the l2-norm backward: K-wide rows
        "FINALIZE_BT": 32 if k <= 128 else 16, "FINALIZE_WARPS": 4, "FINALIZE_STAGES": 1,
    }
