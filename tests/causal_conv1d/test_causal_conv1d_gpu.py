"""GPU tests of cake_causal_conv1d_det_train against the float64 reference (``pytest -m gpu``).

Tolerances, per element, from how the kernels compute (fp32 arithmetic on bf16/fp16 inputs):

* outputs rounded to bf16 (fp16) are off by at most half an ulp, 2^-9 (2^-11) relative; we
  allow one ulp, ``RTOL`` = 2^-8 (2^-10), plus 1e-7 absolute for fp16 subnormals;
* the fp32 part is bounded against a magnitude envelope of the same formula with absolute
  values (``env``): z sums 5 terms (<= 5 u env, u = 2^-24), the sigmoid uses __expf and the
  approximate reciprocal (a few ulp, ~1e-6 relative), so 1e-5 * env for y and dx;
* dweight/dbias add one fp32 chain per column: a thread's rows of its span (<= 128, long tile;
  8, short tile), the block's token threads (4; 16), the token tiles (<= ~600; ~2400 at
  S = 300k, summed in 32 groups of <= 19; <= 75, then the 32 groups): < 210 additions, so
  <= 210 u ~ 1.3e-5 relative to sum |dz x|; we allow 3e-5 * env.
"""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cake.cake_causal_conv1d_det_train import (  # noqa: E402
    cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes, cake_causal_conv1d_det_train_forward,
    is_cake_causal_conv1d_det_train_supported)
from cake.cake_causal_conv1d_det_train import reference as ref  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
RTOL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10, torch.float32: 0.0}


# --------------------------------------------------------------------------- inputs


def doc_lengths(layout: str, tokens: int, gen: torch.Generator) -> list[int] | None:
    """Document lengths summing to ``tokens`` (None: no cu_seqlens, one document)."""
    if layout == "none":
        return None
    if layout == "one":
        return [tokens]
    if layout in ("len1", "len2", "len3"):
        n = int(layout[-1])
        return [n] * (tokens // n) + ([tokens % n] if tokens % n else [])
    if layout == "tiny":  # lengths 0..5, zeros included
        out, left = [], tokens
        while left:
            n = min(int(torch.randint(0, 6, (1,), generator=gen)), left)
            out.append(n)
            left -= n
        return out
    if layout == "huge":  # one huge document between tiny ones
        head = min(tokens, 3)
        tail = min(tokens - head, 2)
        return [1] * head + [tokens - head - tail] + [1] * tail
    if layout == "random":
        cuts = sorted(torch.randint(0, tokens + 1, (9,), generator=gen).tolist())
        return [b - a for a, b in zip([0] + cuts, cuts + [tokens])]
    raise ValueError(layout)


def make_case(tokens, channels, layout, *, dtype=torch.bfloat16, weight_fp32=False, bias=True,
              seed=0, batch=None):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, tokens // batch, channels) if batch else (tokens, channels)
    x = torch.randn(shape, generator=gen).to(dtype).cuda()
    wdtype = torch.float32 if weight_fp32 else dtype
    w = (torch.randn(channels, 4, generator=gen) * 0.6).to(wdtype).cuda()
    b = (torch.randn(channels, generator=gen) * 0.3).to(wdtype).cuda() if bias else None
    dy = torch.randn(shape, generator=gen).to(dtype).cuda()
    lengths = None if batch else doc_lengths(layout, tokens, gen)
    cu = None
    if lengths is not None:
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32).cuda()
    return x, w, b, dy, cu


def poisoned(like: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.full(like.shape, float("nan"), dtype=dtype or like.dtype, device=like.device)


CANARY = 0xA5


class Canaries:
    """Tensors placed inside larger buffers whose margins hold a byte pattern: a write up to
    ``margin`` bytes past either end of a tensor changes its margins, which :meth:`check` finds.
    (A write farther off lands elsewhere; where nothing is mapped, the launch fails and the next
    synchronize raises. Reads out of bounds leave no trace here: compute-sanitizer's memcheck
    runs the same case through sanitize.py.)"""

    def __init__(self, margin: int = 16 << 20, device="cuda"):
        assert margin % 256 == 0, "the margin keeps each tensor's 256-byte alignment"
        self.margin = margin
        self.device = device
        self.placed = []
        """(name, buffer, bytes of the tensor) of every placed tensor."""

    def place(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` whose bytes lie ``margin`` bytes into a buffer of
        canaries (``margin`` more follow it)."""
        nbytes = tensor.numel() * tensor.element_size()
        buffer = torch.full((2 * self.margin + nbytes,), CANARY, dtype=torch.uint8,
                            device=self.device)
        inner = buffer[self.margin:self.margin + nbytes].view(tensor.dtype).view(tensor.shape)
        inner.copy_(tensor)
        self.placed.append((name, buffer, nbytes))
        return inner

    def check(self) -> None:
        """Every margin holds its canaries alone; else names each buffer written past, the side
        and how far from the tensor's end the farthest changed byte is."""
        broken = []
        for name, buffer, nbytes in self.placed:
            before = (buffer[:self.margin] != CANARY).nonzero()
            after = (buffer[self.margin + nbytes:] != CANARY).nonzero()
            if before.numel():
                broken.append(f"{name}: {before.numel()} byte(s) changed before its start, up "
                              f"to {self.margin - int(before[0])} bytes before")
            if after.numel():
                broken.append(f"{name}: {after.numel()} byte(s) changed past its end, up to "
                              f"{int(after[-1]) + 1} bytes past")
        if broken:
            raise AssertionError("written out of bounds: " + "; ".join(broken))


# --------------------------------------------------------------------------- tolerance


def envelopes(x, w, b, dy, cu, activation):
    """Magnitude envelopes (float64) of y, dx, dweight, dbias (see the module docstring)."""
    ax, aw = x.double().abs(), w.double().abs()
    ab = b.double().abs() if b is not None else None
    env_y = ref.pre_activation(ax, aw, ab, cu)
    z = ref.pre_activation(x, w, b, cu)
    if activation == "silu":
        s = torch.sigmoid(z)
        dz_mag = s * (1 + z.abs() * (1 - s))
    else:
        dz_mag = torch.ones_like(z)
    env_dz = dy.double().abs() * (dz_mag + env_y)
    env_dx, _, _ = ref.causal_conv1d_reference_backward(env_dz, ax, aw, ab, cu, activation=None)
    _, env_dw, env_db = ref.causal_conv1d_reference_backward(env_dz, ax, aw, ab, cu,
                                                             activation=None)
    return env_y, env_dx, env_dw, env_db


def assert_close(name, got, want, env, *, rtol, env_factor):
    got64 = got.double()
    allowed = rtol * want.abs() + env_factor * env + 1e-7
    bad = ~((got64 - want).abs() <= allowed)  # NaN counts as bad
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements out of tolerance; first at "
            f"{index}: got {float(got64[index])}, want {float(want[index])}, allowed "
            f"{float(allowed[index])}")


def check_case(x, w, b, dy, cu, *, activation="silu", grad_dtype=torch.float32,
               preallocate=False):
    out = poisoned(x) if preallocate else None
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu, activation=activation, out=out)
    kwargs = {}
    if preallocate:
        kwargs = dict(dx=poisoned(x), dweight=poisoned(w, grad_dtype),
                      dbias=poisoned(b, grad_dtype) if b is not None else None)
        need = cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, b, cu,
                                                                     activation=activation)
        kwargs["workspace"] = torch.full((need + 16,), 255, dtype=torch.uint8, device=x.device)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, activation=activation,
                                                       grad_dtype=grad_dtype, **kwargs)
    if preallocate:
        assert y is out and dx is kwargs["dx"] and dw is kwargs["dweight"]
    assert y.shape == x.shape and y.dtype == x.dtype
    assert dw.dtype == grad_dtype and (db is None) == (b is None)
    want_y = ref.causal_conv1d_reference(x, w, b, cu, activation=activation)
    want_dx, want_dw, want_db = ref.causal_conv1d_reference_backward(dy, x, w, b, cu,
                                                                     activation=activation)
    env_y, env_dx, env_dw, env_db = envelopes(x, w, b, dy, cu, activation)
    assert_close("y", y, want_y, env_y, rtol=RTOL[x.dtype], env_factor=1e-5)
    assert_close("dx", dx, want_dx, env_dx, rtol=RTOL[x.dtype], env_factor=1e-5)
    assert_close("dweight", dw, want_dw, env_dw, rtol=RTOL[grad_dtype], env_factor=3e-5)
    if b is not None:
        assert_close("dbias", db, want_db, env_db, rtol=RTOL[grad_dtype], env_factor=3e-5)


# --------------------------------------------------------------------------- shapes

CHANNELS = (1, 7, 8, 63, 64, 264, 384, 4096, 8192)
LAYOUTS = ("none", "one", "len1", "len2", "len3", "tiny", "huge", "random")


def _cases():
    cases = []
    for c in CHANNELS:
        for s in (0, 1, 2, 3):
            cases += [(s, c, "none"), (s, c, "len1")]
        for layout in LAYOUTS:
            cases.append((4099 if c < 4096 else 1031, c, layout))
    for c in (1, 64, 264, 384, 4096):
        cases += [(70001, c, "random"), (70001, c, "huge")]
    cases += [(300000, 7, "random"), (300000, 264, "len3"), (300000, 384, "huge"),
              (300000, 64, "tiny"), (20000, 8192, "random")]
    # The "long" tile's element path (C >= 256, C % 4 != 0): spans of many steps per thread.
    cases += [(70001, 257, "len3"), (70001, 258, "random")]
    return cases


CASES = _cases()
# Cycle the variant knobs over the cases so every combination meets many shapes.
KNOBS = list(itertools.product((torch.bfloat16, torch.float16), (False, True), (True, False),
                               ("silu", None), (torch.float32, "weight")))


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"S{s}-C{c}-{layout}" for s, c, layout in CASES])
def test_matches_reference(index):
    tokens, channels, layout = CASES[index]
    dtype, weight_fp32, bias, activation, grad = KNOBS[index % len(KNOBS)]
    x, w, b, dy, cu = make_case(tokens, channels, layout, dtype=dtype, weight_fp32=weight_fp32,
                                bias=bias, seed=index)
    check_case(x, w, b, dy, cu, activation=activation,
               grad_dtype=torch.float32 if grad == torch.float32 else w.dtype,
               preallocate=index % 2 == 0)


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(str(v) for v in k))
def test_every_variant(knobs):
    dtype, weight_fp32, bias, activation, grad = knobs
    for tokens, channels, layout in ((1000, 264, "tiny"), (3001, 72, "random"), (5, 13, "len2")):
        x, w, b, dy, cu = make_case(tokens, channels, layout, dtype=dtype,
                                    weight_fp32=weight_fp32, bias=bias, seed=tokens)
        check_case(x, w, b, dy, cu, activation=activation,
                   grad_dtype=torch.float32 if grad == torch.float32 else w.dtype,
                   preallocate=True)


@pytest.mark.parametrize("batch,tokens,channels", [(3, 3000, 264), (2, 2, 64), (4, 70004, 384),
                                                   (5, 0, 8), (1, 7, 1)])
def test_batched_input_is_documents(batch, tokens, channels):
    x, w, b, dy, _ = make_case(tokens, channels, "none", batch=batch, seed=batch)
    check_case(x, w, b, dy, None)


def test_autograd_matches_helpers():
    x, w, b, dy, cu = make_case(5000, 264, "random", seed=3)
    xg, wg, bg = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = cake_causal_conv1d_det(xg, wg, bg, cu)
    y.backward(dy)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, grad_dtype=w.dtype)
    assert torch.equal(y, cake_causal_conv1d_det_train_forward(x, w, b, cu))
    assert torch.equal(xg.grad, dx) and torch.equal(wg.grad, dw) and torch.equal(bg.grad, db)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` one element into a larger buffer: contiguous, not 8-byte aligned."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("tokens,channels,layout", [(70001, 384, "random"), (4099, 264, "tiny")])
def test_misaligned_inputs_take_the_element_path(tokens, channels, layout):
    x, w, b, dy, cu = make_case(tokens, channels, layout, seed=tokens)
    x, dy = _misaligned(x), _misaligned(dy)
    assert x.data_ptr() % 8 and dy.data_ptr() % 8
    check_case(x, w, b, dy, cu, preallocate=True)


def test_supported():
    assert is_cake_causal_conv1d_det_train_supported()
    assert not is_cake_causal_conv1d_det_train_supported(dtype=torch.float32)


# --------------------------------------------------------------------------- determinism


def _outputs(x, w, b, dy, cu):
    y = cake_causal_conv1d_det_train_forward(x, w, b, cu)
    dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    return y, dx, dw, db


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


DET_SHAPES = [(100003, 1024, "random"), (65536, 384, "tiny"), (250340, 512, "random"),
              (4099, 63, "len3")]


@pytest.mark.parametrize("tokens,channels,layout", DET_SHAPES)
def test_bitwise_repeatable_and_stream_independent(tokens, channels, layout):
    x, w, b, dy, cu = make_case(tokens, channels, layout, seed=11)
    first = _outputs(x, w, b, dy, cu)
    for _ in range(20):
        again = _outputs(x, w, b, dy, cu)
        assert all(torch.equal(a, c) for a, c in zip(first, again))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = _outputs(x, w, b, dy, cu)
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(a, c) for a, c in zip(first, other))


def test_bitwise_identical_across_processes():
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_causal_conv1d_gpu as t
        x, w, b, dy, cu = t.make_case(100003, 1024, "random", seed=5)
        print(t._digest(t._outputs(x, w, b, dy, cu)))
    """)
    x, w, b, dy, cu = make_case(100003, 1024, "random", seed=5)
    here = _digest(_outputs(x, w, b, dy, cu))
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           cwd=REPO)
    assert there.returncode == 0, there.stderr
    assert there.stdout.strip().splitlines()[-1] == here


# --------------------------------------------------------------------------- graphs, compile


def test_cuda_graph_capture_with_caller_buffers():
    x, w, b, dy, cu = make_case(20000, 384, "random", seed=21)
    y, dx = poisoned(x), poisoned(x)
    dw, db = poisoned(w, torch.float32), poisoned(b, torch.float32)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, b, cu),
                     dtype=torch.uint8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Warm the library and route caches outside capture.
        cake_causal_conv1d_det_train_forward(x, w, b, cu, out=y)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=side):
            cake_causal_conv1d_det_train_forward(x, w, b, cu, out=y)
            cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, dweight=dw, dbias=db,
                                                  workspace=ws)
    torch.cuda.current_stream().wait_stream(side)
    x2, w2, b2, dy2, _ = make_case(20000, 384, "random", seed=22)
    for dst, src in ((x, x2), (w, w2), (b, b2), (dy, dy2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = _outputs(x, w, b, dy, cu)
    assert all(torch.equal(a, c) for a, c in zip((y, dx, dw, db), want))


def test_capture_with_garbage_cu_seqlens_is_memory_safe():
    """Under capture cu_seqlens' values are not read on the host; the kernels must stay in
    bounds whatever they hold. Every buffer of the call lies between canary margins
    (``Canaries``), which the replay must leave untouched, and the inputs keep their bits
    (compute-sanitizer runs the same case through sanitize.py, for reads too)."""
    x, w, b, dy, _ = make_case(3000, 64, "none", seed=4)
    garbage = torch.tensor([5, -7, 100000, 2, 2999, 1 << 30, -1], dtype=torch.int32,
                           device="cuda")
    canaries = Canaries()
    inputs = {"x": x, "weight": w, "bias": b, "dy": dy, "cu_seqlens": garbage}
    placed = {name: canaries.place(name, tensor) for name, tensor in inputs.items()}
    x, w, b, dy, cu = placed.values()
    y, dx = canaries.place("y", poisoned(x)), canaries.place("dx", poisoned(x))
    dw = canaries.place("dweight", poisoned(w, torch.float32))
    db = canaries.place("dbias", poisoned(b, torch.float32))
    need = cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, b, None)
    ws = canaries.place("workspace", torch.zeros(need, dtype=torch.uint8, device="cuda"))
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            cake_causal_conv1d_det_train_forward(x, w, b, cu, out=y)
            cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx, dweight=dw, dbias=db,
                                                  workspace=ws)
    graph.replay()
    torch.cuda.synchronize()
    canaries.check()
    written = [name for name in inputs if not torch.equal(placed[name], inputs[name])]
    assert not written, f"inputs written: {written}"


@pytest.mark.parametrize("bias", [True, False])
def test_torch_compile_opaque_op(bias):
    x, w, b, dy, cu = make_case(3000, 264, "random", seed=8, bias=bias)

    def loss(x, w, b):
        return (cake_causal_conv1d_det(x, w, b, cu).float() * dy.float()).sum()

    compiled = torch.compile(loss, fullgraph=True)  # fullgraph: the op must not break it
    values, grads = [], []
    for fn in (loss, compiled):
        args = [t.detach().clone().requires_grad_(True) if t is not None else None
                for t in (x, w, b)]
        value = fn(*args)
        value.backward()
        values.append(value.detach())
        grads.append([a.grad if a is not None else None for a in args])
    # Inductor sums the loss in its own order; the gradients reaching our op are exact (dy),
    # so the op's outputs must be bitwise equal.
    torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-3)
    assert all((a is None and c is None) or torch.equal(a, c) for a, c in zip(*grads))


# --------------------------------------------------------------------------- bad input


def _bad_calls():
    x, w, b, dy, cu = make_case(64, 16, "random", seed=1)
    good = dict(x=x, weight=w, bias=b, cu_seqlens=cu)
    i32 = dict(dtype=torch.int32, device="cuda")
    return good, dy, [
        ("x dtype", dict(x=x.float()), TypeError, "^x: expected dtype"),
        ("x device", dict(x=x.cpu()), ValueError, "^x: expected a CUDA tensor"),
        ("x rank", dict(x=x[0]), ValueError, r"^x: expected shape"),
        ("x strides", dict(x=torch.empty(16, 64, dtype=x.dtype, device="cuda").t()), ValueError,
         "^x: expected a contiguous"),
        ("weight C", dict(weight=w[:8].contiguous()), ValueError, "^weight: expected"),
        ("weight width", dict(weight=torch.zeros(16, 3, dtype=w.dtype, device="cuda")),
         ValueError, "^weight: only width 4"),
        ("weight dtype", dict(weight=w.half()), TypeError, "^weight: expected dtype"),
        ("bias dtype", dict(bias=b.float()), TypeError, "^bias: expected dtype"),
        ("bias C", dict(bias=b[:3].contiguous()), ValueError, "^bias: expected"),
        ("cu cpu", dict(cu_seqlens=cu.cpu()), ValueError, "^cu_seqlens: expected a CUDA"),
        ("cu int64", dict(cu_seqlens=cu.long()), TypeError, "^cu_seqlens: expected dtype int32"),
        ("cu start", dict(cu_seqlens=torch.tensor([1, 64], **i32)), ValueError,
         "^cu_seqlens: must start at 0"),
        ("cu decreasing", dict(cu_seqlens=torch.tensor([0, 40, 30, 64], **i32)), ValueError,
         "^cu_seqlens: must be non-decreasing"),
        ("cu end", dict(cu_seqlens=torch.tensor([0, 63], **i32)), ValueError,
         "^cu_seqlens: must end at the token count 64"),
        ("cu rank", dict(cu_seqlens=torch.tensor([[0, 64]], **i32)), ValueError,
         "^cu_seqlens: expected a contiguous 1-D"),
        ("cu with 3-D x", dict(x=x.view(4, 16, 16)), ValueError, "^cu_seqlens: must be None"),
    ]


@pytest.mark.parametrize("case", range(16))
def test_bad_input_raises_before_launch(case):
    good, dy, calls = _bad_calls()
    name, change, error, match = calls[case]
    args = dict(good, **change)
    out = poisoned(good["x"])
    before = out.clone()
    torch.cuda.synchronize()
    with pytest.raises(error, match=match):
        cake_causal_conv1d_det_train_forward(args["x"], args["weight"], args["bias"],
                                             args["cu_seqlens"], out=out)
    dx = poisoned(good["x"])
    with pytest.raises(error, match=match):
        cake_causal_conv1d_det_train_backward(dy.view(args["x"].shape) if args["x"].numel()
                                              == dy.numel() and args["x"].is_contiguous()
                                              else dy, args["x"], args["weight"], args["bias"],
                                              args["cu_seqlens"], dx=dx)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))
    assert torch.equal(dx.view(torch.int16), before.view(torch.int16))


def test_bad_backward_arguments():
    good, dy, _ = _bad_calls()
    x, w, b, cu = good["x"], good["weight"], good["bias"], good["cu_seqlens"]
    dx = poisoned(x)
    with pytest.raises(ValueError, match="^dy: expected the shape of x"):
        cake_causal_conv1d_det_train_backward(dy[:32].contiguous(), x, w, b, cu, dx=dx)
    with pytest.raises(TypeError, match="^dy: expected dtype"):
        cake_causal_conv1d_det_train_backward(dy.half(), x, w, b, cu, dx=dx)
    with pytest.raises(ValueError, match="^grad_dtype: "):
        cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, grad_dtype=torch.float16)
    with pytest.raises(ValueError, match="^workspace: needs"):
        cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx,
                                              workspace=torch.empty(4, dtype=torch.uint8,
                                                                    device="cuda"))
    with pytest.raises(TypeError, match="^dweight: expected"):
        cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dx,
                                              dweight=torch.empty_like(w, dtype=torch.float16))
    with pytest.raises(ValueError, match="^dx: must not share memory with dy"):
        cake_causal_conv1d_det_train_backward(dy, x, w, b, cu, dx=dy)
    with pytest.raises(ValueError, match="^activation: expected one of"):
        cake_causal_conv1d_det_train_forward(x, w, b, cu, activation="gelu")
    torch.cuda.synchronize()
    assert torch.isnan(dx.float()).all()
