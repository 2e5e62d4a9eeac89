"""The CMake build with the real nvcc and host compiler: the toy family for sm_90a, its
libraries (device images embedded, no CUDA runtime) and rebuilds."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from build_tree import (TOY_FAMILY, TOY_NEEDED, build, configure, cuda_symbols,
                        dynamic_section, install, make_build_repo, nvcc, toy_libraries,
                        undefined_symbols)

from cake import checker
from cake.core import loader
from cake.core import manifest as mf
from cake.core import toolchain, trust

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(nvcc() is None, reason="nvcc is not on PATH or in $CUDA_HOME/bin"),
    pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is needed"),
    pytest.mark.skipif(toolchain.find_cxx() is None, reason="no host C++ compiler"),
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


def assert_libraries_and_record(lib: Path, names) -> None:
    """``lib`` holds exactly these libraries and the build record of their sha256."""
    assert sorted(p.name for p in lib.iterdir()) == sorted([*names, trust.RECORD_NAME])
    assert trust.read_record(lib) == {n: trust.sha256_file(lib / n) for n in names}


def test_one_library_per_program_for_the_requested_arch(built):
    tree, build_dir = built
    expected = toy_libraries(tree, ARCH)
    assert len(expected) == 2
    assert_libraries_and_record(library_dir(build_dir), expected)
    # The toy programs list sm_100a too; only the requested arch is built.
    assert not list(build_dir.rglob("*_sm_100a.so"))


def test_each_library_reports_its_manifest_digest_and_abi_version(built):
    tree, build_dir = built
    for name, program in toy_libraries(tree, ARCH).items():
        library = ctypes.CDLL(str(library_dir(build_dir) / name))
        digest = getattr(library, f"{program.library}_digest")
        digest.restype = ctypes.c_char_p
        assert digest().decode() == program.digest
        assert getattr(library, f"{program.library}_abi_version")() == loader.ABI_VERSION == 2
        # And the loader takes it as the program (its recorded bytes checked before loading,
        # digest and ABI after).
        record = trust.read_record(library_dir(build_dir))
        assert loader.Library(program, library_dir(build_dir) / name, "prebuilt", record[name],
                              "rebuild").origin == "prebuilt"


def test_only_the_declared_entries_are_exported(built):
    tree, build_dir = built
    for name, program in toy_libraries(tree, ARCH).items():
        out = subprocess.run(["nm", "-D", "--defined-only", str(library_dir(build_dir) / name)],
                             capture_output=True, text=True, check=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
        assert exported == {f"{program.library}_{e}" for e in
                            (*mf.IDENTITY_EXPORTS, *(entry.name for entry in program.entries))}


def test_libraries_need_libc_alone_and_no_cuda_runtime(built):
    """No CUDA runtime, static or shared, and no link to the driver: NEEDED is libc, and no
    undefined dynamic symbol is a CUDA function (the driver is opened at first use)."""
    tree, build_dir = built
    for name in toy_libraries(tree, ARCH):
        path = library_dir(build_dir) / name
        needed, out = dynamic_section(path)
        assert needed == TOY_NEEDED, needed
        assert "RPATH" not in out and "RUNPATH" not in out
        undefined = undefined_symbols(path)
        assert undefined and not cuda_symbols(undefined), cuda_symbols(undefined)
        assert not [s for s in undefined if s.startswith("_Z")], undefined  # no libstdc++


def _image(build_dir: Path, program: mf.Program) -> Path:
    return build_dir / "images" / f"{program.library}_{ARCH}.kernel.fatbin"


def test_each_library_embeds_its_kernels_fatbin(built):
    """The device image the build made for the kernel source (a fatbin: magic 0xba55ed50) is in
    the library byte for byte (cake/image.h), one per program."""
    tree, build_dir = built
    images = set()
    for name, program in toy_libraries(tree, ARCH).items():
        image = _image(build_dir, program).read_bytes()
        assert image[:4] == bytes.fromhex("50ed55ba")
        assert image in (library_dir(build_dir) / name).read_bytes()
        images.add(image)
    assert len(images) == 2


def test_the_image_holds_compressed_sm_90a_code_only(built):
    tree, build_dir = built
    program = next(iter(toy_libraries(tree, ARCH).values()))
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=str(
        Path(os.environ.get("CUDA_HOME", "/nonexistent")) / "bin"))
    if cuobjdump is None:
        pytest.skip("cuobjdump is not installed (the CUDA toolkit here has only the compiler)")
    out = subprocess.run([cuobjdump, "--list-elf", str(_image(build_dir, program))],
                         capture_output=True, text=True, check=True)
    arches = set(re.findall(r"\.(sm_\w+)\.cubin", out.stdout))
    assert arches == {ARCH}
    ptx = subprocess.run([cuobjdump, "--list-ptx", str(_image(build_dir, program))],
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


@pytest.mark.parametrize("role", ["kernel", "binding"])
def test_touching_one_program_rebuilds_only_its_library(built, role):
    tree, build_dir = built
    libraries = toy_libraries(tree, ARCH)
    (touched, program), (other, _) = sorted(libraries.items())
    before = {name: (library_dir(build_dir) / name).stat().st_mtime_ns for name in libraries}
    source = tree.source_path(program.source(role))
    future = time.time() + 5
    os.utime(source, (future, future))
    output = build(build_dir).stdout
    assert re.findall(r"Building (\S+\.so)", output) == [touched]
    assert (library_dir(build_dir) / other).stat().st_mtime_ns == before[other]
    assert (library_dir(build_dir) / touched).stat().st_mtime_ns != before[touched]
    assert "no work to do" in build(build_dir).stdout


def test_a_failed_host_compile_leaves_the_library_alone(built, tmp_path):
    """The host step writes <library>.so.tmp, which is renamed once complete: a host compile
    that fails after writing part of its output replaces no library (a copy of the tree, built
    with a host compiler that can be made to fail)."""
    tree, build_dir = built
    root = tmp_path / "repo"
    shutil.copytree(build_dir.parent / "repo", root)
    broken = tmp_path / "broken"
    cxx = tmp_path / "c++"
    cxx.write_text(f'#!/bin/sh\nif [ -e "{broken}" ]; then\n  for last; do :; done\n'
                   f'  echo partial > "$last"\n  echo "broken on purpose" >&2\n  exit 1\nfi\n'
                   f'exec "{toolchain.find_cxx()}" "$@"\n')
    cxx.chmod(0o755)
    env = dict(os.environ, CXX=str(cxx))
    configure(root, tmp_path / "build", ARCH, env=env)
    assert build(tmp_path / "build", env=env).returncode == 0
    copy = mf.repository_tree(root, TOY_FAMILY)
    program = mf.read(copy.manifest_path).programs[0]
    library = tmp_path / "build" / "lib" / TOY_FAMILY / f"{program.library}_{ARCH}.so"
    good = library.read_bytes()
    broken.touch()
    future = time.time() + 5
    os.utime(copy.source_path(program.source("binding")), (future, future))
    result = build(tmp_path / "build", env=env, check=False)
    assert result.returncode != 0 and "broken on purpose" in result.stdout + result.stderr
    assert library.read_bytes() == good
    assert (library.parent / f"{library.name}.tmp").read_text() == "partial\n"  # not loadable
    broken.unlink()
    assert build(tmp_path / "build", env=env).returncode == 0
    assert library.read_bytes() == good  # equal inputs, equal bytes
    assert trust.read_record(library.parent)[library.name] == trust.sha256_file(library)
    assert loader.Library(program, library, "prebuilt", trust.sha256_file(library),
                          "rebuild").origin == "prebuilt"


def test_install_lays_out_build_json_csrc_and_lib(built, tmp_path):
    tree, build_dir = built
    package = install(build_dir, tmp_path / "prefix") / TOY_FAMILY
    assert (package / "build.json").read_bytes() == tree.manifest_path.read_bytes()
    assert_libraries_and_record(package / "lib", toy_libraries(tree, ARCH))
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
    assert_libraries_and_record(package / "lib", toy_libraries(tree, ARCH))
    assert checker.check_tree(mf.package_tree(package))[0] == []
