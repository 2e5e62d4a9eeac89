"""Bad inputs of the GDN families: each a TypeError/ValueError naming the argument, raised
before anything is launched or written (the kernel launches are recorded: none happen); and the
nondet family's determinism alert, raised before anything is allocated or launched."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import FAMILIES, family, make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

from cake._shared import gdn as shared

pytestmark = pytest.mark.usefixtures("interpreter")


@pytest.fixture
def launches(monkeypatch) -> list:
    """Every kernel launch of the families, by kernel name (they still run)."""
    found = []
    original = shared.Programs._launch

    def record(plan, stream, name, grid, *arguments):
        found.append(name)
        original(plan, stream, name, grid, *arguments)

    monkeypatch.setattr(shared.Programs, "_launch", staticmethod(record))
    return found


class TensorOps(TorchDispatchMode):
    """Records every tensor operation (allocations included) made while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def base():
    return make_inputs([3, 66], 1, 2, 64, seed=21)


def call(mode: str, **changes):
    """The forward helper with ``changes`` applied to a good call."""
    _, _, forward, _, _ = family(mode)
    inputs = base()
    arguments = {"q": inputs["q"], "k": inputs["k"], "v": inputs["v"], "g": inputs["g"],
                 "beta": inputs["beta"], "cu_seqlens": inputs["cu"],
                 "initial_state": inputs["h0"]}
    arguments.update(changes)
    return forward(**arguments)


def _misaligned(tensor: torch.Tensor) -> torch.Tensor:
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype)
    view = storage[1:].view(tensor.shape)
    view.copy_(tensor)
    return view


CASES = {
    "q dtype": ({"q": base()["q"].double()}, TypeError, "q: expected dtype bfloat16 or float16 or float32"),
    "k dtype": ({"k": base()["k"].half()}, TypeError, "k: expected dtype float32"),
    "v dtype": ({"v": base()["v"].half()}, TypeError, "v: expected dtype float32"),
    "g dtype": ({"g": base()["g"].half()}, TypeError, "g: expected dtype float32"),
    "beta dtype": ({"beta": base()["beta"].double()}, TypeError, "beta: expected dtype float32"),
    "q rank": ({"q": base()["q"][0]}, ValueError, "q: expected shape [T, H, K]"),
    "k shape": ({"k": base()["k"][:-1]}, ValueError, "k: expected the shape of q"),
    "v tokens": ({"v": base()["v"][:-1]}, ValueError, "v: expected [T, HV, V] with the leading"),
    "K": ({"q": base()["q"][..., :32].contiguous(), "k": base()["k"][..., :32].contiguous()},
          ValueError, "q: expected K (the last dim) in (64, 128, 256)"),
    "V < K": ({"q": torch.zeros(69, 1, 128), "k": torch.zeros(69, 1, 128), "initial_state": None},
              ValueError, "v: expected V (the last dim) a multiple of K = 128"),
    "V % K": ({"v": torch.zeros(69, 2, 96)}, ValueError, "v: expected V (the last dim) a multiple of K = 64"),
    "state of V = 2K": ({"v": torch.zeros(69, 2, 128)}, ValueError,
                        "initial_state: expected float32 [N, HV, K, V] = [2, 2, 64, 128]"),
    "HV % H": ({"q": torch.zeros(69, 2, 64), "k": torch.zeros(69, 2, 64),
                "v": torch.zeros(69, 3, 64), "g": torch.zeros(69, 3), "beta": torch.zeros(69, 3),
                "initial_state": None}, ValueError, "v: expected HV (value heads) a positive multiple of H = 2"),
    "g shape": ({"g": base()["g"][:, :1].contiguous()}, ValueError, "g: expected float32 [69, 2]"),
    "beta shape": ({"beta": base()["beta"][:-1]}, ValueError, "beta: expected [69, 2]"),
    "head stride": ({"q": torch.zeros(69, 1, 128)[..., :64]}, ValueError, "q: expected a contiguous tensor"),
    "token stride": ({"v": torch.zeros(138, 2, 64)[::2]}, ValueError, "v: expected a contiguous tensor"),
    "alignment": ({"q": _misaligned(base()["q"])}, ValueError, "q: expected a 16-byte aligned data pointer"),
    "cu dtype": ({"cu_seqlens": base()["cu"].long()}, TypeError, "cu_seqlens: expected dtype int32"),
    "cu rank": ({"cu_seqlens": base()["cu"][None]}, ValueError, "cu_seqlens: expected a contiguous 1-D tensor"),
    "cu start": ({"cu_seqlens": torch.tensor([1, 3, 69], dtype=torch.int32)}, ValueError, "cu_seqlens: must start at 0"),
    "cu order": ({"cu_seqlens": torch.tensor([0, 30, 3, 69], dtype=torch.int32),
                  "initial_state": None}, ValueError, "cu_seqlens: must be non-decreasing"),
    "cu end": ({"cu_seqlens": torch.tensor([0, 3, 68], dtype=torch.int32)}, ValueError, "cu_seqlens: must end at the token count 69, got 68"),
    "state shape": ({"initial_state": torch.zeros(1, 2, 64, 64)}, ValueError, "initial_state: expected float32 [N, HV, K, V] = [2, 2, 64, 64]"),
    "state dtype": ({"initial_state": torch.zeros(2, 2, 64, 64, dtype=torch.float64)}, TypeError, "initial_state: expected dtype float32"),
    "scale": ({"scale": float("nan")}, ValueError, "scale: expected a finite fp32 value"),
    "flag": ({"qk_l2norm": 1}, TypeError, "qk_l2norm: expected a bool"),
    "4-D with cu_seqlens": ({"q": base()["q"][None], "k": base()["k"][None], "v": base()["v"][None],
                             "g": base()["g"][None], "beta": base()["beta"][None]},
                            ValueError, "cu_seqlens: must be None for 4-D inputs"),
    "final_state without output_final_state": ({"final_state": torch.zeros(2, 2, 64, 64)}, ValueError,
                                               "final_state: given, but output_final_state is False"),
    "out shape": ({"out": torch.zeros(69, 2, 32)}, ValueError, "out: expected a contiguous float32[69, 2, 64]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", FAMILIES)
def test_bad_input_is_named_before_any_launch(mode, case, launches):
    changes, error, message = CASES[case]
    with pytest.raises(error) as caught:
        call(mode, **changes)
    assert str(caught.value).startswith(message), str(caught.value)
    assert launches == []


def test_the_output_buffers_are_not_written_when_a_check_fails(launches):
    out = torch.full((69, 2, 64), 7.0)
    with pytest.raises(ValueError, match="initial_state"):
        call("det", out=out, initial_state=torch.zeros(3, 2, 64, 64))
    assert torch.equal(out, torch.full_like(out, 7.0)) and launches == []


def test_a_plan_of_other_documents_is_refused(launches):
    _, _, forward, _, plan_type = family("det")
    inputs = base()
    plan = plan_type(torch.tensor([0, 10, 69], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens: given with a plan made from another"):
        forward(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                inputs["cu"], plan=plan)
    with pytest.raises(TypeError, match="plan: expected a chunk plan"):
        forward(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
                plan=inputs["cu"])
    assert launches == []


def test_hand_made_chunk_tensors_are_checked_against_their_offsets(launches):
    """The autograd class takes the plan's four tensors; tensors that are not a plan's are
    read and checked against the offsets (the kernels trust them)."""
    import cake.cake_gdn_det_train as det

    inputs = base()
    plan = det.CakeGDNDetPlan(inputs["cu"])
    cu, doc, idx, offsets = (t.clone() for t in plan.tensors())
    idx[1] = 5
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match="chunk_idx: does not match cu_seqlens"):
        det.CakeGDNDetFunction.apply(*args, None, cu, doc, idx, offsets, 0.125, False, False)
    assert launches == []
    idx[1] = 0  # now equal to the plan's: accepted after the check
    det.CakeGDNDetFunction.apply(*args, None, cu, doc, idx, offsets, 0.125, False, False)
    assert launches == ["prep", "fwd_h", "fwd_o"]


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        call("det")


def test_fp32_on_a_gpu_is_refused_with_the_remedy(monkeypatch):
    import fake_gpu

    monkeypatch.delenv("TRITON_INTERPRET")
    inputs = base()
    cuda = {n: fake_gpu.cuda(inputs[n]) for n in ("q", "k", "v", "g", "beta")}
    _, _, forward, _, _ = family("det")
    with pytest.raises(TypeError, match="q: float32 inputs run only under Triton's interpreter"
                                        ".*pass bfloat16 or float16"):
        forward(**cuda)


def test_tensors_on_two_devices_are_refused():
    import fake_gpu

    inputs = base()
    with pytest.raises(ValueError, match="k: expected a CPU tensor"):
        call("det", k=fake_gpu.cuda(inputs["k"]))


# --------------------------------------------------------------------------- nondet's alert


def _backward_arguments():
    inputs = make_inputs([3, 66], 1, 2, 64, seed=22)
    return inputs, [inputs[n] for n in ("do", "q", "k", "v", "g", "beta")]


def test_nondet_backward_raises_the_alert_before_it_allocates_or_launches(launches):
    """Under torch.use_deterministic_algorithms(True): PyTorch's alert (RuntimeError) from the
    backward helper, with no tensor operation at all (no allocation, no chunk plan, no copy)
    and no launch; the forward (deterministic) runs."""
    _, _, forward, backward, plan_type = family("nondet")
    inputs, arguments = _backward_arguments()
    plan = plan_type(inputs["cu"])
    torch.use_deterministic_algorithms(True)
    try:
        forward(*arguments[1:], plan=plan)
        assert launches == ["prep", "fwd_h", "fwd_o"]
        launches.clear()
        ops = TensorOps()
        with ops, pytest.raises(RuntimeError) as caught:
            backward(*arguments, inputs["cu"], initial_state=inputs["h0"])
        assert "cake_gdn_nondet_train_backward does not have a deterministic implementation" \
            in str(caught.value)
        assert "torch.use_deterministic_algorithms(True)" in str(caught.value)
        assert ops.ops == [] and launches == []
    finally:
        torch.use_deterministic_algorithms(False)


def test_nondet_autograd_backward_raises_the_alert_before_it_launches(launches):
    _, functional, _, _, plan_type = family("nondet")
    inputs, _ = _backward_arguments()
    plan = plan_type(inputs["cu"])
    leaves = [inputs[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    torch.use_deterministic_algorithms(True)
    try:
        o, _ = functional(*leaves, plan=plan)
        launches.clear()
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            o.sum().backward()
        assert launches == []
    finally:
        torch.use_deterministic_algorithms(False)


def test_nondet_warns_once_per_call_with_warn_only_and_runs(launches):
    _, _, _, backward, plan_type = family("nondet")
    _, _, _, det_backward, _ = family("det")
    inputs, arguments = _backward_arguments()
    plan = plan_type(inputs["cu"])
    expected = det_backward(*arguments, plan=plan)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                found = backward(*arguments, plan=plan)
    finally:
        torch.use_deterministic_algorithms(False)
    alerts = [w for w in caught if "does not have a deterministic implementation" in str(w.message)]
    assert len(alerts) == 2
    assert launches.count("finalize") == 3  # det once, nondet twice: it ran, never as det
    for got, want in zip(found, expected):
        if want is not None:
            assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("mode", FAMILIES)
def test_no_alert_without_deterministic_mode_and_none_from_det(mode, launches):
    _, _, _, backward, plan_type = family(mode)
    inputs, arguments = _backward_arguments()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backward(*arguments, plan=plan_type(inputs["cu"]))
    if mode == "det":
        torch.use_deterministic_algorithms(True)
        try:
            backward(*arguments, plan=plan_type(inputs["cu"]))
        finally:
            torch.use_deterministic_algorithms(False)



@pytest.mark.parametrize("mode", FAMILIES)
@pytest.mark.parametrize("head_v,beta_dtype", [(64, torch.float16), (64, torch.float32),
                                               (128, torch.float16), (128, torch.float32)])
def test_the_backward_allocates_nothing_when_every_buffer_is_given(mode, head_v, beta_dtype,
                                                                   monkeypatch):
    """Every gradient output and the queried workspace given: the host allocates no memory (the
    profiler's allocation events, inside torch's kernels too; the launches are replaced by
    no-ops, so only the host's own work is recorded), for V = K and V = 2K (g, beta, the
    states and the pieces' dg and dbeta live in the workspace) and beta in q's dtype (dbeta
    summed in fp32 in place, then cast once)."""
    module, _, _, backward, plan_type = family(mode)
    inputs = make_inputs([3, 70], 1, 2, 64, head_v=head_v, dtype=torch.float16,
                         beta_dtype=beta_dtype, seed=25)
    plan = plan_type(inputs["cu"])
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]
    size = getattr(module, f"cake_gdn_{mode}_train_backward_workspace_bytes")(
        *args, plan=plan, qk_l2norm=True)
    workspace = torch.empty(size, dtype=torch.uint8)
    outputs = {name: torch.empty_like(inputs[source]) for name, source in
               zip(("dq", "dk", "dv", "dg", "dbeta", "d_initial_state"),
                   ("q", "k", "v", "g", "beta", "h0"))}
    monkeypatch.setattr(shared.Programs, "_launch", staticmethod(lambda *arguments: None))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profiled:
        backward(inputs["do"], *args, plan=plan, d_final_state=inputs["dht"],
                 initial_state=inputs["h0"], qk_l2norm=True, workspace=workspace, **outputs)
    allocating = [(event.name, event.cpu_memory_usage) for event in profiled.events()
                  if event.cpu_memory_usage > 0]
    assert allocating == [], allocating
