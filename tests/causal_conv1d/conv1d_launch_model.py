"""The causal conv1d kernels' launch shapes, modelled in Python from a program's knobs (the
``#define CAKE_*`` params of its kernel source), for the tests that check the C entries against
it (csrc/include/cake/causal_conv1d/config.h: the constants; entries.h: the launches)."""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = "cake_causal_conv1d_det_train"
WIDTH = 4
ACT_BYTES = 2  # bf16 or fp16 activations
REDUCE_COLUMNS, REDUCE_GROUPS = 32, 32  # kReduceColumns, kReduceGroups
DEFAULT_SHARED = 48 * 1024  # above it a launch raises the kernel's shared-memory limit first

_PARAM_RE = re.compile(r"^#define (CAKE_\w+) (-?\d+)$", re.MULTILINE)


def knobs(program) -> dict:
    """The knobs of a program's kernel source (csrc/<package>/<library>_kernel.cu)."""
    source = (REPO / "csrc" / NAME / f"{program.library}_kernel.cu").read_text()
    return {name: int(value) for name, value in _PARAM_RE.findall(source)}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as the driver sees it."""

    kernel: str
    grid: tuple
    block: tuple
    smem: int


def tile(k: dict) -> int:
    """Channels a block covers (kTile)."""
    return k["CAKE_CHANNEL_THREADS"] * k["CAKE_VEC"]


def forward_span(k: dict) -> int:
    """Tokens a forward block streams (Fwd::kSpan)."""
    return k["CAKE_FORWARD_ROWS"] * k["CAKE_FORWARD_CHUNKS"]


def forward_shared(k: dict) -> int:
    """kForwardShared: the ring of FORWARD_ROWS * FORWARD_STAGES rows of a tile."""
    return k["CAKE_FORWARD_ROWS"] * k["CAKE_FORWARD_STAGES"] * tile(k) * ACT_BYTES


def backward_tile_tokens(k: dict) -> int:
    """kBackwardTileTokens."""
    return k["CAKE_TOKEN_THREADS"] * k["CAKE_TOKENS_PER_THREAD"] * k["CAKE_ITERATIONS"]


def taps(k: dict) -> int:
    """Partial rows of the weight gradient: 4 taps, and the bias."""
    return WIDTH + (1 if k["CAKE_HAS_BIAS"] else 0)


def workspace_bytes(k: dict, tokens: int, channels: int) -> int:
    return _ceil(tokens, backward_tile_tokens(k)) * taps(k) * channels * 4


def _kernel(library: str, suffix: str) -> str:
    return f"kernel_{library}_{suffix}"


def forward(k: dict, library: str, *, tokens: int, channels: int, weight_fp32: bool,
            x: int, y: int) -> Launch | None:
    """The forward's launch (None for S = 0): 16-byte copies when C % 8 == 0 and x, y are
    16-byte aligned (x, y: addresses)."""
    if tokens == 0:
        return None
    vector = channels % (16 // ACT_BYTES) == 0 and x % 16 == 0 and y % 16 == 0
    suffix = f"forward_{'f' if weight_fp32 else 'a'}{'v' if vector else 's'}"
    grid = _ceil(channels, tile(k)) * _ceil(tokens, forward_span(k))
    return Launch(_kernel(library, suffix), (grid, 1, 1),
                  (k["CAKE_CHANNEL_THREADS"] * k["CAKE_ROW_GROUPS"], 1, 1), forward_shared(k))


def backward(k: dict, library: str, *, tokens: int, channels: int, weight_fp32: bool,
             grad_fp32: bool, x: int, dy: int, dx: int) -> list:
    """The backward's launches: the backward kernel (not for S = 0; VEC-channel accesses when
    C % VEC == 0 and x, dy, dx are aligned to them), then the weight-gradient reduction (fp32
    output for fp32 gradients or weights)."""
    launches = []
    access = k["CAKE_VEC"] * ACT_BYTES
    if tokens:
        vector = channels % k["CAKE_VEC"] == 0 and all(a % access == 0 for a in (x, dy, dx))
        suffix = f"backward_{'f' if weight_fp32 else 'a'}{'v' if vector else 's'}"
        grid = _ceil(channels, tile(k)) * _ceil(tokens, backward_tile_tokens(k))
        launches.append(Launch(_kernel(library, suffix), (grid, 1, 1),
                               (k["CAKE_CHANNEL_THREADS"] * k["CAKE_TOKEN_THREADS"], 1, 1), 0))
    fp32_out = grad_fp32 or weight_fp32
    launches.append(Launch(_kernel(library, f"reduce_{'f' if fp32_out else 'a'}"),
                           (_ceil(taps(k) * channels, REDUCE_COLUMNS), 1, 1),
                           (REDUCE_COLUMNS * REDUCE_GROUPS, 1, 1), 0))
    return launches


# The kernels' parameters (config.h, Params): what the fake driver records of a launch.
PARAMS = struct.Struct("<4Q7q6Q")
PARAM_FIELDS = ("x", "weight", "bias", "cu_seqlens", "num_docs", "doc_len", "tokens", "channels",
                "vectors", "channel_tiles", "token_tiles", "y", "dy", "dx", "partials", "dweight",
                "dbias")


def params(data: bytes) -> dict:
    return dict(zip(PARAM_FIELDS, PARAMS.unpack_from(data)))
