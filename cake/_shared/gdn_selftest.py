"""What the GDN families' ``_selftest`` modules share: the GPU self-test case against the
float64 reference (``python -m cake selftest``) and the seeded bitwise cases
(``ci/gpu_vendored_check.py`` compares two builds tensor by tensor)."""

from __future__ import annotations

import torch

from ..core import selftest

# The GPU budget of chunked linear attention in bf16 against float64 (docs/architecture.md#accuracy-budgets):
# rel-RMS <= 1e-2 (selftest_case's norm-wise error) and max-abs <= 2e-2 x max|ref|.
TOLERANCE = 1e-2
MAX_ABS = 2e-2


def _inputs(gen: torch.Generator, device, lens, heads, value_heads, head_dim, dtype,
            beta_dtype=torch.float32) -> dict:
    """Seeded inputs drawn on the CPU (the same on every machine), then moved: q, k l2-normed by
    the call (qk_l2norm), g mild with strong steps, beta in (0, 1)."""
    tokens, documents = sum(lens), len(lens)
    offsets = [0]
    for length in lens:
        offsets.append(offsets[-1] + length)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    found = {
        "q": rn(tokens, heads, head_dim), "k": rn(tokens, heads, head_dim),
        "v": rn(tokens, value_heads, head_dim),
        "g": torch.nn.functional.logsigmoid(rn(tokens, value_heads) * 1.5 + 3.0),
        "beta": torch.sigmoid(rn(tokens, value_heads)),
        "h0": rn(documents, value_heads, head_dim, head_dim) * 0.5,
        "do": rn(tokens, value_heads, head_dim),
        "dht": rn(documents, value_heads, head_dim, head_dim),
        "cu": torch.tensor(offsets, dtype=torch.int32),
    }
    casts = {"q": dtype, "k": dtype, "v": dtype, "do": dtype, "beta": beta_dtype}
    return {name: value.to(device, casts.get(name, value.dtype)) for name, value in found.items()}


def _compute(functional, plan_type, inputs: dict) -> dict:
    names = ("q", "k", "v", "g", "beta", "h0")
    leaves = [inputs[n].detach().requires_grad_() for n in names]
    plan = plan_type(inputs["cu"])
    o, ht = functional(*leaves[:5], plan=plan, initial_state=leaves[5],
                       output_final_state=True, qk_l2norm=True)
    torch.autograd.backward([o, ht], [inputs["do"], inputs["dht"]])
    return {"o": o, "final_state": ht, "dq": leaves[0].grad, "dk": leaves[1].grad,
            "dv": leaves[2].grad, "dg": leaves[3].grad, "dbeta": leaves[4].grad,
            "d_initial_state": leaves[5].grad}


def run_case(functional, plan_type, reference_module, device_index: int, *, heads: int,
             value_heads: int, seed: int) -> tuple:
    """One self-test case: bf16, K = V = 128, four packed documents (lengths 1, 63, 700, 1236),
    initial and final state, qk_l2norm; every output and gradient against the float64 recurrence
    of ``reference_module`` (the family's ``reference``: a shared module imports no other shared
    module), rel-RMS <= 1e-2 and max-abs <= 2e-2 x max|ref|, bitwise equal over two runs."""
    gdn_reference = reference_module.gdn_reference
    gdn_reference_backward = reference_module.gdn_reference_backward
    device = torch.device("cuda", device_index)
    inputs = _inputs(selftest.generator(seed), device, [1, 63, 700, 1236], heads, value_heads,
                     128, torch.bfloat16)
    host = {n: t.cpu() for n, t in inputs.items()}
    o, ht = gdn_reference(host["q"], host["k"], host["v"], host["g"], host["beta"], host["cu"],
                          initial_state=host["h0"], output_final_state=True, qk_l2norm=True)
    grads = gdn_reference_backward(host["do"], host["q"], host["k"], host["v"], host["g"],
                                   host["beta"], host["cu"], d_final_state=host["dht"],
                                   initial_state=host["h0"], qk_l2norm=True)
    reference = dict(zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta",
                          "d_initial_state"), (o, ht, *grads)))
    reference = {n: t.to(device) for n, t in reference.items()}
    name = f"bf16 T=2000 H={heads} HV={value_heads} K=V=128, 4 documents"
    case = selftest.selftest_case(name, lambda: _compute(functional, plan_type, inputs),
                                  reference, tolerance=TOLERANCE)
    if case[1] is not None:
        return case
    found = _compute(functional, plan_type, inputs)
    for key, expected in reference.items():
        worst = (found[key].double() - expected).abs().max().item()
        limit = MAX_ABS * expected.abs().max().item()
        if worst > limit:
            return name, f"{key}: max-abs error {worst:.2e} > {limit:.2e} (2e-2 x max|ref|)"
    return case


def bitwise_cases(functional, plan_type, device: torch.device, *, grouped: bool) -> dict:
    """Autograd forward and backward on seeded inputs: the tensors by name. ``grouped``: include
    layouts with HV > H (the nondet family leaves them out: its atomics order may vary)."""
    outputs = {}
    # (name, document lengths, H, HV, head dim, dtype, beta dtype)
    table = [
        ("bf16-d128-gqa", [5, 300, 64, 1000], 2, 4, 128, torch.bfloat16, torch.float32),
        ("fp16-d64-tiny-docs", [1, 2, 3, 65, 129, 7, 1], 4, 4, 64, torch.float16, torch.float16),
        ("bf16-d256", [200, 57], 1, 1, 256, torch.bfloat16, torch.bfloat16),
        ("bf16-d128-hv3", [513, 31], 1, 3, 128, torch.bfloat16, torch.float32),
    ]
    for seed, (name, lens, heads, value_heads, dim, dtype, beta_dtype) in enumerate(table):
        if not grouped and value_heads != heads:
            continue
        inputs = _inputs(selftest.generator(3000 + seed), device, lens, heads, value_heads, dim,
                         dtype, beta_dtype)
        outputs.update({f"{name}/{k}": v for k, v in
                        _compute(functional, plan_type, inputs).items()})
    return outputs
