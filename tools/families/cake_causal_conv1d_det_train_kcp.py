"""Family table of ``cake.cake_causal_conv1d_det_train_kcp``: the row moves of context-parallel
causal conv1d.

The convolution itself runs on the single-rank family's programs
(``cake.cake_causal_conv1d_det_train``); this package's one program (``kcp: True``) gathers the
rows those programs read (a token's context from the local rows and the rows the other ranks
sent, zero rows, negated rows) and scatters the rows they wrote back in place
(docs/families/causal_conv1d_kcp.md). It moves 2-byte elements as their bits, so one program
serves bf16 and fp16.
"""

from tools.render import Family, Spec

# The C entries (csrc/include/cake/causal_conv1d/kcp_entries.h): pointers are device addresses (0
# for none); a table holds one int64 per row (gather: a row code, scatter: a destination row).
ENTRIES = {
    "gather": (("table", "pointer"), ("rows", "i64"), ("local", "pointer"), ("local_rows", "i64"),
               ("exchanged", "pointer"), ("exchanged_rows", "i64"), ("channels", "i64"),
               ("out", "pointer")),
    "scatter": (("table", "pointer"), ("rows", "i64"), ("src", "pointer"), ("out", "pointer"),
                ("out_rows", "i64"), ("channels", "i64")),
}

FAMILY = Family(
    name="cake_causal_conv1d_det_train_kcp",
    templates={"kernel": "csrc/templates/causal_conv1d_kcp/kernel.cu",
               "binding": "csrc/templates/causal_conv1d_kcp/binding.cu"},
    entries=ENTRIES,
    specs=(Spec(
        variant={"element_bytes": 2},
        route={},
        # 256 threads a block: the moves are a few rows of a step (latency-bound), any
        # whole-warp size serves; 256 keeps the grid of a 4096-channel row to 2 blocks.
        params={"CAKE_KCP_THREADS": 256},
        kcp=True),),
)
