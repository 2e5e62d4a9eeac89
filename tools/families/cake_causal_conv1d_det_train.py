"""Family table of ``cake.cake_causal_conv1d_det_train``: causal depthwise conv1d (width 4) + SiLU.

One program per (variant, tile shape). The variant is what the program computes: the dtype of
x/y/dy/dx, whether a bias is added, and the activation. Weight dtype (the activation dtype or
fp32) and gradient dtype (fp32 or the weight's) are template instantiations inside every
program, chosen per call. The tile shape is picked per call by the route: a channel band
(``channels_min`` .. ``channels_max``, inclusive) and a token-count floor (``tokens_min``);
``cake/cake_causal_conv1d_det_train/_routes.py`` takes, among the programs of the variant whose
band holds C, the one with the highest floor not above S. Every arch gets the same routes
(tuned on the H200, sm_90a). 8 variants x 3 tiles = 24 programs.
"""

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from render import Family, Spec  # noqa: E402

_CHANNELS_MAX = 1 << 31

# name: (route, params). Tokens per backward tile = TOKEN_THREADS * TOKENS_PER_THREAD * ITERATIONS;
# the backward workspace holds one fp32 partial per (tile, tap or bias, channel).
TILES = {
    # C < 256: 64 channels x 256 tokens per block, so narrow C still fills the GPU.
    "narrow": ({"channels_min": 1, "channels_max": 255, "tokens_min": 0},
               {"CAKE_VEC": 8, "CAKE_CHANNEL_THREADS": 8, "CAKE_TOKEN_THREADS": 32,
                "CAKE_TOKENS_PER_THREAD": 8, "CAKE_ITERATIONS": 1}),
    # C >= 256, short packs: 256 channels x 64 tokens per block; one backward pass per block.
    "wide": ({"channels_min": 256, "channels_max": _CHANNELS_MAX, "tokens_min": 0},
             {"CAKE_VEC": 8, "CAKE_CHANNEL_THREADS": 32, "CAKE_TOKEN_THREADS": 8,
              "CAKE_TOKENS_PER_THREAD": 8, "CAKE_ITERATIONS": 1}),
    # C >= 256, long packs: the backward walks 8 x 64 tokens per block (fewer partials).
    "wide_long": ({"channels_min": 256, "channels_max": _CHANNELS_MAX, "tokens_min": 65536},
                  {"CAKE_VEC": 8, "CAKE_CHANNEL_THREADS": 32, "CAKE_TOKEN_THREADS": 8,
                   "CAKE_TOKENS_PER_THREAD": 8, "CAKE_ITERATIONS": 8}),
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


FAMILY = Family(
    name="cake_causal_conv1d_det_train",
    templates={"kernel": "csrc/templates/causal_conv1d/kernel.cu",
               "binding": "csrc/templates/causal_conv1d/binding.cu"},
    specs=tuple(_specs()),
)
