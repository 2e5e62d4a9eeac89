"""Fixtures and helpers of the LM head families' CPU tests (tests/lm_head).

The interpreter tests run the families' public entries on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, set per test by the ``interpreter`` fixture: the programs' kernel
sources are loaded on first use, so they become interpreted functions) and compare every output
and gradient with the float64 reference (``cake/_shared/lm_head_reference.py``). Triton's own
library functions (``tl.sum``, ``tl.cdiv``, ...) are made when triton is imported, so on a
machine without a GPU this conftest imports it with the variable set when no one has yet
(tests/gdn/conftest.py does the same), and checks that the triton of this process interprets
them: AOT compiles run ``triton_aot.py`` in subprocesses. On a GPU machine it leaves triton
alone (torch.compile's code generation would meet interpreted library functions there): the
interpreter tests skip and the GPU tests (``-m gpu``, test_lm_head_gpu.py) run the libraries.

Tolerances (``assert_values``: |got - ref| <= atol x scale + rtol |ref| per element;
``assert_grad``: max |got - ref| <= tol x max |ref|), against float64 from the same (already
rounded) inputs:

* fp32 loss, log-prob, entropy: atol 2e-5, rtol 1e-5. The logits are fp32 dot products of length
  D <= 256 of N(0, 1) x N(0, 0.1) values (IEEE fp32 dots): ~1e-6 absolute error each, which the
  log-sum-exp and the log-probs inherit; softcap c adds ~1e-7 c through tanh. Observed <= 6e-6
  (c = 30). A sum over T tokens scales atol by T.
* fp32 gradients: 2e-5 x max|ref| (observed <= 2.4e-6: dz stays fp32 for fp32 inputs).
* fp16 values: as fp32 (fp16 products are exact and summed in fp32, so the forward is as accurate).
* fp16 gradients: 2e-3 x max|ref|: dz is rounded to fp16 (2^-11 relative) before the gradient
  GEMMs and the result rounded once more (observed <= 5.9e-4). The upstream gradients of fp16
  cases are loss-scaled by ``FP16_GRAD_SCALE`` (2^10), as fp16 training scales its loss
  (``torch.amp.GradScaler``): unscaled, a mean over ~100 tokens makes dz ~ 1e-5, below fp16's
  normal range (6.1e-5), where its spacing is a fixed 6e-8, as in eager torch's fp16 backward of
  the logits; 2^10 keeps dz normal and the gradients far from fp16's 65504.

Upstream gradients and any other ``torch.randn`` of a test come from torch's global generator,
seeded per test from its id (``seeded``): fresh values per case, the same on every run.

docs/architecture.md#accuracy-budgets's budget on the GPU is rel <= 1e-3 for the loss and log-probabilities in bf16
(the self-test's); the interpreter runs fp32 and fp16 only (it mishandles bf16 dots and rounding).
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if "triton" not in sys.modules and not torch.cuda.is_available():
    _before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:  # the interpreter tests skip (the fixture below says why)
        pass
    finally:
        if _before is None:
            os.environ.pop("TRITON_INTERPRET")
        else:
            os.environ["TRITON_INTERPRET"] = _before
try:
    import triton.language as tl
    _INTERPRETED = type(tl.sum).__name__ == "InterpretedFunction"
except ImportError:
    _INTERPRETED = False

MODES = ("det", "nondet")
FP16_GRAD_SCALE = 2.0**10
VALUE_TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-5, 1e-5)}  # (atol, rtol)
GRADIENT_TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3}               # x max|ref|


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter on: the families take CPU tensors and run their programs there."""
    if not _INTERPRETED:
        pytest.skip("triton is missing, or was imported without its interpreter (before "
                    "tests/lm_head/conftest.py, or on a GPU machine)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture(autouse=True)
def seeded(request):
    """torch's global generator seeded from the test's id (its upstream gradients)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def grad_scale(dtype) -> float:
    """The loss scale of a case's upstream gradients (FP16_GRAD_SCALE for fp16)."""
    return FP16_GRAD_SCALE if dtype == torch.float16 else 1.0


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the host allocates for the kernels to fill (intermediates, outputs,
    gradients) starts as NaN: an element a kernel does not write shows up."""
    from cake._shared import lm_head

    def new(shape, dtype, like):
        return like.new_full(shape, float("nan"), dtype=dtype)

    monkeypatch.setattr(lm_head, "_new", new)


@pytest.fixture(scope="session")
def family_jit_cache(tmp_path_factory) -> Path:
    """The JIT cache every family test of the session shares (tests/rmsnorm/conftest.py)."""
    path = tmp_path_factory.getbasetemp() / "cake-family-jit-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def family(mode: str):
    """(loss entry, logprob entry, module class, package) of one family."""
    if mode == "det":
        import cake.cake_lm_head_det_train as module
        return (module.cake_lm_head_det_train_loss, module.cake_lm_head_det_train_logprob,
                module.CakeLMHeadDetLoss, module)
    import cake.cake_lm_head_nondet_train as module
    return (module.cake_lm_head_nondet_train_loss, module.cake_lm_head_nondet_train_logprob,
            module.CakeLMHeadNondetLoss, module)


def make_inputs(tokens, dim, vocab, dtype=torch.float32, *, ignore_frac=0.2, ignore_index=-100,
                wscale=0.1, seed=0) -> tuple:
    """Fresh seeded inputs (hidden, weight, labels); labels hold 0 and V - 1 and about
    ``ignore_frac`` of ignore_index."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, dim, generator=gen).to(dtype)
    weight = (torch.randn(vocab, dim, generator=gen) * wscale).to(dtype)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    if tokens >= 2:
        labels[0], labels[1] = 0, vocab - 1
    if tokens:
        ignored = torch.rand(tokens, generator=gen) < ignore_frac
        ignored[:2] = False
        labels[ignored] = ignore_index
    return hidden, weight, labels


def assert_values(name, got, ref, dtype, scale=1.0):
    atol, rtol = VALUE_TOLERANCE[dtype]
    assert got.dtype == torch.float32, f"{name}: dtype {got.dtype}, expected float32"
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    got64 = got.detach().double()
    assert bool(torch.isfinite(got64).all()), f"{name}: non-finite values"
    err = (got64 - ref).abs()
    bound = atol * scale + rtol * ref.abs()
    if err.numel():
        worst = int(err.argmax())
        assert bool((err <= bound).all()), \
            f"{name}: max err {err.max().item():.3e}, bound there {bound.flatten()[worst]:.3e}"


def assert_grad(name, got, ref, dtype):
    assert got is not None, f"{name}: no gradient"
    assert got.dtype == dtype, f"{name}: dtype {got.dtype}, expected {dtype}"
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    got64 = got.detach().double()
    assert bool(torch.isfinite(got64).all()), f"{name}: non-finite gradient"
    if ref.numel() == 0:
        return
    scale = ref.abs().max().item()
    err = (got64 - ref).abs().max().item()
    assert err <= GRADIENT_TOLERANCE[dtype] * max(scale, 1e-30), \
        f"{name}: max err {err:.3e} vs {GRADIENT_TOLERANCE[dtype]:.0e} x max|ref| {scale:.3e}"


def run_loss(loss_fn, hidden, weight, labels, grad, **options) -> tuple:
    """(loss, dhidden, dweight) of one autograd call with upstream ``grad``."""
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = loss_fn(h, w, labels, **options)
    loss.backward(grad)
    return loss.detach(), h.grad, w.grad


def run_logprob(logprob_fn, hidden, weight, labels, grad_lp, grad_ent, **options) -> tuple:
    """(logprob, entropy or None, dhidden, dweight) of one autograd call; ``grad_ent`` None
    leaves the entropy out of the loss (or not returned without ``return_entropy``)."""
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    out = logprob_fn(h, w, labels, **options)
    lp, ent = out if options.get("return_entropy") else (out, None)
    total = (lp * grad_lp).sum()
    if grad_ent is not None:
        total = total + (ent * grad_ent).sum()
    total.backward()
    return lp.detach(), None if ent is None else ent.detach(), h.grad, w.grad
