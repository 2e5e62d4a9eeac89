"""The LM head families on a GPU (``-m gpu``; all passed on an H100 with the prebuilt sm_90a
libraries, 2026-12-05). Every output and gradient of both entries and both modes against the
float64 reference (``F.linear`` then ``F.cross_entropy`` / ``log_softmax``) within the
accuracy budget (docs/architecture.md#accuracy-budgets), the self-test's tolerances (``cake/_shared/lm_head_selftest.py``): loss, log-probs
and entropy norm-wise relative <= 1e-3 (16-bit products are exact in the fp32 logits, so ~1e-6
is expected); gradients <= 1e-2 (dz is rounded to the 16-bit dtype, 2^-8 for bf16, before the
gradient GEMMs, and the result once more). Ignored tokens give exactly 0 and all-zero gradient
rows; softcap, temperature, entropy; edge shapes (T = 0 and 1, V = 1 and 262144, D = 8 and
16384, V x D past 2^31 elements); out-of-range labels with the check off; the dweight
accumulator; det bitwise repeatable across runs and streams; a step captured in a CUDA graph;
torch.compile. Inputs are fresh per case (seeded), gradients start unset (autograd allocates
them), and every output is checked finite; fp16 upstream gradients are loss-scaled as in the CPU
tests (conftest.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import MODES, family, grad_scale, make_inputs

from cake._shared import lm_head_reference as R
from cake._shared.lm_head_selftest import GRADIENT_TOLERANCE, VALUE_TOLERANCE

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _inputs(tokens, dim, vocab, dtype, seed, **options) -> tuple:
    """make_inputs (labels at 0 and V - 1, ~20 % ignored) on the GPU; weights scaled so the
    logits spread over a few units, as a trained LM head's do."""
    hidden, weight, labels = make_inputs(tokens, dim, vocab, torch.float32, seed=seed,
                                         wscale=dim**-0.5 * 3, **options)
    return hidden.to("cuda", dtype), weight.to("cuda", dtype), labels.cuda()


def _close(name, found, expected, tolerance) -> None:
    assert found is not None, f"{name}: missing"
    assert found.shape == expected.shape, f"{name}: {tuple(found.shape)} vs {tuple(expected.shape)}"
    assert bool(torch.isfinite(found).all()), f"{name}: non-finite elements"
    if expected.numel() == 0:
        return
    error = ((found.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
    assert error <= tolerance, f"{name}: norm-wise relative error {error:.2e} > {tolerance:.0e}"


def _loss(mode, hidden, weight, labels, grad, **options) -> dict:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = family(mode)[0](h, w, labels, **options)
    loss.backward(grad)
    return {"loss": loss.detach(), "dhidden": h.grad, "dweight": w.grad}


def _logprob(mode, hidden, weight, labels, g_lp, g_ent, **options) -> dict:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = family(mode)[1](h, w, labels, return_entropy=g_ent is not None, **options)
    lp, ent = out if g_ent is not None else (out, None)
    total = (lp * g_lp).sum() + (0 if ent is None else (ent * g_ent).sum())
    total.backward()
    found = {"logprob": lp.detach(), "dhidden": h.grad, "dweight": w.grad}
    if ent is not None:
        found["entropy"] = ent.detach()
    return found


def _check(found: dict, reference: dict, dtype) -> None:
    for name, expected in reference.items():
        value = name in ("loss", "logprob", "entropy")
        if not value:
            assert found[name].dtype == dtype, f"{name}: {found[name].dtype}, expected {dtype}"
        _close(name, found[name], expected, VALUE_TOLERANCE if value else GRADIENT_TOLERANCE)


def _ignored_rows_are_zero(found: dict, labels, ignore_index=-100) -> None:
    ignored = (labels == ignore_index).reshape(-1)
    assert bool(ignored.any())
    dh = found["dhidden"].reshape(-1, found["dhidden"].shape[-1])
    assert torch.equal(dh[ignored], torch.zeros_like(dh[ignored])), "dhidden of ignored tokens"
    for name in ("logprob", "entropy"):
        if name in found:
            values = found[name].reshape(-1)[ignored]
            assert torch.equal(values, torch.zeros_like(values)), f"{name} of ignored tokens"


LOSS_CASES = [  # (T, D, V, dtype, reduction, softcap)
    pytest.param(1000, 1024, 5003, BF16, "mean", 30.0, id="T1000-D1024-V5003-bf16-mean-cap30"),
    pytest.param(1000, 1024, 5003, BF16, "sum", None, id="T1000-D1024-V5003-bf16-sum"),
    pytest.param(37, 136, 300, BF16, "none", 4.0, id="T37-D136-V300-bf16-none-cap4"),
    # 141 token blocks of 64: the det dhidden kernel unsplit (its last step casts to bf16)
    pytest.param(9000, 128, 1000, BF16, "mean", None, id="T9000-D128-V1000-bf16-mean"),
    pytest.param(2048, 4096, 32003, BF16, "mean", 30.0, id="T2048-D4096-V32003-bf16-mean-cap30"),
    pytest.param(300, 200, 3001, FP16, "none", 10.0, id="T300-D200-V3001-fp16-none-cap10"),
    pytest.param(200, 256, 3001, FP32, "mean", None, id="T200-D256-V3001-fp32-mean"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens,dim,vocab,dtype,reduction,softcap", LOSS_CASES)
def test_loss_against_float64(tokens, dim, vocab, dtype, reduction, softcap, mode):
    hidden, weight, labels = _inputs(tokens, dim, vocab, dtype, seed=tokens + dim + vocab)
    grad = (torch.randn(tokens, device="cuda") if reduction == "none"
            else torch.randn((), device="cuda")) * grad_scale(dtype)
    found = _loss(mode, hidden, weight, labels, grad, reduction=reduction,
                  logit_softcap=softcap)
    loss, dh, dw = R.reference_loss_with_grads(hidden, weight, labels, grad,
                                               reduction=reduction, logit_softcap=softcap)
    _check(found, {"loss": loss, "dhidden": dh, "dweight": dw}, dtype)
    _ignored_rows_are_zero(found, labels)


LOGPROB_CASES = [  # (T, D, V, dtype, temperature, softcap, entropy)
    pytest.param(1000, 1024, 5003, BF16, 0.8, None, True, id="T1000-D1024-V5003-bf16-t0.8-ent"),
    pytest.param(1000, 1024, 5003, BF16, 1.0, 30.0, False, id="T1000-D1024-V5003-bf16-cap30"),
    pytest.param(513, 2048, 50257, BF16, 1.3, 30.0, True,
                 id="T513-D2048-V50257-bf16-t1.3-cap30-ent"),
    pytest.param(300, 200, 3001, FP16, 0.7, 10.0, True, id="T300-D200-V3001-fp16-t0.7-cap10-ent"),
    pytest.param(200, 256, 3001, FP32, 1.0, None, True, id="T200-D256-V3001-fp32-ent"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens,dim,vocab,dtype,temperature,softcap,entropy", LOGPROB_CASES)
def test_logprob_against_float64(tokens, dim, vocab, dtype, temperature, softcap, entropy, mode):
    hidden, weight, labels = _inputs(tokens, dim, vocab, dtype, seed=tokens * 7 + vocab)
    g_lp = torch.randn(tokens, device="cuda") * grad_scale(dtype)
    g_ent = torch.randn(tokens, device="cuda") * grad_scale(dtype) if entropy else None
    options = {"temperature": temperature, "logit_softcap": softcap}
    found = _logprob(mode, hidden, weight, labels, g_lp, g_ent, **options)
    lp, ent, dh, dw = R.reference_logprob_with_grads(hidden, weight, labels, g_lp, g_ent,
                                                     **options)
    reference = {"logprob": lp, "dhidden": dh, "dweight": dw}
    if entropy:
        reference["entropy"] = ent
    _check(found, reference, dtype)
    _ignored_rows_are_zero(found, labels)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens,dim,vocab", [
    pytest.param(1, 64, 1000, id="T1"), pytest.param(5, 8, 1, id="V1-D8"),
    pytest.param(16, 64, 262144, id="V262144"), pytest.param(64, 16384, 1000, id="D16384"),
    pytest.param(130, 64, 129, id="V-one-past-a-tile")])
def test_edge_shapes(tokens, dim, vocab, mode):
    hidden, weight, labels = _inputs(tokens, dim, vocab, BF16, seed=tokens + vocab,
                                     ignore_frac=0.0)
    labels[-1] = vocab - 1
    grad = torch.randn((), device="cuda")
    found = _loss(mode, hidden, weight, labels, grad, logit_softcap=30.0)
    loss, dh, dw = R.reference_loss_with_grads(hidden, weight, labels, grad, logit_softcap=30.0)
    _check(found, {"loss": loss, "dhidden": dh, "dweight": dw}, BF16)
    g = torch.randn(tokens, device="cuda")
    found = _logprob(mode, hidden, weight, labels, g, g.flip(0), temperature=0.9)
    lp, ent, dh, dw = R.reference_logprob_with_grads(hidden, weight, labels, g, g.flip(0),
                                                     temperature=0.9)
    _check(found, {"logprob": lp, "entropy": ent, "dhidden": dh, "dweight": dw}, BF16)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_and_no_tokens(reduction, mode):
    """As torch: mean NaN, sum 0, none zeros; every gradient exactly 0."""
    for tokens in (9, 0):
        hidden, weight, labels = _inputs(tokens, 64, 300, BF16, seed=tokens)
        labels.fill_(-100)
        grad = (torch.randn(tokens, device="cuda") if reduction == "none"
                else torch.randn((), device="cuda"))
        found = _loss(mode, hidden, weight, labels, grad, reduction=reduction)
        expected = torch.nn.functional.cross_entropy(
            hidden.double() @ weight.double().T, labels, reduction=reduction).float()
        assert torch.equal(found["loss"].isnan(), expected.isnan()), (tokens, found["loss"])
        assert torch.equal(found["loss"].nan_to_num(), expected.nan_to_num())
        for name, like in (("dhidden", hidden), ("dweight", weight)):
            assert torch.equal(found[name], torch.zeros_like(like)), (tokens, name)


@pytest.mark.parametrize("mode", MODES)
def test_offsets_past_two_to_the_31(mode):
    """V x D = 2^32 elements (bf16 weight 8.6 GB): every weight offset from V/2 on passes 2^31, so
    an int32 offset anywhere in the kernels reads or writes the wrong rows. Labels at 0 and V - 1.
    The reference is computed in fp32 from the bf16 values in vocabulary chunks (exact products;
    fp32 sums of 16384 terms carry ~1e-6, far inside the budget); dweight is compared on its
    first and last 2048 rows and every label's row."""
    tokens, dim, vocab = 24, 16384, 262144
    gen = torch.Generator(device="cuda").manual_seed(31)
    hidden = torch.randn(tokens, dim, device="cuda", generator=gen).bfloat16()
    weight = (torch.randn(vocab, dim, device="cuda", generator=gen) * dim**-0.5 * 3).bfloat16()
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    labels[0], labels[1], labels[2] = 0, vocab - 1, -100
    found = _loss(mode, hidden, weight, labels, torch.ones((), device="cuda"))
    h = hidden.double()
    chunks = range(0, vocab, 32768)
    z = torch.cat([(hidden.float() @ weight[c:c + 32768].float().T).double() for c in chunks], 1)
    valid = labels != -100
    picked = torch.where(valid, labels, 0)
    loss_rows = torch.logsumexp(z, 1) - z.gather(1, picked[:, None]).squeeze(1)
    count = int(valid.sum())
    _close("loss", found["loss"], loss_rows[valid].sum() / count, VALUE_TOLERANCE)
    dz = torch.softmax(z, 1)
    dz[torch.arange(tokens, device="cuda"), picked] -= 1.0
    dz[~valid] = 0.0
    dz /= count
    dh = sum(dz[:, c:c + 32768] @ weight[c:c + 32768].double() for c in chunks)
    _close("dhidden", found["dhidden"], dh, GRADIENT_TOLERANCE)
    rows = torch.cat([torch.arange(2048, device="cuda"),
                      torch.arange(vocab - 2048, vocab, device="cuda"), labels[valid]])
    _close("dweight rows", found["dweight"][rows], dz[:, rows].T @ h, GRADIENT_TOLERANCE)


@pytest.mark.parametrize("mode", MODES)
def test_labels_out_of_range_unchecked(mode):
    """check_labels=False (the CUDA-graph setting): labels past V, far past it and negative give
    NaN for their tokens and no gradient, read nothing out of bounds (a fault would surface at the
    synchronize), and leave the other tokens exact."""
    tokens, vocab = 300, 1000
    hidden, weight, labels = _inputs(tokens, 128, vocab, BF16, seed=41)
    bad = torch.tensor([3, 4, 5, 6], device="cuda")
    labels[bad] = torch.tensor([vocab, vocab + 10**6, 10**15, -5], device="cuda")
    clean = labels.clone()
    clean[bad] = -100
    g = torch.randn(tokens, device="cuda")
    g[bad] = 0.0  # the reference ignores those tokens; their (NaN) loss takes no gradient
    found = _loss(mode, hidden, weight, labels, g, reduction="none", check_labels=False)
    torch.cuda.synchronize()
    assert bool(found["loss"][bad].isnan().all())
    good = torch.ones(tokens, dtype=torch.bool, device="cuda")
    good[bad] = False
    loss, dh, dw = R.reference_loss_with_grads(hidden, weight, clean, g, reduction="none")
    _close("loss (good tokens)", found["loss"][good], loss[good], VALUE_TOLERANCE)
    _check({k: found[k] for k in ("dhidden", "dweight")}, {"dhidden": dh, "dweight": dw}, BF16)
    assert torch.equal(found["dhidden"][bad], torch.zeros_like(found["dhidden"][bad]))
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 1000\) or "
                                         r"ignore_index \(-100\), got 1000 at flat position 3"):
        family(mode)[0](hidden, weight, labels)


@pytest.mark.parametrize("mode", MODES)
def test_dweight_accumulator(mode):
    """The backward adds dweight into the fp32 accumulator (main_grad) and gives the weight no
    gradient; dhidden as usual."""
    hidden, weight, labels = _inputs(500, 256, 4001, BF16, seed=51)
    start = torch.randn(4001, 256, device="cuda")
    accumulator = start.clone()
    found = _loss(mode, hidden, weight, labels, torch.ones((), device="cuda"),
                  dweight_accumulator=accumulator)
    assert found["dweight"] is None
    _, dh, dw = R.reference_loss_with_grads(hidden, weight, labels,
                                            torch.ones((), device="cuda"))
    _close("dhidden", found["dhidden"], dh, GRADIENT_TOLERANCE)
    _close("dweight (added)", accumulator.double() - start.double(), dw, GRADIENT_TOLERANCE)


def _det_step(hidden, weight, labels) -> dict:
    g = torch.linspace(-1, 1, labels.numel(), device="cuda")
    found = {f"loss/{k}": v for k, v in _loss("det", hidden, weight, labels, torch.ones(
        (), device="cuda"), logit_softcap=30.0).items()}
    found.update({f"logprob/{k}": v for k, v in _logprob(
        "det", hidden, weight, labels, g, g.flip(0), temperature=0.7).items()})
    return found


@pytest.mark.parametrize("tokens", [300, 9000], ids=["dh-split", "dh-unsplit"])
def test_det_is_bitwise_identical_across_runs_and_streams(tokens):
    hidden, weight, labels = _inputs(tokens, 512, 10007, BF16, seed=61)
    first = _det_step(hidden, weight, labels)
    second = _det_step(hidden, weight, labels)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        third = _det_step(hidden, weight, labels)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for name, value in first.items():
        assert torch.equal(value, second[name]) and torch.equal(value, third[name]), name


@pytest.mark.parametrize("mode", MODES)
def test_a_step_is_captured_in_a_cuda_graph(mode):
    """With check_labels=False a training step (mean loss + log-probs with entropy, forward and
    backward) has no host sync: captured once, replayed on new values copied into its inputs,
    it matches an eager step on those values (det bit for bit). check_labels=True is refused
    during the capture, before any launch, naming the remedy."""
    loss_fn, logprob_fn = family(mode)[:2]
    hidden, weight, labels = _inputs(700, 256, 3001, BF16, seed=71)
    advantages = torch.randn(700, device="cuda")
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

    def step(check_labels=False):
        lp, ent = logprob_fn(h, w, labels, return_entropy=True, check_labels=check_labels)
        loss = loss_fn(h, w, labels, logit_softcap=30.0, check_labels=check_labels)
        (loss - (lp * advantages).sum() - 0.01 * ent.sum()).backward()

    side = torch.cuda.Stream()  # warm-up (plans, libraries) off the default stream, as torch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            h.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    h.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(RuntimeError, match="check_labels=True reads the labels' range"):
            step(check_labels=True)
        step()
    fresh = _inputs(700, 256, 3001, BF16, seed=72)
    with torch.no_grad():
        for static, value in zip((h, w, labels), fresh):
            static.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    replayed = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    step()
    for name, eager, captured in zip(("dhidden", "dweight"), (h.grad, w.grad), replayed):
        if mode == "det":
            assert torch.equal(eager, captured), name
        else:  # atomics: the order of the fp32 additions may differ
            _close(name, captured, eager.double(), 1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_fullgraph(mode):
    """A compiled step using both entries (the opaque custom ops, inductor code around them)
    gives eager's gradients: the same bits for det (the upstream gradients are elementwise, so
    inductor cannot reorder them). The step's value goes through inductor's own sums, so it is
    held to fp32 rounding only."""
    loss_fn, logprob_fn = family(mode)[:2]
    hidden, weight, labels = _inputs(600, 512, 5003, BF16, seed=81)
    advantages = torch.randn(600, device="cuda")

    def step(h, w):
        lp, ent = logprob_fn(h, w, labels, temperature=0.9, return_entropy=True,
                             check_labels=False)
        loss = loss_fn(h, w, labels, logit_softcap=30.0, check_labels=False)
        return loss - (lp * advantages).sum() + ent.mean()

    results = []
    for runner in (step, torch.compile(step, fullgraph=True)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        value = runner(h, w)
        value.backward()
        results.append((value.detach(), h.grad, w.grad))
    _close("value", results[1][0], results[0][0].double(), 1e-6)
    for name, eager, compiled in zip(("dhidden", "dweight"), results[0][1:], results[1][1:]):
        if mode == "det":
            assert torch.equal(eager, compiled), name
        else:
            _close(name, compiled, eager.double(), 1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_support_query_and_devices(mode):
    loss_fn, _, _, module = family(mode)
    query = getattr(module, f"is_cake_lm_head_{mode}_train_supported")
    capability = torch.cuda.get_device_capability()
    built = capability in ((9, 0), (10, 0), (10, 3))
    for dtype in (BF16, FP16, FP32):
        assert query(dtype=dtype) is built
    assert query(dtype=torch.float64) is False
    hidden, weight, labels = _inputs(8, 16, 40, BF16, seed=91)
    with pytest.raises(ValueError, match="weight: expected a CUDA tensor"):
        loss_fn(hidden, weight.cpu(), labels)
    with pytest.raises(ValueError, match="labels: expected a CUDA tensor"):
        loss_fn(hidden, weight, labels.cpu())
