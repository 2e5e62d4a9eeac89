# Kernel `scale` of a row-scale program (a family used only by tests): one CTA a row.
import triton
import triton.language as tl

# cake:params
DTYPE = "fp32"
BLOCK = tl.constexpr(1024)
NUM_WARPS = 4
NUM_STAGES = 1
# cake:end-params

rowscale = cake_include("cake/triton/rowscale.py")

SIGNATURE = {"x": "*" + DTYPE, "y": "*" + DTYPE, "scale": "*fp32", "cols": "i32"}
HINTS = {"x": 16, "y": 16, "cols": 16}


@triton.jit
def kernel_cake_library_scale(x, y, scale, cols):
    rowscale.scale_rows(x, y, scale, cols, BLOCK)
