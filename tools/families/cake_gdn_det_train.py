"""Family table of ``cake.cake_gdn_det_train``: chunked Gated DeltaNet (Triton), forward and a
deterministic backward.

One program per (dtype, K, V): bf16 and fp16 for K = V in {64, 128, 256}, built for sm_90a,
sm_100a and sm_103a; fp32 for the same (K, V), built for no arch (``arches=()``: Triton's
interpreter runs them in the CPU tests; on a GPU fp32 is refused before any launch, see
docs/families/gdn.md). Each program holds the ten kernels of csrc/templates/gdn (roles
``kernel_<name>``), one C entry a kernel (``grid_x``, ``grid_y``, ``grid_z``, then the kernel's
``SIGNATURE``), so one library serves a whole training step. Per-call choices (qk_l2norm,
initial state, final state, final-state gradient) are runtime flags inside the kernels, and beta
reaches them in fp32 (the host converts a beta in q's dtype), so they add no specialization.

Knobs: ``DTYPE`` (the pointer type of q, k, v, o, dout (the gradient of o), dv, dq, dk), ``K``,
``V``, ``DOT_PREC`` (``tf32`` for 16-bit inputs: it only touches the three fp32 products that
finish the 64x64 inverse; ``ieee`` for fp32, so that fp32 runs check the math at fp32 precision),
``DETERMINISTIC`` (dq/dk written per value head and summed in order, no atomics) and the tile
sizes, warps and stages of each kernel from ``cake/_shared/gdn_tiles.py`` (one source for these
programs and the host's launch grids; its docstring gives the reasons).
"""

from cake._shared.gdn_tiles import HEAD_DIMS, tiles
from tools.render import Family, Spec

DETERMINISTIC = True
GPU_ARCHES = ("sm_90a", "sm_100a", "sm_103a")
# name, Triton pointer type, DOT_PREC, arches built
DTYPES = (("bfloat16", "bf16", "tf32", GPU_ARCHES), ("float16", "fp16", "tf32", GPU_ARCHES),
          ("float32", "fp32", "ieee", ()))
# (K, V) pairs: K = V only. V = m K runs on them as m value heads of K columns (the host's
# split); programs for K != V would take the wheel over its size budget
# (docs/families/gdn.md#head-dimensions).
HEAD_PAIRS = tuple((d, d) for d in HEAD_DIMS)
TEMPLATES = {f"kernel_{name}": f"csrc/templates/gdn/{name}.py"
             for name in ("rstd", "prep", "fwd_h", "fwd_o", "dv_local", "dh", "dqkwg", "wy_da",
                          "wy_dk", "finalize")}
TEMPLATES["binding"] = "csrc/templates/gdn/binding.cu"

GRID = (("grid_x", "i32"), ("grid_y", "i32"), ("grid_z", "i32"))
# Each entry: the grid, then its kernel's SIGNATURE in order (csrc/templates/gdn/<name>.py).
ENTRIES = {
    "rstd": (*GRID, ("q", "pointer"), ("k", "pointer"), ("rq", "pointer"), ("rk", "pointer"),
                    ("R", "i32")),
    "prep": (*GRID, ("k", "pointer"), ("v", "pointer"), ("g", "pointer"), ("beta", "pointer"),
                    ("rk", "pointer"), ("cu", "pointer"), ("chunk_doc", "pointer"),
                    ("chunk_idx", "pointer"), ("gc", "pointer"), ("tm", "pointer"),
                    ("w", "pointer"), ("u", "pointer"), ("H", "i32"), ("HV", "i32"),
                    ("l2norm", "i32")),
    "fwd_h": (*GRID, ("k", "pointer"), ("w", "pointer"), ("u", "pointer"), ("gc", "pointer"),
                     ("rk", "pointer"), ("h0", "pointer"), ("cu", "pointer"),
                     ("chunk_off", "pointer"), ("hs", "pointer"), ("vn", "pointer"),
                     ("ht", "pointer"), ("H", "i32"), ("HV", "i32"), ("l2norm", "i32"),
                     ("use_h0", "i32"), ("store_ht", "i32")),
    "fwd_o": (*GRID, ("q", "pointer"), ("k", "pointer"), ("vn", "pointer"), ("gc", "pointer"),
                     ("hs", "pointer"), ("rq", "pointer"), ("rk", "pointer"), ("cu", "pointer"),
                     ("chunk_doc", "pointer"), ("chunk_idx", "pointer"), ("o", "pointer"),
                     ("scale", "f32"), ("H", "i32"), ("HV", "i32"), ("l2norm", "i32")),
    "dv_local": (*GRID, ("q", "pointer"), ("k", "pointer"), ("gc", "pointer"), ("dout", "pointer"),
                        ("rq", "pointer"), ("rk", "pointer"), ("cu", "pointer"),
                        ("chunk_doc", "pointer"), ("chunk_idx", "pointer"), ("dvn", "pointer"),
                        ("scale", "f32"), ("H", "i32"), ("HV", "i32"), ("l2norm", "i32")),
    "dh": (*GRID, ("q", "pointer"), ("k", "pointer"), ("w", "pointer"), ("gc", "pointer"),
                  ("dout", "pointer"), ("dvn", "pointer"), ("rq", "pointer"), ("rk", "pointer"),
                  ("dht", "pointer"), ("cu", "pointer"), ("chunk_off", "pointer"),
                  ("dhs", "pointer"), ("dh0", "pointer"), ("scale", "f32"), ("H", "i32"),
                  ("HV", "i32"), ("l2norm", "i32"), ("use_dht", "i32"), ("store_dh0", "i32")),
    "dqkwg": (*GRID, ("q", "pointer"), ("k", "pointer"), ("vn", "pointer"), ("gc", "pointer"),
                     ("dout", "pointer"), ("dvn", "pointer"), ("hs", "pointer"), ("dhs", "pointer"),
                     ("rq", "pointer"), ("rk", "pointer"), ("cu", "pointer"),
                     ("chunk_doc", "pointer"), ("chunk_idx", "pointer"), ("dq", "pointer"),
                     ("dk", "pointer"), ("dw", "pointer"), ("dgp", "pointer"), ("scale", "f32"),
                     ("T", "i32"), ("H", "i32"), ("HV", "i32"), ("l2norm", "i32")),
    "wy_da": (*GRID, ("k", "pointer"), ("v", "pointer"), ("beta", "pointer"), ("gc", "pointer"),
                     ("tm", "pointer"), ("dw", "pointer"), ("dvn", "pointer"), ("rk", "pointer"),
                     ("cu", "pointer"), ("chunk_doc", "pointer"), ("chunk_idx", "pointer"),
                     ("de", "pointer"), ("dv", "pointer"), ("dbp", "pointer"), ("H", "i32"),
                     ("HV", "i32"), ("l2norm", "i32")),
    "wy_dk": (*GRID, ("k", "pointer"), ("beta", "pointer"), ("gc", "pointer"), ("tm", "pointer"),
                     ("dw", "pointer"), ("de", "pointer"), ("dbp", "pointer"), ("rk", "pointer"),
                     ("dgp", "pointer"), ("cu", "pointer"), ("chunk_doc", "pointer"),
                     ("chunk_idx", "pointer"), ("dk", "pointer"), ("dbeta", "pointer"),
                     ("dg", "pointer"), ("T", "i32"), ("H", "i32"), ("HV", "i32"),
                     ("l2norm", "i32")),
    "finalize": (*GRID, ("q", "pointer"), ("k", "pointer"), ("dqp", "pointer"), ("dkp", "pointer"),
                        ("rq", "pointer"), ("rk", "pointer"), ("dq", "pointer"), ("dk", "pointer"),
                        ("T", "i32"), ("H", "i32"), ("NG", "i32"), ("l2norm", "i32")),
}


def specs(deterministic: bool) -> tuple:
    """The programs of one mode (shared with ``cake_gdn_nondet_train``)."""
    return tuple(
        Spec(variant={"dtype": name, "head_k": k, "head_v": v}, route={}, arches=arches,
             params={"DTYPE": pointer, "K": k, "V": v, "DOT_PREC": dot_prec,
                     "DETERMINISTIC": deterministic, **tiles(k, v)})
        for name, pointer, dot_prec, arches in DTYPES for k, v in HEAD_PAIRS)


FAMILY = Family(name="cake_gdn_det_train", kind="triton", templates=TEMPLATES, entries=ENTRIES,
                specs=specs(DETERMINISTIC))
