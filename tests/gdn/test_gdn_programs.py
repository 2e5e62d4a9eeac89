"""The GDN families' programs: what the tables rendered (entries, knobs, the det/nondet split),
the ahead-of-time compile of every GPU program for sm_90a, sm_100a and sm_103a (a sample of
kernels; ``CAKE_SLOW=1`` compiles every kernel: 360 compiles, about 10 minutes with two jobs on
the two-core development machine), and one program's real library launching on the fake CUDA
driver (tests/fake_cuda.c) through the public API.
"""

from __future__ import annotations

import concurrent.futures
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SLOW

from cake._shared import gdn as shared
from cake._shared import gdn_tiles
from cake.core import jit, plans, triton_aot
from cake.core import manifest as mf
from cake.core import toolchain as tc

REPO = Path(__file__).resolve().parents[2]
ARCHES = ("sm_90a", "sm_100a", "sm_103a")
NAMES = {"det": "cake_gdn_det_train", "nondet": "cake_gdn_nondet_train"}
TREES = {mode: mf.repository_tree(REPO, name) for mode, name in NAMES.items()}
MANIFESTS = {mode: mf.read(tree.manifest_path) for mode, tree in TREES.items()}
KERNELS = tuple(shared.ARGUMENTS)
DIFFERING = ("dqkwg", "wy_dk")  # the kernels whose code DETERMINISTIC changes
_KNOB_RE = re.compile(r"^(\w+) = (?:tl\.constexpr\()?(.+?)\)?$", re.MULTILINE)


def _knobs(tree, program, role) -> dict:
    text = tree.source_path(program.source(role)).read_text()
    block = text.split("# cake:params\n", 1)[1].split("# cake:end-params\n", 1)[0]
    return {name: eval(value) for name, value in _KNOB_RE.findall(block)}  # noqa: S307


# --------------------------------------------------------------------------- the rendered programs


@pytest.mark.parametrize("mode", NAMES)
def test_one_program_per_dtype_and_head_dim_with_every_kernel(mode):
    programs = MANIFESTS[mode].programs
    variants = sorted((p.variant["dtype"], p.variant["head_k"], p.variant["head_v"], p.arches)
                      for p in programs)
    assert variants == sorted((dtype, d, d, ARCHES if dtype != "float32" else ())
                              for dtype in ("bfloat16", "float16", "float32")
                              for d in gdn_tiles.HEAD_DIMS)
    for program in programs:
        assert program.kind == "triton"
        assert [s.role for s in program.sources] == [f"kernel_{k}" for k in KERNELS] + ["binding"]
        assert program.kernels == tuple(f"kernel_{program.library}_{k}" for k in KERNELS)
        assert {"cake/triton/gdn.py", "cake/triton_launch.h"} <= set(program.headers)
        for entry in program.entries:
            assert tuple(a.name for a in entry.args) == ("grid_x", "grid_y", "grid_z",
                                                         *shared.ARGUMENTS[entry.name])
            assert all(a.kind == "i32" for a in entry.args[:3])


@pytest.mark.parametrize("mode", NAMES)
def test_the_knobs_are_the_tiles_the_host_launches_with(mode):
    """The host's grids come from gdn_tiles.tiles(K, V); the rendered programs hold the same
    (and the host's chunk size and head dimensions are the tables')."""
    assert (shared.CHUNK, shared.HEAD_DIMS) == (gdn_tiles.CHUNK, gdn_tiles.HEAD_DIMS)
    tree = TREES[mode]
    for program in MANIFESTS[mode].programs:
        k, v = program.variant["head_k"], program.variant["head_v"]
        tiles = gdn_tiles.tiles(k, v)
        pointer = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
        for kernel in KERNELS:
            knobs = _knobs(tree, program, f"kernel_{kernel}")
            assert knobs["DTYPE"] == pointer[program.variant["dtype"]] and knobs["K"] == k
            assert knobs.get("V", v) == v
            assert knobs.get("DOT_PREC", "") in ("", "ieee" if knobs["DTYPE"] == "fp32" else "tf32")
            assert knobs.get("DETERMINISTIC", mode == "det") == (mode == "det")
            for name, value in knobs.items():
                if name in tiles:
                    assert value == tiles[name], (program.library, kernel, name)


def test_det_and_nondet_programs_differ_only_in_the_two_reducing_kernels():
    for det_program in MANIFESTS["det"].programs:
        nondet_program = next(p for p in MANIFESTS["nondet"].programs
                              if p.variant == det_program.variant)
        for source in det_program.sources:
            det_text = TREES["det"].source_path(source).read_text().replace(
                det_program.library, "LIBRARY")
            other = nondet_program.source(source.role)
            nondet_text = TREES["nondet"].source_path(other).read_text().replace(
                nondet_program.library, "LIBRARY")
            same = source.role[len("kernel_"):] not in DIFFERING
            assert (det_text == nondet_text) == same, source.role


# --------------------------------------------------------------------------- ahead of time


def _sample() -> list:
    """(mode, program, role, arch) to compile: every GPU program for every arch, two kernels
    of each det program and one of each nondet program, rotating so that each arch compiles
    every kernel of the det programs and both differing kernels of the nondet programs (54
    compiles; every kernel, 360 compiles, with CAKE_SLOW=1)."""
    found = []
    for mode in NAMES:
        programs = [p for p in MANIFESTS[mode].programs if p.arches]
        for i, program in enumerate(programs):
            for j, arch in enumerate(ARCHES):
                if SLOW:
                    kernels = KERNELS
                elif mode == "det":  # two a program: the six programs cover the ten kernels
                    kernels = [KERNELS[(2 * i + j + n) % len(KERNELS)] for n in (0, 1)]
                else:
                    kernels = [DIFFERING[(i + j) % 2]]
                found += [(mode, program, f"kernel_{k}", arch) for k in kernels]
    return found


def _compile(item, work: Path) -> tuple:
    mode, program, role, arch = item
    tree = TREES[mode]
    cubin = work / f"{program.library}_{arch}.{role}.cubin"
    command = [sys.executable, str(REPO / "cake" / "core" / "triton_aot.py"), "--source",
               str(tree.source_path(program.source(role))), "--include-dir",
               str(tree.include_dir), "--arch", arch, "--role", role, "--cubin", str(cubin),
               "--header", str(cubin.with_suffix(".h")), *(f"--flag={f}" for f in program.flags)]
    if tc.find_ptxas():
        command += ["--ptxas", tc.find_ptxas()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return item, result, cubin


@pytest.mark.skipif(triton_aot.unavailable_reason((f"triton=={triton_aot.TRITON_VERSION}",))
                    is not None, reason="the pinned Triton is not installed")
def test_every_program_compiles_for_every_arch_without_spills(tmp_path, capsys):
    """Each compile prints the kernel's shared memory, registers and spilled bytes
    (triton_aot.py fails a kernel that spills or needs more than 227 KB of shared memory)."""
    sample = _sample()
    covered = {(mode, role, arch) for mode, _, role, arch in sample}
    for arch in ARCHES:
        assert all(("det", f"kernel_{k}", arch) in covered for k in KERNELS)
        assert all(("nondet", f"kernel_{k}", arch) in covered for k in DIFFERING)
    lines = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for (mode, program, role, arch), result, cubin in pool.map(
                lambda item: _compile(item, tmp_path), sample):
            assert result.returncode == 0, result.stderr[-3000:]
            line = result.stdout.strip().splitlines()[-1]
            assert f"{arch}:" in line and "registers" in line and " 0 B spilled" in line, line
            shared_bytes = int(re.search(r"(\d+) B shared", line).group(1))
            assert shared_bytes <= 227 * 1024, line
            assert cubin.read_bytes()[:4] == b"\x7fELF"
            lines.append(f"{program.variant['dtype']} K={program.variant['head_k']} {line}")
    with capsys.disabled():
        print(f"\n{len(lines)} GDN kernel compiles:\n" + "\n".join(sorted(lines)))


# --------------------------------------------------------------------------- the fake driver

STREAM = 0x7


def _image_limit() -> int:
    """How many kernel images a program library may embed (csrc/include/cake/driver.h)."""
    text = (REPO / "csrc" / "include" / "cake" / "driver.h").read_text()
    return int(re.search(r"kMaxImages = (\d+);", text).group(1))


@pytest.fixture(scope="module")
def driver():
    import fake_cuda

    if _image_limit() < len(KERNELS):
        pytest.skip(f"a GDN program embeds {len(KERNELS)} kernel images; cake/driver.h allows "
                    f"{_image_limit()}")
    program = _fake_program()
    reason = jit.unavailable_reason(program)
    if reason is not None:
        pytest.skip(reason)
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here: the fake must not be mixed with it")
    return fake_cuda.load()


def _fake_program():
    return next(p for p in MANIFESTS["det"].programs
                if p.variant == {"dtype": "bfloat16", "head_k": 64, "head_v": 64})


@pytest.fixture(scope="module")
def library(driver, family_jit_cache) -> Path:
    """The det bf16 K = V = 64 program, JIT-compiled for sm_90a into the session's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        patch.delenv("TRITON_INTERPRET", raising=False)
        return jit.compile_program(TREES["det"], MANIFESTS["det"], _fake_program(), "sm_90a")[0]


@pytest.mark.parametrize("pieces", [1, 2])
def test_the_library_launches_every_kernel_on_the_fake_driver(library, driver, family_jit_cache,
                                                              monkeypatch, pieces):
    """The public helpers through the real library: every kernel's grid, block, stream and
    shared memory, and first argument; with V = 2K (``pieces``) over twice the value heads, o
    written in place in the caller's tensor."""
    import fake_gpu

    import cake.cake_gdn_det_train as det
    from cake.cake_gdn_det_train import _function

    monkeypatch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
    monkeypatch.setenv("CAKE_JIT", "0")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    _function._PROGRAMS.clear()
    driver.reset()
    program = _fake_program()
    tokens, heads, value_heads, d = 200, 2, 4, 64
    cu = fake_gpu.cuda(torch.tensor([0, 10, 75, 200], dtype=torch.int32))
    plan = det.CakeGDNDetPlan(cu)
    assert (plan.documents, plan.chunks, plan.tokens) == (3, 5, 200)

    def tensor(*shape, dtype=torch.bfloat16):
        return fake_gpu.cuda(torch.zeros(*shape, dtype=dtype))

    q, k = tensor(tokens, heads, d), tensor(tokens, heads, d)
    v, do = tensor(tokens, value_heads, d * pieces), tensor(tokens, value_heads, d * pieces)
    g, beta = tensor(tokens, value_heads, dtype=torch.float32), tensor(tokens, value_heads)
    h0 = tensor(3, value_heads, d, d * pieces, dtype=torch.float32)
    try:
        o, _ = det.cake_gdn_det_train_forward(q, k, v, g, beta, plan=plan, initial_state=h0,
                                              output_final_state=True, qk_l2norm=True)
        det.cake_gdn_det_train_backward(do, q, k, v, g, beta, plan=plan, initial_state=h0,
                                        qk_l2norm=True)
        launches = driver.launches()
    finally:
        _function._PROGRAMS.clear()
    names = [launch.kernel.rsplit(program.library + "_", 1)[1] for launch in launches]
    assert names == ["rstd", "prep", "fwd_h", "fwd_o",
                     "rstd", "prep", "fwd_h", "dv_local", "dh", "dqkwg", "wy_da", "wy_dk",
                     "finalize"]
    tiles = gdn_tiles.tiles(d, d)
    hv = value_heads * pieces  # the kernels' value heads
    grids = {"rstd": (-(-tokens * heads // tiles["RSTD_BR"]), 1, 1), "prep": (5, hv, 1),
             "fwd_h": (3 * hv, d // tiles["FWD_H_BV"], 1),
             "fwd_o": (5, hv, d // tiles["FWD_O_BV"]),
             "dv_local": (5, hv, d // tiles["DV_LOCAL_BV"]),
             "dh": (3 * hv, d // tiles["DH_BV"], 1), "dqkwg": (5, hv, d // tiles["DQKWG_BK"]),
             "wy_da": (5, hv, 1), "wy_dk": (5, hv, 1),
             "finalize": (-(-tokens // tiles["FINALIZE_BT"]), heads, 1)}
    for name, launch in zip(names, launches):
        assert launch.grid == grids[name], name
        assert launch.stream == STREAM
        warps = _knobs(TREES["det"], program, f"kernel_{name}")[f"{name.upper()}_WARPS"]
        assert launch.block == (32 * warps, 1, 1), name
        # Dynamic shared memory as the compile reported it: the dot kernels stage tiles there.
        assert (launch.smem > 0) == (name not in ("finalize",)) and launch.smem <= 227 * 1024
    # The first kernel argument reaches the kernel: q for rstd and fwd_o, k for prep.
    first = {"rstd": q, "prep": k, "fwd_o": q, "dv_local": q, "finalize": q}
    for name, launch in zip(names, launches):
        if name in first:
            assert struct.unpack_from("<Q", launch.params)[0] == first[name].data_ptr(), name
    # fwd_o's eleventh pointer is o: the caller's tensor, also when split into value heads.
    fwd_o = launches[names.index("fwd_o")]
    assert struct.unpack_from("<Q", fwd_o.params, 8 * 10)[0] == o.data_ptr()


def test_nondet_alert_comes_before_its_library_is_loaded(driver, monkeypatch):
    """Under determinism the nondet backward raises before it routes, loads or compiles a
    program (no nondet library exists in this session: any load would try a JIT compile)."""
    import fake_gpu

    import cake.cake_gdn_nondet_train as nondet

    monkeypatch.setenv("CAKE_JIT", "0")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    driver.reset()
    z = fake_gpu.cuda(torch.zeros(64, 1, 64, dtype=torch.bfloat16))
    g = fake_gpu.cuda(torch.zeros(64, 1))
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="cake_gdn_nondet_train_backward does not have"):
            nondet.cake_gdn_nondet_train_backward(z, z, z, z, g, g)
    finally:
        torch.use_deterministic_algorithms(False)
    assert driver.launches() == [] and driver.calls("cuLibraryLoadData") == []


@pytest.mark.parametrize("mode", sorted(NAMES))
def test_the_support_query_follows_the_programs_and_the_head_dimensions(mode, monkeypatch):
    """``is_cake_gdn_*_train_supported`` on a stand-in device of each arch: true where a
    program of (dtype, K = K) is built for the arch and V is a multiple of K; it compiles
    nothing and reads no library."""
    module = __import__(f"cake.{NAMES[mode]}", fromlist=["_"])
    query = getattr(module, f"is_{NAMES[mode]}_supported")
    arch = {"value": "sm_90a"}
    monkeypatch.setattr(plans, "supported_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(plans, "device_arch", lambda device: arch["value"])
    assert query(dtype=torch.bfloat16, head_dim=128)
    assert query(dtype=torch.float16, head_dim=64, head_v=192)
    assert query(dtype=torch.bfloat16, head_dim=256, head_v=512)
    for refused in ({"head_dim": 128, "head_v": 64}, {"head_dim": 128, "head_v": 192},
                    {"head_dim": 96}, {"head_dim": 0}, {"dtype": torch.float32},
                    {"head_dim": 128, "head_v": 0}):
        assert not query(**{"dtype": torch.bfloat16, **refused}), refused
    for arch["value"] in ("sm_100a", "sm_103a"):
        assert query(dtype=torch.bfloat16, head_dim=128, head_v=256)
    arch["value"] = "sm_120a"
    assert not query(dtype=torch.bfloat16, head_dim=128)
