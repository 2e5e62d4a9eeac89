"""The GDN families on a GPU (``-m gpu``; all passed on an H100 with the prebuilt sm_90a
libraries, 2026-12-05): bf16 and fp16 against the float64 recurrence within the chunked-linear-attention budget
(rel-RMS <= 1e-2 and max-abs <= 2e-2 x max|ref|, docs/architecture.md#accuracy-budgets), det bitwise repeatable across
runs and streams, a step captured in a CUDA graph, torch.compile, fp32 refused."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, errors, family, make_inputs

from cake._shared.gdn_reference import gdn_reference, gdn_reference_backward

pytestmark = pytest.mark.gpu

BUDGET = (1e-2, 2e-2)
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state")
SOURCES = ("q", "k", "v", "g", "beta", "h0")


def _on_gpu(inputs: dict) -> dict:
    return {n: (None if t is None else t.cuda()) for n, t in inputs.items()}


def _run(mode, inputs, *, l2norm, final):
    _, functional, _, _, plan_type = family(mode)
    leaves = {n: inputs[n].clone().requires_grad_() for n in SOURCES if inputs[n] is not None}
    o, ht = functional(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                       plan=plan_type(inputs["cu"]), initial_state=leaves.get("h0"),
                       output_final_state=final, qk_l2norm=l2norm)
    tensors, grads = [o], [inputs["do"]]
    if final:
        tensors.append(ht)
        grads.append(inputs["dht"])
    torch.autograd.backward(tensors, grads)
    found = {"o": o.detach(), "final_state": None if ht is None else ht.detach()}
    found.update({g: leaves[s].grad if s in leaves else None for g, s in zip(GRADIENTS, SOURCES)})
    return found


@pytest.mark.parametrize("mode", FAMILIES)
@pytest.mark.parametrize("lens,heads,value_heads,dim,head_v,dtype,l2norm,h0,final", [
    ([1, 2, 63, 64, 65, 130, 300], 1, 3, 128, 128, torch.bfloat16, True, True, True),
    ([1, 3, 2, 1, 5, 1, 70, 9, 1, 400], 2, 4, 128, 128, torch.bfloat16, False, True, False),
    ([777], 1, 1, 64, 64, torch.bfloat16, True, False, True),
    ([64, 200], 2, 2, 256, 256, torch.bfloat16, True, True, True),
    ([129, 50], 2, 4, 128, 128, torch.float16, True, True, True),
    ([3, 130, 500], 2, 4, 128, 256, torch.bfloat16, True, True, True),  # V = 2K
])
def test_against_the_float64_recurrence(mode, lens, heads, value_heads, dim, head_v, dtype,
                                        l2norm, h0, final):
    host = make_inputs(lens, heads, value_heads, dim, dtype=dtype, l2norm=l2norm, h0=h0,
                       head_v=head_v)
    o, ht = gdn_reference(host["q"], host["k"], host["v"], host["g"], host["beta"], host["cu"],
                          initial_state=host["h0"], output_final_state=final, qk_l2norm=l2norm)
    grads = gdn_reference_backward(host["do"], host["q"], host["k"], host["v"], host["g"],
                                   host["beta"], host["cu"],
                                   d_final_state=host["dht"] if final else None,
                                   initial_state=host["h0"], qk_l2norm=l2norm)
    reference = {"o": o, "final_state": ht, **dict(zip(GRADIENTS, grads))}
    found = _run(mode, _on_gpu(host), l2norm=l2norm, final=final)
    for name, expected in reference.items():
        if expected is None:
            assert found[name] is None, name
            continue
        rms, worst = errors(found[name].cpu(), expected)
        assert rms <= BUDGET[0] and worst <= BUDGET[1], f"{name}: {rms:.2e}, {worst:.2e}"


def test_det_is_bitwise_identical_across_runs_and_streams():
    inputs = _on_gpu(make_inputs([5, 300, 64, 1000], 2, 4, 128, dtype=torch.bfloat16,
                                 l2norm=True))
    first = _run("det", inputs, l2norm=True, final=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        second = _run("det", inputs, l2norm=True, final=True)
    stream.synchronize()
    for name, value in first.items():
        assert torch.equal(value, second[name]), name


@pytest.mark.parametrize("mode", FAMILIES)
@pytest.mark.parametrize("head_v", [128, 256])
def test_a_step_is_captured_in_a_cuda_graph(mode, head_v):
    """With the plan, every output and the workspace given: no host sync, no allocation; the
    replay, over NaN-poisoned outputs and workspace, gives the eager results (V = 2K: the
    spread gates and the pieces' gradients live in the workspace too)."""
    module, _, forward, backward, plan_type = family(mode)
    inputs = _on_gpu(make_inputs([100, 400], 1, 2, 128, dtype=torch.bfloat16, l2norm=True,
                                 head_v=head_v))
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    plan = plan_type(inputs["cu"])
    query = getattr(module, f"cake_gdn_{mode}_train_backward_workspace_bytes")
    workspace = torch.empty(query(*args, plan=plan, qk_l2norm=True), dtype=torch.uint8,
                            device="cuda")
    out = torch.empty_like(inputs["v"])
    grads = {"dq": torch.empty_like(args[0]), "dk": torch.empty_like(args[1]),
             "dv": torch.empty_like(args[2]), "dg": torch.empty_like(args[3]),
             "dbeta": torch.empty_like(args[4])}

    def step():
        forward(*args, plan=plan, qk_l2norm=True, out=out)
        backward(inputs["do"], *args, plan=plan, qk_l2norm=True, workspace=workspace, **grads)

    step()
    torch.cuda.synchronize()
    eager = [out.clone(), *(t.clone() for t in grads.values())]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for tensor in (out, *grads.values()):  # every output and intermediate written before read
        tensor.fill_(float("nan"))
    workspace.fill_(0xFF)  # fp32 NaN
    graph.replay()
    torch.cuda.synchronize()
    for before, after in zip(eager, [out, *grads.values()]):
        if mode == "det":
            assert torch.equal(before, after)
        else:
            assert torch.allclose(before.float(), after.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", FAMILIES)
def test_torch_compile_fullgraph(mode):
    _, functional, _, _, plan_type = family(mode)
    inputs = _on_gpu(make_inputs([40, 90], 1, 1, 128, dtype=torch.bfloat16))
    plan = plan_type(inputs["cu"])

    def step(q, k, v, g, beta):
        o, _ = functional(q, k, v, g, beta, plan=plan)
        return (o.float() * inputs["do"].float()).sum()

    results = []
    for runner in (step, torch.compile(step, fullgraph=True)):
        leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
        runner(*leaves).backward()
        results.append([x.grad for x in leaves])
    for eager, compiled in zip(*results):
        if mode == "det":
            assert torch.equal(eager, compiled)
        else:  # dq and dk: fp32 atomics in an order that varies run to run
            assert torch.allclose(eager.float(), compiled.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", FAMILIES)
def test_compiled_uniform_documents_are_captured_in_cuda_graphs(mode):
    """[B, T, ...] inputs under torch.compile(mode="reduce-overhead"): the ops make the plan of
    the shapes themselves without reading the device, so the compiled step is captured; its
    gradients match the eager step's."""
    _, functional, _, _, _ = family(mode)
    batch, length = 3, 200
    inputs = _on_gpu(make_inputs([length] * batch, 2, 4, 128, dtype=torch.bfloat16, l2norm=True))

    def step(q, k, v, g, beta):
        o, _ = functional(*(x.view(batch, length, *x.shape[1:]) for x in (q, k, v, g, beta)),
                          qk_l2norm=True)
        return (o.float().view(-1, *o.shape[2:]) * inputs["do"].float()).sum()

    from torch._dynamo.utils import counters

    results = []
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    for runner in (step, compiled, compiled, compiled):  # the third call replays a graph
        leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
        runner(*leaves).backward()
        results.append([x.grad.clone() for x in leaves])
    # inductor counts every graph it declines to capture (a host read, a CPU tensor, ...)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    for eager, replayed in zip(results[0], results[-1]):
        if mode == "det":
            assert torch.equal(eager, replayed)
        else:
            assert torch.allclose(eager.float(), replayed.float(), rtol=1e-2, atol=1e-2)


def test_fp32_is_refused_on_the_gpu():
    _, _, forward, _, _ = family("det")
    inputs = _on_gpu(make_inputs([64], 1, 1, 64))
    with pytest.raises(TypeError, match="float32 inputs run only under Triton's interpreter"):
        forward(*(inputs[n] for n in ("q", "k", "v", "g", "beta")))
