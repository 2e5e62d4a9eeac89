"""``python -m cake selftest`` on a GPU: a zigzag step of a one-process group (gloo; made here
when the process has none). With one rank, zigzag holds the pack in its global order as two
pieces, so the second piece's first tokens run through the windows: y and dx must be bitwise
the single-rank op's, and every output within bf16 rounding of the float64 reference.
:func:`bitwise_cases` runs that step for ci/gpu_vendored_check.py (a vendored copy against this
one, through the base family vendored beside it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core import selftest
from ._compute import CudaCompute, ReferenceCompute
from ._function import cake_causal_conv1d_det_kcp
from ._plan import CakeCausalConv1dDetKcpPlan

TOLERANCE = 1e-2  # norm-wise, as the single-rank family's self-test: bf16 outputs
TOKENS, CHANNELS = 3000, 264
CU = [0, 1, 1497, 1502, TOKENS]  # a document crosses the middle, another starts right after


def _inputs(device: torch.device) -> tuple:
    gen = selftest.generator(20261205)
    x, dy = (torch.randn(TOKENS, CHANNELS, generator=gen).to(device, torch.bfloat16)
             for _ in range(2))
    weight, bias = (torch.randn(CHANNELS, 4, generator=gen).to(device, torch.bfloat16),
                    torch.randn(CHANNELS, generator=gen).to(device, torch.bfloat16))
    return x, weight, bias, dy


def _single_rank(x, weight, bias, cu, dy) -> dict:
    y, dx = torch.empty_like(x), torch.empty_like(x)
    CudaCompute.forward(x, weight, bias, cu, "silu", y)
    CudaCompute.backward(dy, x, weight, bias, cu, "silu", dx)
    return {"y": y, "dx": dx}


def _reference(x, weight, bias, cu, dy) -> dict:
    """The float64 reference, on the CPU, moved to the device."""
    cpu = [t.cpu() for t in (x, weight, bias, cu, dy)]
    y, dx = torch.empty(x.shape, dtype=torch.float64), torch.empty(x.shape, dtype=torch.float64)
    ReferenceCompute.forward(*cpu[:4], "silu", y)
    dweight, dbias = ReferenceCompute.backward(cpu[4], *cpu[:4], "silu", dx)
    return {k: v.to(x.device) for k, v in
            {"y": y, "dx": dx, "dweight": dweight, "dbias": dbias}.items()}


def _step(device: torch.device):
    """(a function running one autograd step of a one-rank zigzag plan, and its inputs)."""
    x, weight, bias, dy = _inputs(device)
    cu = torch.tensor(CU, dtype=torch.int32, device=device)
    plan = CakeCausalConv1dDetKcpPlan.build(cu, TOKENS, CHANNELS, torch.bfloat16,
                                            layout="zigzag", device=device)

    def compute():
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        y = cake_causal_conv1d_det_kcp(*leaves, plan, cu_seqlens=cu)
        y.backward(dy)
        return {"y": y, "dx": leaves[0].grad, "dweight": leaves[1].grad,
                "dbias": leaves[2].grad}

    return compute, (x, weight, bias, cu, dy)


def _cases(device: torch.device) -> list:
    compute, (x, weight, bias, cu, dy) = _step(device)
    name = f"zigzag, one rank, bf16 S={TOKENS} C={CHANNELS}, 4 documents"
    cases = [selftest.selftest_case(name, compute, _reference(x, weight, bias, cu, dy),
                                    tolerance=TOLERANCE)]
    got, single = compute(), _single_rank(x, weight, bias, cu, dy)
    unequal = [k for k in ("y", "dx") if not torch.equal(got[k], single[k])]
    cases.append((f"{name}: y and dx bitwise the single-rank op's",
                  f"{' and '.join(unequal)} differ" if unequal else None))
    return cases


def _in_a_group(device: torch.device, work):
    """``work(device)`` with a process group: the process's own, else a one-process gloo one
    made for the call."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with torch.cuda.device(device):
            return work(device)
    finally:
        if made:
            dist.destroy_process_group()


def run(device_index: int) -> list:
    return _in_a_group(torch.device("cuda", device_index), _cases)


def bitwise_cases(device: torch.device) -> dict:
    """The self-test's step (y, dx and the one rank's dweight/dbias partials) on seeded
    inputs: the tensors by name, for ci/gpu_vendored_check.py to compare two builds bitwise."""
    return _in_a_group(device, lambda d: {f"zigzag-one-rank/{k}": v
                                          for k, v in _step(d)[0]().items()})
