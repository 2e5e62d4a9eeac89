# Kernel `dot` of a row-scale program (a family used only by tests): out[r] = sum(x[r] * dy[r]).
import triton
import triton.language as tl

# cake:params
DTYPE = "fp32"
BLOCK = tl.constexpr(1024)
NUM_WARPS = 4
NUM_STAGES = 1
# cake:end-params

rowscale = cake_include("cake/triton/rowscale.py")

SIGNATURE = {"x": "*" + DTYPE, "dy": "*" + DTYPE, "out": "*fp32", "cols": "i32"}
HINTS = {"x": 16, "dy": 16, "cols": 16}


@triton.jit
def kernel_cake_library_dot(x, dy, out, cols):
    rowscale.dot_rows(x, dy, out, cols, BLOCK)
