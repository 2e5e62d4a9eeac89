"""Autograd helpers of the family packages (``cake.core.autograd``) that need no GPU to check:
op names, the backward's return, and the eager launch-first apply."""

from __future__ import annotations

import pytest
import torch

from cake.core import autograd


def test_op_names_are_unique_per_package():
    assert autograd.op_name("cake.cake_x_det_train", "forward") == "cake_cake_x_det_train::forward"
    assert autograd.op_name("flashinfer.experimental.cake.cake_x_det_train", "forward") != \
        autograd.op_name("cake.cake_x_det_train", "forward")


def test_backward_result_places_gradients_by_position():
    a, b = torch.zeros(1), torch.ones(1)
    assert autograd.backward_result(4, {0: a, 2: b}) == (a, None, b, None)


class _Scale(torch.autograd.Function):
    """y = x * factor, launched by ``_launch_scale``, without setup_context (as the families'
    functions): functorch transforms refuse it, which tells whether eager_apply went through
    ``Function.apply``."""

    @staticmethod
    def forward(ctx, x, factor):
        return _keep_scale(ctx, x, factor, _launch_scale(x, factor))

    @staticmethod
    def backward(ctx, dy):
        return autograd.backward_result(len(ctx.needs_input_grad), {0: dy * ctx.factor})


_EVENTS = []


def _launch_scale(x, factor):
    _EVENTS.append("launch")
    return x.detach() * factor


def _keep_scale(ctx, x, factor, y):
    _EVENTS.append("keep")
    ctx.factor = factor
    return y


def test_eager_apply_launches_before_autograd_and_records_the_gradient():
    apply = autograd.eager_apply(_Scale, _launch_scale, _keep_scale)
    assert apply is not _Scale.apply, "this torch has the C apply: the short path must be taken"
    _EVENTS.clear()
    x = torch.randn(5, requires_grad=True)
    y = apply(x, 3.0)
    assert _EVENTS == ["launch", "keep"]
    assert type(y.grad_fn).__name__ == "_ScaleBackward"  # the subclass, named as _Scale
    assert issubclass(type(y.grad_fn)._forward_cls, _Scale) and type(y.grad_fn)._forward_cls is not _Scale
    y.backward(torch.arange(5.0))
    assert torch.equal(y.detach(), x.detach() * 3.0)
    assert torch.equal(x.grad, torch.arange(5.0) * 3.0)


def test_eager_apply_takes_function_apply_under_a_transform():
    apply = autograd.eager_apply(_Scale, _launch_scale, _keep_scale)
    _EVENTS.clear()
    with pytest.raises(RuntimeError, match="must override the setup_context"):
        torch.func.grad(lambda x: apply(x, 3.0).sum())(torch.randn(5))
    assert _EVENTS == []  # Function.apply refused it before its forward could launch


# --------------------------------------------------------------------------- the family skeleton


def _toy_forward(x, weight, bias, factor):
    """A family's forward as the skeleton takes it: validates, allocates and "launches" (here,
    torch on the CPU); the plan handed to the eager backward is a marker."""
    if x.dim() != 2:
        raise ValueError(f"x: expected [S, C], got {list(x.shape)}")
    _TOY_CALLS.append("forward")
    y = x.detach() * weight.detach() * factor
    if bias is not None:
        y = y + bias.detach() * factor
    return (y,), "toy-plan"


def _toy_backward(plan, constants, saved, grads):
    x, weight, bias = saved
    (dy,) = grads
    _TOY_CALLS.append(("backward", plan))
    if dy is None:
        return {}
    factor = constants["factor"]
    found = {"x": dy * weight * factor, "weight": (dy * x).sum(0) * factor}
    if bias is not None:
        found["bias"] = dy.sum(0) * factor
    return found


_TOY_CALLS = []
_TOY = autograd.Differentiable(
    package="tests.cake_toyscale_det_train", name="toyscale",
    function_name="CakeToyScaleDetFunction", module=__name__, doc="apply(x, weight, bias, factor)",
    arguments="Tensor x, Tensor weight, Tensor? bias, float factor",
    forward=_toy_forward, fake=lambda x, weight, bias, factor: (torch.empty_like(x),),
    outputs=lambda args: (0,), save=lambda args, results: args[:3], backward=_toy_backward,
    grad_like={"x": 0, "weight": 1, "bias": 2})


def _toy_case(bias: bool):
    torch.manual_seed(0)
    leaves = [torch.randn(5, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64),
              torch.randn(3, dtype=torch.float64) if bias else None]
    return [t.requires_grad_() if t is not None else None for t in leaves]


def _toy_reference(x, weight, bias, factor):
    y = x * weight * factor
    return y if bias is None else y + bias * factor


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("call", ["functional", "apply"])
def test_differentiable_eager_gradients_and_plan(bias, call):
    """The functional launches first (the forward runs once, before autograd records it) and the
    public class's apply launches inside its forward; both give autograd's gradients of the
    formula, and the eager backward gets the forward's plan."""
    x, w, b = _toy_case(bias)
    dy = torch.randn(5, 3, dtype=torch.float64)
    _TOY_CALLS.clear()
    fn = _TOY.functional if call == "functional" else _TOY.function.apply
    y = fn(x, w, b, 0.5)
    assert type(y.grad_fn).__name__ == "CakeToyScaleDetFunctionBackward"
    y.backward(dy)
    assert _TOY_CALLS == ["forward", ("backward", "toy-plan")]
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    _toy_reference(*leaves, 0.5).backward(dy)
    assert torch.allclose(y, _toy_reference(x, w, b, 0.5))
    for got, want in zip((x, w, b), leaves):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got.grad, want.grad)


def test_differentiable_errors_come_before_autograd_and_no_grad_records_nothing():
    x, w, b = _toy_case(True)
    _TOY_CALLS.clear()
    with pytest.raises(ValueError, match=r"^x: expected \[S, C\]"):
        _TOY.functional(x[0], w, b, 0.5)
    with torch.no_grad():
        assert _TOY.functional(x, w, b, 0.5).grad_fn is None
    assert _TOY_CALLS == ["forward"]


@pytest.mark.parametrize("bias", [True, False])
def test_differentiable_registers_opaque_ops_named_after_the_package(bias):
    """The forward op is ``<package>::<name>`` (its backward ``<name>_backward``), and passes
    torch's checks of a custom op: schema, fake, autograd registration, aot dispatch."""
    namespace = autograd.op_name("tests.cake_toyscale_det_train", "toyscale").split("::")[0]
    ops = getattr(torch.ops, namespace)
    assert hasattr(ops, "toyscale_backward")
    x, w, b = _toy_case(bias)
    (y,) = ops.toyscale(x, w, b, 0.5)
    assert torch.allclose(y, _toy_reference(x, w, b, 0.5))
    torch.library.opcheck(ops.toyscale.default, (x, w, b, 0.5))


@pytest.mark.parametrize("bias", [True, False])
def test_differentiable_under_torch_compile_runs_the_custom_ops(bias):
    """Compiled with fullgraph (aot_eager: no code generation), the functional goes through the
    custom ops and their autograd registration: the same values and gradients, and the backward
    validates its own call (no plan)."""
    x, w, b = _toy_case(bias)
    dy = torch.randn(5, 3, dtype=torch.float64)
    compiled = torch.compile(lambda x, w, b: _TOY.functional(x, w, b, 0.5) * 2, fullgraph=True,
                             backend="aot_eager")
    _TOY_CALLS.clear()
    y = compiled(x, w, b)
    y.backward(dy)
    assert ("backward", None) in _TOY_CALLS
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    (_toy_reference(*leaves, 0.5) * 2).backward(dy)
    torch.testing.assert_close(y, _toy_reference(x, w, b, 0.5) * 2)
    for got, want in zip((x, w, b), leaves):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got.grad, want.grad)
