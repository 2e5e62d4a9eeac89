"""tools/build_plan.py and cake/core/toolchain.py: no compiler needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_tree import REPO, TOY_FAMILY, make_build_repo

from cake.core import manifest as mf
from cake.core import toolchain as tc

PLAN = REPO / "tools" / "build_plan.py"
DIGEST = "0123456789abcdef0123"


def fake_nvcc(folder: Path) -> Path:
    """An 'nvcc' that only answers --list-gpu-code (as CUDA 13.0 does), for plans without CUDA."""
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\necho sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120\n")
    nvcc.chmod(0o755)
    return nvcc


def plan(root: Path, *args: str, nvcc: bool = True, env: dict | None = None,
         build_dir: bool = True) -> tuple[subprocess.CompletedProcess, str]:
    output = root / "plan.cmake"
    extra = ["--nvcc", str(fake_nvcc(root / "cuda" / "bin"))] if nvcc else []
    if build_dir:
        extra += ["--build-dir", str(root / "build")]
    result = subprocess.run([sys.executable, str(PLAN), "--output", str(output), *extra, *args],
                            capture_output=True, text=True, env=env)
    return result, output.read_text() if output.exists() else ""


@pytest.fixture
def toy(tmp_path) -> mf.PackageTree:
    return make_build_repo(tmp_path / "repo")


def calls(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^cake_add_program\((\w+) ARCH (\w+) ", text, re.MULTILINE)


def call_of(text: str, library: str, arch: str = "sm_90a") -> str:
    start = text.index(f"cake_add_program({library} ARCH {arch} ")
    return text[start:text.index(")\n", start)]


def unquote(words: str) -> list[str]:
    """The plan's quoted CMake arguments as plain strings."""
    return [re.sub(r"\\(.)", r"\1", arg) for arg in re.findall(r'"((?:[^"\\]|\\.)*)"', words)]


def steps_of(call: str) -> list[list[str]]:
    """STEP1 .. STEPn of a cake_add_program call, each as an argv."""
    parts = re.split(r"\n  STEP(\d+) ", call)
    assert parts[1::2] == [str(i) for i in range(1, len(parts) // 2 + 1)], parts[1::2]
    return [unquote(words) for words in parts[2::2]]


# --------------------------------------------------------------------------- toolchain


def test_device_flags_are_the_documented_list():
    """Machine code only (no PTX), in a fatbin compressed for size."""
    assert tc.device_flags("sm_90a") == [
        "-fatbin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
        "-Xfatbin=-compress-all", "--compress-mode=size"]


def test_host_flags_build_a_plain_c_plus_plus_library():
    """No CUDA runtime and no libstdc++ use (no exceptions, RTTI or thread-safe statics), any
    symbol outside libc a link error, stripped and without a build id (equal inputs, equal
    bytes), only CAKE_EXPORT visible, and small (no unwind tables, unused sections dropped)."""
    assert tc.HOST_FLAGS == (
        "-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-exceptions",
        "-fno-rtti", "-fno-threadsafe-statics", "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections",
        "-Wl,-z,noseparate-code", "-Wl,-z,defs", "-Wl,--build-id=none", "-s")
    assert not [f for f in tc.HOST_FLAGS if "cuda" in f.lower() or f.startswith("-l")]


def test_the_flags_hash_follows_every_build_flag(monkeypatch):
    """The build flags are not in the digests; the JIT cache key carries their hash instead."""
    before = tc.flags_hash()
    assert re.fullmatch(r"[0-9a-f]{8}", before)
    monkeypatch.setattr(tc, "HOST_FLAGS", (*tc.HOST_FLAGS, "-g"))
    assert tc.flags_hash() != before
    monkeypatch.undo()
    real = tc.device_flags
    monkeypatch.setattr(tc, "device_flags", lambda arch: [*real(arch), "-G"])
    assert tc.flags_hash() != before
    monkeypatch.undo()
    monkeypatch.setattr(tc, "FATBINARY_COMPRESSION", ("-compress-all",))
    assert tc.flags_hash() != before


def _sources(*roles: str) -> list[tc.Source]:
    return [tc.Source(role, f"/src/lib_{role}.cu") for role in roles]


TOOLS = tc.Tools(nvcc="/cuda/bin/nvcc", cxx="/usr/bin/c++", python="/py/bin/python")


@pytest.mark.parametrize("arch", mf.KNOWN_ARCHES)
def test_library_steps_are_one_fatbin_per_kernel_source_then_the_host_library(arch):
    steps = tc.library_steps(TOOLS, kind="cuda", library="lib", digest=DIGEST, arch=arch,
                             include_dir="/inc", flags=["-DX=1"],
                             sources=_sources("kernel", "kernel_backward", "binding"),
                             work_dir="/work", output="/out/lib.so")
    digest = f'-DCAKE_PROGRAM_DIGEST="{DIGEST}"'
    images = [f"/work/lib_{arch}.kernel.fatbin", f"/work/lib_{arch}.kernel_backward.fatbin"]
    assert steps == [
        ["/cuda/bin/nvcc", *tc.device_flags(arch), "-I/inc", digest, "-DX=1",
         "/src/lib_kernel.cu", "-o", images[0]],
        ["/cuda/bin/nvcc", *tc.device_flags(arch), "-I/inc", digest, "-DX=1",
         "/src/lib_kernel_backward.cu", "-o", images[1]],
        ["/usr/bin/c++", *tc.HOST_FLAGS, "-I/inc", digest, "-DCAKE_IMAGE_COUNT=2",
         f'-DCAKE_IMAGES=CAKE_IMAGE(0,"{images[0]}")CAKE_IMAGE(1,"{images[1]}")', "-x", "c++",
         "/src/lib_binding.cu", "-o", "/out/lib.so"]]
    assert tc.gencode(arch) in steps[0]
    assert "-DX=1" not in steps[-1]  # a program's flags are its device code's


def test_library_steps_of_a_triton_program_run_the_pinned_triton():
    steps = tc.library_steps(
        tc.Tools(nvcc=None, cxx="/usr/bin/c++", python="/py/bin/python", ptxas="/cuda/ptxas"),
        kind="triton", library="lib", digest=DIGEST, arch="sm_100a", include_dir="/inc",
        flags=["triton==3.9.0"], sources=[tc.Source("kernel_scale", "/src/lib_kernel_scale.py"),
                                          tc.Source("binding", "/src/lib_binding.cu")],
        work_dir="/work", output="/out/lib.so")
    assert steps[0][:2] == ["/py/bin/python", str(Path(tc.__file__).with_name("triton_aot.py"))]
    assert steps[0][2:] == ["--source", "/src/lib_kernel_scale.py", "--include-dir", "/inc",
                            "--arch", "sm_100a", "--role", "kernel_scale", "--cubin",
                            "/work/lib_sm_100a.kernel_scale.cubin", "--header",
                            "/work/lib_sm_100a.kernel_scale.h", "--flag=triton==3.9.0",
                            "--ptxas", "/cuda/ptxas"]
    assert steps[1][0] == "/usr/bin/c++" and steps[1][-2:] == ["-o", "/out/lib.so"]
    assert "-include" in steps[1] and "/work/lib_sm_100a.kernel_scale.h" in steps[1]
    assert '-DCAKE_IMAGES=CAKE_IMAGE(0,"/work/lib_sm_100a.kernel_scale.cubin")' in steps[1]


def test_library_steps_of_a_triton_program_compress_the_cubin_with_the_toolkits_fatbinary():
    steps = tc.library_steps(
        tc.Tools(nvcc=None, cxx="/usr/bin/c++", python="/py/bin/python", ptxas="/cuda/ptxas",
                 fatbinary="/cuda/fatbinary"),
        kind="triton", library="lib", digest=DIGEST, arch="sm_100a", include_dir="/inc",
        flags=["triton==3.9.0"], sources=[tc.Source("kernel_scale", "/src/lib_kernel_scale.py"),
                                          tc.Source("binding", "/src/lib_binding.cu")],
        work_dir="/work", output="/out/lib.so")
    assert "/work/lib_sm_100a.kernel_scale.cubin" in steps[0]
    assert steps[1] == ["/cuda/fatbinary", "--create=/work/lib_sm_100a.kernel_scale.fatbin",
                        "--image3=kind=elf,sm=100a,file=/work/lib_sm_100a.kernel_scale.cubin",
                        "-compress-all", "--compress-mode=size"]
    assert steps[2][0] == "/usr/bin/c++" and "/work/lib_sm_100a.kernel_scale.h" in steps[2]
    assert '-DCAKE_IMAGES=CAKE_IMAGE(0,"/work/lib_sm_100a.kernel_scale.fatbin")' in steps[2]


@pytest.mark.parametrize("roles,message", [
    (("binding",), "one binding and at least one kernel"),
    (("kernel",), "one binding and at least one kernel"),
    (("kernel", "binding", "binding"), "one binding and at least one kernel"),
])
def test_library_steps_refuse_a_program_without_binding_or_kernel(roles, message):
    with pytest.raises(ValueError, match=message):
        tc.library_steps(TOOLS, kind="cuda", library="lib", digest=DIGEST, arch="sm_90a",
                         include_dir="/inc", flags=[], sources=_sources(*roles),
                         work_dir="/work", output="/out/lib.so")


def test_library_steps_of_a_cuda_program_need_nvcc():
    with pytest.raises(ValueError, match="lib: a CUDA program needs nvcc"):
        tc.library_steps(tc.Tools(nvcc=None, cxx="c++"), kind="cuda", library="lib",
                         digest=DIGEST, arch="sm_90a", include_dir="/inc", flags=[],
                         sources=_sources("kernel", "binding"), work_dir="/w", output="/o.so")


@pytest.mark.parametrize("work_dir", ['/a"b', "/a\\b", "/a\nb", "/a(b", "/a)b", "/a,b"])
def test_library_steps_refuse_an_image_path_that_cannot_be_a_define(work_dir):
    with pytest.raises(ValueError, match="CAKE_IMAGES: a build path cannot hold"):
        tc.library_steps(TOOLS, kind="cuda", library="lib", digest=DIGEST, arch="sm_90a",
                         include_dir="/inc", flags=[], sources=_sources("kernel", "binding"),
                         work_dir=work_dir, output="/o.so")


def test_supported_arches_come_from_nvcc_list_gpu_code(tmp_path):
    nvcc = str(fake_nvcc(tmp_path))
    assert tc.nvcc_supported_arches(nvcc) == ["sm_90a", "sm_100a", "sm_103a"]
    assert tc.nvcc_supported_arches(nvcc, mf.KNOWN_ARCHES) == [
        "sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a"]


@pytest.mark.parametrize("bad", ["sm_90", "90a", "compute_90a", "sm_90a;sm_100a", ""])
def test_gencode_refuses_what_is_not_an_a_arch(bad):
    with pytest.raises(ValueError, match="sm_90a"):
        tc.gencode(bad)


def test_digest_define_is_one_argv_item():
    assert tc.digest_define("0123abcdef") == '-DCAKE_PROGRAM_DIGEST="0123abcdef"'
    with pytest.raises(ValueError, match=r"^digest must be lowercase hex, got 'x\" -DEVIL'$"):
        tc.digest_define('x" -DEVIL')


@pytest.mark.parametrize("printed,version", [
    ("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n",
     "13.0.88"),
    ("c++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022\n", "12.2.0"),
    ("clang version 18.1.8\nTarget: x86_64-pc-linux-gnu\n", "18.1.8"),
])
def test_tool_version_reads_what_the_compiler_prints(tmp_path, printed, version):
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{printed}EOF\n")
    tool.chmod(0o755)
    assert tc.tool_version(str(tool)) == version


def test_find_cxx_takes_cxx_first(monkeypatch, tmp_path):
    compiler = tmp_path / "my-c++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    assert tc.find_cxx() == str(compiler)
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert tc.find_cxx() is None


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


def test_plan_names_digest_sources_include_output_and_install_folder(toy, tmp_path):
    program = mf.read(toy.manifest_path).programs[0]
    _, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    call = call_of(text, program.library)
    output = tmp_path / "build" / "lib" / TOY_FAMILY / f"{program.library}_sm_90a.so"
    assert f'DIGEST {program.digest} PACKAGE {TOY_FAMILY} OUTPUT "{output}"' in call
    sources = call[call.index("SOURCES "):call.index("\n", call.index("SOURCES "))]
    assert unquote(sources) == [str(toy.source_path(s)) for s in program.sources]
    headers = call[call.index("HEADERS "):call.index("\n", call.index("HEADERS "))]
    assert unquote(headers) == [str(toy.header_path(h)) for h in program.headers]
    assert f'"-I{toy.include_dir}"' in call
    steps = steps_of(call)
    assert len(steps) == 2  # the kernel's fatbin, then the host library
    assert steps[0][-2:] == ["-o", str(tmp_path / "build" / "images" /
                                       f"{program.library}_sm_90a.kernel.fatbin")]
    assert steps[-1][-2:] == ["-o", f"{output}.tmp"]  # renamed once complete (CMakeLists.txt)
    assert f'cake_add_package({TOY_FAMILY} INSTALL_DIR "cake/{TOY_FAMILY}"' in text
    # Every manifest, source and header is a configure dependency: an edit re-plans.
    inputs = text[text.index("set(CAKE_PLAN_INPUTS"):].split(")")[0]
    for path in [toy.manifest_path, toy.header_path("cake/program.h"),
                 *(toy.source_path(s) for s in program.sources)]:
        assert f'"{path}"' in inputs


def test_plan_records_each_packages_libraries(toy, tmp_path):
    """One cake_add_record per package: after its libraries, the command that writes their
    sha256 into lib/libraries.json (toolchain.record_step), for every library planned."""
    programs = mf.read(toy.manifest_path).programs
    _, text = plan(tmp_path, "--archs", "sm_90a;sm_100a", "--repository", str(tmp_path / "repo"))
    lib = tmp_path / "build" / "lib" / TOY_FAMILY
    outputs = [str(lib / f"{p.library}_{arch}.so") for p in programs for arch in ("sm_90a",
                                                                                   "sm_100a")]
    assert text.count("cake_add_record(") == 1
    start = text.index(f"cake_add_record({TOY_FAMILY} ")
    call = text[start:text.index(")\n", start)]
    assert f'OUTPUT "{lib / "libraries.json"}"' in call
    libraries = call[call.index("LIBRARIES "):call.index("\n", call.index("LIBRARIES "))]
    assert sorted(unquote(libraries)) == sorted(outputs)
    command = unquote(call[call.index("COMMAND "):])
    assert command == tc.record_step(sys.executable, str(lib), unquote(libraries))
    assert start > max(text.index(f"cake_add_program({p.library} ") for p in programs)
    _, none = plan(tmp_path, "--archs", "none", "--repository", str(tmp_path / "repo"))
    assert "cake_add_record(" not in none  # nothing built, nothing to record


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
    for source in toy.csrc_dir.iterdir():
        (package / "csrc").mkdir(exist_ok=True)
        (package / "csrc" / source.name).write_bytes(source.read_bytes())
    for header in mf.read(toy.manifest_path).headers:
        target = package / "csrc" / "include" / header.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(toy.header_path(header.path).read_bytes())
    result, text = plan(tmp_path, "--archs", "sm_90a", "--package", str(package))
    assert result.returncode == 0, result.stderr
    assert f'OUTPUT_DIR "{package.resolve() / "lib"}"' in text
    programs = mf.read(toy.manifest_path).programs
    assert len(calls(text)) == len(programs)
    for program in programs:
        output = package.resolve() / "lib" / f"{program.library}_sm_90a.so"
        assert f'OUTPUT "{output}"' in call_of(text, program.library)


def test_checker_findings_stop_the_plan_with_the_checkers_lines(toy, tmp_path):
    program = mf.read(toy.manifest_path).programs[0]
    source = toy.source_path(program.sources[0])
    source.write_bytes(source.read_bytes() + b"// edited by hand\n")
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 1
    assert text == ""
    assert "fail check_manifests" in result.stderr
    assert f"{toy.manifest_path}:programs[0].sources[0].sha256: CM304" in result.stderr


def test_the_plan_runs_the_jits_steps(toy, tmp_path, monkeypatch):
    """A prebuilt library is built by exactly the commands the runtime JIT would run
    (toolchain.library_steps), with the plan's nvcc and the host compiler both find."""
    from cake.core import jit

    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))  # the JIT finds the plan's nvcc
    assert jit.find_nvcc() == str(tmp_path / "cuda" / "bin" / "nvcc")
    for program in mf.read(toy.manifest_path).programs:
        output = tmp_path / "build" / "lib" / TOY_FAMILY / f"{program.library}_sm_90a.so.tmp"
        expected = jit.build_steps(toy, program, "sm_90a", tmp_path / "build" / "images", output)
        assert steps_of(call_of(text, program.library)) == [[str(a) for a in s] for s in expected]


def test_a_program_needing_more_steps_than_cmake_takes_is_refused(toy, tmp_path):
    """cake_add_program takes STEP1 .. STEP32: at most 31 kernel sources and the binding."""
    sys.path.insert(0, str(REPO))
    try:
        from tools import build_plan
    finally:
        sys.path.remove(str(REPO))
    manifest = mf.read(toy.manifest_path)
    program = manifest.programs[0]
    kernels = tuple(mf.Source(f"kernel_k{i}", f"k{i}.cu", "0" * 64) for i in range(32))
    wide = mf.Manifest(manifest.schema_version, manifest.package, manifest.library_prefix,
                       manifest.headers,
                       (mf.Program(**{**program.__dict__,
                                      "sources": kernels + (program.source("binding"),)}),))
    family = build_plan.Family(TOY_FAMILY, toy, wide, install_dir=f"cake/{TOY_FAMILY}",
                               output_dir=None)
    tools = tc.Tools(nvcc="nvcc", cxx="c++")
    with pytest.raises(build_plan.PlanError, match=r"33 build steps, at most 32"):
        build_plan.plan_text([family], ["sm_90a"], "repository", tools, tmp_path / "build")
    most = mf.Manifest(**{**wide.__dict__, "programs": (mf.Program(**{
        **program.__dict__, "sources": kernels[:31] + (program.source("binding"),)}),)})
    text = build_plan.plan_text([build_plan.Family(TOY_FAMILY, toy, most, f"cake/{TOY_FAMILY}",
                                                   None)], ["sm_90a"], "repository", tools,
                                tmp_path / "build")
    assert "STEP32 " in text and "STEP33" not in text
    cmake_lists = (REPO / "CMakeLists.txt").read_text()
    assert f"set(CAKE_MAX_STEPS {build_plan.MAX_STEPS})" in cmake_lists


def test_a_plan_for_an_arch_needs_a_host_compiler(toy, tmp_path):
    import os

    env = dict(os.environ, CXX=str(tmp_path / "no-such-c++"))
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"),
                        env=env)
    assert result.returncode == 1 and text == ""
    assert "no host C++ compiler ($CXX, c++ or g++)" in result.stderr
    result, text = plan(tmp_path, "--archs", "none", "--repository", str(tmp_path / "repo"),
                        env=env, nvcc=False)
    assert result.returncode == 0, result.stderr  # nothing to compile, no compiler needed
    result, text = plan(tmp_path, "--archs", "sm_90a", "--repository", str(tmp_path / "repo"),
                        build_dir=False)
    assert result.returncode != 0 and "build folder" in result.stderr


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
