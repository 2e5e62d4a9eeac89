"""The runtime loader and the JIT cache, on the CPU with the real nvcc (SPEC section 5).

Devices are simulated (a compute capability), programs are real: the toy family compiled by
nvcc for sm_90a, and for arch selection the repository's own manifests too.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toy_programs import REPO, make_toy_package

from cake.core import jit, loader
from cake.core import manifest as mf

pytestmark = pytest.mark.nvcc
H200 = loader.Device(0, "Simulated H200", (9, 0))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Fresh cache, JIT allowed, per-process caches emptied, a simulated H200 as device 0."""
    if jit.find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CAKE_JIT", raising=False)
    monkeypatch.setattr(loader.ProgramSet, "_instances", {})
    monkeypatch.setattr(loader, "device", lambda index: H200)


@pytest.fixture
def package(tmp_path) -> Path:
    return make_toy_package(tmp_path)


def programs_of(package: Path) -> loader.ProgramSet:
    return loader.ProgramSet.for_package(package)


def test_abi_version_matches_the_header():
    header = (REPO / "csrc/include/cake/program.h").read_text()
    assert int(re.search(r"#define CAKE_ABI_VERSION (\d+)", header).group(1)) == loader.ABI_VERSION


@pytest.mark.parametrize("capability,arch", sorted(mf.ARCH_BY_CAPABILITY.items()))
def test_every_capability_of_the_table_selects_its_arch(capability, arch):
    assert loader.select_arch(capability, mf.KNOWN_ARCHES) == arch
    others = tuple(a for a in mf.KNOWN_ARCHES if a != arch)
    assert loader.select_arch(capability, others) is None  # "a" builds run on their exact arch


def real_manifests() -> list[Path]:
    return sorted(p for p in (REPO / "manifests").glob("cake_*.json"))


@pytest.mark.parametrize("capability", [*mf.ARCH_BY_CAPABILITY, (8, 0), (9, 1)],
                         ids=lambda c: f"cc{c[0]}{c[1]}")
def test_arch_selection_on_real_manifests(capability, monkeypatch):
    """Every program of every shipped manifest, on every capability, with the JIT off."""
    monkeypatch.setenv("CAKE_JIT", "0")
    simulated = loader.Device(0, "Simulated GPU", capability)
    monkeypatch.setattr(loader, "device", lambda index: simulated)
    manifests = real_manifests()
    assert manifests, "no family manifest in manifests/"
    for path in manifests:
        programs = programs_of(REPO / "cake" / path.stem)
        for program in programs.manifest.programs:
            with pytest.raises(loader.ProgramUnavailable) as caught:
                programs.library(program, 0)
            message = str(caught.value)
            assert "Simulated GPU" in message and f"{capability[0]}.{capability[1]}" in message
            assert "Remedy" in message
            if simulated.arch in program.arches:
                assert "CAKE_JIT=0" in message and simulated.arch in message
            else:
                assert ", ".join(program.arches) in message


def test_jit_compiles_into_an_empty_cache_once(package, capfd):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, "sm_90a") == "would compile"
    library = programs.library(program, 0)
    assert library.origin == "compiled"
    assert capfd.readouterr().err.count("cake: compiling") == 1
    assert programs.state(program, "sm_90a") == "cached"
    assert programs.library(program, 0) is library  # cached per process

    fresh = loader.ProgramSet(package)  # another "process": found in the cache, no compile
    assert fresh.library(program, 0).origin == "cached"
    assert "cake: compiling" not in capfd.readouterr().err


def test_entry_reports_the_programs_error_message(package):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    scale = programs.library(program, 0).entry("scale")
    with pytest.raises(RuntimeError, match=rf"{program.library}_scale: scale: expected 2 "
                                           "arguments, got 3"):
        scale([0, 1, 2], 0)
    with pytest.raises(RuntimeError, match="n must be >= 0, got -5"):
        scale([0, -5], 0)
    with pytest.raises(ValueError, match=rf"^{program.library}_scale: 65 arguments, more than 64"):
        scale([0] * 65, 0)


def test_entries_keep_arguments_and_messages_per_thread(package):
    """ctypes releases the GIL during a call: threads calling at once must each see their own
    arguments and message (each thread has its own argument array and message buffer)."""
    programs = programs_of(package)
    scale = programs.library(programs.manifest.programs[0], 0).entry("scale")

    def calls(n: int) -> set[str]:
        seen = set()
        for _ in range(2000):
            try:
                scale([0, -n], 0)
            except RuntimeError as error:
                seen.add(str(error).rsplit(" ", 1)[-1])
        return seen

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(calls, range(1, 9)))
    assert results == [{f"-{n}"} for n in range(1, 9)]


def test_a_prebuilt_library_is_preferred_and_verified(package):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    built, _ = jit.compile_program(programs.tree, programs.manifest, program, "sm_90a")
    prebuilt = programs.prebuilt_path(program, "sm_90a")
    prebuilt.parent.mkdir()
    shutil.copyfile(built, prebuilt)
    assert programs.state(program, "sm_90a") == "prebuilt"
    assert programs.library(program, 0).origin == "prebuilt"


def test_a_library_of_another_program_is_refused(package):
    programs = programs_of(package)
    first, second = programs.manifest.programs
    built, _ = jit.compile_program(programs.tree, programs.manifest, first, "sm_90a")
    impostor = programs.prebuilt_path(second, "sm_90a")
    impostor.parent.mkdir()
    shutil.copyfile(built, impostor)
    with pytest.raises(loader.LibraryRefused, match=re.escape(str(impostor))):
        programs.library(second, 0)


def test_a_library_embedding_a_wrong_digest_is_refused(package):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    prebuilt = programs.prebuilt_path(program, "sm_90a")
    prebuilt.parent.mkdir()
    command = jit.compile_command(jit.find_nvcc(), programs.tree, program, "sm_90a", prebuilt)
    wrong = "0" * mf.DIGEST_LENGTH
    command = [f'-DCAKE_PROGRAM_DIGEST="{wrong}"' if c.startswith("-DCAKE_PROGRAM_DIGEST")
               else c for c in command]
    subprocess.run(command, check=True)
    with pytest.raises(loader.LibraryRefused, match=f"embeds digest '{wrong}'"):
        programs.library(program, 0)
    assert (program.library, "sm_90a") not in programs._libraries  # never used


def test_jit_disabled_gives_the_unsupported_error(package, monkeypatch):
    monkeypatch.setenv("CAKE_JIT", "0")
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, "sm_90a") == "unsupported"
    with pytest.raises(loader.ProgramUnavailable, match="CAKE_JIT=0 forbids compiling") as caught:
        programs.library(program, 0)
    assert "Simulated H200" in str(caught.value) and "sm_90a" in str(caught.value)


def test_no_nvcc_gives_the_unsupported_error(package, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    programs = programs_of(package)
    with pytest.raises(loader.ProgramUnavailable, match="no nvcc was found"):
        programs.library(programs.manifest.programs[0], 0)


def test_an_arch_the_program_lacks_is_unsupported(package, monkeypatch):
    blackwell_ultra = loader.Device(0, "Simulated B300", (10, 3))
    monkeypatch.setattr(loader, "device", lambda index: blackwell_ultra)
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    with pytest.raises(loader.ProgramUnavailable,
                       match=r"compute capability 10\.3.*sm_103a.*sm_90a, sm_100a.*Remedy"):
        programs.library(program, 0)


def test_tampered_sources_are_not_compiled(package):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    source = programs.tree.source_path(program.sources[0])
    source.write_bytes(source.read_bytes().replace(b"2.0f", b"3.0f"))
    with pytest.raises(RuntimeError, match="refused to compile"):
        programs.library(program, 0)


LOAD_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from cake.core import loader
    loader.device = lambda index: loader.Device(index, "Simulated H200", (9, 0))
    programs = loader.ProgramSet.for_package(__import__("pathlib").Path({package!r}))
    library = programs.library(programs.manifest.programs[0], 0)
    print(library.origin, library.path)
""")


def load_in_subprocess(package: Path, **popen) -> subprocess.Popen:
    script = LOAD_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), package=str(package))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ), **popen)


def test_four_processes_compile_once_and_all_load(package):
    processes = [load_in_subprocess(package) for _ in range(4)]
    results = [p.communicate(timeout=600) for p in processes]
    assert all(p.returncode == 0 for p in processes), [r[1] for r in results]
    assert sum(err.count("cake: compiling") for _, err in results) == 1
    paths = {out.split()[1] for out, _ in results}
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    assert sorted(out.split()[0] for out, _ in results).count("compiled") == 1


def test_a_killed_compile_leaves_no_usable_entry(package, capfd):
    process = load_in_subprocess(package, start_new_session=True)
    deadline = time.monotonic() + 120
    cache = Path(os.environ["CAKE_CACHE_DIR"])
    while not list(cache.rglob("lock")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # nvcc is running now
    os.killpg(process.pid, signal.SIGKILL)  # the loader and its nvcc child
    process.communicate()
    assert not list(cache.rglob("*.so")), "a killed compile published a library"

    programs = programs_of(package)
    library = programs.library(programs.manifest.programs[0], 0)
    assert library.origin == "compiled"
    assert capfd.readouterr().err.count("cake: compiling") == 1
    assert not list(cache.rglob("*.tmp"))
