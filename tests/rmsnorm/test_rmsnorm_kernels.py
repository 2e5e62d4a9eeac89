"""Compiler report of the RMSNorm programs (``nvcc`` on this machine, no GPU): every kernel of
every rendered program of both families compiles for sm_90a without register spills."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
from pathlib import Path

import pytest

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
    # forward and backward of at least two D bands (16 and 32 elements a thread), and dweight
    assert len(found) >= 5 and len(kernels) == len(found), reports[program.library]
    assert all(kernel.split("kernel_")[1].startswith(program.library) for kernel in kernels)
    spilled = [(entry, sizes) for entry, *sizes in found if sizes != ["0", "0", "0"]]
    assert not spilled, f"{program.library}: stack/spill bytes {spilled}"
