"""Both LM head families' public entries under Triton's interpreter (CPU tensors, fp32 and fp16)
against the float64 reference (``F.linear`` then ``F.cross_entropy`` / ``log_softmax``) and its
autograd: every output and gradient compared by name, with the tolerances of conftest.py.

The matrix: every reduction x softcap x mode on one token block and each reduction on several
(V never a tile multiple, D with a K tail), the largest promised shape (T = 256, D = 256,
V = 4089) once per mode, one token, labels at 0 and V - 1 and ~20 % ignored in every random
case, an ignore_index that is a valid class, all tokens ignored and T = 0 for both entries,
log-probs at temperatures 1 / 0.7 / 1.3 with and without softcap and entropy, the entropy's
gradient alone, fp16 (loss-scaled upstream gradients, conftest.py), leading dims, the dweight
accumulator, out-of-range labels with the check off, logits near +-600, the split policies,
det bitwise repeatability, the module and torch.compile. Every buffer the host allocates for the
kernels starts as NaN (``poisoned``).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (GRADIENT_TOLERANCE, MODES, assert_grad, assert_values, family, grad_scale,
                      make_inputs, run_logprob, run_loss)

from cake._shared import lm_head
from cake._shared import lm_head_reference as R

pytestmark = pytest.mark.usefixtures("interpreter", "poisoned")
# numpy's warnings inside the interpreter for the intended 0 / 0 (a mean of nothing) and exp
# overflow (logits near 600): the tests check those values.
INTENDED = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


def loss_grad(labels: torch.Tensor, reduction: str) -> torch.Tensor:
    return torch.randn(labels.shape) if reduction == "none" else torch.randn(())


def check_loss(mode, hidden, weight, labels, *, dtype=torch.float32, **options) -> None:
    loss_fn = family(mode)[0]
    reduction = options.get("reduction", "mean")
    grad = loss_grad(labels, reduction) * grad_scale(dtype)
    loss, dh, dw = run_loss(loss_fn, hidden, weight, labels, grad, **options)
    ref, rdh, rdw = R.reference_loss_with_grads(hidden, weight, labels, grad, **options)
    scale = labels.numel() if reduction == "sum" else 1.0
    assert_values("loss", loss, ref, dtype, scale=scale)
    assert_grad("dhidden", dh, rdh, dtype)
    assert_grad("dweight", dw, rdw, dtype)


def check_logprob(mode, hidden, weight, labels, *, entropy_grad=True, logprob_grad=True,
                  dtype=torch.float32, **options) -> None:
    logprob_fn = family(mode)[1]
    entropy = options.get("return_entropy", False)
    scale = grad_scale(dtype)
    g_lp = torch.randn(labels.shape) * scale if logprob_grad else torch.zeros(labels.shape)
    g_ent = torch.randn(labels.shape) * scale if entropy and entropy_grad else None
    lp, ent, dh, dw = run_logprob(logprob_fn, hidden, weight, labels, g_lp, g_ent, **options)
    rlp, rent, rdh, rdw = R.reference_logprob_with_grads(
        hidden, weight, labels, g_lp, g_ent,
        **{k: v for k, v in options.items() if k != "return_entropy"})
    assert_values("logprob", lp, rlp, dtype)
    if entropy:
        assert_values("entropy", ent, rent, dtype)
    assert_grad("dhidden", dh, rdh, dtype)
    assert_grad("dweight", dw, rdw, dtype)


# --------------------------------------------------------------------------- the loss

# Every reduction x softcap on one token block (V % tile != 0); on several blocks with a K tail
# each reduction once, the softcap alternating (the interpreter's time goes to the larger shape).
LOSS_CASES = [pytest.param((37, 64, 300), reduction, softcap, id=f"T37-D64-V300-{reduction}-{cap}")
              for reduction in ("mean", "sum", "none")
              for softcap, cap in ((None, "nocap"), (4.0, "cap4"))]
LOSS_CASES += [pytest.param((150, 136, 1000), reduction, softcap,
                            id=f"T150-D136-V1000-{reduction}-{cap}")
               for reduction, softcap, cap in (("mean", 4.0, "cap4"), ("sum", None, "nocap"),
                                               ("none", 4.0, "cap4"))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,reduction,softcap", LOSS_CASES)
def test_loss(shape, reduction, softcap, mode):
    check_loss(mode, *make_inputs(*shape, seed=sum(shape)), reduction=reduction,
               logit_softcap=softcap)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_one_token(reduction, mode):
    """T = 1, its label V - 1 (the last, partial vocabulary tile), softcap; and log-probs with
    entropy."""
    hidden, weight, labels = make_inputs(1, 24, 77, seed=29)
    labels[0] = 76
    check_loss(mode, hidden, weight, labels, reduction=reduction, logit_softcap=2.5)
    check_logprob(mode, hidden, weight, labels, temperature=0.6, return_entropy=True)


def test_loss_at_the_largest_shape():
    """T = 256, D = 256, V = 4096 - 7 (the issue's largest), softcap 30: the nondet loss (the det
    kernels at this shape: test_logprob_at_the_largest_shape, whose backward runs the same
    dhidden and dweight kernels with the entropy's coefficients as well)."""
    check_loss("nondet", *make_inputs(256, 256, 4089, seed=1), reduction="mean",
               logit_softcap=30.0)


@pytest.mark.parametrize("mode", MODES)
def test_loss_with_an_ignore_index_that_is_a_class(mode):
    """ignore_index 0: tokens labelled 0 are ignored, not class 0."""
    hidden, weight, labels = make_inputs(40, 32, 200, ignore_index=0, seed=2)
    labels[1] = 0
    check_loss(mode, hidden, weight, labels, ignore_index=0)


@INTENDED
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_and_no_tokens(mode, reduction):
    """Every label ignored, and T = 0: mean NaN, sum 0, none zeros (as torch), zero gradients."""
    loss_fn = family(mode)[0]
    for tokens in (6, 0):
        hidden, weight, labels = make_inputs(tokens, 16, 70, seed=3)
        labels.fill_(-100)
        grad = loss_grad(labels, reduction)
        loss, dh, dw = run_loss(loss_fn, hidden, weight, labels, grad, reduction=reduction)
        ref = torch.nn.functional.cross_entropy(hidden.double() @ weight.double().T, labels,
                                                reduction=reduction)
        assert loss.shape == ref.shape
        assert torch.equal(loss.isnan(), ref.isnan()) and torch.equal(
            loss.nan_to_num(), ref.float().nan_to_num()), (tokens, loss, ref)
        assert dh.shape == hidden.shape and torch.equal(dh, torch.zeros_like(dh))
        assert dw.shape == weight.shape and torch.equal(dw, torch.zeros_like(dw))


# --------------------------------------------------------------------------- log-probabilities


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature,softcap,entropy", [
    (1.0, None, False), (0.7, None, True), (1.3, 5.0, True), (1.0, 5.0, False)],
    ids=["t1", "t0.7-entropy", "t1.3-cap5-entropy", "t1-cap5"])
def test_logprob(temperature, softcap, entropy, mode):
    check_logprob(mode, *make_inputs(100, 136, 700, seed=4), temperature=temperature,
                  logit_softcap=softcap, return_entropy=entropy)


def test_logprob_at_the_largest_shape():
    """T = 256, D = 256, V = 4089 with entropy, softcap 30 and temperature 0.9: the det family (the
    nondet kernels at this shape: test_loss_at_the_largest_shape)."""
    check_logprob("det", *make_inputs(256, 256, 4089, seed=5), temperature=0.9,
                  logit_softcap=30.0, return_entropy=True)


@pytest.mark.parametrize("mode", MODES)
def test_entropy_gradient_alone(mode):
    """The log-probs take no part in the loss (their gradient is 0), the entropy does; and the
    log-probs alone when the entropy is returned but not used."""
    inputs = make_inputs(60, 40, 333, seed=6)
    check_logprob(mode, *inputs, return_entropy=True, logprob_grad=False, logit_softcap=3.0)
    check_logprob(mode, *inputs, return_entropy=True, entropy_grad=False, temperature=1.1)


@pytest.mark.parametrize("mode", MODES)
def test_logprob_all_ignored_and_no_tokens(mode):
    logprob_fn = family(mode)[1]
    for tokens in (5, 0):
        hidden, weight, labels = make_inputs(tokens, 16, 70, seed=7)
        labels.fill_(-100)
        g = torch.randn(tokens)
        lp, ent, dh, dw = run_logprob(logprob_fn, hidden, weight, labels, g, g,
                                      return_entropy=True)
        for value in (lp, ent):
            assert value.shape == (tokens,) and torch.equal(value, torch.zeros(tokens))
        assert torch.equal(dh, torch.zeros_like(hidden))
        assert torch.equal(dw, torch.zeros_like(weight))


@pytest.mark.parametrize("mode", MODES)
def test_leading_dims_are_tokens(mode):
    """hidden [B, S, D] with labels [B, S]; a shifted 1-D labels view (8-byte aligned only)."""
    hidden, weight, labels = make_inputs(2 * 45, 24, 150, seed=8)
    check_loss(mode, hidden.view(2, 45, 24), weight, labels.view(2, 45), reduction="none")
    check_logprob(mode, hidden.view(2, 45, 24), weight, labels.view(2, 45),
                  return_entropy=True)
    padded = torch.cat([labels.new_zeros(1), labels[:-1]])
    check_loss(mode, hidden[:-1], weight, padded[1:], reduction="sum", logit_softcap=2.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", ["loss", "logprob"])
def test_per_token_outputs_may_be_modified_in_place(mode, entry):
    """The per-token outputs (loss with reduction none, log-probabilities) are the autograd
    function's own tensors, not views: a caller may scale them in place, and the gradients are
    those of the scaled outputs."""
    hidden, weight, labels = make_inputs(2 * 30, 24, 150, seed=18)
    functional = family(mode)[0 if entry == "loss" else 1]
    options = {"reduction": "none"} if entry == "loss" else {}
    grad = torch.randn(2, 30)
    found = []
    for in_place in (True, False):
        h = hidden.clone().view(2, 30, 24).requires_grad_(True)
        out = functional(h, weight, labels.view(2, 30), **options)
        if in_place:
            out.mul_(2.0)
        else:
            out = out * 2.0
        (out * grad).sum().backward()
        found.append(h.grad)
    assert torch.equal(found[0], found[1])


# --------------------------------------------------------------------------- fp16, accumulator


@pytest.mark.parametrize("mode", MODES)
def test_fp16(mode):
    """D = 200 = 3 x 64 + 8: a K and D tail for the 16-bit tiles."""
    inputs = make_inputs(150, 200, 600, torch.float16, seed=9)
    check_loss(mode, *inputs, dtype=torch.float16, reduction="mean", logit_softcap=10.0)
    check_logprob(mode, *make_inputs(100, 64, 500, torch.float16, seed=10),
                  dtype=torch.float16, temperature=0.8, return_entropy=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_dweight_accumulator(dtype, mode):
    """The backward adds dweight into the fp32 accumulator and gives the weight no .grad."""
    loss_fn, logprob_fn = family(mode)[:2]
    hidden, weight, labels = make_inputs(70, 48, 260, dtype, seed=11)
    start = torch.randn(260, 48)
    accumulator = start.clone()
    g = torch.randn(()) * grad_scale(dtype)
    _, dh, dw = run_loss(loss_fn, hidden, weight, labels, g, reduction="sum",
                         dweight_accumulator=accumulator)
    _, rdh, rdw = R.reference_loss_with_grads(hidden, weight, labels, g, reduction="sum")
    assert dw is None
    assert_grad("dhidden", dh, rdh, dtype)
    # fp32 additions into the accumulator: its own rounding (1e-6 of its values) on top
    added = accumulator.double() - start.double()
    tol = GRADIENT_TOLERANCE[dtype] * rdw.abs().max().item() + 1e-6 * start.abs().max().item()
    assert (added - rdw).abs().max().item() <= tol
    accumulator = start.clone()
    g_lp = torch.randn(70) * grad_scale(dtype)
    _, _, dh, dw = run_logprob(logprob_fn, hidden, weight, labels, g_lp, None,
                               dweight_accumulator=accumulator)
    _, _, _, rdw = R.reference_logprob_with_grads(hidden, weight, labels, g_lp)
    assert dw is None
    tol = GRADIENT_TOLERANCE[dtype] * rdw.abs().max().item() + 1e-6 * start.abs().max().item()
    assert ((accumulator.double() - start.double()) - rdw).abs().max().item() <= tol


# --------------------------------------------------------------------------- labels out of range


@pytest.mark.parametrize("mode", MODES)
def test_labels_out_of_range_unchecked(mode):
    """check_labels=False: a label outside [0, V) gives NaN for its token and no gradient from
    it, the other tokens exact (reference: those tokens ignored). V = 2 tiles + 1; the bad labels
    sit just past the end, far away and negative. For ``mean`` they count in the denominator
    (they are not ignore_index)."""
    loss_fn, logprob_fn = family(mode)[:2]
    tokens, vocab = 60, 129
    hidden, weight, labels = make_inputs(tokens, 32, vocab, seed=12)
    bad = [5, 6, 7, 8]
    labels[bad] = torch.tensor([vocab, vocab + 1000, 10**12, -7])
    clean = labels.clone()
    clean[bad] = -100
    good = torch.ones(tokens, dtype=torch.bool)
    good[bad] = False
    g = torch.randn(tokens)
    loss, dh, dw = run_loss(loss_fn, hidden, weight, labels, g, reduction="none",
                            check_labels=False)
    ref, rdh, rdw = R.reference_loss_with_grads(hidden, weight, clean, g, reduction="none")
    assert bool(loss[bad].isnan().all())
    assert_values("loss (good tokens)", loss[good], ref[good], torch.float32)
    assert torch.equal(dh[bad], torch.zeros_like(dh[bad]))
    assert_grad("dhidden", dh, rdh, torch.float32)
    assert_grad("dweight", dw, rdw, torch.float32)
    gs = torch.randn(())
    for reduction in ("sum", "mean"):
        loss, dh, dw = run_loss(loss_fn, hidden, weight, labels, gs, reduction=reduction,
                                check_labels=False)
        assert math.isnan(loss.item())
        _, rdh, rdw = R.reference_loss_with_grads(hidden, weight, clean, gs, reduction="sum")
        if reduction == "mean":
            count = int((labels != -100).sum())
            rdh, rdw = rdh / count, rdw / count
        assert_grad(f"dhidden ({reduction})", dh, rdh, torch.float32)
        assert_grad(f"dweight ({reduction})", dw, rdw, torch.float32)
    g_lp, g_ent = torch.randn(tokens), torch.randn(tokens)
    lp, ent, dh, dw = run_logprob(logprob_fn, hidden, weight, labels, g_lp, g_ent,
                                  return_entropy=True, check_labels=False)
    assert bool(lp[bad].isnan().all()) and bool(ent[bad].isnan().all())
    g_lp[bad], g_ent[bad] = 0.0, 0.0
    rlp, rent, rdh, rdw = R.reference_logprob_with_grads(hidden, weight, clean, g_lp, g_ent)
    assert_values("logprob (good tokens)", lp[good], rlp[good], torch.float32)
    assert_values("entropy (good tokens)", ent[good], rent[good], torch.float32)
    assert_grad("dhidden", dh, rdh, torch.float32)
    assert_grad("dweight", dw, rdw, torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_labels_out_of_range_checked_raise_before_any_launch(mode, monkeypatch):
    loss_fn, logprob_fn = family(mode)[:2]
    launched = []
    monkeypatch.setattr(lm_head.Programs, "forward",
                        lambda *a, **k: launched.append(a))
    hidden, weight, labels = make_inputs(10, 16, 50, seed=13)
    labels[3] = 50
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 50\) or ignore_index "
                                         r"\(-100\), got 50 at flat position 3"):
        loss_fn(hidden, weight, labels)
    labels[3] = -1
    with pytest.raises(ValueError, match="got -1 at flat position 3"):
        logprob_fn(hidden, weight, labels)
    assert launched == []


# --------------------------------------------------------------------------- conditioning


@INTENDED
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("offset", [-600.0, 600.0])
def test_logits_near_600(offset, mode):
    """Every logit near +-600 (exp overflows fp32 at 88): the online max keeps the forward finite,
    and padding columns (V = 2 x 64 + 3), whose recomputed logit is 0 and whose exp(0 - lse) is
    inf at lse ~ -600, stay out of the gradients. Logits ~600 carry ~1e-4 absolute fp32 rounding
    in any fp32 implementation and dhidden[:, 0] = 600 sum_v dz_v (sum ~ 0) is ill-conditioned:
    the gradients are held to "finite and at most 4x eager fp32 PyTorch's error" on top of the
    usual tolerance."""
    tokens, dim, vocab = 40, 16, 131
    gen = torch.Generator().manual_seed(14)
    hidden = torch.cat([torch.ones(tokens, 1), torch.randn(tokens, dim - 1, generator=gen)], 1)
    weight = torch.randn(vocab, dim, generator=gen) * 0.5
    weight[:, 0] = offset
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    g_lp, g_ent = torch.randn(tokens, generator=gen), torch.randn(tokens, generator=gen)
    lp, ent, dh, dw = run_logprob(family(mode)[1], hidden, weight, labels, g_lp, g_ent,
                                  return_entropy=True)
    rlp, rent, rdh, rdw = R.reference_logprob_with_grads(hidden, weight, labels, g_lp, g_ent)
    assert_values("logprob", lp, rlp, torch.float32, scale=10.0)  # ulp(600) = 6e-5
    assert_values("entropy", ent, rent, torch.float32, scale=10.0)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    elp, eent = R.reference_logprob(h, w, labels, compute_dtype=torch.float32)
    ((elp * g_lp).sum() + (eent * g_ent).sum()).backward()
    for name, ours, eager, ref in (("dhidden", dh, h.grad, rdh), ("dweight", dw, w.grad, rdw)):
        ours_err = (ours.double() - ref).abs().max().item()
        eager_err = (eager.double() - ref).abs().max().item()
        bound = 4 * eager_err + GRADIENT_TOLERANCE[torch.float32] * ref.abs().max().item()
        assert math.isfinite(ours_err) and ours_err <= bound, \
            f"{name}: max err {ours_err:.3e}, eager fp32 torch {eager_err:.3e}"


# --------------------------------------------------------------------------- determinism, splits


@pytest.mark.parametrize("entry", ["loss", "logprob"])
def test_det_is_bitwise_repeatable(entry):
    loss_fn, logprob_fn = family("det")[:2]
    hidden, weight, labels = make_inputs(100, 64, 500, seed=15)
    g = torch.randn(100)
    runs = []
    for _ in range(2):
        if entry == "loss":
            runs.append(run_loss(loss_fn, hidden, weight, labels, g, reduction="none",
                                 logit_softcap=3.0))
        else:
            runs.append(run_logprob(logprob_fn, hidden, weight, labels, g, g.flip(0),
                                    return_entropy=True, temperature=0.8))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("policy", ["fwd1-dh1", "fwd1-dhN", "fwdN-dh1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_split_policies(policy, dtype, monkeypatch):
    """The split counts follow T and V; each path forced: one forward split holding several
    tiles, the dhidden kernel's single split (its last step casts into dhidden; for fp32 dhidden
    is its accumulator) and split partials summed in order by the cast kernel."""
    if policy.startswith("fwd1"):
        monkeypatch.setattr(lm_head, "FWD_MIN_SPLITS", 1)
        monkeypatch.setattr(lm_head, "FWD_TARGET_PROGRAMS", 1)
    if policy.endswith("dh1"):
        monkeypatch.setattr(lm_head, "DH_MAX_SPLITS", 1)
    tokens, vocab = 90, 530
    tiles = family("det")[3]._function._PROGRAMS.tiles(dtype)
    assert (lm_head.forward_splits(tokens, vocab, tiles)[0] == 1) == policy.startswith("fwd1")
    assert (lm_head.dh_splits(tokens, vocab, tiles)[0] == 1) == policy.endswith("dh1")
    check_logprob("det", *make_inputs(tokens, 40, vocab, dtype, seed=16), dtype=dtype,
                  return_entropy=True, logit_softcap=6.0)


# --------------------------------------------------------------------------- module, compile


@pytest.mark.parametrize("mode", MODES)
def test_the_module_holds_only_options(mode):
    _, _, module_type, _ = family(mode)
    module = module_type(ignore_index=0, reduction="sum", logit_softcap=7.0)
    assert list(module.parameters()) == [] and list(module.buffers()) == []
    assert "reduction='sum'" in repr(module)
    hidden, weight, labels = make_inputs(30, 16, 90, ignore_index=0, seed=17)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    module(h, w, labels).backward()
    _, rdh, rdw = R.reference_loss_with_grads(hidden, weight, labels, torch.ones(()),
                                              ignore_index=0, reduction="sum",
                                              logit_softcap=7.0)
    assert_grad("dhidden", h.grad, rdh, torch.float32)
    assert_grad("dweight", w.grad, rdw, torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_runs_the_opaque_ops(mode):
    """fullgraph torch.compile of a step using both entries: the same bits as eager."""
    loss_fn, logprob_fn = family(mode)[:2]
    hidden, weight, labels = make_inputs(50, 32, 170, seed=18)
    advantages = torch.randn(50)

    def step(h, w):
        lp, ent = logprob_fn(h, w, labels, temperature=0.9, return_entropy=True)
        return loss_fn(h, w, labels, logit_softcap=4.0) - (lp * advantages).sum() + ent.mean()

    results = []
    for runner in (step, torch.compile(step, fullgraph=True)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        runner(h, w).backward()
        results.append((h.grad, w.grad))
    if mode == "det":
        assert all(torch.equal(e, c) for e, c in zip(*results))
    else:  # atomics: the order of the fp32 additions may differ
        for e, c in zip(*results):
            assert (e - c).abs().max() <= 1e-6 * e.abs().max()


@pytest.mark.parametrize("mode", MODES)
def test_checkpoint_gives_the_same_gradients(mode):
    loss_fn = family(mode)[0]
    hidden, weight, labels = make_inputs(40, 24, 100, seed=19)

    def step(use_checkpoint):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        call = (lambda a, b: loss_fn(a, b, labels))
        loss = (torch.utils.checkpoint.checkpoint(call, h, w, use_reentrant=False)
                if use_checkpoint else call(h, w))
        loss.backward()
        return h.grad, w.grad

    plain, checkpointed = step(False), step(True)
    for a, b in zip(plain, checkpointed):
        assert (a - b).abs().max() <= (1e-6 * a.abs().max() if mode == "nondet" else 0)
