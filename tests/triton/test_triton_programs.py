"""Triton programs end to end, on the row-scale family used only by tests (tests/triton_family):
family table -> renderer -> checker -> ahead-of-time compile for sm_90a/sm_100a/sm_103a ->
wheel -> loader on the fake driver, and the public API under Triton's interpreter.

Processes that use the toy repository's ``cake`` run in subprocesses (``PYTHONPATH=root``), so
the repository's own ``cake`` in this process is never mixed with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import triton

from triton_repo import FAMILY, REPO, make_triton_repo

from cake.core import manifest as mf
from cake.core import toolchain as tc
from cake.core import triton_aot
from tools import render

ARCHES = ("sm_90a", "sm_100a", "sm_103a")
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, mf.PackageTree]:
    root = tmp_path_factory.mktemp("triton-repo")
    return root, make_triton_repo(root)


def run_python(root: Path, script: str, *, interpret: bool = False, env: dict | None = None,
               timeout: int = 600) -> subprocess.CompletedProcess:
    """Runs ``script`` with the toy repository's ``cake`` first on the path."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(TESTS)]),
                       **(env or {}))
    environment.pop("TRITON_INTERPRET", None)
    if interpret:
        environment["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, env=environment, timeout=timeout, cwd=root)


def compile_step(tree: mf.PackageTree, program: mf.Program, source: mf.Source, arch: str,
                 work: Path) -> tuple[subprocess.CompletedProcess, Path, Path]:
    cubin = work / f"{program.library}_{arch}.{source.role}.cubin"
    header = cubin.with_suffix(".h")
    command = [sys.executable, str(REPO / "cake" / "core" / "triton_aot.py"),
               "--source", str(tree.source_path(source)), "--include-dir", str(tree.include_dir),
               "--arch", arch, "--role", source.role, "--cubin", str(cubin), "--header",
               str(header), *(f"--flag={f}" for f in program.flags)]
    if tc.find_ptxas():
        command += ["--ptxas", tc.find_ptxas()]
    return subprocess.run(command, capture_output=True, text=True, timeout=600), cubin, header


# --------------------------------------------------------------------------- render and check


def test_the_family_renders_triton_programs_that_check_clean(repo):
    root, tree = repo
    manifest = mf.read(tree.manifest_path)
    assert len(manifest.programs) == 3
    for program in manifest.programs:
        assert program.kind == "triton"
        assert [s.role for s in program.sources] == ["kernel_scale", "kernel_dot", "binding"]
        assert [Path(s.path).suffix for s in program.sources] == [".py", ".py", ".cu"]
        assert program.flags == (f"triton=={triton_aot.TRITON_VERSION}", "fp-fusion=1",
                                 "line-info=0")
        assert {"cake/triton/rowscale.py", "cake/triton_launch.h"} <= set(program.headers)
        assert program.kernels == (f"kernel_{program.library}_scale",
                                   f"kernel_{program.library}_dot")
        assert [e.name for e in program.entries] == ["scale", "dot"]
        assert [a.kind for a in program.entry("scale").args] == [
            "i32", "i32", "i32", "pointer", "pointer", "pointer", "i32"]
    result = subprocess.run([sys.executable, str(REPO / "tools" / "check_manifests.py"),
                             str(root)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok in 1 manifest(s), 3 program(s)" in result.stdout


def test_the_digest_holds_the_triton_pin_the_options_and_the_shared_module(repo, monkeypatch,
                                                                           tmp_path):
    root, _ = repo
    family = render.load_families(root)[FAMILY]
    base = [p.digest for p in render.render_family(family, root)[0].programs]
    renamed = render.render_family(family, root, prefix="cake_other_det_train",
                                   package="cake.cake_other_det_train")[0]
    assert sorted(p.digest for p in renamed.programs) == sorted(base)
    monkeypatch.setattr(triton_aot, "TRITON_VERSION", "3.9.1")
    assert not set(p.digest for p in render.render_family(family, root)[0].programs) & set(base)
    monkeypatch.setattr(triton_aot, "TRITON_VERSION", triton_aot.TRITON_VERSION)
    monkeypatch.undo()
    monkeypatch.setattr(triton_aot, "COMPILE_OPTIONS", ("fp-fusion=0", "line-info=0"))
    assert not set(p.digest for p in render.render_family(family, root)[0].programs) & set(base)
    monkeypatch.undo()
    shared = root / "csrc" / "include" / "cake" / "triton" / "rowscale.py"
    original = shared.read_bytes()
    try:
        shared.write_bytes(original + b"# a comment changes the bytes, so the digests\n")
        assert not set(p.digest for p in render.render_family(family, root)[0].programs) & set(base)
    finally:
        shared.write_bytes(original)


def test_pyproject_pins_the_triton_the_digests_name():
    text = (REPO / "pyproject.toml").read_text()
    assert f'"triton=={triton_aot.TRITON_VERSION}"' in text


def test_the_checker_ignores_bytecode_and_sees_an_edited_triton_source(repo, tmp_path):
    root, tree = repo
    work = tmp_path / "copy"
    make_triton_repo(work)
    cache = work / "csrc" / FAMILY / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    check = [sys.executable, str(REPO / "tools" / "check_manifests.py"), str(work)]
    assert subprocess.run(check, capture_output=True).returncode == 0
    source = next((work / "csrc" / FAMILY).glob("*_kernel_dot.py"))
    source.write_text(source.read_text().replace("BLOCK = tl.constexpr(1024)",
                                                 "BLOCK = tl.constexpr(512)"))
    result = subprocess.run(check, capture_output=True, text=True)
    assert result.returncode == 1 and "CM304" in result.stdout, result.stdout


# --------------------------------------------------------------------------- interpreter

INTERPRETER_SCRIPT = """
import json, torch
from cake.cake_rowscale_det_train import (cake_rowscale_det, cake_rowscale_det_train_backward,
                                          cake_rowscale_det_train_forward)
results = {}
for dtype in (torch.float32, torch.float16):
    x = torch.randn(7, 48, dtype=dtype)
    scale = torch.rand(7) + 0.5
    leaf, s = x.clone().requires_grad_(), scale.clone().requires_grad_()
    y = cake_rowscale_det(leaf, s)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = x.double() * scale.double()[:, None]
    results[str(dtype)] = {
        "y": (y.double() - ref).abs().max().item() / ref.abs().max().item(),
        "dx": (leaf.grad.double() - dy.double() * scale.double()[:, None]).abs().max().item(),
        "dscale": (s.grad.double() - (dy.double() * x.double()).sum(-1)).abs().max().item()}
x = torch.randn(4, 32)
compiled = torch.compile(cake_rowscale_det, fullgraph=True)
leaf = x.clone().requires_grad_()
scale = torch.rand(4).requires_grad_()
compiled(leaf, scale).sum().backward()
results["compiled"] = (leaf.grad - scale.detach()[:, None]).abs().max().item()
errors = {}
for name, call in (("cols", lambda: cake_rowscale_det_train_forward(torch.randn(2, 20), torch.ones(2))),
                   ("dtype", lambda: cake_rowscale_det_train_forward(torch.randn(2, 16).double(), torch.ones(2))),
                   ("scale", lambda: cake_rowscale_det_train_forward(torch.randn(2, 16), torch.ones(3)))):
    try:
        call()
        errors[name] = None
    except (TypeError, ValueError) as exc:
        errors[name] = str(exc)
results["errors"] = errors
print(json.dumps(results))
"""


def test_the_public_api_runs_under_the_interpreter(repo):
    root, _ = repo
    result = run_python(root, INTERPRETER_SCRIPT, interpret=True)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    # fp32: one rounding of x * scale (2^-24 relative) and an fp32 row sum; fp16: y rounds to
    # fp16 (2^-11 relative), dx too; dscale sums in fp32 from fp16 inputs.
    assert found["torch.float32"]["y"] < 1e-6
    assert found["torch.float32"]["dx"] < 1e-5 and found["torch.float32"]["dscale"] < 1e-4
    assert found["torch.float16"]["y"] < 1e-3
    assert found["torch.float16"]["dx"] < 1e-2 and found["torch.float16"]["dscale"] < 1e-2
    assert found["compiled"] < 1e-6
    assert "cols a multiple of 16" in found["errors"]["cols"]
    assert found["errors"]["dtype"].startswith("x: expected dtype")
    assert found["errors"]["scale"].startswith("scale: expected [rows] = [2]")


def test_cpu_tensors_without_the_interpreter_are_refused(repo):
    root, _ = repo
    result = run_python(root, """
        import torch
        from cake.cake_rowscale_det_train import cake_rowscale_det_train_forward
        try:
            cake_rowscale_det_train_forward(torch.randn(2, 16), torch.ones(2))
        except ValueError as exc:
            print(exc)
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "x: expected a CUDA tensor" in result.stdout


# --------------------------------------------------------------------------- ahead of time


@pytest.mark.parametrize("arch", ARCHES)
def test_every_kernel_compiles_for_every_arch_with_its_resources(repo, arch, tmp_path):
    _, tree = repo
    for program in mf.read(tree.manifest_path).programs:
        for source in program.kernel_sources():
            result, cubin, header = compile_step(tree, program, source, arch, tmp_path)
            assert result.returncode == 0, result.stderr[-3000:]
            assert cubin.read_bytes()[:4] == b"\x7fELF"
            line = result.stdout.strip().splitlines()[-1]
            assert f"{arch}:" in line and "registers" in line and " 0 B spilled" in line, line
            defines = header.read_text()
            assert f'"kernel_{program.library}_{source.role[len("kernel_"):]}"' in defines
            assert "_SHARED " in defines and "_WARPS 4" in defines


def test_cubins_and_libraries_are_byte_identical_across_checkouts(tmp_path):
    built = []
    for name in ("first", "second/deeper"):
        root = tmp_path / name
        tree = make_triton_repo(root)
        program = mf.read(tree.manifest_path).programs[0]
        work = root / "build"
        work.mkdir()
        tools = tc.Tools(nvcc=None, cxx=tc.find_cxx(), ptxas=tc.find_ptxas(),
                         fatbinary=tc.find_fatbinary())
        steps = tc.library_steps(
            tools, kind="triton", library=program.library, digest=program.digest,
            arch="sm_90a", include_dir=str(tree.include_dir), flags=program.flags,
            sources=[tc.Source(s.role, str(tree.source_path(s))) for s in program.sources],
            work_dir=str(work), output=str(work / "library.so"))
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            assert result.returncode == 0, result.stderr[-3000:]
        built.append({p.name: p.read_bytes() for p in work.iterdir() if p.suffix != ".h"})
    assert built[0].keys() == built[1].keys()
    for name in built[0]:
        assert built[0][name] == built[1][name], name


def test_the_compressed_image_holds_the_cubin_unchanged(tmp_path):
    """With the toolkit's fatbinary the library embeds the cubin in a compressed fatbin: the
    ELF that cuobjdump extracts from it is the cubin, byte for byte."""
    fatbinary = tc.find_fatbinary()
    cuobjdump = shutil.which("cuobjdump") or str(
        Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    if fatbinary is None or not os.access(cuobjdump, os.X_OK):
        pytest.skip("needs the CUDA toolkit's fatbinary and a cuobjdump")
    tree = make_triton_repo(tmp_path / "repo")
    program = mf.read(tree.manifest_path).programs[0]
    work = tmp_path / "build"
    work.mkdir()
    steps = tc.library_steps(
        tc.Tools(nvcc=None, cxx=tc.find_cxx(), ptxas=tc.find_ptxas(), fatbinary=fatbinary),
        kind="triton", library=program.library, digest=program.digest, arch="sm_90a",
        include_dir=str(tree.include_dir), flags=program.flags,
        sources=[tc.Source(s.role, str(tree.source_path(s))) for s in program.sources],
        work_dir=str(work), output=str(work / "library.so"))
    for step in steps:
        subprocess.run(step, capture_output=True, text=True, check=True)
    cubins = sorted(work.glob("*.cubin"))
    assert cubins and sorted(work.glob("*.fatbin")) == [c.with_suffix(".fatbin") for c in cubins]
    for cubin in cubins:
        fatbin = cubin.with_suffix(".fatbin")
        assert fatbin.stat().st_size < cubin.stat().st_size
        out = tmp_path / cubin.stem
        out.mkdir()
        subprocess.run([cuobjdump, "--extract-elf", "all", str(fatbin)], cwd=out, check=True,
                       capture_output=True)
        (extracted,) = out.glob("*.cubin")
        assert extracted.read_bytes() == cubin.read_bytes(), cubin.name


REFUSED_SOURCE = '''
import triton
import triton.language as tl

NUM_WARPS = 4
NUM_STAGES = 1
SIGNATURE = {"x": "*fp32", "n": "i32"}
HINTS = {}


@triton.jit
def kernel_cake_bad_det_train_0123456789abcdef0123_copy(x, n):
    descriptor = tl.make_tensor_descriptor(x, shape=[n], strides=[1], block_shape=[64])
    values = descriptor.load([0])
    descriptor.store([0], values * 2)
'''


def test_a_kernel_the_launcher_cannot_run_fails_the_compile_with_its_name(tmp_path):
    source = tmp_path / "cake_bad_det_train_0123456789abcdef0123_kernel_copy.py"
    source.write_text(REFUSED_SOURCE)
    result = subprocess.run(
        [sys.executable, str(REPO / "cake" / "core" / "triton_aot.py"), "--source", str(source),
         "--include-dir", str(tmp_path), "--arch", "sm_90a", "--role", "kernel_copy",
         "--cubin", str(tmp_path / "x.cubin"), "--header", str(tmp_path / "x.h"),
         f"--flag=triton=={triton_aot.TRITON_VERSION}"], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kernel_cake_bad_det_train_0123456789abcdef0123_copy for sm_90a" in result.stderr
    assert "global scratch" in result.stderr
    assert not (tmp_path / "x.cubin").exists()


def test_a_triton_version_other_than_the_pin_is_named_with_the_remedy(monkeypatch):
    monkeypatch.setattr(triton_aot, "installed_version", lambda: "3.6.0")
    reason = triton_aot.unavailable_reason(("triton==3.9.0",))
    assert "3.6.0" in reason and "3.9.0" in reason and "pip install triton==3.9.0" in reason
    monkeypatch.setattr(triton_aot, "installed_version", lambda: None)
    assert "not installed" in triton_aot.unavailable_reason(("triton==3.9.0",))


# --------------------------------------------------------------------------- the fake driver

FAKE_DRIVER_SCRIPT = """
import json, torch
import fake_cuda
fake = fake_cuda.load()
import fake_gpu
from cake.core import plans, loader
plans.stream_handle = lambda device: 0x7
from cake.cake_rowscale_det_train import (cake_rowscale_det_train_backward,
                                          cake_rowscale_det_train_forward)
x = fake_gpu.cuda(torch.randn(5, 64, dtype=torch.bfloat16))
scale = fake_gpu.cuda(torch.ones(5))
cake_rowscale_det_train_forward(x, scale)
cake_rowscale_det_train_backward(x, x, scale)
out = {"launches": [dataclasses.asdict(l) | {"params": None} for l in fake.launches()],
       "loads": len(fake.calls("cuLibraryLoadData")),
       "origins": sorted({l.origin for l in plans.program_set(
           __import__("cake.cake_rowscale_det_train._function", fromlist=["x"]).__file__
       )._libraries.values()})}
fake.reset()
fake.fail("cuLaunchKernel", 701)
try:
    cake_rowscale_det_train_forward(x, scale)
except RuntimeError as exc:
    out["failure"] = str(exc)
fake.reset()
raw = torch.empty(5 * 64 + 8, dtype=torch.bfloat16)
shifted = fake_gpu.cuda(raw[2:2 + 5 * 64].view(5, 64))
try:
    cake_rowscale_det_train_forward(shifted, scale)
except RuntimeError as exc:
    out["misaligned"] = str(exc)
print(json.dumps(out))
"""


def test_the_triton_library_launches_on_the_fake_driver(repo, tmp_path):
    root, tree = repo
    script = "import dataclasses\n" + textwrap.dedent(FAKE_DRIVER_SCRIPT)
    result = run_python(root, script, env={"CAKE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cake: compiling" in result.stderr  # the JIT compiled it with the pinned Triton
    found = json.loads(result.stdout.splitlines()[-1])
    program = next(p for p in mf.read(tree.manifest_path).programs
                   if p.variant == {"dtype": "bfloat16"})
    # One load a kernel source's image (two here), once per process.
    assert found["loads"] == 2 and found["origins"] == ["compiled"]
    kernels = [launch["kernel"] for launch in found["launches"]]
    assert kernels == [f"kernel_{program.library}_scale", f"kernel_{program.library}_scale",
                       f"kernel_{program.library}_dot"]
    for launch in found["launches"]:
        assert launch["grid"] == [5, 1, 1] and launch["block"] == [128, 1, 1]
        assert launch["stream"] == 7
    assert f"kernel_{program.library}_scale" in found["failure"]
    assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in found["failure"]
    assert "x must be a multiple of 16" in found["misaligned"]


# --------------------------------------------------------------------------- wheel


@pytest.mark.nvcc
@pytest.mark.skipif(tc.find_nvcc() is None, reason="nvcc is not on PATH or in $CUDA_HOME/bin")
def test_the_wheel_carries_the_triton_libraries_and_they_load_prebuilt(repo, tmp_path):
    root, tree = repo
    env = dict(os.environ, CAKE_CUDA_ARCHS="sm_90a")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(root), "--no-deps",
                             "--no-build-isolation", "-w", str(tmp_path / "dist")],
                            capture_output=True, text=True, env=env, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    programs = mf.read(tree.manifest_path).programs
    for program in programs:
        assert f"cake/{FAMILY}/lib/{program.library}_sm_90a.so" in names
        assert f"cake/{FAMILY}/csrc/{program.library}_kernel_scale.py" in names
    assert f"cake/{FAMILY}/csrc/include/cake/triton/rowscale.py" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    selftest = run_python(site, "from cake.__main__ import main; raise SystemExit(main(['selftest']))")
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
    assert "3 prebuilt libraries verified" in selftest.stdout
    launched = run_python(site, """
        import torch, fake_cuda
        fake = fake_cuda.load()
        import fake_gpu
        from cake.core import plans
        plans.stream_handle = lambda device: 0
        from cake.cake_rowscale_det_train import cake_rowscale_det_train_forward
        cake_rowscale_det_train_forward(fake_gpu.cuda(torch.randn(3, 32)), fake_gpu.cuda(torch.ones(3)))
        print([l.kernel for l in fake.launches()])
    """, env={"CAKE_JIT": "0"})
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "_scale']" in launched.stdout
