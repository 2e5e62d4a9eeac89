"""CPU tests of the causal conv1d family: reference, route table, host validation, names."""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fake_gpu  # noqa: E402
from fake_gpu import cuda  # noqa: E402

import cake.cake_causal_conv1d_det_train as conv  # noqa: E402
from cake.core import autograd, checks, jit, plans  # noqa: E402
from cake.core import manifest as mf  # noqa: E402
from cake.cake_causal_conv1d_det_train import reference as ref  # noqa: E402
from cake.cake_causal_conv1d_det_train import _function, _routes, _validate  # noqa: E402
from cake.cake_causal_conv1d_det_train._validate import Problem  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NAME = "cake_causal_conv1d_det_train"
MANIFEST = mf.read(REPO / "manifests" / f"{NAME}.json")


# --------------------------------------------------------------------------- reference


def _loop_reference(x, w, b, cu, activation):
    """Straight from the issue's formula, one element at a time."""
    tokens, channels = x.shape
    out = torch.zeros(tokens, channels, dtype=torch.float64)
    bounds = cu.tolist() if cu is not None else [0, tokens]
    for d in range(len(bounds) - 1):
        for t in range(bounds[d], bounds[d + 1]):
            for c in range(channels):
                z = float(b[c]) if b is not None else 0.0
                for k in range(4):
                    if t - 3 + k >= bounds[d]:
                        z += float(w[c, k]) * float(x[t - 3 + k, c])
                out[t, c] = z / (1 + math.exp(-z)) if activation == "silu" else z
    return out


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("lengths", [[1], [2], [3], [17], [1, 1, 1, 1], [0, 5, 0, 2, 9],
                                     [3, 1, 2, 7, 1]], ids=lambda v: "-".join(map(str, v)))
def test_reference_matches_formula(lengths, activation):
    torch.manual_seed(sum(lengths) + len(lengths))
    tokens, channels = sum(lengths), 5
    x = torch.randn(tokens, channels, dtype=torch.float64)
    w = torch.randn(channels, 4, dtype=torch.float64)
    b = torch.randn(channels, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    got = ref.causal_conv1d_reference(x, w, b, cu, activation=activation)
    torch.testing.assert_close(got, _loop_reference(x, w, b, cu, activation), rtol=1e-12,
                               atol=1e-12)


def test_reference_batched_is_documents():
    torch.manual_seed(1)
    x = torch.randn(3, 7, 4, dtype=torch.float64)
    w = torch.randn(4, 4, dtype=torch.float64)
    cu = torch.arange(0, 22, 7, dtype=torch.int32)
    packed = ref.causal_conv1d_reference(x.reshape(21, 4), w, None, cu)
    torch.testing.assert_close(ref.causal_conv1d_reference(x, w), packed.reshape(3, 7, 4))


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("bias", [True, False])
def test_reference_backward_matches_autograd_and_finite_differences(activation, bias):
    """The written-out backward equals autograd; autograd passes gradcheck (finite
    differences, float64), so the kernels are checked against a verified gradient."""
    torch.manual_seed(2)
    tokens, channels = 23, 3
    cu = torch.tensor([0, 1, 3, 3, 9, 23], dtype=torch.int32)
    x = torch.randn(tokens, channels, dtype=torch.float64, requires_grad=True)
    w = torch.randn(channels, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(channels, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = (x, w, b) if bias else (x, w)

    def fn(*args):
        return ref.causal_conv1d_reference(args[0], args[1], args[2] if bias else None, cu,
                                           activation=activation)

    assert torch.autograd.gradcheck(fn, inputs)
    y = fn(*inputs)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, inputs, dy)
    dx, dw, db = ref.causal_conv1d_reference_backward(dy, x, w, b, cu, activation=activation)
    torch.testing.assert_close(dx, grads[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, grads[1], rtol=1e-12, atol=1e-12)
    if bias:
        torch.testing.assert_close(db, grads[2], rtol=1e-12, atol=1e-12)
    else:
        assert db is None


def test_reference_empty():
    x = torch.zeros(0, 4, dtype=torch.float64)
    w = torch.randn(4, 4, dtype=torch.float64)
    assert ref.causal_conv1d_reference(x, w).shape == (0, 4)
    dx, dw, db = ref.causal_conv1d_reference_backward(x, x, w, torch.zeros(4, dtype=torch.float64))
    assert dx.shape == (0, 4) and torch.equal(dw, torch.zeros(4, 4, dtype=torch.float64))


# --------------------------------------------------------------------------- route table


def _problem(dtype, bias, activation, channels, tokens):
    return Problem(device=torch.device("cpu"), dtype=dtype, tokens=tokens, channels=channels,
                   num_docs=1, doc_len=0, weight_fp32=False, has_bias=bias,
                   activation=activation)


VARIANTS = [(d, b, a) for d in (torch.bfloat16, torch.float16) for b in (True, False)
            for a in ("silu", None)]


def test_program_count_fits_ci():
    assert len(MANIFEST.programs) <= 24


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_103a"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_every_shape_routes_to_its_variant(arch, variant):
    dtype, bias, activation = variant
    for channels in (1, 7, 8, 63, 64, 255, 256, 264, 384, 4096, 8192, 1 << 20):
        for tokens in (0, 1, 3, 65535, 65536, 250340, 1 << 24):
            program = _routes.select(MANIFEST, _problem(dtype, bias, activation, channels,
                                                        tokens), arch)
            assert program.variant == {"dtype": str(dtype).split(".")[1], "bias": bias,
                                       "activation": activation or "none"}
            route = program.route
            assert route["channels_min"] <= channels <= route["channels_max"]
            assert route["tokens_min"] <= tokens
            assert arch in program.arches


def test_routes_pick_highest_floor_and_are_unambiguous():
    # Within a variant, no two programs share a (band, floor): the choice is a function.
    seen = set()
    for program in MANIFEST.programs:
        key = (tuple(sorted(program.variant.items())), program.route["channels_min"],
               program.route["channels_max"], program.route["tokens_min"])
        assert key not in seen
        seen.add(key)
    long = _routes.select(MANIFEST, _problem(torch.bfloat16, False, "silu", 4096, 250340),
                          "sm_90a")
    short = _routes.select(MANIFEST, _problem(torch.bfloat16, False, "silu", 4096, 1000),
                           "sm_90a")
    assert long.route["tokens_min"] > short.route["tokens_min"]


def test_no_route_is_a_clear_error():
    with pytest.raises(plans.NoRoute, match="channels=0"):
        _routes.select(MANIFEST, _problem(torch.bfloat16, False, "silu", 0, 10), "sm_90a")
    with pytest.raises(plans.NoRoute, match="sm_120a"):
        _routes.select(MANIFEST, _problem(torch.bfloat16, False, "silu", 64, 10), "sm_120a")


def test_manifest_is_rendered_and_checked():
    result = subprocess.run([sys.executable, "tools/render.py", "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([sys.executable, "tools/check_manifests.py"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_program_has_the_entries_and_kernels():
    table = _family_table()
    for program in MANIFEST.programs:
        names = [entry.name for entry in program.entries]
        assert set(names) >= {"forward", "backward"}
        assert "workspace_bytes" in names
        # Each entry declares the family table's arguments, in its order (what Python packs).
        assert {entry.name: tuple((a.name, a.kind) for a in entry.args)
                for entry in program.entries} == table.ENTRIES
        assert len(program.kernels) == 10
        assert set(program.arches) == {"sm_90a", "sm_100a", "sm_103a"}


# --------------------------------------------------------------------------- host validation


def test_check_tensor_names_argument_and_problem():
    good = torch.zeros(4, 8, dtype=torch.bfloat16)
    kwargs = dict(dtypes=(torch.bfloat16,), ndims=(2,), shape_hint="[S, C]", device_type="cpu")
    assert checks.check_tensor("x", good, **kwargs) is good
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        checks.check_tensor("x", [1, 2], **kwargs)
    with pytest.raises(TypeError, match=r"^x: expected dtype bfloat16, got float32"):
        checks.check_tensor("x", good.float(), **kwargs)
    with pytest.raises(ValueError, match=r"^x: expected shape \[S, C\]"):
        checks.check_tensor("x", good[None], **kwargs)
    with pytest.raises(ValueError, match=r"^x: expected a contiguous tensor"):
        checks.check_tensor("x", torch.zeros(8, 4, dtype=torch.bfloat16).t(), **kwargs)
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        checks.check_tensor("x", good, **dict(kwargs, device_type="cuda"))


def test_check_output_and_disjoint():
    out = torch.zeros(4, 8)
    checks.check_output("out", out, shape=(4, 8), dtype=torch.float32, device=out.device)
    with pytest.raises(TypeError, match="^out: "):
        checks.check_output("out", out.double(), shape=(4, 8), dtype=torch.float32,
                          device=out.device)
    with pytest.raises(ValueError, match="^out: "):
        checks.check_output("out", out[:2], shape=(4, 8), dtype=torch.float32, device=out.device)
    with pytest.raises(ValueError, match="^out: must not share memory with x"):
        checks.check_disjoint({"out": out}, {"x": out.view(8, 4)})
    checks.check_disjoint({"out": out}, {"x": torch.zeros(4, 8)})


def test_check_cu_seqlens_type_checks_without_device():
    with pytest.raises(TypeError, match="^cu_seqlens: expected dtype int32"):
        checks.check_cu_seqlens("cu_seqlens", torch.tensor([0, 4]), tokens=4,
                              device=torch.device("cuda", 0))
    with pytest.raises(ValueError, match="^cu_seqlens: expected a CUDA tensor"):
        checks.check_cu_seqlens("cu_seqlens", torch.tensor([0, 4], dtype=torch.int32), tokens=4,
                              device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match="^cu_seqlens: expected an int32 CUDA tensor"):
        checks.check_cu_seqlens("cu_seqlens", [0, 4], tokens=4, device=torch.device("cuda", 0))


def test_backward_result_is_tied_to_arity():
    g = torch.zeros(1)
    assert autograd.backward_result(5, {0: g, 2: g}) == (g, None, g, None, None)


# --------------------------------------------------------------------------- host fast path


@pytest.fixture
def gpu(monkeypatch):
    """A simulated GPU (``fake_gpu``); the family's plans are empty before and after."""
    memos = (_function._plan, _function._forward_plans, _function._backward_plans)
    for memo in memos:
        memo.clear()
    yield fake_gpu.install(monkeypatch)
    for memo in memos:
        memo.clear()


@pytest.fixture
def validations(monkeypatch):
    """Counts full validations of forward and backward calls."""
    counts = {"forward": 0, "backward": 0}
    for name in counts:
        real = getattr(_function, f"validate_{name}")

        def counted(*args, _real=real, _name=name):
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(_function, f"validate_{name}", counted)
    return counts


def _sizes(args: dict) -> dict:
    """The non-pointer arguments of a recorded backward launch."""
    return {name: args[name] for name in ("workspace_bytes", "tokens", "channels", "num_docs",
                                          "doc_len", "weight_fp32", "grad_fp32")}


def _conv_case(tokens=64, channels=32, bias=True):
    torch.manual_seed(0)
    x = cuda(torch.randn(tokens, channels).to(torch.bfloat16))
    w = cuda(torch.randn(channels, 4).to(torch.bfloat16))
    b = cuda(torch.randn(channels).to(torch.bfloat16)) if bias else None
    cu = cuda(torch.tensor([0, 10, 40, tokens], dtype=torch.int32))
    return x, w, b, cu, cuda(torch.randn(tokens, channels).to(torch.bfloat16))


def test_a_repeated_signature_is_validated_and_routed_once(gpu, validations):
    x, w, b, cu, dy = _conv_case()
    for _ in range(3):
        conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    assert validations == {"forward": 1, "backward": 1}
    assert len(gpu.of("workspace_bytes")) == 1  # one query per problem, not per call
    assert len(gpu.of("forward")) == len(gpu.of("backward")) == 3
    forward = gpu.of("forward")[-1].args
    assert forward == {"x": x.data_ptr(), "weight": w.data_ptr(), "bias": b.data_ptr(),
                       "cu_seqlens": cu.data_ptr(), "y": forward["y"], "tokens": 64,
                       "channels": 32, "num_docs": 3, "doc_len": 0, "weight_fp32": 0}
    backward = gpu.of("backward")[-1].args
    assert _sizes(backward) == {"workspace_bytes": fake_gpu.WORKSPACE_BYTES, "tokens": 64,
                                "channels": 32, "num_docs": 3, "doc_len": 0, "weight_fp32": 0,
                                "grad_fp32": 1}


def test_a_new_signature_is_validated_again_with_the_same_errors(gpu, validations):
    x, w, b, cu, dy = _conv_case()
    conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
    bad_calls = [
        (dict(weight=cuda(w.half())), TypeError, "^weight: expected dtype"),
        (dict(x=cuda(torch.zeros(32, 64, dtype=torch.bfloat16).t())), ValueError,
         "^x: expected a contiguous"),
        (dict(bias=cuda(b[:3].contiguous())), ValueError, "^bias: expected"),
        (dict(cu_seqlens=cuda(cu.long())), TypeError, "^cu_seqlens: expected dtype int32"),
        (dict(x=[[0.0] * 32] * 64), TypeError, "^x: expected a torch.Tensor"),
        (dict(activation="gelu"), ValueError, "^activation: expected one of"),
    ]
    for change, error, match in bad_calls:
        args = {**dict(x=x, weight=w, bias=b, cu_seqlens=cu, activation="silu"), **change}
        messages = []
        for _ in range(2):  # a failed signature is not remembered: the same error again
            with pytest.raises(error, match=match) as raised:
                conv.cake_causal_conv1d_det_train_forward(**args)
            messages.append(str(raised.value))
        with pytest.raises(error, match=match) as direct:  # what the validation itself says
            _validate.validate_forward(*args.values(), None)
        assert messages == [str(direct.value)] * 2
    assert validations["forward"] == 1 + 2 * len(bad_calls)
    assert len(gpu.of("forward")) == 1


def test_cu_seqlens_values_are_read_again_after_a_change(gpu, validations, monkeypatch):
    x, w, b, cu, dy = _conv_case()
    reads = []
    monkeypatch.setattr(plans, "is_capturing", lambda: reads.append(1) or False)
    conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
    conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
    assert len(reads) == 1  # unchanged: read once
    cu[2] = 5  # in place: same signature, new values
    with pytest.raises(ValueError, match=r"^cu_seqlens: must be non-decreasing, but entry 2 "
                                         r"\(5\) < entry 1 \(10\)"):
        conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
    with pytest.raises(ValueError, match="^cu_seqlens: must be non-decreasing"):
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    cu[2] = 40
    conv.cake_causal_conv1d_det_train_forward(x, w, b, cu)
    other = cuda(torch.tensor([0, 10, 40, 63], dtype=torch.int32))  # same signature
    with pytest.raises(ValueError, match="^cu_seqlens: must end at the token count 64, got 63"):
        conv.cake_causal_conv1d_det_train_forward(x, w, b, other)
    assert validations["forward"] == 1 and len(gpu.of("forward")) == 3


def test_outputs_overlapping_inputs_are_refused_on_the_fast_path(gpu, validations):
    x, w, b, cu, dy = _conv_case()
    y = cuda(torch.empty_like(x))
    dx, dw, db = cuda(torch.empty_like(x)), cuda(torch.empty(32, 4)), cuda(torch.empty(32))
    workspace = cuda(torch.empty(fake_gpu.WORKSPACE_BYTES, dtype=torch.uint8))
    conv.cake_causal_conv1d_det_train_forward(x, w, b, cu, out=y)
    conv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, dweight=dw, dbias=db,
                                               workspace=workspace)
    with pytest.raises(ValueError, match="^out: must not share memory with x"):
        conv.cake_causal_conv1d_det_train_forward(x, w, b, cu, out=x)
    with pytest.raises(ValueError, match="^dx: must not share memory with dy"):
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dy, dweight=dw, dbias=db,
                                                   workspace=workspace)
    with pytest.raises(ValueError, match="^workspace: must not share memory with x"):
        conv.cake_causal_conv1d_det_train_backward(
            dy, x, w, b, cu, dx=dx, dweight=dw, dbias=db,
            workspace=cuda(x.view(torch.uint8).view(-1)[:fake_gpu.WORKSPACE_BYTES]))
    shifted = cuda(torch.empty(fake_gpu.WORKSPACE_BYTES + 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^workspace: must be 16-byte aligned"):
        conv.cake_causal_conv1d_det_train_backward(
            dy, x, w, b, cu, dx=dx, dweight=dw, dbias=db,
            workspace=cuda(shifted[1:1 + fake_gpu.WORKSPACE_BYTES]))
    assert validations == {"forward": 1, "backward": 1}  # all refused on the fast path
    assert len(gpu.of("forward")) == len(gpu.of("backward")) == 1
    assert len(gpu.of("workspace_bytes")) == 1  # given a workspace: one query, not two


def test_a_small_workspace_is_refused(gpu):
    x, w, b, cu, dy = _conv_case()
    with pytest.raises(ValueError, match=rf"^workspace: needs {fake_gpu.WORKSPACE_BYTES} bytes"):
        conv.cake_causal_conv1d_det_train_backward(
            dy, x, w, b, cu, workspace=cuda(torch.empty(16, dtype=torch.uint8)))
    assert len(gpu.of("workspace_bytes")) == 1 and not gpu.of("backward")


@pytest.mark.parametrize("change,error,match", [
    # x is bf16 or fp16: float32 x (which the programs cannot read) is refused.
    (dict(x=torch.float32), TypeError, r"^x: expected dtype bfloat16 or float16, got float32"),
    (dict(x=torch.float64), TypeError, r"^x: expected dtype bfloat16 or float16, got float64"),
    # weight in x's dtype or fp32.
    (dict(weight=torch.float16), TypeError, r"^weight: expected dtype bfloat16 or float32, got float16"),
    # bias in the weight's dtype, whatever x's: not x's dtype when the weight is fp32, not fp32
    # when the weight is x's.
    (dict(bias=torch.float32), TypeError, r"^bias: expected dtype bfloat16, got float32"),
    (dict(weight=torch.float32), TypeError, r"^bias: expected dtype float32, got bfloat16"),
    (dict(weight=torch.float32, bias=torch.float16), TypeError,
     r"^bias: expected dtype float32, got float16"),
], ids=["x-fp32", "x-fp64", "weight-fp16", "bias-fp32-weight-bf16", "bias-bf16-weight-fp32",
        "bias-fp16-weight-fp32"])
def test_bad_dtypes_are_refused_before_any_launch(gpu, change, error, match):
    """The family's dtype rules on every entry (forward, backward, workspace query and the
    autograd functional): each bad dtype is refused, naming the argument, before any launch."""
    x, w, b, cu, dy = _conv_case()
    dtypes = {"x": torch.bfloat16, "weight": torch.bfloat16, "bias": torch.bfloat16, **change}
    x, w, b = (cuda(t.to(dtypes[name])) for name, t in (("x", x), ("weight", w), ("bias", b)))
    dy = cuda(dy.to(x.dtype))
    calls = [
        lambda: conv.cake_causal_conv1d_det_train_forward(x, w, b, cu),
        lambda: conv.cake_causal_conv1d_det_train_backward(dy, x, w, b, cu),
        lambda: conv.cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, b, cu),
        lambda: conv.cake_causal_conv1d_det(x, w, b, cu),
    ]
    for call in calls:
        with pytest.raises(error, match=match):
            call()
    assert not gpu
    # The same tensors with the dtypes fixed run (the rule, not the values, refused them).
    fixed = {"x": torch.bfloat16, "weight": dtypes["weight"] if dtypes["weight"] in
             (torch.bfloat16, torch.float32) else torch.bfloat16}
    fixed["bias"] = fixed["weight"]
    conv.cake_causal_conv1d_det_train_forward(cuda(x.to(fixed["x"])), cuda(w.to(fixed["weight"])),
                                              cuda(b.to(fixed["bias"])), cu)
    assert [launch.entry for launch in gpu if launch.entry != "workspace_bytes"] == ["forward"]


def test_autograd_backward_reuses_the_forward_plan(gpu, validations):
    x, w, b, cu, dy = _conv_case()
    leaves = [cuda(t.detach()).requires_grad_() for t in (x, w, b)]
    for _ in range(2):
        conv.cake_causal_conv1d_det(*leaves, cu).backward(dy.as_subclass(torch.Tensor))
    assert validations == {"forward": 1, "backward": 0}
    assert len(gpu.of("workspace_bytes")) == 1 and len(gpu.of("backward")) == 2
    args = gpu.of("backward")[-1].args
    assert [args[name] for name in ("x", "weight", "bias", "cu_seqlens")] == \
        [t.data_ptr() for t in (*leaves, cu)]
    assert _sizes(args) == {"workspace_bytes": fake_gpu.WORKSPACE_BYTES, "tokens": 64,
                            "channels": 32, "num_docs": 3, "doc_len": 0, "weight_fp32": 0,
                            "grad_fp32": 0}  # bf16 gradients
    assert [leaf.grad.shape for leaf in leaves] == [(64, 32), (32, 4), (32,)]


def test_functional_and_public_apply_launch_and_record_alike(gpu):
    """The functional launches, then records the call in autograd (autograd.eager_apply); the
    public Function.apply launches inside its forward: the same entries, graph node type and
    gradients' shapes. Under no_grad the functional launches and records nothing."""
    x, w, b, cu, dy = _conv_case()
    leaves = [cuda(t.detach()).requires_grad_() for t in (x, w, b)]
    nodes = []
    for call in (lambda *a: conv.cake_causal_conv1d_det(*a, activation="silu"),
                 lambda *a: conv.CakeCausalConv1dDetFunction.apply(*a, "silu")):
        y = call(*leaves, cu)
        nodes.append(type(y.grad_fn).__name__)
        y.backward(dy.as_subclass(torch.Tensor))
    assert nodes == ["CakeCausalConv1dDetFunctionBackward"] * 2
    assert [launch.entry for launch in gpu if launch.entry != "workspace_bytes"] == \
        ["forward", "backward"] * 2
    assert [leaf.grad.shape for leaf in leaves] == [(64, 32), (32, 4), (32,)]
    gpu.clear()
    with torch.no_grad():
        assert conv.cake_causal_conv1d_det(*leaves, cu).grad_fn is None
    assert [launch.entry for launch in gpu] == ["forward"]


# --------------------------------------------------------------------------- names


def test_public_names_follow_the_scheme():
    import cake.cake_causal_conv1d_det_train as package

    assert sorted(package.__all__) == sorted([
        "cake_causal_conv1d_det", "CakeCausalConv1dDetFunction",
        "cake_causal_conv1d_det_train_forward", "cake_causal_conv1d_det_train_backward",
        "cake_causal_conv1d_det_train_backward_workspace_bytes",
        "is_cake_causal_conv1d_det_train_supported"])
    public = [n for n in dir(package) if not n.startswith("_")]
    for name in public:
        assert not re.search(r"(^|_)(fwd|bwd)(_|$)", name)
        if inspect.isfunction(getattr(package, name)):
            assert "deterministic" not in inspect.signature(getattr(package, name)).parameters
    for name in package.__all__:
        obj = getattr(package, name)
        if inspect.isfunction(obj):
            params = inspect.signature(obj).parameters.values()
            assert not any(p.kind is p.VAR_KEYWORD for p in params), name
            assert obj.__doc__ and "Example" in obj.__doc__ or name.startswith("is_"), name
            # Options after the tensors are keyword-only.
            for p in params:
                if p.name in ("activation", "out", "grad_dtype", "dx", "dweight", "dbias",
                              "workspace", "dtype"):
                    assert p.kind is p.KEYWORD_ONLY, (name, p.name)


def test_library_names_follow_the_scheme():
    assert MANIFEST.package == f"cake.{NAME}" and MANIFEST.library_prefix == NAME
    for program in MANIFEST.programs:
        assert re.fullmatch(rf"{NAME}_[0-9a-f]{{20}}", program.library)
        for kernel in program.kernels:
            assert kernel.startswith(f"kernel_{program.library}_")


# --------------------------------------------------------------------------- compiler report


@pytest.mark.nvcc
@pytest.mark.skipif(jit.find_nvcc() is None, reason="nvcc not found ($CUDA_HOME/bin or PATH)")
@pytest.mark.parametrize("tile", ["short", "long"])
def test_kernels_do_not_spill(tile, tmp_path):
    program = next(p for p in MANIFEST.programs if p.route["tile"] == tile
                   and p.variant == {"dtype": "bfloat16", "bias": True, "activation": "silu"})
    kernel = REPO / "csrc" / NAME / f"{program.library}_kernel.cu"
    result = subprocess.run(
        [jit.find_nvcc(), "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
         f"-I{REPO / 'csrc' / 'include'}", f'-DCAKE_PROGRAM_DIGEST="{program.digest}"', "-c",
         str(kernel), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    reports = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                         r"loads", result.stderr)
    assert len(reports) == 10
    assert all(r == ("0", "0", "0") for r in reports), result.stderr


def test_import_cake_does_not_import_torch_here():
    code = "import sys, cake, cake.core.manifest; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def _family_table():
    """``tools/families/<NAME>.py``, loaded by path (``tools`` is not on the import path)."""
    spec = importlib.util.spec_from_file_location(
        "_table", REPO / "tools" / "families" / f"{NAME}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_family_table_loads():
    module = _family_table()
    assert module.FAMILY.name == NAME and len(module.FAMILY.specs) == len(MANIFEST.programs)


def test_the_canaries_of_the_garbage_cu_seqlens_test_see_a_write_past_either_end():
    """test_causal_conv1d_gpu.py's ``Canaries``, on the CPU: placed tensors keep their values
    and alignment, untouched margins pass, and one byte written just past a tensor's end or
    just before its start (what an off-by-one store does) fails, naming the tensor."""
    from test_causal_conv1d_gpu import CANARY, Canaries

    canaries = Canaries(margin=4096, device="cpu")
    x = torch.randn(30, 64).to(torch.bfloat16)
    placed = canaries.place("x", x)
    cu = canaries.place("cu_seqlens", torch.tensor([0, 7, 30], dtype=torch.int32))
    assert torch.equal(placed, x)
    assert (placed.data_ptr() - canaries.placed[0][1].data_ptr()) % 256 == 0
    assert cu.tolist() == [0, 7, 30]
    placed.fill_(0)  # inside the tensor: fine
    canaries.check()
    for name, buffer, nbytes in canaries.placed:
        for index, where in ((canaries.margin + nbytes, "past its end, up to 1 bytes past"),
                             (canaries.margin - 1, "before its start, up to 1 bytes before")):
            buffer[index] = 0
            with pytest.raises(AssertionError, match=f"^written out of bounds: {name}: 1 byte"
                                                     rf"\(s\) changed {where}$"):
                canaries.check()
            buffer[index] = CANARY
    canaries.check()
