"""Fixtures and helpers of the Gated DeltaNet families' CPU tests (tests/gdn).

The interpreter tests run the families' public entries on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``, set per test by the ``interpreter`` fixture: kernel sources
are loaded on first use, so they become interpreted functions) and compare every output and
gradient with the float64 reference (``cake/_shared/gdn_reference.py``). Triton's own library
functions (``tl.sum``, ``tl.cumsum``, ...) are made when triton is imported, so on a machine
without a GPU this conftest imports it with the variable set (and unsets it again): in this
process triton then interprets its library; no other test of such a session compiles Triton
in-process (AOT compiles run ``triton_aot.py`` in subprocesses).

``CAKE_SLOW=1`` also runs the larger matrices (module-level skips in the test files: the
``slow`` marker is not registered in tests/conftest.py).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
# Only on a machine without a GPU: there the session compiles no Triton kernel in-process (on a
# GPU, torch.compile's Triton code generation would meet interpreted library functions), and
# the GPU tests (-m gpu) cover the families instead.
_INTERPRETED = "triton" not in sys.modules and not torch.cuda.is_available()
if _INTERPRETED:
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

import torch.nn.functional as F  # noqa: E402

SLOW = os.environ.get("CAKE_SLOW") == "1"
FAMILIES = ("det", "nondet")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread for each GDN test, restored after: the float64 recurrence runs
    thousands of tiny ops, which torch's thread pool made 10x slower (8.1 s instead of 0.5 s for
    six documents) on the shared two-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter on: the families take CPU tensors and run their programs there."""
    pytest.importorskip("triton")
    if not _INTERPRETED:
        pytest.skip("the interpreter tests run where triton is first imported by "
                    "tests/gdn/conftest.py on a machine without a GPU")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture(scope="session")
def family_jit_cache(tmp_path_factory) -> Path:
    """The JIT cache every family test of the session shares (tests/rmsnorm/conftest.py)."""
    path = tmp_path_factory.getbasetemp() / "cake-family-jit-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def family(mode: str):
    """(module, functional, forward helper, backward helper, plan type) of one family."""
    if mode == "det":
        import cake.cake_gdn_det_train as module
        return (module, module.cake_gdn_det, module.cake_gdn_det_train_forward,
                module.cake_gdn_det_train_backward, module.CakeGDNDetPlan)
    import cake.cake_gdn_nondet_train as module
    return (module, module.cake_gdn_nondet, module.cake_gdn_nondet_train_forward,
            module.cake_gdn_nondet_train_backward, module.CakeGDNNondetPlan)


def make_inputs(lens, heads, value_heads, head_dim, *, dtype=torch.float32, l2norm=False,
                h0=True, beta_dtype=torch.float32, seed=0, head_v=None) -> dict:
    """Seeded inputs for documents of ``lens`` tokens (K = ``head_dim``, V = ``head_v``,
    default K). Without qk_l2norm, q and k are scaled to |k| ~ 1 so that the delta rule stays
    well conditioned (as trained models keep it); g mixes mild decay (memory across chunks)
    with strong steps; beta in (0, 1)."""
    head_v = head_dim if head_v is None else head_v
    gen = torch.Generator().manual_seed(seed)
    tokens, documents = sum(lens), len(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = rn(tokens, heads, head_dim), rn(tokens, heads, head_dim)
    if not l2norm:
        q, k = q / math.sqrt(head_dim), k / math.sqrt(head_dim)
    v = rn(tokens, value_heads, head_v)
    g = F.logsigmoid(rn(tokens, value_heads) * 1.5 + 3.0)
    beta = torch.sigmoid(rn(tokens, value_heads)).to(beta_dtype)
    initial = rn(documents, value_heads, head_dim, head_v) * 0.5 if h0 else None
    do = rn(tokens, value_heads, head_v).to(dtype)
    dht = rn(documents, value_heads, head_dim, head_v)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "g": g, "beta": beta,
            "h0": initial, "do": do, "dht": dht, "cu": cu}


def errors(found: torch.Tensor, reference: torch.Tensor) -> tuple:
    """(rel-RMS, max-abs / max|ref|) of ``found`` against a float64 ``reference``, each with a
    floor of 1e-2 on the reference's scale: it matters only where the exact gradient is (nearly)
    zero (dg of a one-token document without an initial state), where fp32 rounding of
    cancelling terms leaves ~1e-9."""
    diff = found.double() - reference
    scale_rms = max(reference.norm().item() / math.sqrt(max(reference.numel(), 1)), 1e-2)
    scale_max = max(reference.abs().max().item() if reference.numel() else 0.0, 1e-2)
    rms = diff.norm().item() / math.sqrt(max(diff.numel(), 1))
    return rms / scale_rms, (diff.abs().max().item() if diff.numel() else 0.0) / scale_max
