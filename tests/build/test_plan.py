"""tools/build_plan.py and cake/core/compile_flags.py: no compiler needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_tree import REPO, TOY_FAMILY, make_build_repo

from cake.core import compile_flags as cf
from cake.core import manifest as mf

PLAN = REPO / "tools" / "build_plan.py"


def fake_nvcc(folder: Path) -> Path:
    """An 'nvcc' that only answers --list-gpu-code (as CUDA 13.0 does), for plans without CUDA."""
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\necho sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120\n")
    nvcc.chmod(0o755)
    return nvcc


def plan(root: Path, *args: str, nvcc: bool = True) -> tuple[subprocess.CompletedProcess, str]:
    output = root / "plan.cmake"
    extra = ["--nvcc", str(fake_nvcc(root / "cuda" / "bin"))] if nvcc else []
    result = subprocess.run([sys.executable, str(PLAN), "--output", str(output), *extra, *args],
                            capture_output=True, text=True)
    return result, output.read_text() if output.exists() else ""


@pytest.fixture
def toy(tmp_path) -> mf.PackageTree:
    return make_build_repo(tmp_path / "repo")


def calls(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^cake_add_program\((\w+) ARCH (\w+) ", text, re.MULTILINE)


# --------------------------------------------------------------------------- compile flags


def test_base_flags_are_the_documented_list():
    assert cf.base_nvcc_flags("sm_90a") == [
        "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler",
        "-fvisibility=hidden", "-gencode=arch=compute_90a,code=sm_90a", "-Xfatbin=-compress-all",
        "-Xlinker", "--strip-all"]


@pytest.mark.parametrize("arch", mf.KNOWN_ARCHES)
def test_nvcc_command_is_base_flags_include_digest_flags_sources_output(arch):
    command = cf.nvcc_command("nvcc", arch, "0123456789abcdef0123", "/inc", ["-DX=1"],
                              ["k.cu", "b.cu"], "out.so")
    assert command == ["nvcc", *cf.base_nvcc_flags(arch), "-I/inc",
                       '-DCAKE_PROGRAM_DIGEST="0123456789abcdef0123"', "-DX=1", "k.cu", "b.cu",
                       "-o", "out.so"]
    assert cf.gencode(arch) in command


def test_supported_arches_come_from_nvcc_list_gpu_code(tmp_path):
    nvcc = str(fake_nvcc(tmp_path))
    assert cf.nvcc_supported_arches(nvcc) == ["sm_90a", "sm_100a", "sm_103a"]
    assert cf.nvcc_supported_arches(nvcc, mf.KNOWN_ARCHES) == [
        "sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a"]


@pytest.mark.parametrize("bad", ["sm_90", "90a", "compute_90a", "sm_90a;sm_100a", ""])
def test_gencode_refuses_what_is_not_an_a_arch(bad):
    with pytest.raises(ValueError, match="sm_90a"):
        cf.gencode(bad)


def test_digest_define_is_one_argv_item():
    assert cf.digest_define("0123abcdef") == '-DCAKE_PROGRAM_DIGEST="0123abcdef"'
    with pytest.raises(ValueError):
        cf.digest_define('x" -DEVIL')


# --------------------------------------------------------------------------- plan


def test_plan_intersects_the_requested_arches_with_each_programs_arches(toy, tmp_path):
    programs = mf.read(toy.manifest_path).programs
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    assert calls(text) == [(p.library, "sm_90a") for p in programs]
    result, text = plan(tmp_path, "--archs", "sm_90a;sm_103a,sm_100a",
                        "--repository", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    # The toy programs list sm_90a and sm_100a only: no sm_103a library.
    assert sorted(calls(text)) == sorted((p.library, a) for p in programs
                                         for a in ("sm_90a", "sm_100a"))
    assert '"-gencode=arch=compute_100a,code=sm_100a"' in text


def test_plan_names_digest_sources_include_and_install_folder(toy, tmp_path):
    program = mf.read(toy.manifest_path).programs[0]
    _, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    call = text[text.index(f"cake_add_program({program.library} "):].split(")\n")[0]
    assert f"DIGEST {program.digest} PACKAGE {TOY_FAMILY}" in call
    for source in program.sources:
        assert f'"{toy.source_path(source)}"' in call
    assert f'"-I{toy.include_dir}"' in call
    assert f'cake_add_package({TOY_FAMILY} INSTALL_DIR "cake/{TOY_FAMILY}"' in text
    # Every manifest, source and header is a configure dependency: an edit re-plans.
    inputs = text[text.index("set(CAKE_PLAN_INPUTS"):].split(")")[0]
    for path in [toy.manifest_path, toy.header_path("cake/program.h"),
                 *(toy.source_path(s) for s in program.sources)]:
        assert f'"{path}"' in inputs


def test_none_plans_the_packages_without_libraries(toy, tmp_path):
    result, text = plan(tmp_path, "--archs", "none", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    assert calls(text) == []
    assert f"cake_add_package({TOY_FAMILY} " in text
    assert "no arch (JIT only)" in result.stdout


def test_a_repository_without_families_plans_nothing(tmp_path):
    (tmp_path / "empty" / "manifests").mkdir(parents=True)
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "empty"))
    assert result.returncode == 0, result.stderr
    assert "set(CAKE_PLAN_LIBRARY_COUNT 0)" in text


def test_package_layout_builds_into_the_package_lib_folder(toy, tmp_path):
    package = tmp_path / "site" / "cake" / TOY_FAMILY
    package.mkdir(parents=True)
    (package.parent / "__init__.py").touch()
    (package / "__init__.py").touch()
    (package / "build.json").write_bytes(toy.manifest_path.read_bytes())
    (package / "csrc" / "include" / "cake").mkdir(parents=True)
    for source in toy.csrc_dir.iterdir():
        (package / "csrc" / source.name).write_bytes(source.read_bytes())
    (package / "csrc/include/cake/program.h").write_bytes(
        toy.header_path("cake/program.h").read_bytes())
    result, text = plan(tmp_path, "--archs", "sm_90a", "--package", str(package))
    assert result.returncode == 0, result.stderr
    assert f'OUTPUT_DIR "{package.resolve() / "lib"}"' in text
    assert len(calls(text)) == len(mf.read(toy.manifest_path).programs)


def test_checker_findings_stop_the_plan_with_the_checkers_lines(toy, tmp_path):
    program = mf.read(toy.manifest_path).programs[0]
    source = toy.source_path(program.sources[0])
    source.write_bytes(source.read_bytes() + b"// edited by hand\n")
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 1
    assert text == ""
    assert "fail check_manifests" in result.stderr
    assert f"{toy.manifest_path}:programs[0].sources[0].sha256: CM304" in result.stderr


def test_the_plan_runs_the_jits_nvcc_command(toy, tmp_path):
    """A prebuilt library is built by exactly the command the runtime JIT would run."""
    from cake.core import jit

    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    nvcc = str(tmp_path / "cuda" / "bin" / "nvcc")
    for program in mf.read(toy.manifest_path).programs:
        call = text[text.index(f"cake_add_program({program.library} "):].split(")\n")[0]
        planned = re.findall(r'"((?:[^"\\]|\\.)*)"', call.split("COMMAND ", 1)[1])
        planned = [re.sub(r"\\(.)", r"\1", arg) for arg in planned]
        expected = jit.compile_command(nvcc, toy, program, "sm_90a", Path("OUT"))
        assert planned + ["OUT"] == [str(arg) for arg in expected]


@pytest.mark.parametrize("archs,message,nvcc", [
    ("sm_89", "unknown arch(es) sm_89", True),
    ("sm_90a;bogus", "unknown arch(es) bogus", True),
    ("sm_121a", "which", True),  # known arch, but this nvcc cannot compile it
    ("auto", "needs nvcc", False),
])
def test_bad_arch_requests_are_refused(toy, tmp_path, archs, message, nvcc):
    result, _ = plan(tmp_path, "--archs", archs, "--repository", str(tmp_path / "repo"),
                     nvcc=nvcc)
    assert result.returncode == 1
    assert message in result.stderr
