"""KCP in one process (no process group): every rank of a pack runs the real step functions
(cake_causal_conv1d_det_train_kcp._step) on the CPU compute, NaN-poisoned, exchanging through
the plans' own tables; y and dx gathered in layout order are bitwise the single-rank run's, the
partials' rank-order sum is within the stated bound of the float64 reference. Also: the CPU
compute itself (its exp, its gather and scatter semantics), the support query, the refusals a
step makes before it communicates, and the benchmark script's refusals."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import kcp_testlib as tl  # noqa: E402

import cake.cake_causal_conv1d_det_train_kcp as kcp  # noqa: E402
from cake.cake_causal_conv1d_det_train_kcp import _compute, _tables  # noqa: E402

SEED = int(os.environ.get("KCP_TEST_SEED", random.SystemRandom().randrange(2**31)))
REPO = Path(__file__).resolve().parents[2]
Reference = _compute.ReferenceCompute


# --------------------------------------------------------------------------- the CPU compute


def test_reference_exp_is_position_independent():
    """The CPU compute's exp gives a value the same bits at any position of any tensor (torch's
    CPU sigmoid, which the family's reference uses, does not: its vector and scalar paths
    differ by an ulp)."""
    z = torch.randn(1003, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64) * 6
    full = _compute._sigmoid(z)
    for start in range(48):
        for n in (1, 2, 3, 5, 9, 17, 33, 100):
            part = _compute._sigmoid(z[start:start + n].clone())
            assert torch.equal(part, full[start:start + n]), (SEED, start, n)


def test_reference_compute_matches_the_family_reference():
    """The CPU compute is the family's float64 reference: bitwise without activation, within
    1e-13 with SiLU (the exp), for y, dx, dweight, dbias."""
    gen = random.Random(SEED)
    for activation in ("silu", None):
        cu = tl.random_cu(40, gen, 1, 9)
        x, w, b, dy = tl.inputs(40, 5, torch.float64, torch.float64, True, gen.randrange(2**31))
        got = tl.single_rank(cu, x, w, b, dy, activation)
        want = tl.reference_run(cu, x, w, b, dy, activation)
        for name, g, r in zip(("y", "dx", "dweight", "dbias"), got, want):
            tol = 0.0 if activation is None and name in ("y", "dx") else 1e-13
            assert (g - r).abs().max().item() <= tol * max(1.0, r.abs().max().item()), \
                (SEED, activation, name)


def _codes(*codes):
    return torch.tensor(codes, dtype=torch.int64)


def test_reference_gather_follows_the_row_codes():
    """Local and exchanged rows, negation (also of a zero: -0), zero rows for a negative code,
    an unknown bit or a row past its source (kcp_config.h), into the output's dtype."""
    local = torch.arange(6, dtype=torch.float64).view(3, 2) + 1
    exchanged = -10 * torch.arange(4, dtype=torch.float64).view(2, 2) - 10
    ex, neg = _tables.EXCHANGED_BIT, _tables.NEGATE_BIT
    codes = _codes(2, ex | 1, neg | 0, neg | ex | 0, -1, -7, 3, ex | 2, 1 << 45 | 1, neg | 9)
    out = torch.full((10, 2), float("nan"), dtype=torch.bfloat16)
    Reference.gather(codes, local, exchanged, out)
    want = torch.tensor([[5, 6], [-30, -40], [-1, -2], [10, 20], [0, 0], [0, 0], [0, 0], [0, 0],
                         [0, 0], [-0.0, -0.0]], dtype=torch.bfloat16)
    assert torch.equal(out, want)
    assert torch.equal(out.view(torch.int16)[9], torch.tensor([-32768, -32768], dtype=torch.int16))
    assert torch.equal(out.view(torch.int16)[4], torch.zeros(2, dtype=torch.int16))  # +0
    none = torch.zeros(2, 2, dtype=torch.float64)
    Reference.gather(_codes(ex | 0, 1), local, None, none)  # no exchanged rows: zero
    assert none.tolist() == [[0.0, 0.0], [3.0, 4.0]]


def test_reference_scatter_skips_negative_and_past_the_end_targets():
    src = torch.arange(8, dtype=torch.float64).view(4, 2)
    out = torch.full((3, 2), -1.0, dtype=torch.float32)
    Reference.scatter(src, _codes(2, -1, 3, 0), out)
    assert out.tolist() == [[6.0, 7.0], [-1.0, -1.0], [0.0, 1.0]]


# --------------------------------------------------------------------------- all ranks


CASES = [(world, layout, exchange, name) for world in (1, 2, 3, 4, 5) for layout in tl.LAYOUTS
         for exchange in tl.EXCHANGES for name in tl.PACK_NAMES]


def _check_pack(monkeypatch, cu, total, world, layout, exchange, variant, seed) -> list:
    activation, with_bias, x_dtype, w_dtype = variant
    x, w, b, dy = tl.inputs(total, 3, x_dtype, w_dtype, with_bias, seed)
    run = tl.simulate(monkeypatch, cu, total, world, layout, exchange, x, w, b, dy, activation)
    errors = tl.output_errors(run["y"], run["dx"], cu, x, w, b, dy, activation)
    dw, db = (tl.rank_order_sum(run["partials"], i) for i in (0, 1))
    errors += tl.partials_errors(dw, db, cu, x, w, b, dy, activation,
                                 tl.UNIT_ROUNDOFF[w_dtype], tl.partial_terms(total, world, w_dtype))
    return [f"{variant}: {e}" for e in errors]


@pytest.mark.parametrize("world,layout,exchange,name", CASES,
                         ids=[f"P{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_every_rank_in_one_process_matches_the_single_rank_run(monkeypatch, world, layout,
                                                               exchange, name):
    """Two variants a pack (activation, bias, dtypes), fresh inputs each."""
    rng = random.Random(f"{SEED}/{world}/{layout}/{exchange}/{name}")
    total, cu = tl.pack(name, world, layout, rng)
    errors = []
    for _ in range(2):
        variant = tl.VARIANTS[rng.randrange(len(tl.VARIANTS))]
        errors += _check_pack(monkeypatch, cu, total, world, layout, exchange, variant,
                              rng.randrange(2**31))
    assert not errors, f"seed {SEED}, S={total}, cu={cu}: " + "; ".join(errors)


@pytest.mark.parametrize("variant", tl.VARIANTS, ids=lambda v: f"{v[0]}-bias{v[1]}-"
                         f"{str(v[2])[6:]}-{str(v[3])[6:]}")
def test_every_variant_on_pieces_of_one_and_two_tokens(monkeypatch, variant):
    """SiLU and none, bias and none, every dtype, on the pack where front and tail windows
    merge (pieces of 1-2 tokens inside a document) and a document ends at a piece end."""
    rng = random.Random(f"{SEED}/{variant}")
    errors = []
    for world, layout, name in ((4, "zigzag", "tiny_pieces_1_2"), (3, "contiguous",
                                                                   "doc_ends_at_piece_end")):
        total, cu = tl.pack(name, world, layout, rng)
        for exchange in tl.EXCHANGES:
            errors += _check_pack(monkeypatch, cu, total, world, layout, exchange, variant,
                                  rng.randrange(2**31))
    assert not errors, f"seed {SEED}: " + "; ".join(errors)


def test_random_packs(monkeypatch):
    """Random packs (documents of 0-6 tokens, S up to 50), P 1..6, both layouts."""
    rng = random.Random(SEED)
    for _ in range(40):
        world, layout = rng.randint(1, 6), rng.choice(tl.LAYOUTS)
        total = rng.randint(0, 50)
        cu = tl.random_cu(total, rng, 0 if rng.random() < 0.2 else 1, 6) if total else [0]
        variant = tl.VARIANTS[rng.randrange(len(tl.VARIANTS))]
        errors = _check_pack(monkeypatch, cu, total, world, layout, rng.choice(tl.EXCHANGES),
                             variant, rng.randrange(2**31))
        assert not errors, f"seed {SEED}, P={world} {layout} S={total} cu={cu}: {errors}"


def test_repeated_steps_are_bitwise_equal(monkeypatch):
    """The same inputs twice: y, dx and every rank's partials the same bits."""
    rng = random.Random(SEED)
    total, cu = tl.pack("short_docs_at_boundaries", 3, "zigzag", rng)
    x, w, b, dy = tl.inputs(total, 4, torch.bfloat16, torch.float32, True, rng.randrange(2**31))
    runs = [tl.simulate(monkeypatch, cu, total, 3, "zigzag", "p2p", x, w, b, dy, "silu")
            for _ in range(2)]
    assert torch.equal(runs[0]["y"], runs[1]["y"]) and torch.equal(runs[0]["dx"], runs[1]["dx"])
    for (dw0, db0), (dw1, db1) in zip(runs[0]["partials"], runs[1]["partials"]):
        assert torch.equal(dw0, dw1) and torch.equal(db0, db1)


# --------------------------------------------------------------------------- host checks


def test_supported_query():
    f = kcp.is_cake_causal_conv1d_det_train_kcp_supported
    assert f("cpu", dtype=torch.float64) and f("cpu", dtype=torch.bfloat16)
    assert not f("cpu", dtype=torch.int32)
    assert not f("cuda:0", dtype=torch.bfloat16)  # no CUDA here
    assert not f(None) and not f(0)


def test_token_ranges_checks_its_arguments():
    r = kcp.cake_causal_conv1d_det_train_kcp_token_ranges
    assert r(10, 2, 0, "zigzag") == [(0, 2), (7, 10)]
    with pytest.raises(ValueError, match="layout: expected one of 'contiguous', 'zigzag'"):
        r(10, 2, 0, "ring")
    with pytest.raises(ValueError, match="rank: expected 0 <= rank < world_size = 2, got 2"):
        r(10, 2, 2)


def test_a_step_refuses_before_it_communicates():
    """The local checks need no process group and raise before any exchange (a plan without a
    group would fail its group check last, after every argument check)."""
    plan = tl.Plan._for_rank([0, 10], 10, 4, torch.float64, 2, 0)
    x = torch.zeros(5, 4, dtype=torch.float64)
    w = torch.zeros(4, 4, dtype=torch.float64)
    call = kcp.cake_causal_conv1d_det_kcp
    with pytest.raises(TypeError, match="plan: expected a CakeCausalConv1dDetKcpPlan, got dict"):
        call(x, w, None, {"not": "a plan"})
    with pytest.raises(ValueError, match="activation: expected one of 'silu', None"):
        call(x, w, None, plan, activation="relu")
    with pytest.raises(TypeError, match="x: expected dtype float64"):
        call(x.float(), w, None, plan)
    with pytest.raises(ValueError, match=r"x: expected shape \[L, C\] = \[5, 4\]"):
        call(torch.zeros(6, 4, dtype=torch.float64), w, None, plan)
    with pytest.raises(ValueError, match="x: expected a contiguous tensor"):
        call(torch.zeros(4, 5, dtype=torch.float64).t(), w, None, plan)
    with pytest.raises(ValueError, match=r"weight: expected \[C, 4\] with C = 4"):
        call(x, torch.zeros(4, 3, dtype=torch.float64), None, plan)
    with pytest.raises(ValueError, match=r"bias: expected \[C\] with C = 4"):
        call(x, w, torch.zeros(3, dtype=torch.float64), plan)
    with pytest.raises(ValueError, match="plan: built from other cu_seqlens"):
        call(x, w, None, plan, cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match="plan: built without a process group"):
        call(x, w, None, plan, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32))
    forward = kcp.cake_causal_conv1d_det_train_kcp_forward
    with pytest.raises(ValueError, match="out: must not share memory with x"):
        forward(x, w, None, plan, out=x)
    backward = kcp.cake_causal_conv1d_det_train_kcp_backward
    with pytest.raises(ValueError, match="dbias: given, but there is no bias"):
        backward(x, x.clone(), w, None, plan, dbias=torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"x_halo: expected \[12, 4\] on cpu"):
        backward(x, x.clone(), w, None, plan, x_halo=torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="grad_dtype: expected torch.float32 or the weight's"):
        backward(x, x.clone(), w, None, plan, grad_dtype=torch.float16)


def test_plan_build_needs_torch_distributed():
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        tl.Plan.build(torch.tensor([0, 4], dtype=torch.int32), 4, 2, torch.float64)


# --------------------------------------------------------------------------- the benchmark


def test_bench_script_is_import_safe_and_refuses_cleanly_without_cuda():
    script = REPO / "tools" / "bench" / "causal_conv1d_kcp.py"
    run = lambda *a: subprocess.run([sys.executable, str(script), *a], capture_output=True,
                                    text=True, timeout=120, cwd=REPO)
    out = run("--help")
    assert out.returncode == 0 and "--tokens-per-rank" in out.stdout
    out = run("--channels", "0")
    assert out.returncode == 2 and "--channels" in out.stderr
    out = run()  # no CUDA and not under torchrun: a clear refusal, not a traceback
    assert out.returncode == 2 and "CUDA" in out.stderr and "Traceback" not in out.stderr
    code = (f"import sys; sys.path.insert(0, {str(script.parent)!r}); "
            "import causal_conv1d_kcp; assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
