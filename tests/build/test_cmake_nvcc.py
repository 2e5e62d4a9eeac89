"""The CMake build with the real nvcc: the toy family for sm_90a, its libraries and rebuilds."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from build_tree import (ALLOWED_NEEDED, TOY_FAMILY, build, configure, install,
                        make_build_repo, nvcc, toy_libraries)

from cake import checker
from cake.core import manifest as mf

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(nvcc() is None, reason="nvcc is not on PATH or in $CUDA_HOME/bin"),
    pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is needed"),
]
ARCH = "sm_90a"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The toy repository configured and built for sm_90a: (tree, build folder)."""
    root = tmp_path_factory.mktemp("toy")
    tree = make_build_repo(root / "repo")
    configure(root / "repo", root / "build", ARCH)
    build(root / "build")
    return tree, root / "build"


def library_dir(build_dir: Path) -> Path:
    return build_dir / "lib" / TOY_FAMILY


def test_one_library_per_program_for_the_requested_arch(built):
    tree, build_dir = built
    expected = toy_libraries(tree, ARCH)
    assert len(expected) == 2
    assert sorted(p.name for p in library_dir(build_dir).iterdir()) == sorted(expected)
    # The toy programs list sm_100a too; only the requested arch is built.
    assert not list(build_dir.rglob("*_sm_100a.so"))


def test_each_library_reports_its_manifest_digest_and_abi_version(built):
    tree, build_dir = built
    for name, program in toy_libraries(tree, ARCH).items():
        library = ctypes.CDLL(str(library_dir(build_dir) / name))
        digest = getattr(library, f"{program.library}_digest")
        digest.restype = ctypes.c_char_p
        assert digest().decode() == program.digest
        assert getattr(library, f"{program.library}_abi_version")() == 1


def test_only_the_program_entries_are_exported(built):
    tree, build_dir = built
    for name, program in toy_libraries(tree, ARCH).items():
        out = subprocess.run(["nm", "-D", "--defined-only", str(library_dir(build_dir) / name)],
                             capture_output=True, text=True, check=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
        assert exported == set(program.entries)
        assert {f"{program.library}_digest", f"{program.library}_abi_version"} <= exported


def test_libraries_need_no_libtorch_python_or_shared_cudart(built):
    tree, build_dir = built
    for name in toy_libraries(tree, ARCH):
        out = subprocess.run(["readelf", "-d", str(library_dir(build_dir) / name)],
                             capture_output=True, text=True, check=True).stdout
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
        assert needed and needed <= ALLOWED_NEEDED, needed - ALLOWED_NEEDED
        assert "RPATH" not in out and "RUNPATH" not in out


def test_the_library_holds_compressed_sm_90a_code_only(built):
    tree, build_dir = built
    name = next(iter(toy_libraries(tree, ARCH)))
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=str(
        Path(os.environ.get("CUDA_HOME", "/nonexistent")) / "bin"))
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed (the CUDA toolkit here has only the compiler)")
    out = subprocess.run([cuobjdump, "--list-elf", str(library_dir(build_dir) / name)],
                         capture_output=True, text=True, check=True)
    arches = set(re.findall(r"\.(sm_\w+)\.cubin", out.stdout))
    assert arches == {ARCH}
    ptx = subprocess.run([cuobjdump, "--list-ptx", str(library_dir(build_dir) / name)],
                         capture_output=True, text=True)
    assert ".ptx" not in ptx.stdout


def test_an_unchanged_tree_rebuilds_nothing(built):
    _, build_dir = built
    dry = subprocess.run(["ninja", "-C", str(build_dir), "-n"], capture_output=True, text=True,
                         check=True).stdout
    assert "no work to do" in dry
    start = time.monotonic()
    assert "no work to do" in build(build_dir).stdout
    assert time.monotonic() - start < 30  # a no-op, not a compile (measured: well under 1 s)


def test_touching_one_program_rebuilds_only_its_library(built):
    tree, build_dir = built
    libraries = toy_libraries(tree, ARCH)
    (touched, program), (other, _) = sorted(libraries.items())
    before = {name: (library_dir(build_dir) / name).stat().st_mtime_ns for name in libraries}
    source = tree.source_path(program.sources[0])
    future = time.time() + 5
    os.utime(source, (future, future))
    output = build(build_dir).stdout
    assert re.findall(r"Building (\S+\.so)", output) == [touched]
    assert (library_dir(build_dir) / other).stat().st_mtime_ns == before[other]
    assert (library_dir(build_dir) / touched).stat().st_mtime_ns != before[touched]
    assert "no work to do" in build(build_dir).stdout


def test_install_lays_out_build_json_csrc_and_lib(built, tmp_path):
    tree, build_dir = built
    package = install(build_dir, tmp_path / "prefix") / TOY_FAMILY
    assert (package / "build.json").read_bytes() == tree.manifest_path.read_bytes()
    assert sorted(p.name for p in (package / "lib").iterdir()) == sorted(toy_libraries(tree, ARCH))
    assert (package / "csrc/include/cake/program.h").is_file()
    findings, programs = checker.check_tree(mf.package_tree(package))
    assert findings == [] and programs == 2


def test_a_package_tree_is_built_into_its_lib_folder(built, tmp_path):
    """CAKE_PACKAGE_ROOT: an installed/vendored layout (build.json + csrc/) built in place."""
    tree, build_dir = built
    package = install(build_dir, tmp_path / "prefix") / TOY_FAMILY
    shutil.rmtree(package / "lib")
    source = build_dir.parent / "repo"
    configure(source, tmp_path / "build", ARCH, extra=(f"-DCAKE_PACKAGE_ROOT={package}",))
    build(tmp_path / "build")
    assert sorted(p.name for p in (package / "lib").iterdir()) == sorted(toy_libraries(tree, ARCH))
    assert checker.check_tree(mf.package_tree(package))[0] == []
