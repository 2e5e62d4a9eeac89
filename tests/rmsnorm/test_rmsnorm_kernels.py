"""Compiler report of the RMSNorm programs (``nvcc`` on this machine, no GPU): every kernel of
every rendered program of both families compiles for sm_90a without register spills, and each
program holds exactly the kernel instances its table calls for."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
from pathlib import Path

import pytest
from launch_model import elems_per_thread, has_fixed_instance, threads_per_row

from cake.core import jit
from cake.core import manifest as mf

REPO = Path(__file__).resolve().parents[2]
NAMES = ("cake_rmsnorm_det_train", "cake_gated_rmsnorm_det_train")
_REPORT_RE = re.compile(r"Compiling entry function '(\w+)' for 'sm_90a'\s*\n"
                        r".*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                        re.DOTALL)


def _programs():
    for name in NAMES:
        for program in mf.read(REPO / "manifests" / f"{name}.json").programs:
            variant = program.variant
            yield pytest.param(name, program, id=f"{name}-{variant['dtype']}-{variant['load']}")


def _report(name: str, program: mf.Program, out: Path) -> str:
    kernel = REPO / "csrc" / name / f"{program.library}_kernel.cu"
    result = subprocess.run(
        [jit.find_nvcc(), "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
         f"-I{REPO / 'csrc' / 'include'}", "-cubin", str(kernel), "-o", str(out)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """ptxas's report of every program's kernels, compiled in parallel (one per core)."""
    if jit.find_nvcc() is None:
        pytest.skip("nvcc not found ($CUDA_HOME/bin or PATH)")
    out = tmp_path_factory.mktemp("cubins")
    programs = [param.values for param in _programs()]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        texts = pool.map(lambda job: _report(*job, out / f"{job[1].library}.cubin"), programs)
        return {program.library: text for (_, program), text in zip(programs, texts)}


@pytest.mark.nvcc
@pytest.mark.parametrize("name,program", list(_programs()))
def test_kernels_do_not_spill(reports, name, program):
    found = _REPORT_RE.findall(reports[program.library])
    kernels = {entry for entry, *_ in found}
    # at least a forward, a backward and dweight
    assert len(found) >= 3 and len(kernels) == len(found), reports[program.library]
    assert all(kernel.split("kernel_")[1].startswith(program.library) for kernel in kernels)
    spilled = [(entry, sizes) for entry, *sizes in found if sizes != ["0", "0", "0"]]
    assert not spilled, f"{program.library}: stack/spill bytes {spilled}"


_INSTANCE_RE = re.compile(r"_(forward|backward)ILi(\d+)ELi(\d+)EE")
_PARAM_RE = re.compile(r"^#define (CAKE_\w+) (-?\d+)$", re.MULTILINE)


def _expected_instances(params: dict) -> set:
    """(direction, elements a thread, fixed row width or 0) of every kernel instance the
    program's table calls for: the instance that serves each D of the program's route
    (CAKE_COLS_MIN .. CAKE_COLS_MAX) in each direction. On the vector route that is the fixed
    width of its row group where the row group has one (64, 128, 256 or 512 threads; with the
    direction's CAKE_*_COMMON_WIDTHS the other multiples of 64 (1) or of 32 (2) too, and the
    rows of a warp or less (3)), else, and on the scalar route, the run-time-width instance (0)."""
    expected = set()
    for direction in ("forward", "backward"):
        min_ept = params[f"CAKE_{direction.upper()}_MIN_ELEMS_PER_THREAD"]
        max_row = params[f"CAKE_{direction.upper()}_MAX_ROW_THREADS"]
        common_widths = params[f"CAKE_{direction.upper()}_COMMON_WIDTHS"]
        for cols in range(params["CAKE_COLS_MIN"], params["CAKE_COLS_MAX"] + 1):
            ept = elems_per_thread(cols, min_ept, max_row)
            tpr = threads_per_row(cols, ept)
            fixed = has_fixed_instance(params["CAKE_VECTOR"], tpr, common_widths)
            expected.add((direction, ept, tpr if fixed else 0))
    return expected


@pytest.mark.nvcc
@pytest.mark.parametrize("name,program", list(_programs()))
def test_fixed_width_instances_follow_the_table(reports, name, program):
    """The program compiles the instances that serve the D of its band and no other: every row
    width that some D runs with that width fixed, and a run-time-width instance only for the
    elements a thread where some D has no fixed width (e.g. RMSNorm's 16-bit vector program at
    D = 6145 .. 7168 compiles one forward, 32 elements a thread in 224-thread rows)."""
    found = {(direction, int(ept), int(tpr))
             for entry, *_ in _REPORT_RE.findall(reports[program.library])
             for direction, ept, tpr in _INSTANCE_RE.findall(entry)}
    source = (REPO / "csrc" / name / f"{program.library}_kernel.cu").read_text()
    expected = _expected_instances({key: int(value) for key, value in _PARAM_RE.findall(source)})
    assert found == expected, sorted(found ^ expected)


_BARRIERS_RE = re.compile(r"used (\d+) barriers")


def _barriers(report: str) -> dict:
    """Kernel name -> the barriers ptxas reserves for it (0 when the report names none)."""
    blocks = report.split("Compiling entry function '")[1:]
    return {block.split("'", 1)[0]: int(m.group(1)) if (m := _BARRIERS_RE.search(block)) else 0
            for block in blocks}


@pytest.mark.nvcc
@pytest.mark.parametrize("name,program", list(_programs()))
def test_named_barriers_only_where_the_table_wants_them(reports, name, program):
    """Row sums meet at a named barrier per row group (a register barrier id, so ptxas reserves
    all 16) only in the backward's fixed-width rows wider than a warp with 4 or more row groups
    a CTA (64, 96 and 128 threads); every other kernel reserves the CTA's one barrier, or none
    in an instance of fixed rows of a warp or less (its row sums are shuffles; a forward whose
    weights come through L1 meets at no barrier), since the reservation caps the CTAs an SM
    (RMSNorm's one-row forward fell to 59-84% of copy on the H200 with it)."""
    source = (REPO / "csrc" / name / f"{program.library}_kernel.cu").read_text()
    cta = int(dict(_PARAM_RE.findall(source))["CAKE_BACKWARD_CTA_THREADS"])
    barriers = _barriers(reports[program.library])
    assert barriers, reports[program.library]
    for kernel, count in barriers.items():
        instance = _INSTANCE_RE.search(kernel)
        width = int(instance.group(3)) if instance is not None else 0
        named = instance is not None and instance.group(1) == "backward" and width > 32 and cta // width >= 4
        allowed = (16,) if named else (0, 1) if 0 < width <= 32 else (1,)
        assert count in allowed, f"{kernel}: {count} barriers"
