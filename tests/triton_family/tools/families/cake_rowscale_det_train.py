"""Family table of ``cake.cake_rowscale_det_train``, a Triton family used only by tests:
``y[r, :] = x[r, :] * scale[r]``. One program per dtype (fp32, fp16, bf16) with two kernels, one
CTA a row (the grid: rows, 1, 1): ``scale`` (the forward, and dx = dy * scale in the backward)
and ``dot`` (the backward's dscale[r] = sum(dy[r, :] * x[r, :]), in fp32)."""

from tools.render import Family, Spec

ENTRIES = {
    "scale": (("grid_x", "i32"), ("grid_y", "i32"), ("grid_z", "i32"), ("x", "pointer"),
              ("y", "pointer"), ("scale", "pointer"), ("cols", "i32")),
    "dot": (("grid_x", "i32"), ("grid_y", "i32"), ("grid_z", "i32"), ("x", "pointer"),
            ("dy", "pointer"), ("out", "pointer"), ("cols", "i32")),
}

FAMILY = Family(
    name="cake_rowscale_det_train",
    kind="triton",
    templates={"kernel_scale": "csrc/templates/rowscale/scale.py",
               "kernel_dot": "csrc/templates/rowscale/dot.py",
               "binding": "csrc/templates/rowscale/binding.cu"},
    entries=ENTRIES,
    specs=tuple(Spec(variant={"dtype": name}, route={}, params={"DTYPE": triton_type,
                     "BLOCK": 1024, "NUM_WARPS": 4, "NUM_STAGES": 1})
                for name, triton_type in (("float32", "fp32"), ("float16", "fp16"),
                                          ("bfloat16", "bf16"))),
)
