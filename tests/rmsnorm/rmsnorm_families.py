"""Both RMSNorm families behind one interface, so every test runs on each (``FAMILIES``).

``Family.forward`` / ``Family.backward`` call the public helpers with the gate inserted for the
gated family; ``Family.reference`` gives the float64 forward and backward of the same call.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path

import launch_model
import torch

import cake.cake_gated_rmsnorm_det_train as gated_pkg
import cake.cake_rmsnorm_det_train as plain_pkg
from cake.cake_gated_rmsnorm_det_train import reference as gated_ref
from cake.cake_rmsnorm_det_train import reference as plain_ref


# The widths and dtypes that the GPU tests and output_digest.py cover: every D band edge of the
# instances (8, 16 or 32 elements a thread; up to 256 or 512 threads a row), unaligned ends (7,
# 127, 8199) and the widest rows; the fixed-width instances (row groups of 64, 128, 256, 512
# threads, and 192, 320, 384, 448 in both directions) full (1024 .. 8192, 16384) and with their last
# lanes idle (1000, 1600, 2600, 3840, 4616, 6664, 7744: 63, 100, 163, 240, 289, 417 and 484
# threads of work at 16 elements a thread); 64 and 128 are fixed rows of 4 and 8 threads too
# (SUBWARP_DIMS below).
EARLIER_DIMS = [1, 7, 64, 127, 128, 1000, 1024, 1600, 2048, 2056, 2600, 3072, 3584, 3592, 3840, 4096,
                4104, 4616, 5120, 6144, 6664, 7168, 7744, 8192, 8199, 8200, 16384]
# The rows of the other multiples of 32 threads (96, 160, 224, 288, 352, 416, 480 at 16 elements
# a thread; fixed-width instances since CAKE_*_COMMON_WIDTHS 2), full (1536, 2560, 4608, 5632,
# 6656, 7680; 3584 above) and with their last lanes idle (1096, 3080, 5128, 6152, 7176: 69, 193,
# 321, 385 and 449 threads of work; 2056 and 4104 above). output_digest.py digests them after
# every earlier case, so that those keep their seeds.
LATER_DIMS = [1096, 1536, 2560, 3080, 4608, 5128, 5632, 6152, 6656, 7176, 7680]
# The fixed-width rows at 32 elements a thread (the widest instances fix the common widths too
# since the eleventh session of 2026-12-03), full: 384 threads (12288), then 320, 352, 416, 448
# and 480 (10240 .. 15360); 288 with its last lanes idle is 8200 above, 512 is 16384. The digest
# takes their cases after all the others, in that order.
WIDEST_DIMS = [12288]
LATER_WIDEST_DIMS = [10240, 11264, 13312, 14336, 15360]
# The row groups of RMSNorm's 16-bit registers-path backward (8 elements a thread, 256-thread
# CTAs, D <= 2048) that the widths above leave out: 2 threads (16), 32 (256), 64 (392 with lanes
# idle, 512: four groups at named barriers) and 96 (768: two groups, a 192-thread CTA). The digest
# takes them last.
NARROW_DIMS = [16, 256, 392, 512, 768]
# The fixed rows of a warp or less (CAKE_*_COMMON_WIDTHS 3: 1 to 32 threads, D <= 512 at 16
# elements a thread) that the widths above leave out: 1 thread (8) and 2 (24, 32) at 16 elements,
# 1 (8) and 4 (24, 32) in RMSNorm's 16-bit backward at 8. The digest takes them last.
SUBWARP_DIMS = [8, 24, 32]
_ALL_DIMS = EARLIER_DIMS + LATER_DIMS + WIDEST_DIMS + LATER_WIDEST_DIMS + NARROW_DIMS + SUBWARP_DIMS
assert len(set(_ALL_DIMS)) == len(_ALL_DIMS), "a width in two lists would repeat its cases"
DIMS = sorted(_ALL_DIMS)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]

REPO = Path(__file__).resolve().parents[2]


def case_rows(cols: int) -> int:
    """The rows of the GPU tests' and the digest's short cases at D = cols (fewer above 8192)."""
    return 67 if cols <= 8192 else 19


@functools.lru_cache(maxsize=None)
def family_module(name: str):
    """The module ``tools/families/<name>.py`` (loaded by path: the tests do not put the
    repository's ``tools`` on the import path)."""
    path = REPO / "tools" / "families" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_table_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def family_table(name: str):
    """``FAMILY`` of ``tools/families/<name>.py``."""
    return family_module(name).FAMILY


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    gated: bool
    package: object

    def backward_knobs(self, cols: int, dtype=torch.bfloat16) -> dict:
        """The knobs of the program serving D = ``cols`` with aligned rows of ``dtype``."""
        load = "vector" if cols % (16 // dtype.itemsize) == 0 else "scalar"
        return family_module("cake_rmsnorm_det_train").tuning(str(dtype)[6:], load, self.gated, cols)

    def rows_per_band(self, rows: int, cols: int, dtype=torch.bfloat16) -> int:
        """The kernels' band of ``rows`` at D = ``cols`` (launch_model.rows_per_band: the grid
        has ceil(rows / band) CTAs, which take the row steps in turn; with CAKE_BACKWARD_GUIDED
        1, half as many take each half of them, so a CTA still takes a band's rows)."""
        return launch_model.rows_per_band(self.backward_knobs(cols, dtype), rows, cols)

    def forward(self, x, g, w, residual=None, **kw):
        if self.gated:
            return gated_pkg.cake_gated_rmsnorm_det_train_forward(x, g, w, residual, **kw)
        return plain_pkg.cake_rmsnorm_det_train_forward(x, w, residual, **kw)

    def backward(self, dy, s, g, w, rstd, **kw):
        """Returns (dx, dg or None, dresidual, dweight) for both families."""
        if self.gated:
            return gated_pkg.cake_gated_rmsnorm_det_train_backward(dy, s, g, w, rstd, **kw)
        kw.pop("dg", None)
        dx, dres, dw = plain_pkg.cake_rmsnorm_det_train_backward(dy, s, w, rstd, **kw)
        return dx, None, dres, dw

    def workspace_bytes(self, x, g, w) -> int:
        if self.gated:
            return gated_pkg.cake_gated_rmsnorm_det_train_backward_workspace_bytes(x, g, w)
        return plain_pkg.cake_rmsnorm_det_train_backward_workspace_bytes(x, w)

    def functional(self, x, g, w, residual=None, **kw):
        if self.gated:
            return gated_pkg.cake_gated_rmsnorm_det(x, g, w, residual, **kw)
        return plain_pkg.cake_rmsnorm_det(x, w, residual, **kw)

    def apply(self, x, g, w, residual=None, eps=1e-6, weight_offset=0.0):
        """The public ``autograd.Function``'s apply (it launches inside its forward)."""
        if self.gated:
            return gated_pkg.CakeGatedRMSNormDetFunction.apply(x, g, w, residual, eps, weight_offset)
        return plain_pkg.CakeRMSNormDetFunction.apply(x, w, residual, eps, weight_offset)

    def module(self, hidden, **kw):
        return gated_pkg.CakeGatedRMSNormDet(hidden, **kw) if self.gated else \
            plain_pkg.CakeRMSNormDet(hidden, **kw)

    def reference_forward(self, x, g, w, residual=None, **kw):
        if self.gated:
            return gated_ref.reference_forward(x, g, w, residual, **kw)
        return plain_ref.reference_forward(x, w, residual, **kw)

    def reference_backward(self, dy, s, g, w, **kw):
        """(dx, dg or None, dweight) in float64."""
        if self.gated:
            return gated_ref.reference_backward(dy, s, g, w, **kw)
        dx, dw = plain_ref.reference_backward(dy, s, w, **kw)
        return dx, None, dw


FAMILIES = [Family("rmsnorm", False, plain_pkg), Family("gated", True, gated_pkg)]
