"""Family table of ``cake.cake_causal_conv1d_det_train``: causal depthwise conv1d (width 4) + SiLU.

One program per (variant, tile shape). The variant is what the program computes: the dtype of
x/y/dy/dx, whether a bias is added, and the activation. Weight dtype (the activation dtype or
fp32) and gradient dtype (fp32 or the weight's) are template instantiations inside every
program, chosen per call. The tile shape is picked per call by the route: a channel band
(``channels_min`` .. ``channels_max``, inclusive) and a token-count floor (``tokens_min``);
``cake/cake_causal_conv1d_det_train/_routes.py`` takes, among the programs of the variant whose
band holds C, the one with the highest floor not above S. Every arch gets the same routes
(tuned on the H200, sm_90a). 8 variants x 2 tiles = 16 programs.
"""

import itertools

from tools.render import Family, Spec

_CHANNELS_MAX = 1 << 31

# name: (route, params). Knob meanings: csrc/include/cake/causal_conv1d/config.h. Values from
# H200 sweeps of 2026-11-29 (tools/bench/causal_conv1d.py --tune; docs/families/causal_conv1d.md);
# "no spills" is checked by tests/causal_conv1d/test_causal_conv1d_cpu.py.
TILES = {
    # Any C, and every pack with C < 256 or S < 65536: a 32k-token pack must still fill the GPU.
    "short": ({"channels_min": 1, "channels_max": _CHANNELS_MAX, "tokens_min": 0},
              {"CAKE_VEC": 4,                # 4 channels a thread: ahead of 8 at every shape
               "CAKE_CHANNEL_THREADS": 16,   # 64-channel tiles: enough blocks for short packs
               "CAKE_ROW_GROUPS": 8,         # 128-thread forward blocks
               "CAKE_FORWARD_ROWS": 32,      # x 8 chunks: 256-token forward spans
               "CAKE_FORWARD_STAGES": 4,     # ring slots: the forward sweep's best geometry
               "CAKE_FORWARD_CHUNKS": 8,     # (spans above)
               "CAKE_FORWARD_MIN_BLOCKS": 5,  # blocks an SM the registers allow, no spills
               "CAKE_TOKEN_THREADS": 16,     # 256-thread backward blocks
               "CAKE_TOKENS_PER_THREAD": 8,  # x 1 iteration: 128-token backward tiles
               "CAKE_ITERATIONS": 1,         # (tiles above): many blocks for short packs
               "CAKE_BACKWARD_MIN_BLOCKS": 2,  # blocks an SM, no spills on the vector path
               "CAKE_BACKWARD_SCALAR_MIN_BLOCKS": 2}),  # ... and on the element path
    # C >= 256 and S >= 65536: long spans, fewer fixed costs a token.
    "long": ({"channels_min": 256, "channels_max": _CHANNELS_MAX, "tokens_min": 65536},
             {"CAKE_VEC": 4,                 # as "short"
              "CAKE_CHANNEL_THREADS": 32,    # 128-channel tiles
              "CAKE_ROW_GROUPS": 4,          # 128-thread forward blocks
              "CAKE_FORWARD_ROWS": 32,       # x 16 chunks: 512-token forward spans
              "CAKE_FORWARD_STAGES": 4,      # as "short"
              "CAKE_FORWARD_CHUNKS": 16,     # (spans above)
              "CAKE_FORWARD_MIN_BLOCKS": 4,  # blocks an SM the registers allow, no spills
              "CAKE_TOKEN_THREADS": 4,       # 128-thread backward blocks
              "CAKE_TOKENS_PER_THREAD": 8,   # x 16 iterations: 512-token backward tiles; 80-90%
              "CAKE_ITERATIONS": 16,         # of copy at C = 512-8192 against 77-84% for 8 x 64
              "CAKE_BACKWARD_MIN_BLOCKS": 4,  # blocks an SM, no spills on the vector path
              "CAKE_BACKWARD_SCALAR_MIN_BLOCKS": 1}),  # ... and on the element path
}

DTYPES = {"bfloat16": 1, "float16": 0}
ACTIVATIONS = {"silu": 1, "none": 0}


def _specs():
    for (dtype, bf16), bias, (activation, silu), (tile, (route, params)) in itertools.product(
            DTYPES.items(), (True, False), ACTIVATIONS.items(), TILES.items()):
        yield Spec(
            variant={"dtype": dtype, "bias": bias, "activation": activation},
            route=dict(route, tile=tile),
            params=dict(params, CAKE_DTYPE_BF16=bf16, CAKE_HAS_BIAS=bias, CAKE_SILU=silu),
        )


# The C entries (csrc/include/cake/causal_conv1d/entries.h): pointers are device addresses (0 for
# none) but workspace_bytes' out, a host int64; without cu_seqlens the tokens are documents of
# doc_len tokens.
_INPUTS = (("x", "pointer"), ("weight", "pointer"), ("bias", "pointer"), ("cu_seqlens", "pointer"))
_SIZES = (("tokens", "i64"), ("channels", "i64"), ("num_docs", "i64"), ("doc_len", "i64"))
ENTRIES = {
    "forward": (*_INPUTS, ("y", "pointer"), *_SIZES, ("weight_fp32", "i32")),
    "backward": (*_INPUTS, ("dy", "pointer"), ("dx", "pointer"), ("dweight", "pointer"),
                 ("dbias", "pointer"), ("workspace", "pointer"), ("workspace_bytes", "i64"),
                 *_SIZES, ("weight_fp32", "i32"), ("grad_fp32", "i32")),
    "workspace_bytes": (("tokens", "i64"), ("channels", "i64"), ("out", "pointer")),
}

FAMILY = Family(
    name="cake_causal_conv1d_det_train",
    templates={"kernel": "csrc/templates/causal_conv1d/kernel.cu",
               "binding": "csrc/templates/causal_conv1d/binding.cu"},
    entries=ENTRIES,
    specs=tuple(_specs()),
)
