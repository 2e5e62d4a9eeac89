"""CPU tests of the causal conv1d programs' real libraries on the fake CUDA driver
(tests/fake_cuda.c): the bf16, no-bias, SiLU programs of both tiles, JIT-compiled with nvcc into
the session's JIT cache, run their host code through the public API (``fake_gpu.cuda`` tensors)
and "launch" on the fake, which records every driver call.

Each launch's kernel, grid, block, dynamic shared memory, stream and parameters are what the
launch model computes from the program's knobs (conv1d_launch_model.py, after config.h and
entries.h); a process loads each library's image once and looks each kernel up once; a driver
error reaches the caller as a RuntimeError naming the kernel and the error.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import conv1d_launch_model as model  # noqa: E402
import fake_cuda  # noqa: E402
from fake_gpu import cuda  # noqa: E402

import cake.cake_causal_conv1d_det_train as conv  # noqa: E402
from cake.cake_causal_conv1d_det_train import _function  # noqa: E402
from cake.core import jit, plans  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

pytestmark = pytest.mark.nvcc

REPO = Path(__file__).resolve().parents[2]
NAME = model.NAME
MANIFEST = mf.read(REPO / "manifests" / f"{NAME}.json")
ARCH = "sm_90a"  # the fake driver's device: an H200, compute capability 9.0
STREAM = 0x5  # the stream handle the family is given (plans.stream_handle)
VARIANT = {"dtype": "bfloat16", "bias": False, "activation": "silu"}
PROGRAMS = {tile: next(p for p in MANIFEST.programs if p.variant == VARIANT
                       and p.route["tile"] == tile) for tile in ("short", "long")}
KNOBS = {tile: model.knobs(program) for tile, program in PROGRAMS.items()}


@pytest.fixture(scope="module")
def driver():
    """The fake driver, loaded into this process (before anything loads a real one)."""
    reason = jit.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here: the fake must not be mixed with it")
    return fake_cuda.load()


@pytest.fixture(scope="module")
def libraries(driver, family_jit_cache) -> dict:
    """The two programs, JIT-compiled (in parallel) into the session's JIT cache: tile -> path."""
    tree = mf.repository_tree(REPO, NAME)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            paths = list(pool.map(lambda p: jit.compile_program(tree, MANIFEST, p, ARCH)[0],
                                  PROGRAMS.values()))
    return dict(zip(PROGRAMS, paths))


@pytest.fixture
def fake(libraries, driver, family_jit_cache, monkeypatch):
    """The fake driver with an empty record; the family launches on STREAM through the real
    loader (its libraries from the session's JIT cache); the family's plans are empty before
    and after (they hold the loaded libraries' entries)."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
    monkeypatch.setenv("CAKE_JIT", "0")  # compiled by `libraries`: nothing compiles here
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    monkeypatch.setattr(plans, "is_capturing", lambda: False)
    memos = (_function._plan, _function._forward_plans, _function._backward_plans)
    for memo in memos:
        memo.clear()
    driver.reset()
    yield driver
    driver.reset()
    for memo in memos:
        memo.clear()


def _tile(tokens: int, channels: int) -> str:
    """The tile the router gives (S, C): "long" for C >= 256 with S >= 65536."""
    return "long" if channels >= 256 and tokens >= 65536 else "short"


def _tensor(shape, dtype=torch.bfloat16, *, offset: int = 0):
    """A fake CUDA tensor ``offset`` elements into a fresh buffer (values irrelevant: the fake
    driver runs no kernel)."""
    count = 1
    for size in shape:
        count *= size
    return cuda(torch.zeros(count + offset, dtype=dtype)[offset:].view(shape))


def _cu(lengths):
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return cuda(torch.tensor(offsets, dtype=torch.int32))


def _recorded(driver) -> list:
    return [model.Launch(launch.kernel, launch.grid, launch.block, launch.smem)
            for launch in driver.launches()]


# (x shape, document lengths or None, weight fp32, x one element into its buffer)
CASES = [
    ((1000, 512), [300, 700], False, False),    # short tile, 16-byte copies
    ((65536, 256), [3, 65000, 533], False, False),  # long tile (its floor and band)
    ((65536, 200), None, True, False),          # C < 256: short tile; fp32 weights
    ((37, 264), [1, 2, 3, 0, 31], False, True),  # misaligned x: the element paths
    ((129, 7), [100, 29], True, False),          # C % 4 != 0: element paths both ways
    ((300, 12), [1] * 300, False, False),        # C % 8 != 0, C % 4 == 0: scalar fwd, vector bwd
    ((0, 64), [0], False, False),                # S = 0: no forward, the reduction alone
    ((3, 50, 24), None, False, False),           # [B, T, C]: B documents of T tokens
]


@pytest.mark.parametrize("shape,lengths,weight_fp32,misaligned", CASES,
                         ids=["x".join(map(str, c[0])) + ("-fp32w" if c[2] else "")
                              + ("-misaligned" if c[3] else "") for c in CASES])
@pytest.mark.parametrize("grad_dtype", ["fp32", "weight"])
def test_launches_follow_the_launch_model(fake, shape, lengths, weight_fp32, misaligned,
                                          grad_dtype):
    """Forward and backward helpers (caller buffers given, so every address is known): each
    launch's kernel, grid, block and shared memory are the model's for the routed program, on
    the caller's stream, with the problem's sizes and the tensors' addresses in its parameters;
    the workspace size is the model's."""
    x = _tensor(shape, offset=1 if misaligned else 0)
    channels, tokens = shape[-1], x.numel() // shape[-1]
    wdtype = torch.float32 if weight_fp32 else torch.bfloat16
    w = _tensor((channels, 4), wdtype)
    cu = None if lengths is None else _cu(lengths)
    tile = _tile(tokens, channels)
    library, knobs = PROGRAMS[tile].library, KNOBS[tile]
    grad = torch.float32 if grad_dtype == "fp32" else wdtype
    y, dy, dx = _tensor(shape), _tensor(shape), _tensor(shape)
    dw = _tensor((channels, 4), grad)
    need = conv.cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, None, cu)
    assert need == model.workspace_bytes(knobs, tokens, channels)
    workspace = _tensor((max(need, 16),), torch.uint8)

    assert conv.cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y) is y
    conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, grad_dtype=grad, dx=dx,
                                               dweight=dw, workspace=workspace)
    forward = model.forward(knobs, library, tokens=tokens, channels=channels,
                            weight_fp32=weight_fp32, x=x.data_ptr(), y=y.data_ptr())
    expected = ([] if forward is None else [forward]) + model.backward(
        knobs, library, tokens=tokens, channels=channels, weight_fp32=weight_fp32,
        grad_fp32=grad == torch.float32, x=x.data_ptr(), dy=dy.data_ptr(), dx=dx.data_ptr())
    assert _recorded(fake) == expected
    launches = fake.launches()
    assert {launch.stream for launch in launches} == {STREAM}

    num_docs = 0 if cu is None else len(lengths)
    doc_len = 0 if cu is not None else shape[1] if len(shape) == 3 else max(tokens, 1)
    common = {"x": x.data_ptr(), "weight": w.data_ptr(), "bias": 0,
              "cu_seqlens": 0 if cu is None else cu.data_ptr(), "num_docs": num_docs,
              "doc_len": doc_len, "tokens": tokens, "channels": channels,
              "vectors": -(-channels // knobs["CAKE_VEC"]),
              "channel_tiles": -(-channels // model.tile(knobs))}
    token_tiles = -(-tokens // model.backward_tile_tokens(knobs))
    want = []
    if forward is not None:
        want.append({**common, "token_tiles": 0, "y": y.data_ptr(), "dy": 0, "dx": 0,
                     "partials": 0, "dweight": 0, "dbias": 0})
    backward = {**common, "token_tiles": token_tiles, "y": 0, "dy": dy.data_ptr(),
                "dx": dx.data_ptr(), "partials": workspace.data_ptr(), "dweight": dw.data_ptr(),
                "dbias": 0}
    want += [backward] * (2 if tokens else 1)
    assert [model.params(launch.params) for launch in launches] == want


def test_autograd_launches_the_same_kernels(fake):
    """The eager functional launches the forward (before autograd records the call) and, from
    the backward, the backward kernel and the reduction in the weight's dtype."""
    x = _tensor((1000, 512)).requires_grad_()
    w = _tensor((512, 4)).requires_grad_()
    cu = _cu([300, 700])
    y = conv.cake_causal_conv1d_det(x, w, None, cu)
    knobs, library = KNOBS["short"], PROGRAMS["short"].library
    assert _recorded(fake) == [model.forward(knobs, library, tokens=1000, channels=512,
                                             weight_fp32=False, x=x.data_ptr(), y=y.data_ptr())]
    fake.reset()
    y.backward(_tensor((1000, 512)).as_subclass(torch.Tensor))
    launches = _recorded(fake)
    assert [launch.kernel for launch in launches] == [
        f"kernel_{library}_backward_av", f"kernel_{library}_reduce_a"]
    assert launches[1] == model.backward(knobs, library, tokens=1000, channels=512,
                                         weight_fp32=False, grad_fp32=False, x=0, dy=0, dx=0)[1]


def test_forward_shared_memory_needs_no_raised_limit():
    """Both tiles' forward rings fit the default 48 KiB (so no launch raises a kernel's limit:
    test_each_library_loads_once_and_looks_each_kernel_up_once); the backward and the reduction
    take none."""
    for knobs in KNOBS.values():
        assert 0 < model.forward_shared(knobs) <= model.DEFAULT_SHARED


_ONCE_SCRIPT = """
import json, sys
sys.path[:0] = [{repo!r}, {tests!r}]
import fake_cuda
driver = fake_cuda.load()
import torch
from fake_gpu import cuda
from cake.core import plans
plans.stream_handle = lambda device: {stream}
plans.is_capturing = lambda: False
import cake.cake_causal_conv1d_det_train as conv

def tensor(shape, dtype=torch.bfloat16, offset=0):
    count = 1
    for size in shape:
        count *= size
    return cuda(torch.zeros(count + offset, dtype=dtype)[offset:].view(shape))

for tokens, channels, offset in ((1000, 512, 0), (65536, 256, 0), (37, 264, 1), (2000, 512, 0)):
    x, dy = tensor((tokens, channels), offset=offset), tensor((tokens, channels))
    w = tensor((channels, 4))
    for _ in range(2):
        conv.cake_causal_conv1d_det_train_forward(x, w, None, None)
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, None)
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, None, grad_dtype=w.dtype)
print(json.dumps(driver.lines()))
"""


def test_each_library_loads_once_and_looks_each_kernel_up_once(libraries, family_jit_cache):
    """In a fresh process, calls of both programs (each library one image: its one kernel
    source), several shapes, twice each, both access paths and both reductions: each library's
    image is loaded once, each kernel looked up once, before its first launch, and no kernel's
    shared-memory limit is raised (the model's rings fit the default)."""
    script = _ONCE_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), stream=STREAM)
    env = {**os.environ, "CAKE_CACHE_DIR": str(family_jit_cache), "CAKE_JIT": "0"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                            text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = json.loads(result.stdout.strip().splitlines()[-1])
    calls = [line.split(" ", 1)[0] for line in lines]
    loads = [line for line in lines if line.startswith("cuLibraryLoadData ")]
    assert len(loads) == 2 and all(" image=fatbin error=0" in line for line in loads)
    lookups = [re.search(r" name=(\S+)", line).group(1) for line in lines
               if line.startswith("cuLibraryGetKernel ")]
    launched = [re.search(r" kernel=(\S+)", line).group(1) for line in lines
                if line.startswith("cuLaunchKernel ")]
    assert len(lookups) == len(set(lookups)) and set(lookups) == set(launched)
    for kernel in set(launched):  # looked up before its first launch
        first_lookup = next(i for i, line in enumerate(lines)
                            if line.startswith("cuLibraryGetKernel ") and f" name={kernel} " in line)
        first_launch = next(i for i, line in enumerate(lines)
                            if line.startswith("cuLaunchKernel ") and f" kernel={kernel} " in line)
        assert first_lookup < first_launch
    short, long = (PROGRAMS[t].library for t in ("short", "long"))
    assert set(launched) == {f"kernel_{library}_{suffix}" for library in (short, long)
                             for suffix in ("forward_av", "backward_av", "reduce_f", "reduce_a")} | {
        f"kernel_{short}_{suffix}" for suffix in ("forward_as", "backward_as")}
    assert "cuKernelSetAttribute" not in calls
    assert len(launched) == 4 * 2 * 5  # per shape and round: forward, 2 x (backward, reduce)
    assert all(" stream=0x5 " in line for line in lines if line.startswith("cuLaunchKernel "))


def test_a_failed_launch_raises_naming_the_kernel_and_the_driver_error(fake):
    x, dy, w = _tensor((1000, 512)), _tensor((1000, 512)), _tensor((512, 4))
    library = PROGRAMS["short"].library
    conv.cake_causal_conv1d_det_train_forward(x, w, None, None)  # loaded, looked up, planned
    fake.fail("cuLaunchKernel", 701)
    message = (rf"^{library}_forward: kernel_{library}_forward_av: cuLaunchKernel failed: "
               r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES \(701\)$")
    with pytest.raises(RuntimeError, match=message):
        conv.cake_causal_conv1d_det_train_forward(x, w, None, None)
    with pytest.raises(RuntimeError, match=message):  # the autograd functional: the same error
        conv.cake_causal_conv1d_det(x, w, None, None)
    fake.reset()
    fake.fail("cuLaunchKernel", 701, after=1)  # the backward kernel launches, the reduction fails
    with pytest.raises(RuntimeError, match=rf"^{library}_backward: kernel_{library}_reduce_f: "
                                           r"cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RES"):
        conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, None)
    fake.reset()
    conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, None)  # the driver is fine again
    assert [launch.kernel for launch in fake.launches()] == [
        f"kernel_{library}_backward_av", f"kernel_{library}_reduce_f"]
