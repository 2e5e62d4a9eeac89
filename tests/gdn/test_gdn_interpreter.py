"""Both GDN families' public entries under Triton's interpreter (CPU tensors, fp32 and fp16)
against the float64 recurrence (``gdn_reference``) and its autograd: every output (o, the final
state) and every gradient (dq, dk, dv, dg, dbeta, d_initial_state).

Tolerances, per tensor, as (rel-RMS, max-abs / max|ref|) (``conftest.errors``):

* fp32 inputs: (1e-5, 2e-5). The programs' fp32 variant runs every ``tl.dot`` with
  ``input_precision="ieee"``; what remains is fp32 rounding in reductions of at most
  64 + max(K, V) terms inside a chunk, the 64x64 unit-triangular inverse (well conditioned
  here: beta in (0, 1), |k| ~ 1) and the state recurrence over a few chunks. Observed: up to
  5.4e-7 rel-RMS (dg) and 5.7e-7 max-abs (dv, dbeta); a wrong formula shows at >= 1e-3.
* fp16 inputs: (2e-3, 5e-3). The 16-bit programs round every dot operand (q, k, v and the
  fp32 intermediates W, U, V_new, the states, their gradients, Tm, E, ...) to the input dtype
  (2^-11 relative for fp16), as they round to bf16 (2^-8) on the GPU, where the budget is
  rel-RMS <= 1e-2 and max-abs <= 2e-2 x max|ref| (docs/families/gdn.md). Observed: up to
  6.0e-4 rel-RMS and 6.9e-4 max-abs.

The interpreter runs fp32 and fp16 only (it mishandles bf16 dots and rounding); bf16 is the GPU
tests' (``_selftest``) concern.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, SLOW, errors, family, make_inputs

from cake._shared import gdn as shared
from cake._shared.gdn_reference import gdn_reference, gdn_reference_backward

pytestmark = pytest.mark.usefixtures("interpreter")

TOLERANCE = {torch.float32: (1e-5, 2e-5), torch.float16: (2e-3, 5e-3)}
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state")
SOURCES = ("q", "k", "v", "g", "beta", "h0")


def reference(inputs: dict, *, l2norm: bool, final: bool) -> tuple:
    """(o, final state or None, gradients by name) of the float64 recurrence."""
    o, ht = gdn_reference(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                          inputs["cu"], initial_state=inputs["h0"], output_final_state=final,
                          qk_l2norm=l2norm)
    grads = gdn_reference_backward(inputs["do"], inputs["q"], inputs["k"], inputs["v"],
                                   inputs["g"], inputs["beta"], inputs["cu"],
                                   d_final_state=inputs["dht"] if final else None,
                                   initial_state=inputs["h0"], qk_l2norm=l2norm)
    return o, ht, dict(zip(GRADIENTS, grads))


def run_autograd(mode: str, inputs: dict, *, l2norm: bool, final: bool, plan: bool) -> tuple:
    """The family's functional with autograd: (o, final state, gradients by name)."""
    _, functional, _, _, plan_type = family(mode)
    leaves = {n: inputs[n].clone().requires_grad_() for n in SOURCES if inputs[n] is not None}
    arguments = {"plan": plan_type(inputs["cu"])} if plan else {"cu_seqlens": inputs["cu"]}
    o, ht = functional(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                       initial_state=leaves.get("h0"), output_final_state=final,
                       qk_l2norm=l2norm, **arguments)
    loss = (o.double() * inputs["do"].double()).sum()
    if final:
        loss = loss + (ht.double() * inputs["dht"].double()).sum()
    loss.backward()
    grads = {g: leaves[s].grad if s in leaves else None for g, s in zip(GRADIENTS, SOURCES)}
    return o.detach(), None if ht is None else ht.detach(), grads


def check_case(lens, heads, value_heads, head_dim, *, l2norm=False, h0=True, final=True,
               dtype=torch.float32, beta_dtype=torch.float32, seed=0, plan=True,
               head_v=None) -> dict:
    """Both families against the reference; returns the errors seen (name -> (rms, max))."""
    inputs = make_inputs(lens, heads, value_heads, head_dim, dtype=dtype, l2norm=l2norm, h0=h0,
                         beta_dtype=beta_dtype, seed=seed, head_v=head_v)
    o_ref, ht_ref, g_ref = reference(inputs, l2norm=l2norm, final=final)
    rms_limit, max_limit = TOLERANCE[dtype]
    seen = {}
    for mode in FAMILIES:
        o, ht, grads = run_autograd(mode, inputs, l2norm=l2norm, final=final, plan=plan)
        assert o.dtype == dtype and o.shape == inputs["v"].shape
        found = {"o": (o, o_ref)}
        if final:
            assert ht.dtype == torch.float32 and ht.shape == inputs["dht"].shape
            found["final_state"] = (ht, ht_ref)
        else:
            assert ht is None
        for name, source in zip(GRADIENTS, SOURCES):
            if g_ref[name] is None:
                assert grads[name] is None, name
                continue
            assert grads[name].dtype == inputs[source].dtype, (name, grads[name].dtype)
            assert grads[name].shape == inputs[source].shape, name
            assert torch.isfinite(grads[name]).all(), f"{mode} {name} has non-finite values"
            found[name] = (grads[name], g_ref[name])
        for name, (value, expected) in found.items():
            rms, worst = errors(value, expected)
            seen[f"{mode}/{name}"] = (rms, worst)
            assert rms <= rms_limit and worst <= max_limit, \
                f"{mode} {name}: rel-RMS {rms:.2e} (<= {rms_limit}), max {worst:.2e} " \
                f"(<= {max_limit})"
    return seen


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("length", [1, 2, 63, 64, 65, 130])
def test_document_lengths(length):
    """One document per call; the flags rotate so each length also covers a combination."""
    check_case([length], 1, 3, 64, h0=length in (1, 64, 130), final=length in (2, 64, 65),
               l2norm=length in (63, 65, 130), seed=100 + length)


@pytest.mark.parametrize("heads,value_heads", [(1, 1), (1, 3), (2, 4)])
def test_mixed_pack_per_head_layout(heads, value_heads):
    check_case([1, 2, 63, 64, 65, 130], heads, value_heads, 64, l2norm=True,
               seed=10 * heads + value_heads)


def test_many_tiny_documents_in_one_pack():
    """18 documents, 16 of them under 10 tokens (a grouped layout: the interpreter's time
    grows with chunks x value heads, and the head layouts have their own test)."""
    check_case([1, 3, 2, 1, 5, 1, 1, 4, 2, 7, 1, 2, 70, 1, 3, 1, 9, 1], 1, 2, 64, seed=3)


def test_empty_documents_in_a_pack():
    check_case([5, 0, 66, 0], 1, 3, 64, l2norm=True, seed=4)


@pytest.mark.parametrize("h0,final,l2norm", [(h0, f, l2) for h0 in (False, True)
                                             for f in (False, True) for l2 in (False, True)])
def test_every_flag_combination(h0, final, l2norm):
    check_case([30, 100], 1, 3, 64, h0=h0, final=final, l2norm=l2norm,
               seed=50 + 4 * h0 + 2 * final + l2norm)


@pytest.mark.parametrize("l2norm", [True, False])
def test_head_dim_128(l2norm):
    check_case([65, 130], 2, 4, 128, l2norm=l2norm, h0=l2norm, final=not l2norm, seed=6)


def test_fp16_inputs_with_fp32_beta():
    check_case([20, 110], 1, 3, 64, dtype=torch.float16, l2norm=True, seed=7)


def test_fp16_inputs_with_fp16_beta():
    """beta in q's dtype: converted to fp32 on the host (one copy), dbeta returned in fp16."""
    check_case([70], 2, 4, 64, dtype=torch.float16, beta_dtype=torch.float16, h0=False, seed=8)


def test_cu_seqlens_without_a_plan():
    check_case([1, 64, 65], 1, 2, 64, seed=9, plan=False)


@pytest.mark.parametrize("heads,value_heads,head_v", [(1, 1, 128), (2, 4, 192)])
def test_values_wider_than_keys(heads, value_heads, head_v):
    """V = m K: the kernels run m value heads of K columns per value head (shared.split); the
    caller's o, final state and every gradient in the caller's layout."""
    check_case([1, 63, 65, 7], heads, value_heads, 64, head_v=head_v, l2norm=True,
               seed=20 + head_v)


def test_the_remedy_for_values_narrower_than_keys_is_exact():
    """V < K is refused with a remedy: zero-pad v (and the initial state) to K columns and keep
    o[..., :V]. The padded columns of the state stay zero, so o, the final state and every
    gradient are those of the narrow problem."""
    _, functional, _, _, plan_type = family("det")
    inputs = make_inputs([3, 70], 1, 2, 64, head_v=32, l2norm=True, seed=24)
    o_ref, ht_ref, g_ref = reference(inputs, l2norm=True, final=True)

    def pad(x):
        return torch.nn.functional.pad(x, (0, 64 - x.shape[-1]))

    leaves = {n: inputs[n].clone().requires_grad_() for n in SOURCES}
    o, ht = functional(leaves["q"], leaves["k"], pad(leaves["v"]), leaves["g"], leaves["beta"],
                       initial_state=pad(leaves["h0"]), output_final_state=True, qk_l2norm=True,
                       plan=plan_type(inputs["cu"]))
    o, ht = o[..., :32], ht[..., :32]
    ((o * inputs["do"]).sum() + (ht * inputs["dht"]).sum()).backward()
    rms_limit, max_limit = TOLERANCE[torch.float32]
    for name, value, expected in [("o", o.detach(), o_ref), ("final_state", ht.detach(), ht_ref),
                                  *((n, leaves[s].grad, g_ref[n])
                                    for n, s in zip(GRADIENTS, SOURCES))]:
        rms, worst = errors(value, expected)
        assert rms <= rms_limit and worst <= max_limit, f"{name}: {rms:.2e}, {worst:.2e}"


def test_values_wider_than_keys_in_fp16_with_fp16_beta():
    """g and beta spread over the pieces (beta converted to fp32 there); dbeta summed back
    over the pieces into fp16."""
    check_case([70, 5], 1, 2, 64, head_v=128, dtype=torch.float16, beta_dtype=torch.float16,
               final=False, seed=21)


SLOW_CASES = [(lens, h, hv, d, l2, h0, fin)
              for lens in ([1], [64], [130], [1, 2, 63, 64, 65, 130], [3, 1, 1, 2, 129, 1, 5])
              for (h, hv) in ((1, 1), (1, 3), (2, 4))
              for d in (64, 128)
              for (l2, h0, fin) in ((True, True, True), (False, False, False))]


@pytest.mark.skipif(not SLOW, reason="the larger matrix: set CAKE_SLOW=1")
@pytest.mark.parametrize("lens,heads,value_heads,head_dim,l2norm,h0,final", SLOW_CASES)
def test_larger_matrix(lens, heads, value_heads, head_dim, l2norm, h0, final):
    check_case(lens, heads, value_heads, head_dim, l2norm=l2norm, h0=h0, final=final,
               seed=len(lens) + head_dim + value_heads)


@pytest.mark.skipif(not SLOW, reason="the larger matrix: set CAKE_SLOW=1")
def test_head_dim_256():
    check_case([70, 3], 1, 2, 256, l2norm=True, seed=17)


# --------------------------------------------------------------------------- the layouts


@pytest.mark.parametrize("mode", FAMILIES)
def test_batched_inputs_are_b_documents(mode):
    """[B, T, H, K] without cu_seqlens: B documents of T tokens, o shaped [B, T, HV, V]."""
    _, functional, _, _, _ = family(mode)
    batch, length = 2, 70
    inputs = make_inputs([length] * batch, 1, 2, 64, l2norm=True, seed=10)
    leaves = {n: inputs[n].clone().requires_grad_() for n in SOURCES}

    def batched(x):
        return x.reshape(batch, length, *x.shape[1:])

    o, ht = functional(*(batched(leaves[n]) for n in ("q", "k", "v", "g", "beta")),
                       initial_state=leaves["h0"], output_final_state=True, qk_l2norm=True)
    assert o.shape == (batch, length, 2, 64)
    ((o.reshape(-1, 2, 64) * inputs["do"]).sum() + (ht * inputs["dht"]).sum()).backward()
    o_ref, ht_ref, g_ref = reference(inputs, l2norm=True, final=True)
    limit = TOLERANCE[torch.float32]
    for value, expected in [(o.detach().reshape(-1, 2, 64), o_ref), (ht.detach(), ht_ref),
                            *((leaves[s].grad, g_ref[n]) for n, s in zip(GRADIENTS, SOURCES))]:
        rms, worst = errors(value, expected)
        assert rms <= limit[0] and worst <= limit[1]


@pytest.mark.parametrize("mode", FAMILIES)
@pytest.mark.parametrize("form", ["packed", "batched"])
def test_the_output_may_be_modified_in_place(mode, form):
    """o is the autograd function's own output, not a view of it: a caller may scale it in
    place, and the gradients are those of the scaled output."""
    _, functional, _, _, plan_type = family(mode)
    inputs = make_inputs([64, 64], 1, 2, 64, seed=17)
    leaves = {n: inputs[n].clone().requires_grad_() for n in SOURCES}
    args = [leaves[n] for n in ("q", "k", "v", "g", "beta")]
    if form == "packed":
        o, _ = functional(*args, plan=plan_type(inputs["cu"]))
    else:
        o, _ = functional(*(x.view(2, 64, *x.shape[1:]) for x in args))
    o.mul_(2.0)
    (o.reshape(inputs["do"].shape) * inputs["do"]).sum().backward()
    expected = {n: leaves[n].grad.clone() for n in ("q", "v")}
    for leaf in leaves.values():
        leaf.grad = None
    o, _ = functional(*args, plan=plan_type(inputs["cu"]))
    (o * 2.0 * inputs["do"]).sum().backward()
    for name, grad in expected.items():
        assert torch.equal(grad, leaves[name].grad), name


@pytest.mark.parametrize("mode", FAMILIES)
def test_no_tokens_launch_nothing_and_pass_the_state_through(mode):
    _, functional, forward, backward, plan_type = family(mode)
    plan = plan_type(torch.tensor([0, 0, 0], dtype=torch.int32))
    q, v = torch.zeros(0, 1, 64), torch.zeros(0, 2, 64)
    g = torch.zeros(0, 2)
    h0 = torch.randn(2, 2, 64, 64)
    o, ht = forward(q, q, v, g, g, plan=plan, initial_state=h0, output_final_state=True)
    assert o.shape == v.shape and torch.equal(ht, h0)
    dht = torch.randn(2, 2, 64, 64)
    grads = backward(v, q, q, v, g, g, plan=plan, initial_state=h0, d_final_state=dht)
    assert torch.equal(grads[-1], dht) and grads[0].shape == q.shape


@pytest.mark.parametrize("mode", FAMILIES)
def test_no_tokens_with_wider_values_take_the_queried_workspace(mode):
    """V = 2K without tokens: the query says 0 bytes and the backward takes that workspace (it
    launches and carves nothing); the state gradient passes through in the caller's layout."""
    module, _, _, backward, plan_type = family(mode)
    plan = plan_type(torch.tensor([0, 0, 0], dtype=torch.int32))
    q, v, g = torch.zeros(0, 1, 64), torch.zeros(0, 2, 128), torch.zeros(0, 2)
    query = getattr(module, f"cake_gdn_{mode}_train_backward_workspace_bytes")
    assert query(q, q, v, g, g, plan=plan) == 0
    h0, dht = torch.randn(2, 2, 64, 128), torch.randn(2, 2, 64, 128)
    grads = backward(v, q, q, v, g, g, plan=plan, initial_state=h0, d_final_state=dht,
                     workspace=torch.empty(0, dtype=torch.uint8))
    assert torch.equal(grads[-1], dht) and grads[2].shape == v.shape


# --------------------------------------------------------------------------- determinism, buffers


def _poisoned_helpers(mode: str, inputs: dict) -> tuple:
    """The forward and backward helpers with a NaN-poisoned workspace and NaN-poisoned outputs
    (every one given): ((o, final state), gradients by name), each checked to be the buffer
    passed in."""
    module, _, forward, backward, plan_type = family(mode)
    plan = plan_type(inputs["cu"])
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    query = getattr(module, f"cake_gdn_{mode}_train_backward_workspace_bytes")
    size = query(*args, plan=plan, qk_l2norm=True)
    workspace = torch.full((size,), 0xFF, dtype=torch.uint8)  # fp32 NaN everywhere
    outputs = {name: torch.full_like(inputs[source], float("nan"))
               for name, source in zip(GRADIENTS, SOURCES)}
    found = backward(inputs["do"], *args, plan=plan, d_final_state=inputs["dht"],
                     initial_state=inputs["h0"], qk_l2norm=True, workspace=workspace, **outputs)
    for name, value in zip(GRADIENTS, found):
        assert value is outputs[name], name
    out = torch.full_like(inputs["v"], float("nan"))
    final = torch.full_like(inputs["h0"], float("nan"))
    o, ht = forward(*args, plan=plan, initial_state=inputs["h0"], output_final_state=True,
                    qk_l2norm=True, out=out, final_state=final)
    assert o is out and ht is final
    return (o, ht), outputs


def test_det_is_bitwise_reproducible_and_its_buffers_are_written_before_read():
    """Two autograd runs agree bit for bit; the helpers with a NaN-poisoned workspace and
    NaN-poisoned outputs give the same bits (every intermediate and output is written before it
    is read, on every element)."""
    inputs = make_inputs([1, 63, 130, 7], 1, 2, 64, l2norm=True, seed=11)  # grouped: HV = 2H
    runs = [run_autograd("det", inputs, l2norm=True, final=True, plan=True) for _ in range(2)]
    (o1, h1, g1), (o2, h2, g2) = runs
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    for name in GRADIENTS:
        assert torch.equal(g1[name], g2[name]), name
    (o, ht), grads = _poisoned_helpers("det", inputs)
    assert torch.equal(o, o1) and torch.equal(ht, h1)
    for name in GRADIENTS:
        assert torch.equal(grads[name], g1[name]), name


def test_nondet_writes_its_buffers_before_reading_them():
    """The nondet helpers with a NaN-poisoned workspace (its atomics add into buffers it must
    zero first) and NaN-poisoned outputs match the float64 recurrence: a NaN left anywhere
    would reach the results."""
    inputs = make_inputs([2, 65, 60], 1, 3, 64, l2norm=True, seed=16)
    o_ref, ht_ref, g_ref = reference(inputs, l2norm=True, final=True)
    (o, ht), grads = _poisoned_helpers("nondet", inputs)
    rms_limit, max_limit = TOLERANCE[torch.float32]
    for name, value, expected in [("o", o, o_ref), ("final_state", ht, ht_ref),
                                  *((n, grads[n], g_ref[n]) for n in GRADIENTS)]:
        rms, worst = errors(value, expected)
        assert rms <= rms_limit and worst <= max_limit, f"{name}: {rms:.2e}, {worst:.2e}"


@pytest.mark.parametrize("mode", FAMILIES)
def test_wider_values_write_every_buffer_before_reading_it(mode):
    """V = 2K through the helpers with a NaN-poisoned workspace (which then also holds g and
    beta spread over the pieces, the states in the kernels' layout and the pieces' dg and
    dbeta) and NaN-poisoned outputs: within the fp32 budget of the float64 recurrence, and for
    det the bits of the autograd run."""
    inputs = make_inputs([1, 63, 70], 1, 2, 64, head_v=128, l2norm=True, seed=22)
    (o, ht), grads = _poisoned_helpers(mode, inputs)
    o_ref, ht_ref, g_ref = reference(inputs, l2norm=True, final=True)
    rms_limit, max_limit = TOLERANCE[torch.float32]
    for name, value, expected in [("o", o, o_ref), ("final_state", ht, ht_ref),
                                  *((n, grads[n], g_ref[n]) for n in GRADIENTS)]:
        rms, worst = errors(value, expected)
        assert rms <= rms_limit and worst <= max_limit, f"{name}: {rms:.2e}, {worst:.2e}"
    if mode == "det":
        o1, h1, g1 = run_autograd("det", inputs, l2norm=True, final=True, plan=True)
        assert torch.equal(o, o1) and torch.equal(ht, h1)
        for name in GRADIENTS:
            assert torch.equal(grads[name], g1[name]), name


@pytest.mark.parametrize("head_v", [64, 128])
def test_dbeta_in_q_dtype_is_the_fp32_gradient_rounded_once(head_v):
    """beta in fp16 reaches the kernels as the same fp32 values as beta given in fp32, so every
    gradient is the same, and dbeta is the fp32 run's, rounded once (with V = 2K: after the
    pieces are summed in fp32, not piece by piece)."""
    inputs = make_inputs([3, 70], 1, 2, 64, head_v=head_v, dtype=torch.float16,
                         beta_dtype=torch.float16, seed=26)
    _, _, _, backward, plan_type = family("det")
    plan = plan_type(inputs["cu"])
    found = {}
    for dtype in (torch.float16, torch.float32):
        args = [inputs[n] for n in ("q", "k", "v", "g")] + [inputs["beta"].to(dtype)]
        found[dtype] = backward(inputs["do"], *args, plan=plan, initial_state=inputs["h0"],
                                d_final_state=inputs["dht"], qk_l2norm=True)
    half, single = found[torch.float16], found[torch.float32]
    for name, a, b in zip(GRADIENTS, half, single):
        expected = b.half() if name == "dbeta" else b
        assert a.dtype == expected.dtype and torch.equal(a, expected), name


def test_workspace_bytes_match_the_layout():
    import cake.cake_gdn_det_train as det
    import cake.cake_gdn_nondet_train as nondet

    inputs = make_inputs([100, 30], 2, 4, 128, seed=12)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    det_bytes = det.cake_gdn_det_train_backward_workspace_bytes(*args, inputs["cu"])
    nondet_bytes = nondet.cake_gdn_nondet_train_backward_workspace_bytes(*args, inputs["cu"])
    tokens, heads, hv, d, chunks = 130, 2, 4, 128, 3
    # per token and value head (K = V = 128, fp32): gc 4, Tm 256, W 512, U/V_new 512, dV_new 512,
    # dW 512, dg partials 8, dbeta partial 4; det adds dq/dk partials 2 x 512 per value head,
    # nondet 2 x 512 per q/k head; per chunk and value head the state and its gradient 2 x 64 KB;
    # each buffer rounded up to 128 bytes.
    common = tokens * hv * (4 + 256 + 512 + 512 + 512 + 512 + 8 + 4) + chunks * hv * 2 * d * d * 4
    assert 0 <= det_bytes - (common + tokens * hv * 2 * 4 * d) < 16 * 128
    assert 0 <= nondet_bytes - (common + tokens * heads * 2 * 4 * d) < 16 * 128
    assert det.cake_gdn_det_train_backward_workspace_bytes(
        *(x[:0] for x in args), torch.tensor([0, 0], dtype=torch.int32)) == 0


def test_workspace_bytes_of_wider_values():
    """V = 2K: the kernels' layout at K = V = 64 over 2 HV value heads, plus g, beta, dg and
    dbeta spread over the pieces and three states (initial, final-state gradient, initial-state
    gradient) in the kernels' layout (counted whether or not the call has them: the query does
    not know)."""
    import cake.cake_gdn_det_train as det

    inputs = make_inputs([100, 30], 2, 4, 64, head_v=128, seed=23)
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    found = det.cake_gdn_det_train_backward_workspace_bytes(*args, inputs["cu"])
    tokens, hv, d, chunks, documents = 130, 8, 64, 3, 2
    # per token and kernel value head (K = V = 64, fp32): gc 4, Tm 256, W 256, U/V_new 256,
    # dV_new 256, dW 256, dg partial 4, dbeta partial 4, dq/dk partials 2 x 256, and the
    # spread g, beta, dg, dbeta 4 x 4; per chunk the state and its gradient; three states.
    expected = (tokens * hv * (4 + 256 * 5 + 4 + 4 + 2 * 256 + 16)
                + chunks * hv * 2 * d * d * 4 + 3 * documents * hv * d * d * 4)
    assert 0 <= found - expected < 20 * 128


# --------------------------------------------------------------------------- autograd integration


@pytest.mark.parametrize("mode", FAMILIES)
def test_checkpoint_non_reentrant_gives_the_same_gradients(mode):
    _, functional, _, _, plan_type = family(mode)
    inputs = make_inputs([40, 90], 1, 2, 64, l2norm=True, seed=13)
    plan = plan_type(inputs["cu"])

    def step(use_checkpoint):
        leaves = [inputs[n].clone().requires_grad_() for n in SOURCES]

        def body(q, k, v, g, beta, h0):
            return functional(q, k, v, g, beta, plan=plan, initial_state=h0,
                              output_final_state=True, qk_l2norm=True)

        if use_checkpoint:
            o, ht = torch.utils.checkpoint.checkpoint(body, *leaves, use_reentrant=False)
        else:
            o, ht = body(*leaves)
        ((o * inputs["do"]).sum() + (ht * inputs["dht"]).sum()).backward()
        return [x.grad for x in leaves]

    for plain, checkpointed in zip(step(False), step(True)):
        assert torch.equal(plain, checkpointed)


@pytest.mark.parametrize("mode", FAMILIES)
def test_torch_compile_runs_the_opaque_ops(mode):
    """fullgraph torch.compile of a step with a plan: the same bits as eager."""
    _, functional, _, _, plan_type = family(mode)
    inputs = make_inputs([40, 90], 1, 2, 64, seed=14)
    plan = plan_type(inputs["cu"])

    def step(q, k, v, g, beta, h0):
        o, ht = functional(q, k, v, g, beta, plan=plan, initial_state=h0,
                           output_final_state=True)
        return (o * inputs["do"]).sum() + (ht * inputs["dht"]).sum()

    results = []
    for runner in (step, torch.compile(step, fullgraph=True)):
        leaves = [inputs[n].clone().requires_grad_() for n in SOURCES]
        runner(*leaves).backward()
        results.append([x.grad for x in leaves])
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


@pytest.mark.parametrize("mode", FAMILIES)
def test_torch_compile_of_uniform_documents_reads_no_offsets(mode, monkeypatch):
    """fullgraph torch.compile of a step over [B, T, ...] inputs: the ops get the plan of the
    shapes themselves, so nothing reads chunk offsets on the host (a sync, and refused under
    graph capture); the same bits as the eager step over the packed inputs with their plan."""
    _, functional, _, _, plan_type = family(mode)
    batch, length = 3, 70
    inputs = make_inputs([length] * batch, 1, 2, 64, l2norm=True, seed=16)
    plan = plan_type(inputs["cu"])

    def packed_step(q, k, v, g, beta, h0):
        o, ht = functional(q, k, v, g, beta, plan=plan, initial_state=h0,
                           output_final_state=True, qk_l2norm=True)
        return (o * inputs["do"]).sum() + (ht * inputs["dht"]).sum()

    def batched_step(q, k, v, g, beta, h0):
        o, ht = functional(*(x.view(batch, length, *x.shape[1:]) for x in (q, k, v, g, beta)),
                           initial_state=h0, output_final_state=True, qk_l2norm=True)
        assert o.shape == (batch, length, 2, 64)
        return (o.view(-1, 2, 64) * inputs["do"]).sum() + (ht * inputs["dht"]).sum()

    def read_offsets(*_):
        raise AssertionError("chunk offsets read on the host")

    results = []
    for runner in (packed_step, torch.compile(batched_step, fullgraph=True)):
        leaves = [inputs[n].clone().requires_grad_() for n in SOURCES]
        runner(*leaves).backward()
        results.append([x.grad for x in leaves])
        monkeypatch.setattr(shared, "_check_offsets", read_offsets)  # from the compiled step on
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


def test_a_plan_of_either_family_serves_both():
    import cake.cake_gdn_det_train as det
    import cake.cake_gdn_nondet_train as nondet

    inputs = make_inputs([10, 70], 1, 1, 64, seed=15)
    plan = nondet.CakeGDNNondetPlan(inputs["cu"])
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    o1, _ = det.cake_gdn_det_train_forward(*args, plan=plan)
    o2, _ = det.cake_gdn_det_train_forward(*args, inputs["cu"])
    assert torch.equal(o1, o2)
    assert isinstance(plan, shared.ChunkPlan) and plan.documents == 2 and plan.chunks == 3
    assert plan.chunk_doc.tolist() == [0, 1, 1] and plan.chunk_idx.tolist() == [0, 0, 1]
    assert plan.chunk_offsets.tolist() == [0, 1, 3] and plan.tokens == 80
    assert all(t.data_ptr() % 16 == 0 for t in plan.tensors())
