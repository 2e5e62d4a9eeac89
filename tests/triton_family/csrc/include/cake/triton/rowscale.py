# Shared Triton code of the row-scale test family: y[r, :] = x[r, :] * scale[r], and the
# row dot products of its backward (dscale[r] = sum(dy[r, :] * x[r, :])).
import triton
import triton.language as tl


@triton.jit
def scale_rows(x, y, scale, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    factor = tl.load(scale + row)
    for start in range(0, cols, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < cols
        values = tl.load(x + row * cols + offsets, mask=mask)
        tl.store(y + row * cols + offsets, (values * factor).to(values.dtype), mask=mask)


@triton.jit
def dot_rows(x, dy, out, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < cols
        a = tl.load(x + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(dy + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
        total += a * b
    tl.store(out + row, tl.sum(total, axis=0))
