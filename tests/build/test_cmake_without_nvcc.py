"""The CMake build where no nvcc can be found: CAKE_CUDA_ARCHS=none installs without compiling,
anything else stops with a message that states the fix. Also: the checker gates the configure."""

from __future__ import annotations

import shutil

import pytest

from build_tree import (TOY_FAMILY, build, configure, env_without_nvcc, install,
                        make_build_repo)

from cake import checker
from cake.core import manifest as mf

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                                reason="cmake and ninja are needed")


@pytest.fixture
def toy(tmp_path) -> mf.PackageTree:
    return make_build_repo(tmp_path / "repo")


def test_none_installs_manifests_and_sources_without_compiling(toy, tmp_path):
    env = env_without_nvcc()
    result = configure(tmp_path / "repo", tmp_path / "build", "none", env=env)
    assert "0 libraries for no arch (JIT only)" in result.stdout
    assert "CUDA compiler identification" not in result.stdout
    build(tmp_path / "build", env=env)
    package = install(tmp_path / "build", tmp_path / "prefix")
    family = package / TOY_FAMILY
    assert (family / "build.json").read_bytes() == toy.manifest_path.read_bytes()
    manifest = mf.read(toy.manifest_path)
    for program in manifest.programs:
        for source in program.sources:
            assert (family / "csrc" / source.path).read_bytes() == \
                toy.source_path(source).read_bytes()
    assert sorted(p.relative_to(family / "csrc/include").as_posix()
                  for p in (family / "csrc/include").rglob("*") if p.is_file()) == \
        sorted(h.path for h in manifest.headers)
    assert not (family / "lib").exists()
    assert list(tmp_path.rglob("*.so")) == []
    findings, programs = checker.check_tree(mf.package_tree(family))
    assert findings == [] and programs == len(manifest.programs)


@pytest.mark.parametrize("archs", ["auto", "sm_90a"])
def test_without_nvcc_the_configure_stops_and_states_the_fix(toy, tmp_path, archs):
    result = configure(tmp_path / "repo", tmp_path / "build", archs, env=env_without_nvcc(),
                       check=False)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())  # CMake wraps long lines
    assert "nvcc (the CUDA compiler) was not found" in message
    assert "CUDA_HOME" in message and "CAKE_CUDA_ARCHS=none" in message


def test_checker_findings_fail_the_configure(toy, tmp_path):
    program = mf.read(toy.manifest_path).programs[0]
    index = [s.role for s in program.sources].index("binding")
    source = toy.source_path(program.sources[index])
    data = source.read_bytes()
    assert b"n must be >= 0" in data
    source.write_bytes(data.replace(b"n must be >= 0", b"n must not be negative"))
    result = configure(tmp_path / "repo", tmp_path / "build", "none", env=env_without_nvcc(),
                       check=False)
    assert result.returncode != 0
    assert f"programs[0].sources[{index}].sha256: CM304" in result.stderr


def test_without_a_host_compiler_the_configure_stops_and_states_the_fix(toy, tmp_path):
    """An arch to build needs the host C++ compiler too (the program libraries are plain C++);
    here nvcc is a stand-in that only lists its arches."""
    cuda = tmp_path / "cuda" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvcc").write_text("#!/bin/sh\necho sm_90 sm_100 sm_103\n")
    (cuda / "nvcc").chmod(0o755)
    env = dict(env_without_nvcc(), CUDA_HOME=str(cuda.parent), CXX=str(tmp_path / "no-c++"))
    result = configure(tmp_path / "repo", tmp_path / "build", "sm_90a", env=env, check=False)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "no host C++ compiler ($CXX, c++ or g++)" in message
    assert "install g++ or set CXX" in message


def test_a_later_edit_of_a_source_re_runs_the_checker(toy, tmp_path):
    env = env_without_nvcc()
    configure(tmp_path / "repo", tmp_path / "build", "none", env=env)
    assert "no work to do" in build(tmp_path / "build", env=env).stdout
    source = toy.source_path(mf.read(toy.manifest_path).programs[-1].sources[0])
    source.write_bytes(source.read_bytes() + b"\n")
    result = build(tmp_path / "build", env=env, check=False)
    assert result.returncode != 0
    assert "CM304" in result.stdout + result.stderr


def test_a_new_manifest_is_planned_on_the_next_build(tmp_path):
    root = tmp_path / "repo"
    toy = make_build_repo(root)
    # Start from a repository without the family, then let it land.
    landed = tmp_path / "landed"
    shutil.move(toy.manifest_path, landed)
    shutil.move(toy.csrc_dir, tmp_path / "csrc")
    env = env_without_nvcc()
    assert "0 package(s)" in configure(root, tmp_path / "build", "none", env=env).stdout
    shutil.move(tmp_path / "csrc", toy.csrc_dir)
    shutil.move(landed, toy.manifest_path)
    result = build(tmp_path / "build", env=env)
    assert "1 package(s)" in result.stdout
