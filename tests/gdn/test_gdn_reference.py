"""The float64 references every GDN test compares with: the recurrence (the definition) against
the chunked WY/UT form the kernels compute, and the recurrence's gradients against finite
differences (torch.autograd.gradcheck)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_inputs

from cake._shared.gdn_reference import gdn_chunked_reference, gdn_reference


@pytest.mark.parametrize("lens,heads,value_heads,dim,l2norm,h0", [
    ([130], 1, 1, 16, False, False),
    ([1, 2, 63, 64, 65, 130], 2, 4, 32, True, True),
    ([5, 200, 1, 70], 1, 3, 24, False, True),
])
def test_the_recurrence_equals_the_chunked_form(lens, heads, value_heads, dim, l2norm, h0):
    inputs = make_inputs(lens, heads, value_heads, dim, l2norm=l2norm, h0=h0, seed=1)
    args = [inputs[n].double() for n in ("q", "k", "v", "g", "beta")]
    initial = inputs["h0"].double() if h0 else None
    o1, f1 = gdn_reference(*args, inputs["cu"], initial_state=initial, output_final_state=True,
                           qk_l2norm=l2norm)
    o2, f2 = gdn_chunked_reference(*args, inputs["cu"], initial_state=initial,
                                   output_final_state=True, qk_l2norm=l2norm)
    assert (o1 - o2).abs().max().item() < 1e-10
    assert (f1 - f2).abs().max().item() < 1e-10


def test_batched_inputs_are_b_documents_in_the_reference():
    inputs = make_inputs([9, 9], 1, 2, 8, seed=3)
    args = [inputs[n].double() for n in ("q", "k", "v", "g", "beta")]
    packed, _ = gdn_reference(*args, inputs["cu"])
    batched, _ = gdn_reference(*(x.reshape(2, 9, *x.shape[1:]) for x in args))
    assert torch.equal(batched.reshape(packed.shape), packed)


def test_gradients_of_the_recurrence_match_finite_differences():
    inputs = make_inputs([3, 4], 1, 2, 3, l2norm=True, seed=2)
    leaves = [inputs[n].double().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    initial = inputs["h0"].double().requires_grad_()

    def function(q, k, v, g, beta, h0):
        return gdn_reference(q, k, v, g, beta, inputs["cu"], scale=0.7, initial_state=h0,
                             output_final_state=True, qk_l2norm=True)

    assert torch.autograd.gradcheck(function, (*leaves, initial), eps=1e-6, atol=1e-7,
                                    rtol=1e-5)
