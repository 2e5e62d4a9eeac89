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

# name: (route, params). VEC = 4: a thread owns 4 channels. Forward: a block streams a span of
# FORWARD_ROWS * FORWARD_CHUNKS tokens of one tile of CHANNEL_THREADS * 4 channels through a ring
# of FORWARD_STAGES stages in shared memory (ROW_GROUPS threads across rows). Backward: each of a
# block's TOKEN_THREADS threads of a channel walks TOKENS_PER_THREAD * ITERATIONS consecutive
# tokens (one fp32 workspace partial per block tile, tap or bias, and channel); <= 128 registers.
# *_MIN_BLOCKS: resident blocks per SM the registers must allow (no spills on either access
# path; tests/causal_conv1d/test_causal_conv1d_cpu.py). From H200 sweeps (tools/bench/
# causal_conv1d.py --tune, tools/bench/results/), 2026-11-29: VEC = 4 ahead of 8 at every shape,
# the forward streaming geometries, and the backward spans (4 x 128 tokens a block: 80-90% of
# copy bandwidth at C = 512-8192 against 77-84% for 8 x 64).
TILES = {
    # Any C, short packs (and every pack with C < 256): 64 channels; forward spans of 256
    # tokens (128-thread blocks) so that a 32k-token pack still fills the GPU.
    "short": ({"channels_min": 1, "channels_max": _CHANNELS_MAX, "tokens_min": 0},
              {"CAKE_VEC": 4, "CAKE_CHANNEL_THREADS": 16, "CAKE_ROW_GROUPS": 8,
               "CAKE_FORWARD_ROWS": 32, "CAKE_FORWARD_STAGES": 4, "CAKE_FORWARD_CHUNKS": 8,
               "CAKE_FORWARD_MIN_BLOCKS": 5,
               "CAKE_TOKEN_THREADS": 16, "CAKE_TOKENS_PER_THREAD": 8, "CAKE_ITERATIONS": 1,
               "CAKE_BACKWARD_MIN_BLOCKS": 2, "CAKE_BACKWARD_SCALAR_MIN_BLOCKS": 2}),
    # C >= 256, long packs: 128 channels; forward spans of 512 tokens (128-thread blocks);
    # the backward walks 4 x 128 tokens per block (128-thread blocks, 512-token tiles).
    "long": ({"channels_min": 256, "channels_max": _CHANNELS_MAX, "tokens_min": 65536},
             {"CAKE_VEC": 4, "CAKE_CHANNEL_THREADS": 32, "CAKE_ROW_GROUPS": 4,
              "CAKE_FORWARD_ROWS": 32, "CAKE_FORWARD_STAGES": 4, "CAKE_FORWARD_CHUNKS": 16,
              "CAKE_FORWARD_MIN_BLOCKS": 4, "CAKE_TOKEN_THREADS": 4, "CAKE_TOKENS_PER_THREAD": 8,
              "CAKE_ITERATIONS": 16, "CAKE_BACKWARD_MIN_BLOCKS": 4, "CAKE_BACKWARD_SCALAR_MIN_BLOCKS": 1}),
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
