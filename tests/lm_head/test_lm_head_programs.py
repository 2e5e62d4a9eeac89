"""The LM head families' programs: what the tables rendered (one program per dtype, the kernels,
the declared entries against the kernels' SIGNATUREs, the knobs against the host's tiles, the
det/nondet split), the ahead-of-time compile of every kernel of every program for sm_90a, sm_100a
and sm_103a with its resources (a spill fails it), the host's launches on stand-in libraries
(tests/fake_gpu.py: every entry's arguments), and the real det and nondet bf16 libraries
launching on the fake CUDA driver (tests/fake_cuda.c) through the public API.
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
from conftest import MODES, family, make_inputs

from cake._shared import lm_head, lm_head_tiles
from cake.core import jit, plans, toolchain, triton_aot
from cake.core import manifest as mf

REPO = Path(__file__).resolve().parents[2]
ARCHES = ("sm_90a", "sm_100a", "sm_103a")
NAMES = {"det": "cake_lm_head_det_train", "nondet": "cake_lm_head_nondet_train"}
TREES = {mode: mf.repository_tree(REPO, name) for mode, name in NAMES.items()}
MANIFESTS = {mode: mf.read(tree.manifest_path) for mode, tree in TREES.items()}
KERNELS = {mode: lm_head_tiles.KERNELS[mode == "det"] for mode in MODES}
_KNOB_RE = re.compile(r"^(\w+) = (?:tl\.constexpr\()?(.+?)\)?$", re.MULTILINE)


def _source_text(mode, program, role) -> str:
    return TREES[mode].source_path(program.source(role)).read_text()


def _knobs(mode, program, role) -> dict:
    block = _source_text(mode, program, role).split("# cake:params\n", 1)[1]
    block = block.split("# cake:end-params\n", 1)[0]
    return {name: eval(value) for name, value in _KNOB_RE.findall(block)}  # noqa: S307


# --------------------------------------------------------------------------- the rendered programs


@pytest.mark.parametrize("mode", MODES)
def test_one_program_per_dtype_with_every_kernel(mode):
    programs = MANIFESTS[mode].programs
    assert sorted((p.variant["dtype"], p.arches) for p in programs) == [
        (dtype, ARCHES) for dtype in ("bfloat16", "float16", "float32")]
    for program in programs:
        assert program.kind == "triton" and program.route == {}
        assert [s.role for s in program.sources] == [f"kernel_{k}" for k in KERNELS[mode]] + [
            "binding"]
        assert program.kernels == tuple(f"kernel_{program.library}_{k}" for k in KERNELS[mode])
        assert {"cake/triton/lm_head.py", "cake/triton_launch.h"} <= set(program.headers)
        for entry in program.entries:
            declared = tuple((a.name, a.kind) for a in entry.args)
            assert declared == (("grid_x", "i32"), ("grid_y", "i32"), ("grid_z", "i32"),
                                *lm_head_tiles.ARGUMENTS[entry.name])


@pytest.mark.parametrize("mode", MODES)
def test_each_kernels_signature_is_its_declared_entry(mode):
    """The interpreter passes an entry's arguments to the kernel in declared order: the
    kernels' SIGNATUREs must be the declarations (the AOT compile checks the same in C)."""
    tree = TREES[mode]
    program = MANIFESTS[mode].programs[0]
    for kernel in KERNELS[mode]:
        module = triton_aot.load_source(tree.source_path(program.source(f"kernel_{kernel}")),
                                        tree.include_dir)
        function = triton_aot.kernel_of(module, f"kernel_{program.library}_{kernel}")
        assert triton_aot.declared_arguments(module, function) == list(
            lm_head_tiles.ARGUMENTS[kernel])


@pytest.mark.parametrize("mode", MODES)
def test_the_knobs_are_the_tiles_the_host_launches_with(mode):
    pointer = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    for program in MANIFESTS[mode].programs:
        tiles = lm_head_tiles.tiles(program.variant["dtype"], mode == "det")
        seen = set()
        for kernel in KERNELS[mode]:
            for name, value in _knobs(mode, program, f"kernel_{kernel}").items():
                assert value == (pointer[program.variant["dtype"]] if name == "DTYPE"
                                 else tiles[name]), (program.library, kernel, name)
                seen.add(name)
        assert seen == set(tiles) | {"DTYPE"}


def test_det_and_nondet_programs_share_their_forward_and_row_kernels():
    for det in MANIFESTS["det"].programs:
        nondet = next(p for p in MANIFESTS["nondet"].programs if p.variant == det.variant)
        for kernel in ("stats", "finalize", "reduce", "coef", "cast"):
            role = f"kernel_{kernel}"
            assert _source_text("det", det, role).replace(det.library, "L") == \
                _source_text("nondet", nondet, role).replace(nondet.library, "L"), kernel


# --------------------------------------------------------------------------- ahead of time


def _distinct_kernels() -> dict:
    """Every kernel source of every program, grouped by its text with the library name taken
    out (the digest's own rule): the row kernels are the same text in all six programs, so a
    group's compile (of its first member) is each member's, but for the symbol's name."""
    groups: dict = {}
    for mode in MODES:
        for program in MANIFESTS[mode].programs:
            for source in program.kernel_sources():
                text = _source_text(mode, program, source.role).replace(program.library, "L")
                groups.setdefault(text, []).append((mode, program, source.role))
    return groups


def _compile(member, arch: str, work: Path) -> tuple:
    mode, program, role = member
    tree = TREES[mode]
    cubin = work / f"{program.library}_{arch}.{role}.cubin"
    command = [sys.executable, str(REPO / "cake" / "core" / "triton_aot.py"), "--source",
               str(tree.source_path(program.source(role))), "--include-dir",
               str(tree.include_dir), "--arch", arch, "--role", role, "--cubin", str(cubin),
               "--header", str(cubin.with_suffix(".h")), *(f"--flag={f}" for f in program.flags)]
    if toolchain.find_ptxas():
        command += ["--ptxas", toolchain.find_ptxas()]
    return subprocess.run(command, capture_output=True, text=True, timeout=600), cubin


@pytest.mark.skipif(triton_aot.unavailable_reason((f"triton=={triton_aot.TRITON_VERSION}",))
                    is not None, reason="the pinned Triton is not installed")
def test_every_kernel_compiles_for_every_arch_without_spills(tmp_path, capsys):
    """18 distinct kernel sources (the 39 of the six programs) x 3 arches: each compile prints
    its shared memory, registers and spilled bytes (triton_aot.py fails a kernel that spills or
    needs more shared memory than the arch has); the wheel build compiles all 39 for its
    arches again."""
    groups = _distinct_kernels()
    assert sum(len(members) for members in groups.values()) == sum(
        len(KERNELS[mode]) * len(MANIFESTS[mode].programs) for mode in MODES)
    jobs = [(members, arch) for members in groups.values() for arch in ARCHES]
    lines = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for (members, arch), (result, cubin) in zip(jobs, pool.map(
                lambda job: _compile(job[0][0], job[1], tmp_path), jobs)):
            assert result.returncode == 0, result.stderr[-3000:]
            line = result.stdout.strip().splitlines()[-1]
            assert f"{arch}:" in line and "registers" in line and " 0 B spilled" in line, line
            assert int(re.search(r"(\d+) B shared", line).group(1)) <= 227 * 1024, line
            assert cubin.read_bytes()[:4] == b"\x7fELF"
            mode, program, role = members[0]
            users = ", ".join(sorted({f"{m} {p.variant['dtype']}" for m, p, _ in members}))
            lines.append(f"{role[7:]:9} {arch:8} {line.split(': ', 1)[1]}  [{users}]")
    with capsys.disabled():
        print(f"\n{len(lines)} LM head kernel compiles:\n" + "\n".join(sorted(lines)))


# --------------------------------------------------------------------------- stand-in libraries


@pytest.fixture
def recorded(monkeypatch):
    """Stand-in libraries recording every entry call (tests/fake_gpu.py); empty plans before and
    after (they would keep the stand-ins' entries)."""
    import fake_gpu

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for mode in MODES:
        family(mode)[3]._function._PROGRAMS.clear()
    yield fake_gpu.install(monkeypatch)
    for mode in MODES:
        family(mode)[3]._function._PROGRAMS.clear()


def _gpu_inputs(tokens, dim, vocab, dtype=torch.bfloat16):
    import fake_gpu

    hidden, weight, labels = make_inputs(tokens, dim, vocab, torch.float32, seed=30)
    return fake_gpu.cuda(hidden.to(dtype)), fake_gpu.cuda(weight.to(dtype)), fake_gpu.cuda(labels)


@pytest.mark.parametrize("mode", MODES)
def test_the_loss_launches_with_its_arguments(mode, recorded):
    """bf16 loss, mean, softcap 30, T = 300: the entries in order, their grids (from the tiles and
    the split policies) and values; no host sync with check_labels=False."""
    loss_fn, _, _, module = family(mode)
    tokens, dim, vocab = 300, 64, 1000
    hidden, weight, labels = _gpu_inputs(tokens, dim, vocab)
    hidden.requires_grad_()
    weight.requires_grad_()
    loss = loss_fn(hidden, weight, labels, logit_softcap=30.0, check_labels=False)
    loss.backward()
    tiles = module._function._PROGRAMS.tiles(torch.bfloat16)
    heavy = ["dh", "cast", "dw"] if mode == "det" else ["fused", "cast", "cast"]
    assert [launch.entry for launch in recorded] == ["stats", "finalize", "reduce", "coef",
                                                     *heavy]
    stats, finalize, reduce, coef = (recorded.of(name)[0].args
                                     for name in ("stats", "finalize", "reduce", "coef"))
    splits, per = lm_head.forward_splits(tokens, vocab, tiles)
    assert (stats["grid_x"], stats["num_splits"], stats["tiles_per_split"]) == (
        splits * -(-tokens // 128), splits, per)
    assert (stats["h"], stats["w"], stats["labels"]) == (
        hidden.data_ptr(), weight.data_ptr(), labels.data_ptr())
    assert (stats["T"], stats["V"], stats["D"], stats["entropy"], stats["part_a"]) == (
        tokens, vocab, dim, 0, 0)
    assert stats["inv_softcap"] == pytest.approx(1 / 30.0) and stats["tanh_scale"] == 30.0
    assert (stats["linear_scale"], stats["inv_temp"]) == (0.0, 1.0)
    assert (finalize["logprob"], finalize["entropy"], finalize["ent"], finalize["ignore_index"],
            finalize["grid_x"]) == (0, 0, 0, -100, 1)
    assert (reduce["grid_x"], reduce["mean"], reduce["T"]) == (1, 1, tokens)
    assert (coef["logprob"], coef["reduction"], coef["has_grad_out"], coef["has_grad_ent"],
            coef["count"], coef["ent"]) == (0, 2, 1, 0, reduce["count"], 0)
    if mode == "det":
        dh, cast, dw = (recorded.of(name)[0].args for name in ("dh", "cast", "dw"))
        dh_splits, dh_per = lm_head.dh_splits(tokens, vocab, tiles)
        assert dh_splits > 1 and dh_per % 2 == 0  # 5 token blocks: the vocabulary is split
        assert (dh["grid_x"], dh["num_splits"], dh["final_cast"]) == (
            dh_splits * 5, dh_splits, 0)
        assert (cast["src"], cast["N"], cast["num_parts"], cast["dst"]) == (
            dh["acc"], tokens * dim, dh_splits, dh["out"])
        assert (dw["grid_x"], dw["accumulate"], dw["out"]) == (
            -(-vocab // 64), 0, weight.grad.data_ptr())
    else:
        fused = recorded.of("fused")[0].args
        assert fused["grid_x"] == -(-tokens // 128) * -(-vocab // 128)
        casts = [launch.args for launch in recorded.of("cast")]
        assert [(c["src"], c["N"], c["num_parts"]) for c in casts] == [
            (fused["dh_acc"], tokens * dim, 1), (fused["dw_acc"], vocab * dim, 1)]
        assert casts[1]["dst"] == weight.grad.data_ptr()


@pytest.mark.parametrize("mode", MODES)
def test_the_logprob_launches_with_its_arguments(mode, recorded):
    """fp32 log-probs with entropy, temperature 0.5, a dweight accumulator, T = 5000 (the det
    dhidden kernel unsplit: its last step casts into dhidden)."""
    import fake_gpu

    _, logprob_fn, _, module = family(mode)
    tokens, dim, vocab = 5000, 16, 100
    hidden, weight, labels = _gpu_inputs(tokens, dim, vocab, torch.float32)
    accumulator = fake_gpu.cuda(torch.zeros(vocab, dim))
    hidden.requires_grad_()
    weight.requires_grad_()
    lp, ent = logprob_fn(hidden, weight, labels, temperature=0.5, return_entropy=True,
                         dweight_accumulator=accumulator, check_labels=False)
    (lp.sum() + ent.sum()).backward()
    assert weight.grad is None
    stats, finalize, coef = (recorded.of(name)[0].args for name in ("stats", "finalize", "coef"))
    assert (stats["entropy"], stats["inv_softcap"], stats["tanh_scale"], stats["linear_scale"],
            stats["inv_temp"]) == (1, 0.0, 0.0, 2.0, 2.0)
    assert stats["part_a"] != 0 and recorded.of("reduce") == []
    assert (finalize["logprob"], finalize["entropy"], finalize["out"], finalize["ent"]) == (
        1, 1, lp.data_ptr(), ent.data_ptr())
    assert (coef["logprob"], coef["reduction"], coef["has_grad_out"], coef["has_grad_ent"],
            coef["ent"], coef["count"]) == (1, 0, 1, 1, ent.data_ptr(), 0)
    if mode == "det":
        dh, dw = recorded.of("dh")[0].args, recorded.of("dw")[0].args
        assert (dh["num_splits"], dh["final_cast"], dh["acc"]) == (1, 1, hidden.grad.data_ptr())
        assert (dw["accumulate"], dw["acc"], dw["out"]) == (1, accumulator.data_ptr(), 0)
        assert recorded.of("cast") == []  # fp32: the accumulators are the gradients
    else:
        fused = recorded.of("fused")[0].args
        assert (fused["dh_acc"], fused["dw_acc"]) == (hidden.grad.data_ptr(),
                                                      accumulator.data_ptr())
        assert recorded.of("cast") == []


# --------------------------------------------------------------------------- the fake driver

STREAM = 0x7


def _program(mode):
    return next(p for p in MANIFESTS[mode].programs if p.variant == {"dtype": "bfloat16"})


@pytest.fixture(scope="module")
def driver():
    import fake_cuda

    reason = jit.unavailable_reason(_program("det"))
    if reason is not None:
        pytest.skip(reason)
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here: the fake must not be mixed with it")
    return fake_cuda.load()


@pytest.fixture(scope="module")
def libraries(driver, family_jit_cache) -> dict:
    """The det and nondet bf16 programs, JIT-compiled for sm_90a into the session's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
        patch.delenv("TRITON_INTERPRET", raising=False)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            paths = pool.map(lambda mode: jit.compile_program(
                TREES[mode], MANIFESTS[mode], _program(mode), "sm_90a")[0], MODES)
            return dict(zip(MODES, paths))


@pytest.fixture
def fake(libraries, driver, family_jit_cache, monkeypatch):
    monkeypatch.setenv("CAKE_CACHE_DIR", str(family_jit_cache))
    monkeypatch.setenv("CAKE_JIT", "0")  # compiled by `libraries`: nothing compiles here
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(plans, "stream_handle", lambda device: STREAM)
    for mode in MODES:
        family(mode)[3]._function._PROGRAMS.clear()
    driver.reset()
    yield driver
    driver.reset()
    for mode in MODES:
        family(mode)[3]._function._PROGRAMS.clear()


@pytest.mark.parametrize("mode", MODES)
def test_the_library_launches_every_kernel_on_the_fake_driver(mode, fake):
    """Both entries through the public API on fake GPU tensors: each kernel launched with its
    grid, its warps, its compiled shared memory, the caller's stream and its first argument;
    labels as a shifted (8-byte aligned) view, which no hint constrains."""
    loss_fn, logprob_fn, _, module = family(mode)
    program = _program(mode)
    tokens, dim, vocab = 200, 64, 1000
    hidden, weight, labels = _gpu_inputs(tokens + 1, dim, vocab)
    import fake_gpu

    hidden = fake_gpu.cuda(hidden[1:].clone())
    labels = fake_gpu.cuda(labels[1:])
    assert labels.data_ptr() % 16 == 8
    hidden.requires_grad_()
    weight.requires_grad_()
    loss_fn(hidden, weight, labels, check_labels=False).backward()
    lp, ent = logprob_fn(hidden, weight, labels, return_entropy=True, check_labels=False)
    (lp.sum() + ent.sum()).backward()
    launches = fake.launches()
    names = [launch.kernel.rsplit(program.library + "_", 1)[1] for launch in launches]
    backward = ["coef", "dh", "cast", "dw"] if mode == "det" else ["coef", "fused", "cast",
                                                                     "cast"]
    assert names == ["stats", "finalize", "reduce", *backward, "stats", "finalize", *backward]
    tiles = module._function._PROGRAMS.tiles(torch.bfloat16)
    splits = lm_head.forward_splits(tokens, vocab, tiles)[0]
    grids = {"stats": splits * 2, "finalize": 1, "reduce": 1, "coef": 1, "fused": 2 * 8,
             "dw": -(-vocab // 64)}
    if mode == "det":
        grids["dh"] = lm_head.dh_splits(tokens, vocab, tiles)[0] * 4
    for name, launch in zip(names, launches):
        knob = {"finalize": "ROWS", "coef": "ROWS"}.get(name, name.upper())
        assert launch.stream == STREAM
        assert launch.block == (32 * tiles[f"{knob}_WARPS"], 1, 1), name
        if name != "cast":
            assert launch.grid == (grids[name], 1, 1), name
        assert (launch.smem > 0) == (name in ("stats", "dh", "dw", "fused", "reduce")), name
        assert launch.smem <= 227 * 1024
    first = {"stats": hidden, "dh": hidden, "dw": hidden, "fused": hidden, "coef": labels,
             "finalize": None}
    for name, launch in zip(names, launches):
        if first.get(name) is not None:
            assert struct.unpack_from("<Q", launch.params)[0] == first[name].data_ptr(), name


def test_a_refused_launch_names_the_kernel_and_the_error(fake):
    """A driver error reaches the caller as a RuntimeError naming the kernel; the nondet alert
    comes before the backward launches anything."""
    loss_fn = family("nondet")[0]
    hidden, weight, labels = _gpu_inputs(64, 16, 100)
    fake.fail("cuLaunchKernel", 701)
    with pytest.raises(RuntimeError, match=r"kernel_cake_lm_head_nondet_train_\w+_stats.*"
                                           "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        loss_fn(hidden, weight, labels, check_labels=False)
    fake.reset()
    hidden.requires_grad_()
    loss = loss_fn(hidden, weight, labels, check_labels=False)
    launched = len(fake.launches())
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            loss.backward()
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(fake.launches()) == launched == 3
