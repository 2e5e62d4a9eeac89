"""CPU tests of the RMSNorm families: references, family tables and routes, host checks, names,
and (with nvcc, no GPU needed) the C entries' own argument checks and workspace sizes."""

from __future__ import annotations

import concurrent.futures
import ctypes
import importlib.util
import inspect
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fake_gpu  # noqa: E402
import launch_model  # noqa: E402
from fake_gpu import cuda  # noqa: E402
from rmsnorm_families import FAMILIES, family_module, family_table  # noqa: E402

from cake._shared import rmsnorm  # noqa: E402
from cake.core import jit  # noqa: E402
from cake.core import manifest as mf  # noqa: E402
from cake.cake_gated_rmsnorm_det_train import _function as gated_function  # noqa: E402
from cake.cake_gated_rmsnorm_det_train import reference as gated_ref  # noqa: E402
from cake.cake_rmsnorm_det_train import _function as plain_function  # noqa: E402
from cake.cake_rmsnorm_det_train import reference as plain_ref  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NAMES = ("cake_rmsnorm_det_train", "cake_gated_rmsnorm_det_train")
MANIFESTS = {name: mf.read(REPO / "manifests" / f"{name}.json") for name in NAMES}


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize("cols", [1, 7, 64])
def test_plain_reference_matches_torch(cols, weight_offset):
    torch.manual_seed(cols)
    x = torch.randn(5, 3, cols, dtype=torch.float64)
    w = torch.randn(cols, dtype=torch.float64)
    y, s, rstd = plain_ref.reference_forward(x, w, eps=1e-5, weight_offset=weight_offset)
    want = torch.nn.functional.rms_norm(x, (cols,), w + weight_offset, 1e-5)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    assert s is not None and rstd.shape == x.shape[:-1]
    dy = torch.randn_like(x)
    dx, dw = plain_ref.reference_backward(dy, x, w, eps=1e-5, weight_offset=weight_offset)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    torch.nn.functional.rms_norm(xr, (cols,), wr + weight_offset, 1e-5).backward(dy)
    torch.testing.assert_close(dx, xr.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, wr.grad, rtol=1e-10, atol=1e-12)


def test_gated_reference_is_norm_then_gate():
    torch.manual_seed(3)
    x, g = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 9, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    y, _, _ = gated_ref.reference_forward(x, g, w, eps=1e-6)
    want = torch.nn.functional.rms_norm(x, (16,), w, 1e-6) * torch.nn.functional.silu(g)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(x)
    dsum = torch.randn_like(x)
    dx, dg, dw = gated_ref.reference_backward(dy, x, g, w, dsum=dsum)
    leaves = [t.clone().requires_grad_(True) for t in (x, g, w)]
    out = torch.nn.functional.rms_norm(leaves[0], (16,), leaves[2], 1e-6) * \
        torch.nn.functional.silu(leaves[1])
    out.backward(dy)
    torch.testing.assert_close(dx, leaves[0].grad + dsum, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dg, leaves[1].grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, leaves[2].grad, rtol=1e-10, atol=1e-12)


def test_prenorm_sum_is_rounded_like_the_kernels():
    x = torch.tensor([[1.0, 2.0 ** -9]], dtype=torch.bfloat16)
    r = torch.tensor([[2.0 ** -9, 1.0]], dtype=torch.bfloat16)
    _, s, _ = plain_ref.reference_forward(x, torch.ones(2), r)
    assert torch.equal(s, (x.float() + r.float()).to(torch.bfloat16).double())
    _, s_exact, _ = plain_ref.reference_forward(x, torch.ones(2), r, round_sum=False)
    assert not torch.equal(s, s_exact)


# --------------------------------------------------------------------------- tables, routes


def _bands_by_variant(programs) -> dict:
    """(dtype, load) -> [(cols_min, cols_max), ...] of the programs, in D order."""
    out = {}
    for program in programs:
        key = (program.variant["dtype"], program.variant["load"])
        out.setdefault(key, []).append((program.route["cols_min"], program.route["cols_max"]))
    return {key: sorted(bands) for key, bands in out.items()}


@pytest.mark.parametrize("name", NAMES)
def test_family_tables(name):
    family = family_table(name)
    manifest = MANIFESTS[name]
    gated = name.startswith("cake_gated")
    # The 16-bit vector programs come in D bands with different forwards: RMSNorm's split at
    # D = 2048, 3584, 4096, 6144, 7168 and 8192, the gated family's at 3584, 4096 and 8192.
    split = (("bfloat16", "vector"), ("float16", "vector"))
    split_routes = ([(1, 3584), (3585, 4096), (4097, 8192), (8193, 16384)] if gated
                    else [(1, 2048), (2049, 3584), (3585, 4096), (4097, 6144), (6145, 7168), (7169, 8192),
                          (8193, 16384)])
    assert family.name == name
    assert len(family.specs) == len(manifest.programs) == 4 + len(split) * len(split_routes)
    assert all(s.params["CAKE_GATED"] == int(gated) for s in family.specs)
    bands = _bands_by_variant(manifest.programs)
    assert set(bands) == {(d, l) for d in ("bfloat16", "float16", "float32") for l in ("vector", "scalar")}
    for variant, routes in bands.items():
        want = split_routes if variant in split else [(1, 16384)]
        assert routes == want, (variant, routes)
    # The bands of a variant differ in their forward, and RMSNorm's first band (D <= 2048) in its
    # backward too (the registers path, NARROW_BACKWARD_TUNING): the other bands share one
    # backward partition and workspace, and each band's forward knobs differ from the next one's
    # (else the split is for nothing). Every program knows its route (it compiles the fixed widths
    # that serve it).
    for variant in split:
        knobs = [s.params for s in family.specs if (s.variant["dtype"], s.variant["load"]) == variant]
        backward = [{k: v for k, v in params.items() if "BACKWARD" in k} for params in knobs]
        assert len(knobs) == len(split_routes) and all(b == backward[-1] for b in backward[1:])
        assert (backward[0] == backward[-1]) == gated
        assert (backward[0]["CAKE_BACKWARD_STAGES"] == 0) != gated  # RMSNorm's: the registers path
        forward = [{k: v for k, v in params.items() if "BACKWARD" not in k and "CAKE_COLS_" not in k}
                   for params in knobs]
        assert all(a != b for a, b in zip(forward, forward[1:]))
    for spec in family.specs:
        assert (spec.params["CAKE_COLS_MIN"], spec.params["CAKE_COLS_MAX"]) == (
            spec.route["cols_min"], spec.route["cols_max"])
    for program in manifest.programs:
        # The declared entries, each with the family table's arguments in its order (what
        # Python packs; both families declare RMSNorm's).
        assert tuple(entry.name for entry in program.entries) == ("forward", "backward",
                                                                  "workspace_bytes")
        assert {entry.name: tuple((a.name, a.kind) for a in entry.args)
                for entry in program.entries} == family_module("cake_rmsnorm_det_train").ENTRIES
        assert set(program.kernels) == {f"kernel_{program.library}_{k}"
                                        for k in ("forward", "backward", "dweight")}
        assert {"cake/rmsnorm/kernels.cuh", "cake/rmsnorm/common.h"} <= set(program.headers)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", rmsnorm.DTYPES, ids=str)
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("cols", [1, 8, 2048, 2056, 3584, 3592, 4096, 4104, 8192, 8200, 16384])
def test_route_picks_the_variant(name, dtype, vector, cols):
    problem = rmsnorm.Problem(device=torch.device("cuda", 0), dtype=dtype, rows=10, cols=cols,
                              weight_fp32=False, gated=name.startswith("cake_gated"),
                              has_residual=False, vector=vector)
    program = rmsnorm.select(MANIFESTS[name], problem, "sm_90a")
    assert program.variant == {"dtype": str(dtype)[6:], "load": "vector" if vector else "scalar"}
    assert program.route["cols_min"] <= cols <= program.route["cols_max"]
    # The routed program is the one rendered with the knobs the table gives this D (both
    # families' knobs come from the RMSNorm table's ``tuning``).
    spec = next(s for s in family_table(name).specs
                if s.variant == program.variant and s.route == program.route)
    knobs = family_module("cake_rmsnorm_det_train").tuning(
        program.variant["dtype"], program.variant["load"], name.startswith("cake_gated"), cols)
    assert {k: spec.params[k] for k in knobs} == knobs
    with pytest.raises(ValueError, match="no program"):
        rmsnorm.select(MANIFESTS[name], problem, "sm_120a")


def test_scalar_checks():
    assert rmsnorm.fp32_bits(1.0) == 0x3F800000 and rmsnorm.fp32_bits(0.0) == 0
    for bad, error in ((0.0, ValueError), (-1.0, ValueError), (1e-50, ValueError),
                       (float("inf"), ValueError), (float("nan"), ValueError), (True, TypeError),
                       ("1e-6", TypeError), (None, TypeError), (1e39, ValueError)):
        with pytest.raises(error, match="^eps: "):
            rmsnorm._check_number("eps", bad, positive=True)
    assert rmsnorm._check_number("weight_offset", -1, positive=False) == -1.0


def test_validation_rejects_cpu_tensors_first():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):
        rmsnorm.validate_forward(x=x, gate=None, weight=torch.ones(8), residual=None, eps=1e-6,
                                 weight_offset=0.0, gated=False, out=None, residual_out=None,
                                 rstd=None)
    with pytest.raises(TypeError, match="^x: expected dtype"):
        rmsnorm.validate_forward(x=x.double(), gate=None, weight=torch.ones(8), residual=None,
                                 eps=1e-6, weight_offset=0.0, gated=False, out=None,
                                 residual_out=None, rstd=None)

    out = torch.empty(4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="^x: expected a torch.Tensor"):  # before out is compared
        rmsnorm.validate_forward(x=[[1.0] * 8] * 4, gate=None, weight=torch.ones(8),
                                 residual=None, eps=1e-6, weight_offset=0.0, gated=False,
                                 out=out, residual_out=None, rstd=None)


def test_the_dweight_check_past_2_31_elements_fails_a_zero_result():
    """The dweight check of test_rmsnorm_gpu.py's test_rows_past_2_31_elements, on the CPU with
    the same band length (so the same bound: 0.4% of the envelope) over three bands: the
    float64 reference and an fp32 sum of one chain a band, then the bands, pass; a zero dweight
    and one missing a band's rows fail; and with random-sign dy (that test's data before) the
    bound would pass a zero, which the check refuses to call a check."""
    from test_rmsnorm_gpu import assert_dweight_bound, dweight_reference, same_sign_dy

    band = FAMILIES[0].rows_per_band((1 << 31) // 128 + 5, 128)
    rows, cols = 3 * band, 128
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)
    dy = same_sign_dy(x, gen)
    want, env = dweight_reference(x, dy)
    assert_dweight_bound(want.float(), want, env, band)
    x32 = x.float()
    terms = dy.float() * (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + 1e-6))
    total = torch.zeros(cols)
    for start in range(0, rows, band):
        chain = torch.zeros(cols)
        for row in terms[start:start + band]:
            chain += row
        total += chain
    assert_dweight_bound(total, want, env, band)
    out_of_tolerance = rf"^dweight: {cols} of {cols} elements out of tolerance"
    with pytest.raises(AssertionError, match=out_of_tolerance):
        assert_dweight_bound(torch.zeros(cols), want, env, band)
    with pytest.raises(AssertionError, match=out_of_tolerance):
        assert_dweight_bound(total - terms[:band].sum(0), want, env, band)
    random_dy = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)
    want, env = dweight_reference(x, random_dy)
    with pytest.raises(AssertionError, match=r"^dweight: the bound is too loose to check "
                                             r"anything: \d+ of 128 columns would pass a zero"):
        assert_dweight_bound(want.float(), want, env, band)


# --------------------------------------------------------------------------- host fast path


@pytest.fixture
def gpu(monkeypatch):
    """A simulated GPU (``fake_gpu``); both families' plans are empty before and after."""
    programs = (plain_function._PROGRAMS, gated_function._PROGRAMS)
    for family in programs:
        family.clear()
    yield fake_gpu.install(monkeypatch)
    for family in programs:
        family.clear()


@pytest.fixture
def validations(monkeypatch):
    """Counts full validations of forward and backward calls (both families)."""
    counts = {"forward": 0, "backward": 0}
    for name in counts:
        real = getattr(rmsnorm, f"validate_{name}")

        def counted(_real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(**kwargs)

        monkeypatch.setattr(rmsnorm, f"validate_{name}", counted)
    return counts


def _rows(rows, cols, *, offset=0, dtype=torch.bfloat16):
    """A [rows, cols] tensor starting ``offset`` elements into a fresh (aligned) buffer."""
    return cuda(torch.randn(rows * cols + offset).to(dtype)[offset:].view(rows, cols))


def _rms_case(rows=8, cols=64):
    torch.manual_seed(0)
    return _rows(rows, cols), _rows(rows, cols), cuda(torch.rand(cols).to(torch.bfloat16))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_repeated_signature_is_validated_and_routed_once(gpu, validations, family):
    x, g, w = _rms_case()
    offsets = (0.0, -0.0, 0.0)  # equal, so one signature; the sign still reaches the program
    for offset in offsets:
        y, _, rstd = family.forward(x, g, w, eps=1e-5, weight_offset=offset)
        family.backward(cuda(torch.randn_like(y)), x, g, w, cuda(rstd), weight_offset=offset)
    assert validations == {"forward": 1, "backward": 1}
    assert len(gpu.of("workspace_bytes")) == 1  # one query per problem, not per call
    forward, backward = gpu.of("forward"), gpu.of("backward")
    # Floats as given (the entry packs them as fp32 bits): compared by their fp32 bits, so
    # that -0.0 and 0.0 differ.
    assert [{name: launch.args[name] for name in ("rows", "cols", "weight_fp32")}
            for launch in forward] == [{"rows": 8, "cols": 64, "weight_fp32": 0}] * 3
    assert [(rmsnorm.fp32_bits(launch.args["eps"]), rmsnorm.fp32_bits(launch.args["weight_offset"]))
            for launch in forward] == \
        [(rmsnorm.fp32_bits(1e-5), rmsnorm.fp32_bits(offset)) for offset in offsets]
    assert [rmsnorm.fp32_bits(launch.args["weight_offset"]) for launch in backward] == \
        [rmsnorm.fp32_bits(offset) for offset in offsets]
    assert rmsnorm.fp32_bits(-0.0) != rmsnorm.fp32_bits(0.0)
    assert backward[-1].args["workspace_bytes"] == fake_gpu.WORKSPACE_BYTES
    assert {launch.variant["load"] for launch in gpu} == {"vector"}


@pytest.mark.parametrize("family,moved,path",
                         [(f, moved, path) for f in FAMILIES
                          for moved in (("x", "residual", "g") if f.gated else ("x", "residual"))
                          for path in ("forward", "functional")],
                         ids=lambda v: getattr(v, "name", v))
def test_rmsnorm_route_follows_alignment_on_the_fast_path(gpu, validations, family, moved, path):
    """The forward's key reads the addresses of x, the residual and the gate (the eager path's
    too)."""
    x, g, w = _rms_case()
    misaligned = _rows(8, 64, offset=1)
    for tensor in (x, misaligned, x, misaligned):
        args = {"x": x, "g": g, "residual": None if moved != "residual" else x.clone(),
                moved: tensor}
        getattr(family, path)(args["x"], args["g"], w, args["residual"])
    assert [launch.variant["load"] for launch in gpu.of("forward")] == \
        ["vector", "scalar", "vector", "scalar"]
    assert validations["forward"] == 2


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_forward_with_non_tensors_is_refused_every_time(gpu, validations, family):
    """A call whose arguments are not tensors has no key: validated (and refused) each time."""
    x, g, w = _rms_case()
    for _ in range(2):
        with pytest.raises(TypeError, match="^x: expected a torch.Tensor"):
            family.forward([[1.0] * 64] * 8, g, w)
        with pytest.raises(TypeError, match="^weight: expected a torch.Tensor"):
            family.functional(x, g, [1.0] * 64)
    assert validations["forward"] == 4
    assert not gpu.of("forward")
    assert len((gated_function if family.gated else plain_function)._PROGRAMS._forward_calls) == 0


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_optional_outputs_are_keyed_and_rechecked(gpu, validations, family):
    """Outputs given after a call without them are validated (rstd's shape), and a repeated
    signature still has each given output's overlap checked."""
    x, g, w = _rms_case()
    family.forward(x, g, w)
    with pytest.raises(ValueError, match="^rstd: expected a contiguous"):
        family.forward(x, g, w, rstd=cuda(torch.empty(3)))
    family.forward(x, g, w, rstd=cuda(torch.empty(8)))
    with pytest.raises(ValueError, match="^rstd: must not share memory with x"):
        family.forward(x, g, w, rstd=cuda(x.view(torch.float32).view(-1)[:8]))
    r = _rows(8, 64)
    family.forward(x, g, w, r, residual_out=_rows(8, 64))
    with pytest.raises(ValueError, match="^residual_out: must not share memory with residual"):
        family.forward(x, g, w, r, residual_out=r)
    assert validations["forward"] == 4
    assert len(gpu.of("forward")) == 3


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_new_signature_is_validated_again_with_the_same_errors(gpu, validations, family):
    x, g, w = _rms_case()
    family.forward(x, g, w, eps=1)
    bad_calls = [
        (dict(eps=True), TypeError, "^eps: expected a float, got bool"),  # True == 1
        (dict(eps=None), TypeError, "^eps: expected a float, got NoneType"),
        (dict(eps=0.0), ValueError, "^eps: expected a value > 0"),
        (dict(eps=1e-50), ValueError, "^eps: expected a value > 0"),
        (dict(weight_offset=float("nan")), ValueError, "^weight_offset: expected a finite"),
        (dict(w=cuda(torch.rand(32).to(torch.bfloat16))), ValueError, r"^weight: expected \[D\]"),
        (dict(x=cuda(torch.zeros(64, 8, dtype=torch.bfloat16).t())), ValueError,
         "^x: expected a contiguous"),
    ]
    for change, error, match in bad_calls:
        args = {**dict(x=x, w=w, eps=1, weight_offset=0.0), **change}
        messages, before = [], validations["forward"]
        for _ in range(2):  # a failed signature is not remembered: the same error again
            with pytest.raises(error, match=match) as raised:
                family.forward(args["x"], g, args["w"], eps=args["eps"],
                               weight_offset=args["weight_offset"])
            messages.append(str(raised.value))
        assert validations["forward"] == before + 2
        with pytest.raises(error, match=match) as direct:  # what the validation itself says
            rmsnorm.validate_forward(x=args["x"], gate=g if family.gated else None,
                                     weight=args["w"], residual=None, eps=args["eps"],
                                     weight_offset=args["weight_offset"], gated=family.gated,
                                     out=None, residual_out=None, rstd=None)
        assert messages == [str(direct.value)] * 2
    assert len(gpu.of("forward")) == 1


# (x's dtype, the weight's, the message): the weight is in x's dtype or fp32, nothing else.
BAD_WEIGHT_DTYPES = [
    (torch.bfloat16, torch.float16, r"^weight: expected dtype bfloat16 or float32, got float16\["),
    (torch.bfloat16, torch.float64, r"^weight: expected dtype bfloat16 or float32, got float64\["),
    (torch.float16, torch.bfloat16, r"^weight: expected dtype float16 or float32, got bfloat16\["),
    (torch.float32, torch.bfloat16, r"^weight: expected dtype float32, got bfloat16\["),
    (torch.bfloat16, torch.int32, r"^weight: expected dtype bfloat16 or float32, got int32\["),
]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("x_dtype,w_dtype,match", BAD_WEIGHT_DTYPES,
                         ids=[f"x-{str(x)[6:]}-w-{str(w)[6:]}" for x, w, _ in BAD_WEIGHT_DTYPES])
def test_rmsnorm_weight_dtype_is_x_dtype_or_fp32(gpu, family, x_dtype, w_dtype, match):
    """Every entry (forward and backward helpers, workspace query, autograd functional) refuses a
    weight in another dtype than x's or fp32, naming the weight, before any launch; the same call
    with an fp32 weight runs."""
    x, g = _rows(8, 64, dtype=x_dtype), _rows(8, 64, dtype=x_dtype)
    w = cuda(torch.ones(64, dtype=w_dtype))
    rstd, dy = cuda(torch.ones(8)), _rows(8, 64, dtype=x_dtype)
    calls = [
        lambda: family.forward(x, g, w),
        lambda: family.functional(x, g, w),
        lambda: family.backward(dy, x, g, w, rstd),
        lambda: family.workspace_bytes(x, g, w),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=match):
            call()
    assert not gpu
    family.forward(x, g, cuda(torch.ones(64)))
    assert [launch.entry for launch in gpu if launch.entry != "workspace_bytes"] == ["forward"]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_outputs_overlapping_inputs_are_refused_on_the_fast_path(gpu, validations,
                                                                        family):
    x, g, w = _rms_case()
    out, rstd = _rows(8, 64), cuda(torch.empty(8))
    family.forward(x, g, w, out=out, rstd=rstd)
    with pytest.raises(ValueError, match="^out: must not share memory with x"):
        family.forward(x, g, w, out=x, rstd=rstd)
    with pytest.raises(ValueError, match="^rstd: must not share memory with x"):
        family.forward(x, g, w, out=out, rstd=cuda(x.view(torch.float32).view(-1)[:8]))
    dy, dx, dg = _rows(8, 64), _rows(8, 64), _rows(8, 64)
    dw = cuda(torch.empty(64))
    workspace = cuda(torch.empty(fake_gpu.WORKSPACE_BYTES, dtype=torch.uint8))
    family.backward(dy, x, g, w, rstd, dx=dx, dg=dg, dweight=dw, workspace=workspace)
    with pytest.raises(ValueError, match="^dx: must not share memory with dy"):
        family.backward(dy, x, g, w, rstd, dx=dy, dg=dg, dweight=dw, workspace=workspace)
    shifted = cuda(torch.empty(fake_gpu.WORKSPACE_BYTES + 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^workspace: must be 16-byte aligned"):
        family.backward(dy, x, g, w, rstd, dx=dx, dg=dg, dweight=dw,
                        workspace=cuda(shifted[8:8 + fake_gpu.WORKSPACE_BYTES]))
    assert validations == {"forward": 1, "backward": 1}  # all refused on the fast path
    assert len(gpu.of("forward")) == len(gpu.of("backward")) == 1


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_rmsnorm_workspace_is_sized_for_the_backward_route(gpu, family):
    """x allows the vector route, dy does not: the size comes from the program that runs."""
    x, g, w = _rms_case()
    rstd, dy = cuda(torch.empty(8)), _rows(8, 64, offset=1)
    workspace = cuda(torch.empty(fake_gpu.WORKSPACE_BYTES, dtype=torch.uint8))
    family.backward(dy, x, g, w, rstd, workspace=workspace)
    assert [(launch.entry, launch.variant["load"]) for launch in gpu] == \
        [("workspace_bytes", "scalar"), ("backward", "scalar")]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_autograd_backward_reuses_the_forward_plan(gpu, validations, family, residual):
    x, g, w = _rms_case()
    leaves = [cuda(t.detach()).requires_grad_() for t in (x, g, w)]
    r = cuda(torch.randn(8, 64).to(torch.bfloat16)).requires_grad_() if residual else None
    for dy in (torch.randn(8, 64).to(torch.bfloat16),
               torch.randn(8 * 64 + 1).to(torch.bfloat16)[1:].view(8, 64)):  # misaligned
        out = family.functional(leaves[0], leaves[1], leaves[2], r)
        (out[0] if residual else out).backward(dy)
    assert validations == {"forward": 1, "backward": 0}
    assert [launch.variant["load"] for launch in gpu.of("backward")] == ["vector", "scalar"]
    assert len(gpu.of("workspace_bytes")) == 2  # one per program
    assert leaves[2].grad.shape == (64,) and (r is None or r.grad.shape == (8, 64))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_functional_and_public_apply_launch_and_record_alike(gpu, family, residual):
    """The functional launches, then records the call in autograd (autograd.eager_apply); the
    public Function.apply launches inside its forward. Same programs, same graph node type,
    gradients of the same shapes; under no_grad the functional launches and records nothing."""
    x, g, w = _rms_case()
    leaves = [cuda(t.detach()).requires_grad_() for t in (x, g, w)]
    r = cuda(torch.randn(8, 64).to(torch.bfloat16)).requires_grad_() if residual else None
    dy = torch.randn(8, 64).to(torch.bfloat16)
    nodes = []
    for call in (family.functional, family.apply):
        out = call(leaves[0], leaves[1], leaves[2], r)
        y = out[0] if residual else out
        nodes.append(type(y.grad_fn).__name__)
        y.backward(dy)
    function = "CakeGatedRMSNormDetFunction" if family.gated else "CakeRMSNormDetFunction"
    assert nodes == [f"{function}Backward"] * 2
    assert [(launch.library, launch.entry) for launch in gpu if launch.entry != "workspace_bytes"] \
        == [(gpu[0].library, "forward"), (gpu[0].library, "backward")] * 2
    assert all(leaf.grad.shape == leaf.shape for leaf in leaves if family.gated or leaf is not leaves[1])
    gpu.clear()
    with torch.no_grad():
        out = family.functional(leaves[0], leaves[1], leaves[2], r)
    assert (out[0] if residual else out).grad_fn is None
    assert [launch.entry for launch in gpu] == ["forward"]


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", NAMES)
def test_public_names_follow_the_scheme(name):
    package = importlib.import_module(f"cake.{name}")
    op = "gated_rmsnorm" if "gated" in name else "rmsnorm"
    cls = "GatedRMSNorm" if "gated" in name else "RMSNorm"
    assert sorted(package.__all__) == sorted([
        f"cake_{op}_det", f"Cake{cls}DetFunction", f"Cake{cls}Det",
        f"cake_{op}_det_train_forward", f"cake_{op}_det_train_backward",
        f"cake_{op}_det_train_backward_workspace_bytes", f"is_cake_{op}_det_train_supported"])
    for public in package.__all__:
        assert not re.search(r"(^|_)(fwd|bwd)(_|$)", public)
        obj = getattr(package, public)
        assert obj.__doc__ and ("Example" in obj.__doc__ or public.startswith("is_")), public
        if inspect.isfunction(obj):
            params = inspect.signature(obj).parameters.values()
            assert "deterministic" not in inspect.signature(obj).parameters
            assert not any(p.kind is p.VAR_KEYWORD for p in params), public
            for p in params:
                if p.name in ("eps", "weight_offset", "out", "residual_out", "dsum",
                              "has_residual", "grad_dtype", "dx", "dg", "dresidual", "dweight",
                              "workspace", "dtype"):
                    assert p.kind is p.KEYWORD_ONLY, (public, p.name)


# --------------------------------------------------------------------------- C entries (nvcc)


@pytest.fixture(scope="module")
def compiled(family_jit_cache):
    """Every bf16 vector program of each family (one a D band), JIT-compiled (the checks need no
    GPU) into the session's JIT cache, in parallel, and loaded: name -> [(library, program)] in
    D order."""
    reason = jit.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    jobs = [(name, program) for name in NAMES for program in MANIFESTS[name].programs
            if program.variant == {"dtype": "bfloat16", "load": "vector"}]

    def build(job):
        name, program = job
        path = jit.compile_program(mf.repository_tree(REPO, name), MANIFESTS[name], program,
                                   "sm_90a")[0]
        return ctypes.CDLL(str(path))

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            libraries = list(pool.map(build, jobs))
    out = {name: [] for name in NAMES}
    for (name, program), library in zip(jobs, libraries):
        out[name].append((library, program))
    return {name: sorted(programs, key=lambda lp: lp[1].route["cols_min"]) for name, programs in out.items()}


def _serving(compiled, name, cols):
    """The compiled (library, program) of the family whose band holds D = cols (the router's
    choice on the vector route)."""
    return next(lp for lp in compiled[name] if lp[1].route["cols_min"] <= cols <= lp[1].route["cols_max"])


def _knobs(name, program) -> dict:
    """The family table's knobs of a program."""
    return next(spec.params for spec in family_table(name).specs
                if spec.variant == program.variant and spec.route == program.route)


def _call(compiled, name, entry, args, cols=1):
    """Calls a C entry of the program serving D = cols."""
    lib, program = _serving(compiled, name, cols)
    library = program.library
    error = ctypes.create_string_buffer(512)
    array = (ctypes.c_int64 * len(args))(*args)
    status = getattr(lib, f"{library}_{entry}")(array, len(args), None, error, len(error))
    return status, error.value.decode()


def _workspace_bytes(params: dict, rows: int, cols: int) -> int:
    """One fp32 partial row (D rounded up to 4) per backward CTA: one per band (at most
    launch_model.backward_bands bands of at least 16 rows: the table's CAKE_BACKWARD_BANDS, half
    as many again in RMSNorm's 16-bit backward at D = 4097 .. 5120), or with CAKE_BACKWARD_GUIDED
    h a wave of half as many CTAs for each of its h + 1 regions."""
    ctas = -(-rows // launch_model.rows_per_band(params, rows, cols))
    assert ctas <= launch_model.backward_bands(params, cols) and (rows == 0) == (ctas == 0)
    guided = params["CAKE_BACKWARD_GUIDED"]
    if guided:
        ctas = -(-ctas // 2) * (guided + 1)
    return ctas * ((cols + 3) // 4 * 4) * 4


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NAMES)
def test_workspace_bytes_entry(compiled, name):
    """The entry's workspace size (_workspace_bytes, from the knobs of the program serving the D)
    at the edges of the band count: no rows, fewer rows than a band's least, the table's bands
    full and one row past, and the widths whose bands differ (D = 4097 .. 5120; in RMSNorm's
    registers-path band, D = 520 .. 768, 1032 .. 1536). A D outside the program's band is
    refused, as the launches refuse it."""
    table_bands = family_table(name).specs[0].params["CAKE_BACKWARD_BANDS"]
    out = ctypes.c_int64(-1)
    for rows, cols in ((0, 8), (1, 8), (16, 8), (17, 8), (48, 8), (16 * table_bands, 4096),
                       (16 * table_bands + 1, 16), (65536, 1024), (10 ** 7, 16384), (16 * table_bands + 1, 4104),
                       (65536, 4616), (10 ** 6, 5120), (10 ** 6, 5128), (10 ** 6, 768), (10 ** 6, 1280),
                       (10 ** 6, 1536), (10 ** 6, 2048)):
        params = _knobs(name, _serving(compiled, name, cols)[1])
        assert _call(compiled, name, "workspace_bytes", [rows, cols, ctypes.addressof(out)], cols) == (0, "")
        assert out.value == _workspace_bytes(params, rows, cols), (rows, cols)
    status, message = _call(compiled, name, "workspace_bytes", [10, 12, ctypes.addressof(out)])
    assert status == 1 and "vector width" in message
    past_band = _serving(compiled, name, 1)[1].route["cols_max"] + 8
    status, message = _call(compiled, name, "workspace_bytes", [10, past_band, ctypes.addressof(out)])
    assert (status, message) == (1, "workspace_bytes: cols is outside this program's band of D (wrong route)")


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NAMES)
def test_backward_bands_at_every_width(compiled, name):
    """The backward's band count, read back through the workspace entry at enough rows that the
    bands bind, follows launch_model.backward_bands at every width of the vector programs (each
    width asked of the program serving it)."""
    out = ctypes.c_int64(-1)
    wrong = []
    for cols in range(8, 16385, 8):
        params = _knobs(name, _serving(compiled, name, cols)[1])
        rows = 16 * 4 * params["CAKE_BACKWARD_BANDS"]
        assert _call(compiled, name, "workspace_bytes", [rows, cols, ctypes.addressof(out)], cols) == (0, "")
        if out.value != _workspace_bytes(params, rows, cols):
            wrong.append(cols)
    assert not wrong, wrong[:10]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NAMES)
def test_entries_check_their_arguments(compiled, name):
    fake = 1 << 20  # an aligned, never-dereferenced address
    gate = fake if "gated" in name else 0
    one = rmsnorm.fp32_bits(1.0)
    forward = [fake, 0, gate, fake, fake, 0, 0, 4, 64, 0, rmsnorm.fp32_bits(1e-6), 0]
    # A call with the wrong argument count is refused by the declaration's unpacking.
    assert _call(compiled, name, "forward", forward[:11]) == (1, "forward takes 12 arguments, got 11")
    assert _call(compiled, name, "forward", forward + [0]) == (1, "forward takes 12 arguments, got 13")
    cases = [
        (forward[:8] + [0] + forward[9:], "cols must be in [1, 16384]"),
        (forward[:8] + [16392] + forward[9:], "cols must be in [1, 16384]"),
        (forward[:7] + [-1] + forward[8:], "rows must be >= 0"),
        (forward[:10] + [0, 0], "eps must be finite and > 0"),
        (forward[:10] + [rmsnorm.fp32_bits(-1.0), 0], "eps must be finite and > 0"),
        (forward[:9] + [2] + forward[10:], "weight_fp32 must be 0 or 1"),
        (forward[:9] + [1 << 40] + forward[10:], "argument weight_fp32 does not fit i32"),
        ([0] + forward[1:], "x is null"),
        ([fake + 2] + forward[1:], "x is not 16-byte aligned"),
        (forward[:4] + [0] + forward[5:], "y is null"),
        (forward[:1] + [fake] + forward[2:], "residual_out is null"),
        (forward[:5] + [fake] + forward[6:], "residual_out given without residual"),
        (forward[:6] + [fake + 2] + forward[7:], "rstd is not 4-byte aligned"),
    ]
    # a D the program has no kernels for: past its band (D <= 2048 or 3584 here), a multiple of 8
    past_band = _serving(compiled, name, 1)[1].route["cols_max"] + 8
    outside = "cols is outside this program's band of D (wrong route)"
    cases.append((forward[:8] + [past_band] + forward[9:], outside))
    if gate:
        cases.append((forward[:2] + [0] + forward[3:], "gate is null"))
    else:
        cases.append((forward[:2] + [fake] + forward[3:], "gate given to a program without a gate"))
    for args, message in cases:
        assert _call(compiled, name, "forward", args) == (1, f"forward: {message}"), message
    backward = [fake, gate, fake, fake, fake, 0, fake, 0, gate, fake, 1 << 20, fake, 4, 64, 0, 2, one]
    assert _call(compiled, name, "backward", backward[:16]) == (1, "backward takes 17 arguments, got 16")
    cases = [
        (backward[:10] + [4] + backward[11:], "workspace is smaller than backward_workspace_bytes"),
        (backward[:15] + [3, one], "dweight dtype code must be 0, 1 or 2"),
        (backward[:4] + [0] + backward[5:], "rstd is null"),
        (backward[:6] + [0] + backward[7:], "dx is null"),
        (backward[:3] + [fake + 8] + backward[4:], "dy is not 16-byte aligned"),
        (backward[:16] + [rmsnorm.fp32_bits(float("inf"))], "weight_offset must be finite"),
        (backward[:13] + [past_band] + backward[14:], outside),
    ]
    for args, message in cases:
        assert _call(compiled, name, "backward", args) == (1, f"backward: {message}"), message
