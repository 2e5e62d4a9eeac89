"""aarch64 (Grace Hopper / Grace Blackwell) libraries cross-built on this x86_64 machine, and the
loader's host-dependent parts on CPU (docs/build.md, "aarch64 wheels").

One real program is built twice with the build's own commands (toolchain.library_steps): host
code by g++ and by Debian's aarch64-linux-gnu-g++. Its device image must be byte-identical and
both libraries must pass tools/check_libraries.py for their machine (ELF machine, NEEDED libc
alone, no glibc symbol past the baseline). The full aarch64 wheel and its self-test under qemu
are a release step (ci/build_wheel.sh with CAKE_WHEEL_HOST=aarch64), not run here.

.ci/run installs the cross compiler and sets CAKE_REQUIRE_CROSS=1, so in CI a missing cross
compiler fails these tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_tree import REPO, nvcc

sys.path.insert(0, str(REPO / "tools"))
import check_libraries  # noqa: E402
import compare_images  # noqa: E402

from cake.core import jit, loader, toolchain, trust  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

CROSS_CXX = "aarch64-linux-gnu-g++"
ARCH = "sm_90a"


def _cross_compiler() -> str:
    found = shutil.which(CROSS_CXX)
    if found is None:
        if os.environ.get("CAKE_REQUIRE_CROSS") == "1":
            pytest.fail(f"{CROSS_CXX} is missing, and CAKE_REQUIRE_CROSS=1 (.ci/run installs "
                        "Debian's g++-aarch64-linux-gnu)")
        pytest.skip(f"{CROSS_CXX} is not installed (Debian: g++-aarch64-linux-gnu)")
    return found


def _build(program: mf.Program, cxx: str, out: Path) -> Path:
    tree = mf.repository_tree(REPO, "cake_causal_conv1d_det_train")
    out.mkdir()
    library = out / f"{program.library}_{ARCH}.so"
    steps = toolchain.library_steps(
        toolchain.Tools(nvcc=nvcc(), cxx=cxx), kind=program.kind, library=program.library,
        digest=program.digest, arch=ARCH, include_dir=str(REPO / "csrc" / "include"),
        flags=program.flags, sources=[toolchain.Source(s.role, str(tree.source_path(s)))
                                      for s in program.sources],
        work_dir=str(out), output=str(library))
    for step in steps:
        subprocess.run(step, check=True, capture_output=True)
    return library


@pytest.fixture(scope="module")
def both_builds(tmp_path_factory) -> tuple[Path, Path]:
    """One conv1d program built for x86_64 and for aarch64: (x86_64 folder, aarch64 folder)."""
    cross = _cross_compiler()
    if nvcc() is None:
        pytest.skip("nvcc is not on PATH or in $CUDA_HOME/bin")
    manifest = mf.read(REPO / "manifests" / "cake_causal_conv1d_det_train.json")
    program = manifest.programs[0]
    root = tmp_path_factory.mktemp("cross")
    _build(program, toolchain.find_cxx(), root / "x86_64")
    _build(program, cross, root / "aarch64")
    return root / "x86_64", root / "aarch64"


@pytest.mark.nvcc
def test_the_device_image_is_the_same_bytes_for_both_hosts(both_builds):
    native, cross = both_builds
    shared, differ = compare_images.compare(native, cross)
    assert len(shared) == 1 and shared[0].endswith(f"_{ARCH}.kernel.fatbin")
    assert differ == []


@pytest.mark.nvcc
def test_each_library_suits_its_machines_manylinux_wheel(both_builds, capsys):
    native, cross = both_builds
    assert check_libraries.main(["--machine", "aarch64", str(cross)]) == 0
    assert "AArch64, NEEDED libc.so.6, newest glibc symbol version GLIBC_2.17: ok" in \
        capsys.readouterr().out
    assert check_libraries.main(["--machine", "x86_64", str(native)]) == 0
    assert "newest glibc symbol version GLIBC_2.2.5: ok" in capsys.readouterr().out
    # Each is refused as the other machine's.
    assert check_libraries.main(["--machine", "x86_64", str(cross)]) == 1
    assert "built for AArch64, not Advanced Micro Devices X86-64" in capsys.readouterr().out


@pytest.mark.nvcc
def test_the_aarch64_library_is_refused_on_x86_64_and_taken_on_aarch64(both_builds, monkeypatch):
    native, cross = both_builds
    [x86_library], [arm_library] = native.glob("*.so"), cross.glob("*.so")
    monkeypatch.setattr(trust.platform, "machine", lambda: "x86_64")
    assert trust.elf_problem(x86_library.read_bytes()) is None
    assert trust.elf_problem(arm_library.read_bytes()) == \
        "it is built for ELF machine 183, this host is x86_64"
    monkeypatch.setattr(trust.platform, "machine", lambda: "aarch64")
    assert trust.elf_problem(arm_library.read_bytes()) is None
    assert trust.elf_problem(x86_library.read_bytes()) == \
        "it is built for ELF machine 62, this host is aarch64"


def _library_with(tmp_path: Path, source: str, *link: str) -> Path:
    (tmp_path / "probe.c").write_text(source)
    library = tmp_path / "probe.so"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", str(tmp_path / "probe.c"), "-o",
                    str(library), *link], check=True, capture_output=True)
    return library


def test_check_libraries_finds_a_new_glibc_symbol_and_an_extra_needed(tmp_path, capsys):
    """dlopen without cake/driver.h's pinning binds GLIBC_2.34 on this glibc; -lm adds a NEEDED."""
    library = _library_with(tmp_path, '#include <dlfcn.h>\n#include <math.h>\n'
                            'void* f(double x) { return dlopen(x > cos(x) ? "a" : "b", 2); }\n',
                            "-lm")
    assert check_libraries.main(["--machine", "x86_64", str(library)]) == 1
    out = capsys.readouterr().out
    assert "NEEDED ['libm.so.6', 'libc.so.6'], expected ['libc.so.6']" in out
    assert "needs GLIBC_2.34, newer than GLIBC_2.2.5" in out


def test_the_jit_cache_keeps_each_host_machine_apart(monkeypatch):
    """x86_64 and Grace nodes sharing a home folder (and so a cache) never meet in an entry."""
    program = mf.read(REPO / "manifests" / "cake_causal_conv1d_det_train.json").programs[0]
    monkeypatch.setattr(jit, "compiler_version", lambda tool: "1.2.3")
    monkeypatch.setattr(jit, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(toolchain, "find_cxx", lambda: "/usr/bin/g++")
    keys = {}
    for machine in ("x86_64", "aarch64"):
        monkeypatch.setattr(jit.platform, "machine", lambda: machine)
        keys[machine] = jit.entry_dir(program, ARCH)
    flags = toolchain.flags_hash()
    assert keys["aarch64"].parts[-3:] == (ARCH, f"nvcc-1.2.3-aarch64-c++-1.2.3-{flags}",
                                          program.digest)
    assert keys["x86_64"].parts[-2] == f"nvcc-1.2.3-x86_64-c++-1.2.3-{flags}"


def test_nvcc_lookup_and_library_names_do_not_depend_on_the_host(monkeypatch, tmp_path):
    """On Grace the toolkit is CUDA's sbsa build, found the same way: $CUDA_HOME/bin, then PATH;
    prebuilt libraries have the same names in both wheels."""
    fake_nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    fake_nvcc.parent.mkdir(parents=True)
    fake_nvcc.write_text("#!/bin/sh\n")
    fake_nvcc.chmod(0o755)
    program = mf.read(REPO / "manifests" / "cake_causal_conv1d_det_train.json").programs[0]
    programs = loader.ProgramSet(REPO / "cake" / "cake_causal_conv1d_det_train")
    found, names = {}, {}
    for machine in ("x86_64", "aarch64"):
        monkeypatch.setattr("platform.machine", lambda: machine)
        monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
        found[machine] = toolchain.find_nvcc()
        names[machine] = programs.prebuilt_path(program, ARCH).name
    assert found == {"x86_64": str(fake_nvcc), "aarch64": str(fake_nvcc)}
    assert names == {m: f"{program.library}_{ARCH}.so" for m in ("x86_64", "aarch64")}
