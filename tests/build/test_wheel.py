"""The wheel of the real repository: ci/build_wheel.sh builds it for sm_90a, repairs it with
auditwheel, installs it into a fresh venv, runs check_manifests and imports cake there.

The build folder is build/<wheel tag>, shared with `pip install .`: in CI (.ci/run installs
the checkout first, for sm_90a) the compile is already done and this test only packages,
repairs and installs. From a cold tree it compiles every program once (about 3.5 minutes for
24 programs on 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from build_tree import (ALLOWED_NEEDED, REPO, cuda_symbols, dynamic_section, nvcc,
                        undefined_symbols)

from cake.core import manifest as mf

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(nvcc() is None, reason="nvcc is not on PATH or in $CUDA_HOME/bin")]
ARCH = "sm_90a"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, CAKE_CUDA_ARCHS=ARCH, CAKE_WHEEL_TORCH="0")
    result = subprocess.run(["bash", str(REPO / "ci" / "build_wheel.sh"), str(out)], env=env,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
    return wheels[0], result.stdout


def families() -> list[str]:
    return mf.repository_families(REPO)


def test_one_manylinux_wheel_for_every_python(built):
    """py3-none (no library links Python) and auditwheel's oldest tag: the libraries bind no glibc
    symbol past GLIBC_2.2.5 (csrc/include/cake/driver.h pins dlopen's), so manylinux_2_5
    (manylinux1)."""
    wheel, output = built
    assert re.fullmatch(r"cake_train-[^-]+-py3-none-manylinux1_x86_64\.manylinux_2_5_x86_64\.whl",
                        wheel.name)
    assert f"wheel tag: {wheel.name[:-4].split('-', 2)[2]}" in output
    assert re.search(r"check_libraries: \d+ libraries, Advanced Micro Devices X86-64, NEEDED "
                     r"libc\.so\.6, newest glibc symbol version GLIBC_2\.2\.5: ok", output)
    assert wheel.stat().st_size < 100 * 1000 * 1000  # PyPI's default limit


def test_wheel_holds_packages_manifests_sources_and_one_library_per_program(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "cake"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert {p for p in tracked if p.endswith(".py")} <= names
    expected_libraries = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in families():
            tree = mf.repository_tree(REPO, name)
            manifest = mf.read(tree.manifest_path)
            assert archive.read(f"cake/{name}/build.json") == tree.manifest_path.read_bytes()
            for program in manifest.programs:
                for source in program.sources:
                    assert archive.read(f"cake/{name}/csrc/{source.path}") == \
                        tree.source_path(source).read_bytes()
                if ARCH in program.arches:
                    expected_libraries.add(f"cake/{name}/lib/{program.library}_{ARCH}.so")
            for header in manifest.headers:
                assert f"cake/{name}/csrc/include/{header.path}" in names
    # Nothing grafted by auditwheel (no cake_train.libs/), no other arch, no stray library.
    assert {n for n in names if ".so" in n} == expected_libraries


def test_installed_wheel_passes_check_manifests_and_imports_without_torch(built):
    _, output = built
    assert "(import cake loaded no torch)" in output
    if families():
        count = sum(len(mf.read(mf.repository_tree(REPO, n).manifest_path).programs)
                    for n in families())
        assert (f"check_manifests: ok in {len(families())} manifest(s), {count} program(s)"
                in output)


def test_every_library_links_no_cuda_and_exports_its_declared_entries(built, tmp_path):
    """The libraries as the wheel ships them: NEEDED within libc (plus the C++ runtime where a
    binding needs it; docs/build.md), no CUDA runtime or driver symbol, no RPATH, and the
    exports the manifest declares."""
    wheel, _ = built
    programs = {p.library: p for name in families()
                for p in mf.read(mf.repository_tree(REPO, name).manifest_path).programs}
    checked = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in sorted(n for n in archive.namelist() if n.endswith(".so")):
            path = tmp_path / Path(member).name
            path.write_bytes(archive.read(member))
            needed, dynamic = dynamic_section(path)
            assert needed and set(needed) <= ALLOWED_NEEDED, (member, needed)
            assert "RPATH" not in dynamic and "RUNPATH" not in dynamic, member
            assert not cuda_symbols(undefined_symbols(path)), member
            program = programs[path.name[: -len(f"_{ARCH}.so")]]
            out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                                 text=True, check=True).stdout
            exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
            assert exported == {f"{program.library}_{e}" for e in
                                (*mf.IDENTITY_EXPORTS, *(x.name for x in program.entries))}
            checked += 1
    assert checked == sum(ARCH in p.arches for p in programs.values())
