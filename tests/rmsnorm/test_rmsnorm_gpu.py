"""GPU tests of both RMSNorm families against the float64 references (``pytest -m gpu``).

Tolerances, per element, from how the kernels compute (fp32 arithmetic on the stored inputs):

* outputs rounded to bf16 (fp16) are off by at most half an ulp, 2^-9 (2^-11) relative; we allow
  one ulp, ``RTOL`` = 2^-8 (2^-10); fp32 outputs get 0;
* the fp32 part is bounded against a magnitude envelope (the same formula on absolute values):
  the sum of squares and the backward's dot product run a per-thread chain of at most 32 terms
  and a tree of at most 10 levels (< 50 u, u = 2^-24 ~ 6e-8), rsqrtf and __expf add a few ulp,
  so 2e-5 * envelope for y, rstd, dx and dg;
* dweight is one fp32 chain per column: the rows a row group takes in its CTA (the CTAs take
  steps of `groups` rows in turn: at most rows_per_band / groups + 2, ``Family.rows_per_band``),
  the CTA's row groups (<= 512) and the CTA partials (128 segments of <= 16, then a 7-level
  tree), so at most rows_per_band + 537 terms; we allow (rows_per_band + 400) * 2 u of the
  envelope sum |dn * xhat|, at least 5e-5. That is a fraction of the envelope (0.4% at 2^31
  elements), so where the terms cancel (random dy) it can exceed dweight itself, and a zero
  result would pass; the case past 2^31 elements takes dy of x's sign, so that dweight equals
  its envelope and the bound fails a zero in every column (``assert_dweight_bound``);
* 1e-7 absolute for fp16 subnormals.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rmsnorm_families import DIMS, DTYPES, FAMILIES, case_rows  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
RTOL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10, torch.float32: 0.0}
U = 2.0 ** -24


# --------------------------------------------------------------------------- inputs


def make_case(shape, *, dtype=torch.bfloat16, weight_fp32=False, residual=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cols = shape[-1]
    x = torch.randn(shape, generator=gen).to(dtype).cuda()
    g = (torch.randn(shape, generator=gen) * 2).to(dtype).cuda()
    w = (torch.rand(cols, generator=gen) + 0.5).to(torch.float32 if weight_fp32 else dtype).cuda()
    r = torch.randn(shape, generator=gen).to(dtype).cuda() if residual else None
    dy = torch.randn(shape, generator=gen).to(dtype).cuda()
    return x, g, w, r, dy


def poisoned(like: torch.Tensor, dtype=None, shape=None) -> torch.Tensor:
    return torch.full(like.shape if shape is None else shape, float("nan"),
                      dtype=dtype or like.dtype, device=like.device)


def assert_close(name, got, want, env, *, rtol, env_factor):
    got64 = got.double()
    allowed = rtol * want.abs() + env_factor * env + 1e-7
    bad = ~((got64 - want).abs() <= allowed)  # NaN counts as bad
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements out of tolerance; first at "
            f"{index}: got {float(got64[index])}, want {float(want[index])}, allowed "
            f"{float(allowed[index])}")


def envelopes(family, s, g, w, dy, rstd, weight_offset):
    """float64 magnitude envelopes of y, dx, dg, dweight (see the module docstring)."""
    s64, dy64 = s.double(), dy.double()
    xhat = (s64 * rstd.double().unsqueeze(-1)).abs()
    wabs = (w.double() + weight_offset).abs()
    gate = torch.ones_like(s64)
    dgate = torch.zeros_like(s64)
    if family.gated:
        g64 = g.double()
        sig = torch.sigmoid(g64)
        gate = (g64 * sig).abs()
        # Term by term: 1 + g * (1 - sig) cancels near g = -1.28, where |dg| is far below the
        # rounding error of its terms.
        dgate = sig * (1 + g64.abs() * (1 + sig))
    env_y = xhat * wabs * gate
    dn = dy64.abs() * gate
    mean = (dn * wabs * xhat).mean(dim=-1, keepdim=True)
    env_dx = rstd.double().unsqueeze(-1) * (dn * wabs + xhat * mean)
    env_dg = dy64.abs() * xhat * wabs * dgate
    env_dw = (dn * xhat).reshape(-1, s.shape[-1]).sum(0)
    return env_y, env_dx, env_dg, env_dw


def same_sign_dy(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random dy of x's sign (x's dtype, on x's device): every term dy * xhat of dweight is >= 0,
    so dweight equals its envelope sum |dy * xhat|, and the fp32 bound, a small fraction of the
    envelope, is a small fraction of dweight: a zero dweight, or one that misses rows, fails."""
    dy = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return dy.abs_().mul_(x.sign())


def dweight_reference(x: torch.Tensor, dy: torch.Tensor, eps: float = 1e-6,
                      chunk: int = 1 << 20) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 dweight of RMSNorm (no gate, no weight offset) and its envelope sum |dy * xhat|,
    ``chunk`` rows at a time (x in float64 at once may not fit)."""
    cols = x.shape[-1]
    want = torch.zeros(cols, dtype=torch.float64, device=x.device)
    env = torch.zeros_like(want)
    for start in range(0, x.shape[0], chunk):
        s64 = x[start:start + chunk].double()
        xhat = s64 * torch.rsqrt(s64.square().mean(-1, keepdim=True) + eps)
        terms = dy[start:start + chunk].double() * xhat
        want += terms.sum(0)
        env += terms.abs().sum(0)
    return want, env


def assert_dweight_bound(dw: torch.Tensor, want: torch.Tensor, env: torch.Tensor,
                         rows_per_band: int) -> None:
    """dweight within the fp32 chain bound of the module docstring, a bound that must be tight
    enough to fail a zero dweight in every column (else the check would prove nothing)."""
    factor = (rows_per_band + 400) * 2 * U
    allowed = factor * env + 1e-7
    loose = ~(allowed < want.abs())
    if loose.any():
        column = int(loose.nonzero()[0])
        raise AssertionError(
            f"dweight: the bound is too loose to check anything: {int(loose.sum())} of "
            f"{loose.numel()} columns would pass a zero result; first {column}: allowed "
            f"{float(allowed[column])}, want {float(want[column])}")
    assert_close("dweight", dw, want, env, rtol=0, env_factor=factor)


def check_case(family, shape, *, dtype=torch.bfloat16, weight_fp32=False, residual=False,
               weight_offset=0.0, grad_dtype=torch.float32, preallocate=False, seed=0, eps=1e-6,
               misaligned_weight=False):
    x, g, w, r, dy = make_case(shape, dtype=dtype, weight_fp32=weight_fp32, residual=residual,
                               seed=seed)
    if misaligned_weight:  # one element past a 16-byte boundary: the kernels' element weight loads
        w = torch.cat([w.new_empty(1), w])[1:]
        assert w.data_ptr() % 16 != 0
    grad_dtype = w.dtype if grad_dtype == "weight" else grad_dtype
    fkw = dict(eps=eps, weight_offset=weight_offset)
    if preallocate:
        fkw.update(out=poisoned(x), residual_out=poisoned(x) if residual else None,
                   rstd=poisoned(x, torch.float32, x.shape[:-1]))
    y, s, rstd = family.forward(x, g, w, r, **fkw)
    if preallocate:
        assert y is fkw["out"] and rstd is fkw["rstd"] and (s is fkw["residual_out"])
    assert y.shape == x.shape and y.dtype == x.dtype and rstd.dtype == torch.float32
    want_y, want_s, want_rstd = family.reference_forward(x, g, w, r, **fkw_ref(fkw))
    if residual:
        assert torch.equal(s.double(), want_s), "residual_out must be (x + residual) rounded"
    else:
        assert s is None
        s = x
    env_y, env_dx, env_dg, env_dw = envelopes(family, s, g, w, dy, want_rstd, weight_offset)
    assert_close("y", y, want_y, env_y, rtol=RTOL[dtype], env_factor=2e-5)
    assert_close("rstd", rstd, want_rstd, want_rstd, rtol=0, env_factor=2e-5)

    dsum = torch.randn_like(s) if residual else None
    bkw = dict(dsum=dsum, has_residual=residual, weight_offset=weight_offset, grad_dtype=grad_dtype)
    if preallocate:
        bkw.update(dx=poisoned(x), dg=poisoned(x) if family.gated else None,
                   dresidual=poisoned(x) if residual else None, dweight=poisoned(w, grad_dtype))
        need = family.workspace_bytes(x, g, w)
        bkw["workspace"] = torch.full((need + 16,), 255, dtype=torch.uint8, device=x.device)
    dx, dg, dres, dw = family.backward(dy, s, g, w, rstd, **bkw)
    if preallocate:
        assert dx is bkw["dx"] and dw is bkw["dweight"]
    assert dw.dtype == grad_dtype and dw.shape == w.shape
    want_dx, want_dg, want_dw = family.reference_backward(dy, s, g, w, eps=eps,
                                                          weight_offset=weight_offset, dsum=dsum)
    env_dsum = dsum.double().abs() if dsum is not None else 0
    assert_close("dx", dx, want_dx, env_dx + env_dsum, rtol=RTOL[dtype], env_factor=2e-5)
    if residual:
        assert torch.equal(dres, dx), "dresidual must equal dx"
    else:
        assert dres is None
    if family.gated:
        assert_close("dg", dg, want_dg, env_dg, rtol=RTOL[dtype], env_factor=2e-5)
    rows = x.numel() // x.shape[-1]
    dw_factor = max(5e-5, (family.rows_per_band(rows, x.shape[-1], dtype) + 400) * 2 * U)
    assert_close("dweight", dw, want_dw, env_dw, rtol=RTOL[grad_dtype], env_factor=dw_factor)
    return y, dx, dw


def fkw_ref(fkw):
    return {k: fkw[k] for k in ("eps", "weight_offset")}


# --------------------------------------------------------------------------- correctness


def _cases():
    index = 0
    for family in FAMILIES:
        for dtype in DTYPES:
            for cols in DIMS:
                rows = case_rows(cols)
                yield pytest.param(
                    family, (rows, cols), dtype, dict(
                        weight_fp32=index % 2 == 1, residual=index % 3 == 0,
                        weight_offset=1.0 if index % 4 == 1 else 0.0,
                        grad_dtype="weight" if index % 5 == 2 else torch.float32,
                        preallocate=index % 2 == 0, seed=index),
                    id=f"{family.name}-T{rows}-D{cols}-{str(dtype)[6:]}-{index}")
                index += 1


@pytest.mark.parametrize("family,shape,dtype,options", list(_cases()))
def test_matches_reference(family, shape, dtype, options):
    check_case(family, shape, dtype=dtype, **options)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("option", ["weight_fp32", "residual", "offset", "grad_weight",
                                    "eps", "3d", "1d"])
def test_options(family, option):
    shape = (33, 2048)
    kwargs = {"weight_fp32": dict(weight_fp32=True), "residual": dict(residual=True),
              "offset": dict(weight_offset=1.0), "grad_weight": dict(grad_dtype="weight"),
              "eps": dict(eps=0.5), "3d": {}, "1d": {}}[option]
    if option == "3d":
        shape = (3, 11, 1024)
    if option == "1d":
        shape = (768,)
    check_case(family, shape, preallocate=True, **kwargs)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("weight_fp32", [False, True], ids=["weight_x_dtype", "weight_fp32"])
@pytest.mark.parametrize("cols", [1024, 2048, 3072, 4096, 8192, 16384])
def test_misaligned_weight(family, dtype, weight_fp32, cols):
    """The weight one element off 16 bytes with x aligned (the vector route): every forward and
    backward instance reads its weights an element at a time."""
    check_case(family, (37, cols), dtype=dtype, weight_fp32=weight_fp32, preallocate=True,
               misaligned_weight=True)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("rows", [0, 1, 2, 5000])
@pytest.mark.parametrize("cols", [1, 4096])
def test_edge_rows(family, rows, cols):
    check_case(family, (rows, cols), residual=rows % 2 == 1, preallocate=True)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("cols", [1024, 8199, 16384])
def test_scalar_route_for_misaligned_rows(family, dtype, cols):
    """x at an odd element offset: 16-byte loads are impossible (D = 1024, 16384: a multiple of
    8; 8199: rows end inside a pack), up to the widest rows."""
    from cake._shared import rmsnorm

    rows = 45
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(rows * cols + 1, generator=gen).to(dtype).cuda()
    x = base[1:].view(rows, cols)
    g = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    w = (torch.rand(cols, generator=gen) + 0.5).to(dtype).cuda()
    problem = rmsnorm.validate_inputs(x=x, gate=g if family.gated else None, weight=w,
                                      residual=None, weight_offset=0.0, gated=family.gated)
    assert not problem.vector
    y, _, rstd = family.forward(x, g, w)
    want_y, _, want_rstd = family.reference_forward(x, g, w)
    env_y, _, _, _ = envelopes(family, x, g, w, torch.zeros_like(x), want_rstd, 0.0)
    assert_close("y", y, want_y, env_y, rtol=RTOL[dtype], env_factor=2e-5)
    dy = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    dx, dg, _, dw = family.backward(dy, x, g, w, rstd)
    want_dx, want_dg, want_dw = family.reference_backward(dy, x, g, w)
    _, env_dx, env_dg, env_dw = envelopes(family, x, g, w, dy, want_rstd, 0.0)
    assert_close("dx", dx, want_dx, env_dx, rtol=RTOL[dtype], env_factor=2e-5)
    if family.gated:
        assert_close("dg", dg, want_dg, env_dg, rtol=RTOL[dtype], env_factor=2e-5)
    else:
        assert dg is None
    assert_close("dweight", dw, want_dw, env_dw, rtol=0, env_factor=5e-5)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_widest_rows_with_every_input(family, dtype):
    """D = 16384 with a residual and fp32 weights: the largest shared-memory rings (fp32 gated:
    x, g and the residual in the forward; s, dy and g in the backward)."""
    check_case(family, (9, 16384), dtype=dtype, weight_fp32=True, residual=True, preallocate=True)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("cols", [1001, 1024, 4608, 4616, 5120])
def test_many_rows_a_cta(family, dtype, cols):
    """20000 rows: every forward CTA and backward band runs more steps than its ring has slots
    (or, in RMSNorm's 16-bit registers-path backward at D = 1024, than its two sets of
    registers), on both routes (D = 1001: unaligned), and at D = 4608 (288-thread rows), 4616 and
    5120 (320) in RMSNorm's 16-bit backward half as many bands again (792:
    launch_model.backward_bands)."""
    check_case(family, (20000, cols), dtype=dtype, residual=cols == 1024, seed=cols)


def test_rows_past_2_31_elements():
    """T * D > 2^31: 64-bit row offsets (bf16, D = 128, 16.8M rows, ~30 GB in all). dy has x's
    sign (``same_sign_dy``), so that the dweight bound (0.4% of dweight here) fails a zero
    dweight, or one short of 1% of its rows (test_rmsnorm_cpu.py checks the check on the CPU)."""
    family = FAMILIES[0]
    cols = 128
    rows = (1 << 31) // cols + 5
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(rows, cols, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = (torch.rand(cols, device="cuda", generator=gen) + 0.5)
    dy = same_sign_dy(x, gen)
    y, _, rstd = family.forward(x, None, w)
    dx, _, _, dw = family.backward(dy, x, None, w, rstd)
    for part in (slice(0, 64), slice(rows // 2, rows // 2 + 64), slice(rows - 64, rows)):
        want_y, _, want_rstd = family.reference_forward(x[part], None, w)
        env_y, env_dx, _, _ = envelopes(family, x[part], None, w, dy[part], want_rstd, 0.0)
        assert_close("y", y[part], want_y, env_y, rtol=RTOL[torch.bfloat16], env_factor=2e-5)
        want_dx, _, _ = family.reference_backward(dy[part], x[part], None, w)
        assert_close("dx", dx[part], want_dx, env_dx, rtol=RTOL[torch.bfloat16], env_factor=2e-5)
    want_dw, env_dw = dweight_reference(x, dy)
    assert_dweight_bound(dw, want_dw, env_dw, family.rows_per_band(rows, cols))


# --------------------------------------------------------------------------- autograd, modules


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("residual", [False, True])
def test_autograd_matches_helpers(family, residual):
    x, g, w, r, dy = make_case((3, 37, 1024), residual=residual, weight_fp32=True, seed=5)
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (x, g, w, r)]
    lx, lg, lw, lr = leaves
    out = family.functional(lx, lg if family.gated else None, lw, lr, eps=1e-5, weight_offset=0.5)
    dsum = torch.randn_like(x) if residual else None
    if residual:
        y, s = out
        torch.autograd.backward([y, s], [dy, dsum])
    else:
        y = out
        y.backward(dy)
    y2, s2, rstd = family.forward(x, g, w, r, eps=1e-5, weight_offset=0.5)
    assert torch.equal(y.detach(), y2)
    dx, dg, dres, dw = family.backward(dy, s2 if residual else x, g, w, rstd, dsum=dsum,
                                       has_residual=residual, weight_offset=0.5,
                                       grad_dtype=w.dtype)
    assert torch.equal(lx.grad, dx) and torch.equal(lw.grad, dw)
    if family.gated:
        assert torch.equal(lg.grad, dg)
    if residual:
        assert torch.equal(lr.grad, dres)
        assert lr.grad.data_ptr() != lx.grad.data_ptr()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_unused_sum_output_and_module(family):
    x, g, w, r, dy = make_case((64, 512), residual=True, seed=6)
    norm = family.module(512, weight_offset=1.0, device="cuda", dtype=torch.float32)
    assert torch.equal(norm.weight.detach() + 1.0, torch.ones(512, device="cuda"))
    xr = x.clone().requires_grad_(True)
    args = (xr, g) if family.gated else (xr,)
    y, _ = norm(*args, residual=r)
    y.backward(dy)  # the sum output takes no gradient
    _, s, rstd = family.forward(x, g, norm.weight.detach(), r, weight_offset=1.0)
    dx, _, _, dw = family.backward(dy, s, g, norm.weight.detach(), rstd, has_residual=True,
                                   weight_offset=1.0)
    assert torch.equal(xr.grad, dx) and torch.equal(norm.weight.grad, dw)


def test_supported():
    from cake.cake_gated_rmsnorm_det_train import is_cake_gated_rmsnorm_det_train_supported
    from cake.cake_rmsnorm_det_train import is_cake_rmsnorm_det_train_supported

    for query in (is_cake_rmsnorm_det_train_supported, is_cake_gated_rmsnorm_det_train_supported):
        assert query() and query(0) and query(torch.device("cuda", 0))
        assert query(dtype=torch.float32) and not query(dtype=torch.float64)
        assert not query(torch.cuda.device_count())


# --------------------------------------------------------------------------- determinism


def _digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("shape", [(65536, 1024), (20000, 4096), (20000, 5120), (3000, 16384), (4097, 127)])
def test_bitwise_repeatable_and_stream_independent(family, shape):
    x, g, w, r, dy = make_case(shape, weight_fp32=True, residual=True, seed=11)
    results = []
    for stream in (None, torch.cuda.Stream(), torch.cuda.Stream(), None):
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            y, s, rstd = family.forward(x, g, w, r)
            dx, dg, _, dw = family.backward(dy, s, g, w, rstd, has_residual=True)
            torch.cuda.current_stream().synchronize()
        results.append(_digest(y, s, rstd, dx, dw, *(() if dg is None else (dg,))))
    assert len(set(results)) == 1


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_mixed_shared_memory_sizes_from_two_threads(family):
    """Rows of 8192 and 6144 take more than 48 KiB of shared memory (dynamic plus static) in the
    same kernels, whose limit is raised once per kernel and device and never lowered
    (cake::allow_smem): both sizes, called alternately from two threads on two streams, run and
    give the bits of a single-threaded run. The single-threaded run raises the limits first, so
    the threads take the checked fast path; the first raise under a race is not exercised."""
    cases = [make_case((600, cols), seed=cols) for cols in (8192, 6144)]

    def run(case):
        x, g, w, _, dy = case
        y, _, rstd = family.forward(x, g, w)
        dx, dg, _, dw = family.backward(dy, x, g, w, rstd)
        return _digest(y, rstd, dx, dw, *(() if dg is None else (dg,)))

    expected = [run(case) for case in cases]
    torch.cuda.synchronize()
    digests, errors = [], []

    def worker(first):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for step in range(12):
                    which = (first + step) % 2
                    got = run(case=cases[which])  # _digest synchronizes (a host copy)
                    digests.append((which, got))
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(first,)) for first in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(digests) == 24
    assert all(got == expected[which] for which, got in digests)


def test_bitwise_identical_across_processes():
    script = textwrap.dedent(f"""
        import hashlib, sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests' / 'rmsnorm')!r}]
        import torch
        from rmsnorm_families import FAMILIES
        from test_rmsnorm_gpu import make_case, _digest
        out = []
        for family in FAMILIES:
            x, g, w, r, dy = make_case((30000, 2048), weight_fp32=True, residual=True, seed=21)
            y, s, rstd = family.forward(x, g, w, r)
            dx, dg, _, dw = family.backward(dy, s, g, w, rstd, has_residual=True)
            out.append(_digest(y, dx, dw, *(() if dg is None else (dg,))))
        print(" ".join(out))
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.split()[-2:] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 2


# --------------------------------------------------------------------------- graphs, compile


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_cuda_graph_capture_with_caller_buffers(family):
    x, g, w, r, dy = make_case((4096, 2048), residual=True, seed=13)
    y, s, rstd = poisoned(x), poisoned(x), poisoned(x, torch.float32, x.shape[:-1])
    dx, dg, dres, dw = poisoned(x), poisoned(x), poisoned(x), poisoned(w, torch.float32)
    need = family.workspace_bytes(x, g, w)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda")
    gate = g if family.gated else None

    def step():
        family.forward(x, gate, w, r, out=y, residual_out=s, rstd=rstd)
        family.backward(dy, s, gate, w, rstd, has_residual=True, dx=dx,
                        dg=dg if family.gated else None, dresidual=dres, dweight=dw, workspace=ws)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm: loads the programs before capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    outputs = (y, s, rstd, dx, dw, *((dg,) if family.gated else ()))
    expected = _digest(*outputs)
    for t in (*outputs, dres):
        t.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    assert _digest(*outputs) == expected
    assert torch.equal(dres, dx)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("residual", [True, False])
def test_torch_compile_opaque_op(family, residual):
    x, g, w, r, dy = make_case((257, 1024), residual=residual, weight_fp32=True, seed=17)

    def block(x, g, w, r):
        out = family.functional(x * 2, g if family.gated else None, w, r)
        if r is None:
            return (out.float() * 3).sum()
        y, s = out
        return (y.float() * 3).sum() + s.float().square().sum()

    def leaves_of():
        return [t.clone().requires_grad_(True) if t is not None else None for t in (x, g, w, r)]

    leaves = leaves_of()
    compiled = torch.compile(block, fullgraph=True)
    compiled(*leaves).backward()
    grads = [t.grad if t is not None else None for t in leaves]
    leaves2 = leaves_of()
    block(*leaves2).backward()
    for got, want in zip(grads, (t.grad if t is not None else None for t in leaves2)):
        if want is None:
            assert got is None
        else:
            assert torch.equal(got, want)


# --------------------------------------------------------------------------- bad input


def _with_outputs(x):
    """x with an ``out`` and ``rstd`` that fit it: the error must then be x's own."""
    return dict(x=x, out=poisoned(x), rstd=poisoned(x, torch.float32, x.shape[:-1]))


_X_SHAPE_ERROR = (r"^x: expected shape \[\.\.\., D\] with 1 <= D <= 16384 \(leading dims are "
                  r"flattened into rows\), got bfloat16\[2, {}\] on cuda:0$")
_OUT = r"^out: expected a contiguous bfloat16\[16, 256\] on cuda:0, got {}\[{}\] on cuda:0$"


def _bad_cases():
    """(id, builder, expected exception, its message's pattern); each builder returns the call's
    overrides. The messages are the host validation's (cake/_shared/rmsnorm.py)."""
    return [
        ("x-int32", lambda c: dict(x=c["x"].to(torch.int32)), TypeError,
         r"^x: expected dtype bfloat16 or float16 or float32, got int32\[16, 256\]"),
        ("x-float64", lambda c: dict(x=c["x"].double()), TypeError,
         r"^x: expected dtype bfloat16 or float16 or float32, got float64\[16, 256\]"),
        ("x-cpu", lambda c: dict(x=c["x"].cpu()), ValueError,
         r"^x: expected a CUDA tensor, got bfloat16\[16, 256\] on cpu$"),
        ("x-strided", lambda c: dict(x=c["x"].t().contiguous().t()), ValueError,
         r"^x: expected a contiguous tensor \[\.\.\., D\]"),
        ("x-D-too-big", lambda c: _with_outputs(torch.zeros(2, 16385, dtype=torch.bfloat16,
                                                            device="cuda")),
         ValueError, _X_SHAPE_ERROR.format(16385)),
        ("x-D-zero", lambda c: _with_outputs(torch.zeros(2, 0, dtype=torch.bfloat16,
                                                         device="cuda")),
         ValueError, _X_SHAPE_ERROR.format(0)),
        ("weight-size", lambda c: dict(w=c["w"][:-1].clone()), ValueError,
         r"^weight: expected \[D\] = \[256\] \(x's last dim\), got bfloat16\[255\]"),
        ("weight-2d", lambda c: dict(w=c["w"].view(1, -1)), ValueError,
         r"^weight: expected shape \[D\] = \[256\] in x's dtype or float32, got "
         r"bfloat16\[1, 256\]"),
        ("weight-fp16", lambda c: dict(w=c["w"].half()), TypeError,
         r"^weight: expected dtype bfloat16 or float32, got float16\[256\]"),
        ("weight-cpu", lambda c: dict(w=c["w"].cpu()), ValueError,
         r"^weight: expected a CUDA tensor, got bfloat16\[256\] on cpu$"),
        ("eps-zero", lambda c: dict(eps=0.0), ValueError,
         r"^eps: expected a value > 0 \(in fp32\), got 0\.0$"),
        ("eps-negative", lambda c: dict(eps=-1e-6), ValueError,
         r"^eps: expected a value > 0 \(in fp32\), got -1e-06$"),
        ("eps-nan", lambda c: dict(eps=float("nan")), ValueError,
         r"^eps: expected a finite fp32 value, got nan$"),
        ("eps-underflow", lambda c: dict(eps=1e-50), ValueError,
         r"^eps: expected a value > 0 \(in fp32\), got 1e-50$"),
        ("eps-str", lambda c: dict(eps="1e-6"), TypeError, r"^eps: expected a float, got str$"),
        ("offset-inf", lambda c: dict(weight_offset=float("inf")), ValueError,
         r"^weight_offset: expected a finite fp32 value, got inf$"),
        ("residual-shape", lambda c: dict(r=c["x"][:-1].clone()), ValueError,
         r"^residual: expected the shape of x \[16, 256\], got bfloat16\[15, 256\]"),
        ("residual-dtype", lambda c: dict(r=c["x"].float()), TypeError,
         r"^residual: expected dtype bfloat16, got float32\[16, 256\]"),
        ("out-dtype", lambda c: dict(out=poisoned(c["x"], torch.float32)), TypeError,
         _OUT.format("float32", "16, 256")),
        ("out-shape", lambda c: dict(out=poisoned(c["x"][:-1])), ValueError,
         _OUT.format("bfloat16", "15, 256")),
        ("out-aliases-x", lambda c: dict(out=c["x"]), ValueError,
         r"^out: must not share memory with x$"),
        ("rstd-shape", lambda c: dict(rstd=poisoned(c["x"], torch.float32, (5,))), ValueError,
         r"^rstd: expected a contiguous float32\[16\] on cuda:0, got float32\[5\] on cuda:0$"),
    ]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("name,build,error,match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_forward_input_raises_before_launch(family, name, build, error, match):
    """Refused with the argument named, and nothing written: ``out`` keeps its bits, and so does
    every input (with ``out`` aliasing x, a write to out is a write to x)."""
    x, g, w, r, _ = make_case((16, 256), residual=True, seed=23)
    case = dict(x=x, g=g, w=w, r=r, eps=1e-6, weight_offset=0.0, out=poisoned(x),
                rstd=poisoned(x, torch.float32, x.shape[:-1]))
    case.update(build(case))
    tensors = [case[k] for k in ("x", "g", "w", "r", "out", "rstd")]
    before = [_digest(t) for t in tensors]
    with pytest.raises(error, match=match):
        family.forward(case["x"], case["g"], case["w"], case["r"], eps=case["eps"],
                       weight_offset=case["weight_offset"], out=case["out"], rstd=case["rstd"])
    torch.cuda.synchronize()
    written = [k for k, t, d in zip(("x", "g", "w", "r", "out", "rstd"), tensors, before)
               if _digest(t) != d]
    assert not written, f"written by a refused call: {written}"


def test_bad_gate_rejected():
    family = FAMILIES[1]
    x, g, w, _, _ = make_case((16, 256), seed=29)
    out = poisoned(x)
    for bad, error in ((g[:, :-1].clone(), ValueError), (g.float(), TypeError), (None, TypeError),
                       (g.t().contiguous().t(), ValueError)):
        with pytest.raises(error, match="^g:"):
            family.forward(x, bad, w, out=out)
    assert out.isnan().all()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_bad_backward_arguments(family):
    x, g, w, r, dy = make_case((16, 256), residual=True, seed=31)
    y, s, rstd = family.forward(x, g, w, r)
    dx = poisoned(x)
    bad = [
        (dict(dy=dy.float()), TypeError, r"^dy: expected dtype bfloat16, got float32\[16, 256\]"),
        (dict(dy=dy[:-1].clone()), ValueError,
         r"^dy: expected the shape of x \[16, 256\], got bfloat16\[15, 256\]"),
        (dict(rstd=rstd[:-1].clone()), ValueError,
         r"^rstd: expected float32 \[16\] \(x\.shape\[:-1\]\), got float32\[15\]"),
        (dict(rstd=rstd.double()), TypeError, r"^rstd: expected dtype float32, got float64\[16\]"),
        (dict(grad_dtype=torch.float16), ValueError,
         r"^grad_dtype: expected torch\.float32 or the weight's dtype torch\.bfloat16, got "
         r"torch\.float16$"),
        (dict(dsum=torch.randn_like(x), has_residual=False), ValueError,
         r"^dsum: given, but the forward had no residual \(residual=False\)$"),
        (dict(dresidual=poisoned(x), has_residual=False), ValueError,
         r"^dresidual: given, but the forward had no residual \(residual=False\)$"),
        (dict(workspace=torch.empty(1, dtype=torch.uint8, device="cuda")), ValueError,
         r"^workspace: needs \d+ bytes \(backward_workspace_bytes\), got 1 \(uint8\[1\]"),
        (dict(dweight=poisoned(w, torch.float16)), TypeError,
         r"^dweight: expected a contiguous float32\[256\] on cuda:0, got float16\[256\]"),
        (dict(dx=dy), ValueError, r"^dx: must not share memory with dy$"),
    ]
    inputs = (dy, s, g, w, rstd)
    before = [_digest(t) for t in inputs]
    for override, error, match in bad:
        kw = dict(dy=dy, rstd=rstd, has_residual=True, dx=dx)
        kw.update(override)
        call_dy, call_rstd = kw.pop("dy"), kw.pop("rstd")
        with pytest.raises(error, match=match):
            family.backward(call_dy, s, g, w, call_rstd, **kw)
    torch.cuda.synchronize()
    assert dx.isnan().all()
    assert [_digest(t) for t in inputs] == before, "an input was written (dx=dy aliases dy)"
