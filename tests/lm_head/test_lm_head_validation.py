"""The LM head families' public surface on CPU: the names (docs/architecture.md#names's multi-entry form),
bad inputs (each a clear error naming the argument, raised before anything is allocated or
launched), docs/architecture.md#names's determinism rule for nondet, the support and memory queries, and the
memory the calls allocate against what the query reports."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import MODES, family, make_inputs, run_logprob, run_loss
from fake_gpu import cuda

from cake._shared import lm_head
from cake.core import plans

NAMES = {
    "det": ["CakeLMHeadDetLogprobFunction", "CakeLMHeadDetLoss", "CakeLMHeadDetLossFunction",
            "cake_lm_head_det_train_logprob", "cake_lm_head_det_train_loss",
            "cake_lm_head_det_train_workspace_bytes", "is_cake_lm_head_det_train_supported"],
    "nondet": ["CakeLMHeadNondetLogprobFunction", "CakeLMHeadNondetLoss",
               "CakeLMHeadNondetLossFunction", "cake_lm_head_nondet_train_logprob",
               "cake_lm_head_nondet_train_loss", "cake_lm_head_nondet_train_workspace_bytes",
               "is_cake_lm_head_nondet_train_supported"],
}


@pytest.mark.parametrize("mode", MODES)
def test_public_names_follow_the_multi_entry_form(mode):
    module = family(mode)[3]
    assert sorted(module.__all__) == NAMES[mode]
    title = mode.capitalize()
    assert not hasattr(module, f"cake_lm_head_{mode}")  # no functional in the multi-entry form
    for entry in ("Loss", "Logprob"):
        function = getattr(module, f"CakeLMHead{title}{entry}Function")
        assert issubclass(function, torch.autograd.Function)
        assert function.__module__ == f"cake.cake_lm_head_{mode}_train._function"
    assert issubclass(getattr(module, f"CakeLMHead{title}Loss"), torch.nn.Module)


# --------------------------------------------------------------------------- bad inputs


@pytest.fixture
def no_launch(monkeypatch):
    """Fails a test whose call reaches the forward's allocations and launches."""
    def forward(*args, **kwargs):
        raise AssertionError("the call reached the forward's launches")
    monkeypatch.setattr(lm_head.Programs, "forward", forward)


def _misaligned(tokens, dim):
    return torch.randn(tokens * dim + 1)[1:].view(tokens, dim)


BAD = [
    ("D", TypeError, "hidden: expected dtype bfloat16 or float16 or float32, got float64",
     lambda h, w, y: ((h.double(), w.double(), y), {})),
    ("D%8", ValueError, r"hidden: expected D \(the last dim\) a multiple of 8 in \[8, 16384\], "
     r"got float32\[8, 12\]", lambda h, w, y: ((torch.randn(8, 12), torch.randn(40, 12), y), {})),
    ("D>16384", ValueError, "a multiple of 8 in",
     lambda h, w, y: ((torch.randn(1, 16392), torch.randn(2, 16392), y[:1]), {})),
    ("weight-dtype", TypeError, "weight: expected dtype float32, got float16",
     lambda h, w, y: ((h, w.half(), y), {})),
    ("weight-D", ValueError, r"weight: expected \[V, 16\] \(D of hidden\)",
     lambda h, w, y: ((h, torch.randn(40, 24), y), {})),
    ("V>262144", ValueError, r"weight: expected V \(the first dim\) in \[1, 262144\]",
     lambda h, w, y: ((h, torch.zeros(262145, 16), y), {})),
    ("V=0", ValueError, r"in \[1, 262144\]", lambda h, w, y: ((h, w[:0], y), {})),
    ("labels-dtype", TypeError, "labels: expected dtype int64, got int32",
     lambda h, w, y: ((h, w, y.int()), {})),
    ("labels-shape", ValueError, r"labels: expected int64 \[8\] \(hidden's leading dims\)",
     lambda h, w, y: ((h, w, y[:5]), {})),
    ("labels-rank", ValueError, r"labels: expected shape \[8\] int64",
     lambda h, w, y: ((h, w, y.view(2, 4)), {})),
    ("labels-strided", ValueError, "labels: expected a contiguous tensor",
     lambda h, w, y: ((h.view(2, 4, 16), w, torch.zeros(4, 2, dtype=torch.long).t()), {})),
    ("hidden-strided", ValueError, "hidden: expected a contiguous tensor",
     lambda h, w, y: ((torch.randn(16, 8).t(), torch.randn(40, 8), y), {})),
    ("hidden-misaligned", ValueError, "hidden: expected a 16-byte aligned data pointer",
     lambda h, w, y: ((_misaligned(8, 16), w, y), {})),
    ("weight-misaligned", ValueError, "weight: expected a 16-byte aligned data pointer",
     lambda h, w, y: ((h, _misaligned(40, 16), y), {})),
    ("device", ValueError, "weight: expected a CPU tensor, got float32\\[40, 16\\] on cuda:0",
     lambda h, w, y: ((h, cuda(w), y), {})),
    ("ignore_index", TypeError, "ignore_index: expected an int, got float",
     lambda h, w, y: ((h, w, y), {"ignore_index": -100.0})),
    ("ignore_index-bool", TypeError, "ignore_index: expected an int, got bool",
     lambda h, w, y: ((h, w, y), {"ignore_index": True})),
    ("softcap", ValueError, r"logit_softcap: expected a finite float in \[2\^-60, 2\^60\], "
     "got -1.0", lambda h, w, y: ((h, w, y), {"logit_softcap": -1.0})),
    ("softcap-inf", ValueError, "logit_softcap: expected a finite float",
     lambda h, w, y: ((h, w, y), {"logit_softcap": float("inf")})),
    ("check_labels", TypeError, "check_labels: expected a bool, got int",
     lambda h, w, y: ((h, w, y), {"check_labels": 1})),
    ("accumulator-dtype", TypeError, "dweight_accumulator: expected dtype float32, got float64",
     lambda h, w, y: ((h, w, y), {"dweight_accumulator": torch.zeros(40, 16).double()})),
    ("accumulator-shape", ValueError, r"dweight_accumulator: expected float32 \[40, 16\]",
     lambda h, w, y: ((h, w, y), {"dweight_accumulator": torch.zeros(41, 16)})),
    ("accumulator-overlap", ValueError, "dweight_accumulator: must not share memory with weight",
     lambda h, w, y: ((h, w, y), {"dweight_accumulator": w})),
]


@pytest.mark.usefixtures("interpreter", "no_launch")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("error,match,make", [pytest.param(*c[1:], id=c[0]) for c in BAD])
def test_bad_input_is_named_before_any_launch(make, error, match, mode):
    loss_fn, logprob_fn = family(mode)[:2]
    hidden, weight, labels = make_inputs(8, 16, 40, seed=20)
    args, options = make(hidden, weight, labels)
    with pytest.raises(error, match=match):
        loss_fn(*args, **options)
    with pytest.raises(error, match=match):
        logprob_fn(*args, **options)


@pytest.mark.usefixtures("interpreter", "no_launch")
@pytest.mark.parametrize("mode", MODES)
def test_bad_options_of_one_entry(mode):
    loss_fn, logprob_fn, module_type, _ = family(mode)
    hidden, weight, labels = make_inputs(8, 16, 40, seed=21)
    with pytest.raises(ValueError, match="reduction: expected one of 'mean', 'sum', 'none', "
                                         "got 'avg'"):
        loss_fn(hidden, weight, labels, reduction="avg")
    for value, error in ((0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                         (2.0**61, ValueError), (True, TypeError), ("1", TypeError)):
        with pytest.raises(error, match="temperature: expected"):
            logprob_fn(hidden, weight, labels, temperature=value)
    with pytest.raises(TypeError, match="return_entropy: expected a bool, got NoneType"):
        logprob_fn(hidden, weight, labels, return_entropy=None)
    with pytest.raises(ValueError, match="reduction: expected one of"):
        module_type(reduction="avg")
    with pytest.raises(ValueError, match="logit_softcap: expected a finite float"):
        module_type(logit_softcap=0.0)


@pytest.mark.usefixtures("interpreter", "no_launch")
def test_too_many_tokens(monkeypatch):
    monkeypatch.setattr(lm_head, "MAX_TOKENS", 10)
    hidden, weight, labels = make_inputs(11, 8, 20, seed=22)
    with pytest.raises(ValueError, match=r"hidden: expected at most 10 tokens"):
        family("det")[0](hidden, weight, labels)


@pytest.mark.parametrize("mode", MODES)
def test_cpu_tensors_without_the_interpreter_are_refused(mode, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    hidden, weight, labels = make_inputs(8, 16, 40, seed=23)
    with pytest.raises(ValueError, match=r"hidden: expected a CUDA tensor, got float32\[8, 16\] "
                                         "on cpu"):
        family(mode)[0](hidden, weight, labels)


@pytest.mark.usefixtures("no_launch")
@pytest.mark.parametrize("mode", MODES)
def test_label_check_is_refused_under_graph_capture(mode, monkeypatch):
    """check_labels=True reads the labels' range to the host: refused (before any launch) while
    a CUDA graph is being captured, naming the remedy."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(plans, "is_capturing", lambda: True)
    hidden, weight, labels = (cuda(t) for t in make_inputs(8, 16, 40, seed=24))
    with pytest.raises(RuntimeError, match="labels: check_labels=True reads the labels' range "
                                           "on the host.*pass check_labels=False"):
        family(mode)[0](hidden, weight, labels)


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("mode", MODES)
def test_dweight_accumulator_is_refused_under_torch_compile(mode):
    loss_fn = family(mode)[0]
    hidden, weight, labels = make_inputs(4, 16, 30, seed=25)
    accumulator = torch.zeros(30, 16)

    def step(h):
        return loss_fn(h, weight, labels, dweight_accumulator=accumulator)

    with pytest.raises(RuntimeError, match="dweight_accumulator: not supported under "
                                           "torch.compile"):
        torch.compile(step, fullgraph=True)(hidden.requires_grad_())


# --------------------------------------------------------------------------- docs/architecture.md#names


@pytest.mark.usefixtures("interpreter")
def test_nondet_alert_comes_before_the_backward_allocates_or_launches(monkeypatch):
    """Under torch.use_deterministic_algorithms(True) the nondet backward raises PyTorch's alert
    (RuntimeError) before it allocates or launches anything; the forward (deterministic) runs;
    with warn_only=True it warns once per call and runs; det raises nothing."""
    loss_fn, logprob_fn = family("nondet")[:2]
    hidden, weight, labels = make_inputs(20, 16, 64, seed=26)
    real_new, real_zeros, real_backward = lm_head._new, lm_head._zeros, lm_head.Programs.backward
    allocated, backwards = [], []
    monkeypatch.setattr(lm_head, "_new", lambda *a: allocated.append(a) or real_new(*a))
    monkeypatch.setattr(lm_head, "_zeros", lambda *a: allocated.append(a) or real_zeros(*a))
    monkeypatch.setattr(lm_head.Programs, "backward",
                        lambda *a, **k: backwards.append(a) or real_backward(*a, **k))
    previous = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        for value in (loss_fn(hidden.clone().requires_grad_(), weight, labels),
                      logprob_fn(hidden.clone().requires_grad_(), weight, labels).sum()):
            allocated.clear()
            with pytest.raises(RuntimeError, match="cake_lm_head_nondet_train's backward does "
                                                   "not have a deterministic implementation.*"
                                                   r"use cake\.cake_lm_head_det_train"):
                value.backward()
            assert allocated == [] and backwards == []
        run_loss(family("det")[0], hidden, weight, labels, torch.randn(()))
        backwards.clear()
        torch.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_loss(loss_fn, hidden, weight, labels, torch.randn(()))
            run_logprob(logprob_fn, hidden, weight, labels, torch.randn(20), None)
        alerts = [w for w in caught if "does not have a deterministic implementation" in
                  str(w.message)]
        assert len(alerts) == 2 and len(backwards) == 2
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


# --------------------------------------------------------------------------- queries


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible (test_lm_head_gpu.py)")
@pytest.mark.parametrize("mode", MODES)
def test_supported_is_false_without_a_gpu(mode):
    module = family(mode)[3]
    query = getattr(module, f"is_cake_lm_head_{mode}_train_supported")
    assert query() is False
    assert query(dtype=torch.float64) is False


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("entry", ["loss-mean", "loss-none", "logprob", "logprob-entropy",
                                   "accumulator"])
def test_workspace_bytes_is_what_the_calls_allocate(entry, dtype, mode, monkeypatch):
    """The query's forward, saved and backward parts equal what the host allocates besides the
    inputs, outputs and gradients (upstream gradients as autograd gives them from .sum(): broadcast
    views, so each is copied), and the public query is their peak."""
    loss_fn, logprob_fn, _, module = family(mode)
    tokens, dim, vocab = 70, 40, 300
    hidden, weight, labels = make_inputs(tokens, dim, vocab, dtype, seed=27)
    allocated = []  # (address, bytes): holding the tensors would make autograd copy .grad

    def spy(allocate):
        def allocated_by(*args):
            tensor = allocate(*args)
            allocated.append((tensor.data_ptr(), tensor.nbytes))
            return tensor
        return allocated_by

    monkeypatch.setattr(lm_head, "_new", spy(lm_head._new))
    monkeypatch.setattr(lm_head, "_zeros", spy(lm_head._zeros))
    plans.unused_pointer(hidden.device)  # made once a process, not per call
    accumulator = torch.zeros(vocab, dim) if entry == "accumulator" else None
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    logprob, entropy = entry.startswith("logprob"), entry == "logprob-entropy"
    reduction = "none" if entry == "loss-none" else "mean"
    if logprob:
        out = logprob_fn(h, w, labels, return_entropy=entropy)
        outputs = list(out) if entropy else [out]
    else:
        outputs = [loss_fn(h, w, labels, reduction=reduction, dweight_accumulator=accumulator)]
    kept = {t.data_ptr() for t in outputs}
    forward = sum(size for address, size in allocated if address not in kept)
    allocated.clear()
    sum(o.sum() for o in outputs).backward()
    grads = {g.data_ptr() for g in (h.grad, w.grad) if g is not None}
    backward = sum(size for address, size in allocated if address not in grads)
    tiles = module._function._PROGRAMS.tiles(dtype)
    parts = lm_head.workspace(tiles, mode == "det", tokens=tokens, dim=dim, vocab=vocab,
                              fp32=dtype == torch.float32, logprob=logprob, reduction=reduction,
                              entropy=entropy, accumulate=accumulator is not None)
    assert (forward, backward) == (parts["forward"], parts["backward"]), parts
    query = getattr(module, f"cake_lm_head_{mode}_train_workspace_bytes")
    found = query(hidden, weight, entry="logprob" if logprob else "loss", reduction=reduction,
                  return_entropy=entropy, accumulate_dweight=accumulator is not None)
    assert found == max(parts["forward"], parts["saved"] + parts["backward"])


def test_workspace_at_a_training_shape():
    """bf16 T = 32768, D = 4096, V = 151936: the fp32 dweight accumulator (V x D x 4, 2.3 GiB)
    and dhidden accumulator (T x D x 4, 512 MiB) dominate; the rest is O(T); nothing is T x V."""
    tokens, dim, vocab = 32768, 4096, 151936
    tiles = family("det")[3]._function._PROGRAMS.tiles(torch.bfloat16)
    parts = lm_head.workspace(tiles, True, tokens=tokens, dim=dim, vocab=vocab, fp32=False,
                              logprob=False, reduction="mean", entropy=False, accumulate=False)
    dense = tokens * dim * 4 + vocab * dim * 4
    assert parts["saved"] == 2 * tokens * 4 + 4
    assert 0 < parts["backward"] - dense <= 3 * tokens * 4
    assert parts["forward"] <= 64 * tokens * 4  # 16 splits x 3 statistics, row statistics
    accumulated = lm_head.workspace(tiles, True, tokens=tokens, dim=dim, vocab=vocab, fp32=False,
                                    logprob=False, reduction="mean", entropy=False,
                                    accumulate=True)
    assert parts["backward"] - accumulated["backward"] == vocab * dim * 4


@pytest.mark.usefixtures("interpreter")
def test_workspace_bytes_query_checks_its_arguments():
    import cake.cake_lm_head_det_train as det

    hidden, weight, _ = make_inputs(8, 16, 40, seed=28)
    assert det.cake_lm_head_det_train_workspace_bytes(hidden[:0], weight) == 4  # the count
    with pytest.raises(ValueError, match="entry: expected one of 'loss', 'logprob'"):
        det.cake_lm_head_det_train_workspace_bytes(hidden, weight, entry="both")
    with pytest.raises(ValueError, match="return_entropy: the loss entry has no entropy"):
        det.cake_lm_head_det_train_workspace_bytes(hidden, weight, return_entropy=True)
    with pytest.raises(TypeError, match="weight: expected dtype float32"):
        det.cake_lm_head_det_train_workspace_bytes(hidden, weight.half())
    with pytest.raises(TypeError, match="accumulate_dweight: expected a bool"):
        det.cake_lm_head_det_train_workspace_bytes(hidden, weight, accumulate_dweight=None)
