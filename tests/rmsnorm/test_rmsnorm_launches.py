"""CPU tests of the RMSNorm programs' real libraries on the fake CUDA driver (tests/fake_cuda.c):
two programs, JIT-compiled with nvcc into the session's JIT cache (RMSNorm's bf16 vector program of
the D band 3585 .. 4096: a registers-path forward and a ring backward above 48 KiB of shared memory;
the gated family's bf16 scalar program: element loads, rings, every D up to 16384), run their host
code through the public API (``fake_gpu.cuda`` tensors) and "launch" on the fake, which records
every driver call.

Each launch's kernel instance, grid, block, dynamic shared memory, stream and parameters are what
launch_model.py computes from the program's knobs (after csrc/include/cake/rmsnorm/common.h and
entries.h); a process loads each library's image once, looks each kernel up once and raises a
kernel's shared-memory limit once; a driver error reaches the caller as a RuntimeError naming the
kernel and the error.
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

import fake_cuda  # noqa: E402
import launch_model as model  # noqa: E402
from fake_gpu import cuda  # noqa: E402
from rmsnorm_families import FAMILIES  # noqa: E402

from cake.cake_gated_rmsnorm_det_train import _function as gated_function  # noqa: E402
from cake.cake_rmsnorm_det_train import _function as plain_function  # noqa: E402
from cake.core import jit, plans  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

pytestmark = pytest.mark.nvcc

REPO = Path(__file__).resolve().parents[2]
ARCH = "sm_90a"  # the fake driver's device: an H200, compute capability 9.0
STREAM = 0x5  # the stream handle the families are given (plans.stream_handle)
EPS = 1e-6
PLAIN, GATED = FAMILIES
NAMES = {False: "cake_rmsnorm_det_train", True: "cake_gated_rmsnorm_det_train"}
MANIFESTS = {gated: mf.read(REPO / "manifests" / f"{name}.json") for gated, name in NAMES.items()}
_PARAM_RE = re.compile(r"^#define (CAKE_\w+) (-?\d+)$", re.MULTILINE)


def _program(gated: bool, load: str, cols: int):
    return next(p for p in MANIFESTS[gated].programs
                if p.variant == {"dtype": "bfloat16", "load": load}
                and p.route["cols_min"] <= cols <= p.route["cols_max"])


# (family, its program): RMSNorm's vector band of D = 3585 .. 4096 and the gated scalar program.
PROGRAMS = {"vector": (PLAIN, _program(False, "vector", 4096)),
            "scalar": (GATED, _program(True, "scalar", 1))}


def _knobs(family, program) -> dict:
    source = (REPO / "csrc" / NAMES[family.gated] / f"{program.library}_kernel.cu").read_text()
    return {name: int(value) for name, value in _PARAM_RE.findall(source)}


KNOBS = {key: _knobs(*pair) for key, pair in PROGRAMS.items()}


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
    """The two programs, JIT-compiled (in parallel) into the session's JIT cache."""
    def build(pair):
        family, program = pair
        name = NAMES[family.gated]
        return jit.compile_program(mf.repository_tree(REPO, name), MANIFESTS[family.gated],
                                   program, ARCH)[0]

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            paths = list(pool.map(build, PROGRAMS.values()))
    return dict(zip(PROGRAMS, paths))


@pytest.fixture
def fake(libraries, driver, family_jit_cache, monkeypatch):
    """The fake driver with an empty record; the families launch on STREAM through the real
    loader (their libraries from the session's JIT cache); the families' plans are empty before
    and after (they hold the loaded libraries' entries)."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
    monkeypatch.setenv("CAKE_JIT", "0")  # compiled by `libraries`: nothing compiles here
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    monkeypatch.setattr(plans, "is_capturing", lambda: False)
    families = (plain_function._PROGRAMS, gated_function._PROGRAMS)
    for programs in families:
        programs.clear()
    driver.reset()
    yield driver
    driver.reset()
    for programs in families:
        programs.clear()


def _rows(rows, cols, dtype=torch.bfloat16, *, offset=0):
    """A fake CUDA [rows, cols] tensor ``offset`` elements into a fresh buffer (values
    irrelevant: the fake driver runs no kernel)."""
    return cuda(torch.zeros(rows * cols + offset, dtype=dtype)[offset:].view(rows, cols))


def _launch(record) -> dict:
    return {"kernel": record.kernel, "grid": record.grid, "block": record.block,
            "smem": record.smem}


def _shape(launch: dict) -> dict:
    return {key: launch[key] for key in ("kernel", "grid", "block", "smem")}


# (program, rows, D, residual, fp32 weight, every row tensor one element into its buffer)
CASES = [
    ("vector", 1, 4096, False, False, False),
    ("vector", 37, 3592, True, True, False),
    ("vector", 5000, 4096, False, True, False),
    ("vector", 9000, 3592, False, False, False),  # more rows than 16 a band: wider bands
    ("vector", 0, 4096, True, False, False),      # no rows: the reduction alone
    ("scalar", 1, 7, False, False, False),        # one thread a row, 512 row groups a CTA
    ("scalar", 300, 1000, True, False, True),     # misaligned rows: the scalar route, D % 8 == 0
    ("scalar", 45, 1001, False, True, False),
    ("scalar", 9, 16384, True, True, True),       # the widest rows: 32 elements a thread
    ("scalar", 600, 12001, False, False, False),  # 32 elements a thread, guided bands
]


@pytest.mark.parametrize("key,rows,cols,residual,weight_fp32,misaligned", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}" + ("-residual" if c[3] else "")
                              + ("-fp32w" if c[4] else "") + ("-misaligned" if c[5] else "")
                              for c in CASES])
@pytest.mark.parametrize("grad_dtype", ["fp32", "weight"])
def test_launches_follow_the_launch_model(fake, key, rows, cols, residual, weight_fp32,
                                          misaligned, grad_dtype):
    """Forward and backward helpers with every buffer given (so every address is known): each
    launch's kernel instance, grid, block and shared memory are the launch model's for the routed
    program, on the caller's stream, with the call's addresses and sizes and the model's row
    group and ring slots in its parameters; the workspace size is the model's."""
    family, program = PROGRAMS[key]
    knobs, library = KNOBS[key], program.library
    offset = 1 if misaligned else 0

    def tensor(given=True):
        return _rows(rows, cols, offset=offset) if given else None

    x, g, r = tensor(), tensor(family.gated), tensor(residual)
    w = cuda(torch.ones(cols, dtype=torch.float32 if weight_fp32 else torch.bfloat16))
    y, s, rstd = tensor(), tensor(residual), cuda(torch.ones(rows))
    dy, dsum = tensor(), tensor(residual)
    dx, dg, dres = tensor(), tensor(family.gated), tensor(residual)
    grad = torch.float32 if grad_dtype == "fp32" else w.dtype
    dw = cuda(torch.ones(cols, dtype=grad))
    normalised = s if residual else x
    per, ctas = model.backward_partition(knobs, rows, cols)
    need = family.workspace_bytes(normalised, g, w)
    assert need == ctas * -(-cols // 4) * 4 * 4
    workspace = cuda(torch.zeros(max(need, 16), dtype=torch.uint8))

    family.forward(x, g, w, r, eps=EPS, weight_offset=0.25, out=y, residual_out=s, rstd=rstd)
    family.backward(dy, normalised, g, w, rstd, dsum=dsum, has_residual=residual,
                    weight_offset=0.25, grad_dtype=grad, dx=dx, dg=dg, dresidual=dres, dweight=dw,
                    workspace=workspace)
    forward = model.forward_launch(knobs, library, rows, cols, residual=residual)
    backward = model.backward_launch(knobs, library, rows, cols)
    dweight = model.dweight_launch(library, cols)
    expected = [launch for launch in (forward, backward) if launch is not None] + [dweight]
    launches = fake.launches()
    assert [_launch(launch) for launch in launches] == [_shape(launch) for launch in expected]
    assert {launch.stream for launch in launches} == {STREAM}

    def address(tensor):
        return 0 if tensor is None else tensor.data_ptr()

    sizes = {"rows": rows, "cols": cols, "weight_fp32": int(weight_fp32),
             "weight_offset": 0.25, "inv_cols": model.inv_cols(cols)}
    want = []
    if rows:
        want.append((model.FORWARD_PARAMS, {
            "x": x.data_ptr(), "residual": address(r), "gate": address(g), "weight": w.data_ptr(),
            "y": y.data_ptr(), "residual_out": address(s), "rstd": rstd.data_ptr(), **sizes,
            "tpr": forward["tpr"], "stages": forward["stages"], "eps": model.fp32(EPS)}))
        want.append((model.BACKWARD_PARAMS, {
            "s": normalised.data_ptr(), "gate": address(g), "weight": w.data_ptr(),
            "dy": dy.data_ptr(), "rstd": rstd.data_ptr(), "dsum": address(dsum),
            "dx": dx.data_ptr(), "dresidual": address(dres), "dgate": address(dg),
            "partials": workspace.data_ptr(), **sizes, "rows_per_cta": per,
            "cols_padded": -(-cols // 4) * 4, "tpr": backward["tpr"],
            "stages": backward["stages"]}))
    want.append((model.DWEIGHT_PARAMS, {
        "partials": workspace.data_ptr() if rows else 0, "dweight": dw.data_ptr(),
        "chunks": ctas if rows else 0, "cols": cols, "cols_padded": -(-cols // 4) * 4,
        "out_dtype": {torch.bfloat16: 0, torch.float32: 2}[grad]}))
    got = [model.params(layout, launch.params) for (layout, _), launch in zip(want, launches)]
    assert got == [fields for _, fields in want]


@pytest.mark.parametrize("key", ["vector", "scalar"])
def test_autograd_launches_the_same_kernels(fake, key):
    """The eager functional launches the forward before autograd records the call, and the
    backward's kernel and the reduction from autograd's backward (dweight in the weight's
    dtype)."""
    family, program = PROGRAMS[key]
    knobs, library = KNOBS[key], program.library
    rows, cols = (64, 4096) if key == "vector" else (64, 1001)
    x = _rows(rows, cols).requires_grad_()
    g = _rows(rows, cols).requires_grad_() if family.gated else None
    w = cuda(torch.ones(cols, dtype=torch.bfloat16)).requires_grad_()
    y = family.functional(x, g, w)
    forward = model.forward_launch(knobs, library, rows, cols, residual=False)
    assert [_launch(launch) for launch in fake.launches()] == [_shape(forward)]
    fake.reset()
    y.backward(torch.zeros(rows, cols, dtype=torch.bfloat16))
    assert [_launch(launch) for launch in fake.launches()] == [
        _shape(model.backward_launch(knobs, library, rows, cols)),
        model.dweight_launch(library, cols)]
    dweight = model.params(model.DWEIGHT_PARAMS, fake.launches()[-1].params)
    assert dweight["out_dtype"] == 0  # the weight's dtype (bf16)


_ONCE_SCRIPT = """
import json, sys
sys.path[:0] = [{repo!r}, {tests!r}, {here!r}]
import fake_cuda
driver = fake_cuda.load()
import torch
from fake_gpu import cuda
from cake.core import plans
plans.stream_handle = lambda device: {stream}
plans.is_capturing = lambda: False
from rmsnorm_families import FAMILIES

def rows(t, d, offset=0):
    return cuda(torch.zeros(t * d + offset, dtype=torch.bfloat16)[offset:].view(t, d))

# (family, rows, D, offset of x): per family the widest rows first, then narrower rows of the
# same kernel instances (less shared memory: no raise), each twice.
# (x one element into its buffer: the gated scalar program's route at D % 8 == 0)
calls = [(0, 5000, 4096, 0), (0, 37, 3592, 0), (0, 5000, 4096, 0), (1, 9, 16384, 1),
         (1, 9, 12000, 1), (1, 300, 1001, 0), (1, 9, 16384, 1), (1, 300, 1001, 0)]
for which, t, d, offset in calls:
    family = FAMILIES[which]
    x = rows(t, d, offset)
    g = rows(t, d) if family.gated else None
    w = cuda(torch.ones(d, dtype=torch.bfloat16))
    y, _, rstd = family.forward(x, g, w)
    family.backward(rows(t, d), x, g, w, cuda(rstd))
print(json.dumps(driver.lines()))
"""


def test_each_library_loads_once_and_raises_each_kernels_limit_once(libraries, family_jit_cache):
    """In a fresh process, calls of both programs (each library one image: its one kernel
    source), several shapes, each twice: each library's image is loaded once and each kernel
    looked up once, before its first launch; a kernel's shared-memory limit is raised (to its
    launch's bytes) only by a launch that needs more than 48 KiB (with the kernels' static
    bytes) and more than the kernel was allowed before: here once, by the first launch of each
    kernel that needs it."""
    script = _ONCE_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"),
                                 here=str(Path(__file__).parent), stream=STREAM)
    env = {**os.environ, "CAKE_CACHE_DIR": str(family_jit_cache), "CAKE_JIT": "0"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                            text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = json.loads(result.stdout.strip().splitlines()[-1])
    loads = [line for line in lines if line.startswith("cuLibraryLoadData ")]
    assert len(loads) == 2 and all(" image=fatbin error=0" in line for line in loads)
    lookups = [re.search(r" name=(\S+)", line).group(1) for line in lines
               if line.startswith("cuLibraryGetKernel ")]
    launches = [(re.search(r" kernel=(\S+)", line).group(1),
                 int(re.search(r" smem=(\d+)", line).group(1)))
                for line in lines if line.startswith("cuLaunchKernel ")]
    assert len(lookups) == len(set(lookups)) and set(lookups) == {k for k, _ in launches}
    for kernel in set(lookups):  # looked up before its first launch
        lookup = next(i for i, line in enumerate(lines)
                      if line.startswith("cuLibraryGetKernel ") and f" name={kernel} " in line)
        launch = next(i for i, line in enumerate(lines)
                      if line.startswith("cuLaunchKernel ") and f" kernel={kernel} " in line)
        assert lookup < launch
    raised = [(re.search(r" kernel=(\S+)", line).group(1),
               int(re.search(r" attribute=(\d+)", line).group(1)),
               int(re.search(r" value=(\d+)", line).group(1)))
              for line in lines if line.startswith("cuKernelSetAttribute ")]
    allowed, expected = {}, []
    for kernel, smem in launches:  # cake::Kernel::allow_smem, as the model has it
        if model.raises_limit(smem) and smem > allowed.get(kernel, 0):
            allowed[kernel] = smem
            expected.append((kernel, 8, smem))  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert raised == expected
    # Here each raise is its kernel's only one, and both programs raise some.
    assert len({kernel for kernel, _, _ in raised}) == len(raised) >= 3
    for key, (_, program) in PROGRAMS.items():
        assert any(program.library in kernel for kernel, _, _ in raised), key
    assert all(" stream=0x5 " in line for line in lines if line.startswith("cuLaunchKernel "))


@pytest.mark.parametrize("key", ["vector", "scalar"])
def test_a_failed_launch_raises_naming_the_kernel_and_the_driver_error(fake, key):
    family, program = PROGRAMS[key]
    knobs, library = KNOBS[key], program.library
    rows, cols = (8, 4096) if key == "vector" else (8, 1001)
    x, dy = _rows(rows, cols), _rows(rows, cols)
    g = _rows(rows, cols) if family.gated else None
    w = cuda(torch.ones(cols, dtype=torch.bfloat16))
    rstd = cuda(family.forward(x, g, w)[2])  # loaded, looked up, planned
    forward = model.forward_launch(knobs, library, rows, cols, residual=False)["kernel"]
    fake.fail("cuLaunchKernel", 701)
    message = (rf"^{library}_forward: {re.escape(forward)}: cuLaunchKernel failed: "
               r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES \(701\)$")
    with pytest.raises(RuntimeError, match=message):
        family.forward(x, g, w)
    with pytest.raises(RuntimeError, match=message):  # the autograd functional: the same error
        family.functional(x, g, w)
    fake.reset()
    fake.fail("cuLaunchKernel", 701, after=1)  # the backward kernel launches, the reduction fails
    with pytest.raises(RuntimeError, match=rf"^{library}_backward: kernel_{library}_dweight: "
                                           r"cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RES"):
        family.backward(dy, x, g, w, rstd)
    fake.reset()
    family.backward(dy, x, g, w, rstd)  # the driver is fine again
    assert [launch.kernel for launch in fake.launches()] == [
        model.backward_launch(knobs, library, rows, cols)["kernel"], f"kernel_{library}_dweight"]
