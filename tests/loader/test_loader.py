"""The runtime loader, its entries and the JIT cache, on the CPU (docs/loader.md).

Programs are real: the toy family of tests/toy_programs.py, compiled by the JIT with the real
nvcc and host compiler (about a second a program; those tests are marked ``nvcc`` and share the
session's JIT cache, so each toy program compiles once), and the repository's own manifests for
arch selection. Devices are simulated: either ``loader.device`` is replaced by an H200 of
compute capability 9.0, or the fake CUDA driver of tests/fake_cuda.py answers for libcuda.so.1
and records what the libraries ask of it (image loads, kernel lookups, shared-memory limits,
launches) instead of running it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import fake_cuda
from toy_programs import ENTRIES, REPO, compiled_library, make_toy_package

from cake.core import jit, loader
from cake.core import manifest as mf
from cake.core import toolchain, trust

H200 = loader.Device(0, "Simulated H200", (9, 0))
ARCH = "sm_90a"
TESTS = REPO / "tests"
_REAL_DEVICE = loader.device  # through the driver: the fake one in the fake driver's tests
# The toy kernel's parameters as the fake driver records them (toy/scale.h: ToyScaleParams).
_PARAMS = struct.Struct("<Qqfid")


def compiles(test):
    """Marks a test that compiles toy programs (nvcc and the host C++ compiler)."""
    test = pytest.mark.nvcc(test)
    missing = jit.find_nvcc() is None or toolchain.find_cxx() is None
    return pytest.mark.skipif(missing, reason="nvcc or a host C++ compiler is not installed")(test)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Fresh cache, JIT allowed, per-process caches emptied, a simulated H200 as device 0."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CAKE_JIT", raising=False)
    monkeypatch.setattr(loader.ProgramSet, "_instances", {})
    monkeypatch.setattr(loader, "device", lambda index: H200)


@pytest.fixture
def package(tmp_path) -> Path:
    """The toy family as an installed package, without libraries (a fresh copy per test)."""
    return make_toy_package(tmp_path)


@pytest.fixture
def shared_cache(monkeypatch, toy_jit_cache) -> Path:
    """The session's JIT cache as CAKE_CACHE_DIR: toy programs compiled once per session."""
    monkeypatch.setenv("CAKE_CACHE_DIR", str(toy_jit_cache))
    return toy_jit_cache


@pytest.fixture(scope="session")
def toy_build(tmp_path_factory, toy_jit_cache):
    """Both toy programs compiled for sm_90a into the session's JIT cache:
    (manifest, library name -> its file)."""
    package = make_toy_package(tmp_path_factory.mktemp("toy-build"))
    tree = mf.package_tree(package)
    manifest = mf.read(tree.manifest_path)
    paths = {p.library: compiled_library(tree, p, ARCH, toy_jit_cache) for p in manifest.programs}
    return manifest, paths


def load_library(program: mf.Program, path: Path) -> loader.Library:
    """A :class:`loader.Library` of ``path`` as it is (its bytes are what the check expects)."""
    return loader.Library(program, path, "test", trust.sha256_file(path), "a test library")


def by_block(manifest: mf.Manifest) -> list[mf.Program]:
    """The toy programs by TOY_BLOCK (128, then 256): the manifest's order follows the digests."""
    return sorted(manifest.programs, key=lambda program: program.variant["block"])


@pytest.fixture
def fresh(toy_build):
    """``fresh(index)``: a new :class:`loader.Library` of toy program ``index``. Each load is a
    new instance of the library in this process (trust.load loads the checked bytes from an
    in-memory file of its own), so its first-use work (driver, image load, kernel lookups,
    shared-memory limits) has not happened yet."""
    manifest, paths = toy_build

    def make(index: int = 0) -> loader.Library:
        program = by_block(manifest)[index]
        return load_library(program, paths[program.library])
    return make


def install_prebuilt(programs: loader.ProgramSet, files: dict) -> None:
    """Puts ``files`` (prebuilt path -> source file) into the package's lib/ with their build
    record, as the build installs them."""
    for target, source in files.items():
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, target)
    lib = programs.package_dir / "lib"
    trust.write_record(lib, sorted(lib.glob("*.so")))


@pytest.fixture
def fake(monkeypatch):
    """The fake CUDA driver, its record empty; ``loader.device`` asks it (an H200, 9.0)."""
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here; the fake must not be mixed with it")
    driver = fake_cuda.load()
    driver.reset()
    driver.set_kernels(None)
    driver.set_device((9, 0), 132, 1)
    monkeypatch.setattr(loader, "device", _REAL_DEVICE)
    monkeypatch.setattr(loader, "_driver", None)
    monkeypatch.setattr(loader, "_devices", {})
    yield driver
    driver.reset()
    driver.set_device((9, 0), 132, 1)


def programs_of(package: Path) -> loader.ProgramSet:
    return loader.ProgramSet.for_package(package)


def scale_arguments(**overrides) -> dict:
    arguments = dict(x=0x1000, n=1000, factor=2.0, offset=0.5, smem_bytes=0)
    arguments.update(overrides)
    return arguments


def params(launch: fake_cuda.Launch) -> tuple:
    """(x, n, factor, block, offset) of a recorded launch of the toy kernel."""
    return _PARAMS.unpack_from(launch.params)


def set_attribute_calls(driver: fake_cuda.FakeDriver) -> list[tuple[int, int, int]]:
    """(attribute, value, device) of each recorded cuKernelSetAttribute."""
    found = []
    for line in driver.calls("cuKernelSetAttribute"):
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        found.append((int(fields["attribute"]), int(fields["value"]), int(fields["device"])))
    return found


# --------------------------------------------------------------------------- arches


def test_abi_version_matches_the_header():
    header = (REPO / "csrc/include/cake/program.h").read_text()
    assert int(re.search(r"#define CAKE_ABI_VERSION (\d+)", header).group(1)) == \
        loader.ABI_VERSION == 2


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
            with pytest.raises(loader.ProgramUnavailable,
                               match=f"^{re.escape(program.library)} ") as caught:
                programs.library(program, 0)
            message = str(caught.value)
            assert "Simulated GPU" in message and f"{capability[0]}.{capability[1]}" in message
            assert "Remedy" in message
            if simulated.arch in program.arches:
                assert "CAKE_JIT=0" in message and simulated.arch in message
            else:
                assert ", ".join(program.arches) in message


# --------------------------------------------------------------------------- the JIT cache


@compiles
def test_jit_compiles_into_an_empty_cache_once(package, capfd):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, ARCH) == "would compile"
    library = programs.library(program, 0)
    assert library.origin == "compiled"
    err = capfd.readouterr().err
    assert err.count("cake: compiling") == 1
    assert f"cake: compiling {program.library} (cuda) for {ARCH} (one-time" in err
    assert programs.state(program, ARCH) == "cached"
    assert programs.library(program, 0) is library  # cached per process

    fresh_set = loader.ProgramSet(package)  # another "process": found in the cache, no compile
    assert fresh_set.library(program, 0).origin == "cached"
    assert "cake: compiling" not in capfd.readouterr().err


@compiles
def test_the_cache_is_keyed_by_arch_toolchain_and_digest(toy_build, toy_jit_cache):
    """<cache>/<arch>/nvcc-<version>-<machine>-c++-<version>-<flags hash>/<digest>/
    <library>_<arch>.so with its sha256 beside it, one entry per program, and nothing else left
    in an entry but its lock."""
    manifest, paths = toy_build
    for program in manifest.programs:
        path = paths[program.library]
        relative = path.relative_to(toy_jit_cache)
        assert relative.parts[0] == ARCH and relative.parts[2] == program.digest
        assert re.fullmatch(rf"nvcc-\d+\.\d+\.\d+-{platform.machine()}-c\+\+-\d+\.\d+\.\d+-"
                            r"[0-9a-f]{8}", relative.parts[1])
        assert relative.parts[1].endswith(f"-{toolchain.flags_hash()}")
        assert relative.parts[3] == f"{program.library}_{ARCH}.so"
        record = path.with_name(path.name + ".sha256")
        assert sorted(p.name for p in path.parent.iterdir()) == \
            sorted([path.name, record.name, "lock"])
        assert record.read_text().strip() == trust.sha256_file(path)
    assert len({p.parent for p in paths.values()}) == 2


@compiles
def test_a_prebuilt_library_is_preferred_and_verified(package, toy_build):
    _, paths = toy_build
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    prebuilt = programs.prebuilt_path(program, ARCH)
    install_prebuilt(programs, {prebuilt: paths[program.library]})
    assert programs.state(program, ARCH) == "prebuilt"
    library = programs.library(program, 0)
    assert library.origin == "prebuilt" and library.path == prebuilt


@compiles
@pytest.mark.parametrize("record", ["missing", "other bytes"])
def test_a_prebuilt_library_the_build_record_does_not_vouch_for_is_refused(package, toy_build,
                                                                            record):
    _, paths = toy_build
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    prebuilt = programs.prebuilt_path(program, ARCH)
    install_prebuilt(programs, {prebuilt: paths[program.library]})
    if record == "missing":
        (prebuilt.parent / trust.RECORD_NAME).unlink()
        message = "build record (libraries.json) does not list it; reinstall"
    else:
        prebuilt.write_bytes(prebuilt.read_bytes() + b"\0")
        message = "refused before loading: its sha256 is"
    with pytest.raises(loader.LibraryRefused, match=re.escape(message)) as caught:
        programs.library(program, 0)
    assert str(prebuilt) in str(caught.value)


@compiles
def test_a_library_of_another_program_is_refused(package, toy_build):
    _, paths = toy_build
    programs = programs_of(package)
    first, second = programs.manifest.programs
    impostor = programs.prebuilt_path(second, ARCH)
    install_prebuilt(programs, {impostor: paths[first.library]})  # recorded as it is
    with pytest.raises(loader.LibraryRefused, match=re.escape(str(impostor))) as caught:
        programs.library(second, 0)
    assert f"does not export {second.library}_digest" in str(caught.value)


@compiles
def test_a_library_embedding_a_wrong_digest_is_refused(package, tmp_path):
    """Built by the JIT's own steps with another CAKE_PROGRAM_DIGEST."""
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    prebuilt = programs.prebuilt_path(program, ARCH)
    prebuilt.parent.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    wrong = "0" * mf.DIGEST_LENGTH
    steps = jit.build_steps(programs.tree, program, ARCH, work, prebuilt)
    assert sum(a == toolchain.digest_define(program.digest) for s in steps for a in s) == \
        len(steps)  # every step is told the digest
    for step in steps:
        subprocess.run([toolchain.digest_define(wrong) if a.startswith("-DCAKE_PROGRAM_DIGEST")
                        else a for a in step], check=True)
    trust.write_record(prebuilt.parent, [prebuilt])  # its bytes vouched for: only the digest
    with pytest.raises(loader.LibraryRefused, match=f"embeds digest '{wrong}'"):
        programs.library(program, 0)
    assert (program.library, ARCH) not in programs._libraries  # never used


def test_a_library_of_another_abi_version_is_refused(package, tmp_path):
    """A library with the right digest but ABI version 1 (the contract before this one)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    source = tmp_path / "old.c"
    source.write_text(f'const char* {program.library}_digest(void) {{ return "{program.digest}"; }}\n'
                      f"int {program.library}_abi_version(void) {{ return 1; }}\n")
    prebuilt = programs.prebuilt_path(program, ARCH)
    prebuilt.parent.mkdir()
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(prebuilt)], check=True)
    trust.write_record(prebuilt.parent, [prebuilt])
    with pytest.raises(loader.LibraryRefused, match="ABI version 1, this cake-train needs 2"):
        programs.library(program, 0)


def test_jit_disabled_gives_the_unsupported_error(package, monkeypatch):
    monkeypatch.setenv("CAKE_JIT", "0")
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, ARCH) == "unsupported"
    with pytest.raises(loader.ProgramUnavailable, match="CAKE_JIT=0 forbids compiling") as caught:
        programs.library(program, 0)
    assert "Simulated H200" in str(caught.value) and ARCH in str(caught.value)


def test_no_nvcc_gives_the_unsupported_error(package, monkeypatch, tmp_path):
    cxx = toolchain.find_cxx()
    if cxx is None:
        pytest.skip("no host C++ compiler (its absence is reported first)")
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, ARCH) == "unsupported"
    with pytest.raises(loader.ProgramUnavailable, match="no nvcc was found") as caught:
        programs.library(program, 0)
    assert "nvcc on PATH or in $CUDA_HOME/bin" in str(caught.value)


def test_no_host_compiler_gives_the_unsupported_error(package, monkeypatch, tmp_path):
    """The host library needs the host C++ compiler, even with nvcc present."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    assert programs.state(program, ARCH) == "unsupported"
    with pytest.raises(loader.ProgramUnavailable,
                       match=r"no host C\+\+ compiler \(\$CXX, c\+\+ or g\+\+\)") as caught:
        programs.library(program, 0)
    assert "a host C++ compiler" in str(caught.value) and "Remedy" in str(caught.value)


def test_an_arch_the_program_lacks_is_unsupported(package, monkeypatch):
    blackwell_ultra = loader.Device(0, "Simulated B300", (10, 3))
    monkeypatch.setattr(loader, "device", lambda index: blackwell_ultra)
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    with pytest.raises(loader.ProgramUnavailable,
                       match=r"compute capability 10\.3.*sm_103a.*sm_90a, sm_100a.*Remedy"):
        programs.library(program, 0)


@pytest.mark.parametrize("what", ["kernel", "binding", "header"])
def test_tampered_sources_are_not_compiled(package, what):
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    if what == "header":
        path = programs.tree.header_path("toy/scale.h")
    else:
        path = programs.tree.source_path(program.source(what))
    path.write_bytes(path.read_bytes() + b"// tampered\n")
    with pytest.raises(RuntimeError, match="refused to compile") as caught:
        programs.library(program, 0)
    assert str(path) in str(caught.value)
    assert not list(Path(os.environ["CAKE_CACHE_DIR"]).rglob("*.so"))


LOAD_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from cake.core import loader
    loader.device = lambda index: loader.Device(index, "Simulated H200", (9, 0))
    programs = loader.ProgramSet.for_package(__import__("pathlib").Path({package!r}))
    library = programs.library(programs.manifest.programs[0], 0)
    print(library.origin, library.path)
""")


def load_in_subprocess(package: Path, env: dict | None = None, **popen) -> subprocess.Popen:
    script = LOAD_SCRIPT.format(repo=str(REPO), tests=str(TESTS), package=str(package))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or dict(os.environ),
                            **popen)


@compiles
def test_four_processes_compile_once_and_all_load(package):
    processes = [load_in_subprocess(package) for _ in range(4)]
    results = [p.communicate(timeout=600) for p in processes]
    assert all(p.returncode == 0 for p in processes), [r[1] for r in results]
    assert sum(err.count("cake: compiling") for _, err in results) == 1
    paths = {out.split()[1] for out, _ in results}
    assert len(paths) == 1 and Path(paths.pop()).is_file()
    assert sorted(out.split()[0] for out, _ in results).count("compiled") == 1


def stalling_cxx(folder: Path, written: Path) -> Path:
    """A host C++ compiler that runs the real one and, once it has written a ``.so`` (the
    library's last build step), touches ``written`` and waits a minute before it exits: the
    moment the compile's output has appeared, and before the loader can publish it."""
    real = toolchain.find_cxx()
    cxx = folder / "c++"
    cxx.parent.mkdir(parents=True)
    cxx.write_text(f'#!/bin/sh\n"{real}" "$@" || exit $?\nout=; previous=\n'
                   f'for argument in "$@"; do\n'
                   f'  [ "$previous" = -o ] && out=$argument; previous=$argument\ndone\n'
                   f'case "$out" in *.so) touch "{written}"; sleep 60;; esac\n')
    cxx.chmod(0o755)
    return cxx


@compiles
def test_a_killed_compile_leaves_no_usable_entry(package, tmp_path, capfd):
    """Killed the moment its library file is complete: nothing is published (the build writes
    into a temporary folder and the library is renamed into the entry only after), and the
    next use compiles again."""
    written = tmp_path / "library-written"
    env = dict(os.environ, CXX=str(stalling_cxx(tmp_path / "cxx", written)))
    process = load_in_subprocess(package, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not written.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written.exists(), process.communicate()
    os.killpg(process.pid, signal.SIGKILL)  # the loader and its compiler child
    process.communicate()
    cache = Path(os.environ["CAKE_CACHE_DIR"])
    published = [p for p in cache.rglob("*") if p.is_file() and p.name != "lock"
                 and not any(part.endswith(".tmp") for part in p.relative_to(cache).parts)]
    assert not published, f"a killed compile left files in the cache entry: {published}"
    built = [p for p in cache.rglob("*.so") if p.parent.name.endswith(".tmp")]
    assert built, "the kill came before the compile's output appeared"

    programs = programs_of(package)  # the real nvcc, same version: the same cache entry
    library = programs.library(programs.manifest.programs[0], 0)
    assert library.origin == "compiled"
    assert capfd.readouterr().err.count("cake: compiling") == 1
    assert not list(cache.rglob("*.tmp"))


# --------------------------------------------------------------------------- the library file


@compiles
def test_a_library_needs_libc_alone_and_no_cuda_symbol(toy_build):
    """No CUDA runtime (static or shared), no driver link, no libstdc++: NEEDED is libc, and
    no undefined dynamic symbol is a CUDA runtime (cuda*, __cuda*) or driver (cu*) function."""
    for tool in ("readelf", "nm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    manifest, paths = toy_build
    for program in manifest.programs:
        path = str(paths[program.library])
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                                 check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
        assert needed == ["libc.so.6"], needed
        assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
        undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True,
                                   text=True, check=True).stdout.split()
        names = [word.split("@")[0] for word in undefined if word != "U" and word != "w"]
        assert names, "nm printed no undefined symbol (libc's are expected)"
        cuda = [n for n in names if "cuda" in n.lower() or n.startswith("cu")]
        assert not cuda, cuda
        assert not [n for n in names if n.startswith("_Z")], names  # no C++ runtime symbol
        defined = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                                 text=True, check=True).stdout.split("\n")
        exported = {line.split()[-1] for line in defined if line.strip()}
        assert exported == {f"{program.library}_{name}" for name in
                            ("digest", "abi_version", *ENTRIES)}


NO_DRIVER_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    import fake_cuda
    if fake_cuda.real_driver_present():
        print("real driver")
        raise SystemExit(0)
    from pathlib import Path
    from cake.core import loader, manifest as mf, trust
    program = next(p for p in mf.read(Path({manifest!r})).programs if p.library == {library!r})
    path = Path({path!r})
    library = loader.Library(program, path, "test", trust.sha256_file(path), "test")
    out = ctypes.c_int64(-1)
    library.entry("blocks")(0, n=1000, out=ctypes.addressof(out))
    print("blocks", out.value)
    try:
        library.entry("scale")(0, x=0, n=1000, factor=1.0, offset=0.0, smem_bytes=0)
    except RuntimeError as error:
        print("scale", error)
""")


@compiles
def test_without_a_driver_a_library_loads_and_says_what_is_missing(toy_build, tmp_path):
    """Loading and verifying a library, and an entry that launches nothing, need no driver;
    the first launch names the missing libcuda.so.1 (a fresh process, no fake driver)."""
    manifest, paths = toy_build
    program = by_block(manifest)[0]  # TOY_BLOCK 128: 8 blocks for n = 1000
    manifest_path = tmp_path / "build.json"
    manifest_path.write_text(mf.to_json(manifest))
    script = NO_DRIVER_SCRIPT.format(repo=str(REPO), tests=str(TESTS),
                                     manifest=str(manifest_path), library=program.library,
                                     path=str(paths[program.library]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "real driver":
        pytest.skip("a real CUDA driver is installed here")
    lines = result.stdout.splitlines()
    assert lines[0] == "blocks 8"
    assert lines[1].startswith(f"scale {program.library}_scale: cannot open the NVIDIA driver "
                               "(libcuda.so.1): "), lines


# --------------------------------------------------------------------------- entries


@compiles
def test_entry_reports_the_programs_error_message(package, shared_cache):
    """The binding's checks (cake/program.h and the toy's own) come back as RuntimeErrors named
    after the entry, before anything is launched."""
    programs = programs_of(package)
    program = programs.manifest.programs[0]
    library = programs.library(program, 0)
    assert library.origin == "cached"
    scale, blocks = library.entry("scale"), library.entry("blocks")
    name = f"{program.library}_scale"
    with pytest.raises(RuntimeError, match=rf"^{name}: scale: n must be >= 0, got -5$"):
        scale(0, **scale_arguments(n=-5))
    with pytest.raises(RuntimeError,
                       match=rf"^{name}: scale: argument smem_bytes does not fit i32$"):
        scale(0, **scale_arguments(smem_bytes=2 ** 31))
    with pytest.raises(RuntimeError, match=rf"^{name}: scale takes 5 arguments, got 3$"):
        scale.launch([0, 1, 2], 0)
    with pytest.raises(RuntimeError, match=rf"^{program.library}_blocks: blocks: out is null$"):
        blocks(0, n=5, out=None)


@compiles
def test_entries_keep_arguments_and_messages_per_thread(package, shared_cache):
    """ctypes releases the GIL during a call: threads calling at once must each see their own
    arguments and message (each thread has its own argument array and message buffer)."""
    programs = programs_of(package)
    scale = programs.library(programs.manifest.programs[0], 0).entry("scale")

    def calls(n: int) -> set[str]:
        seen = set()
        for _ in range(2000):
            try:
                scale(0, **scale_arguments(n=-n))
            except RuntimeError as error:
                seen.add(str(error).rsplit(" ", 1)[-1])
        return seen

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(calls, range(1, 9)))
    assert results == [{f"-{n}"} for n in range(1, 9)]


@compiles
def test_an_entry_that_launches_nothing_returns_through_a_host_pointer(package, shared_cache):
    """blocks: an i64 in, an int64 written at a host address; each program its own TOY_BLOCK."""
    programs = programs_of(package)
    for program in programs.manifest.programs:
        block = program.variant["block"]
        blocks = programs.library(program, 0).entry("blocks")
        for n in (0, 1, block, block + 1, 2 ** 40 + 3):
            out = ctypes.c_int64(-1)
            blocks(0, n=n, out=ctypes.addressof(out))
            assert out.value == -(-n // block)


@compiles
def test_entry_refuses_missing_and_extra_argument_names(fresh, fake):
    library = fresh(0)
    scale = library.entry("scale")
    assert scale.names == ("x", "n", "factor", "offset", "smem_bytes")
    arguments = scale_arguments()
    del arguments["smem_bytes"]
    with pytest.raises(TypeError, match=r"missing arguments \['smem_bytes'\], unknown \[\]"):
        scale(0, **arguments)
    with pytest.raises(TypeError, match=r"missing arguments \[\], unknown \['eps'\]"):
        scale(0, **scale_arguments(eps=1e-6))
    with pytest.raises(TypeError, match=r"missing arguments \['x', 'n'\], unknown \['y'\]"):
        scale(0, y=0, factor=1.0, offset=0.0, smem_bytes=0)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 7 were given"):
        scale(0, 0x1000, 1000, 2.0, 0.5, 0)  # only the stream is positional
    assert fake.lines() == []  # refused before the driver was even opened
    with pytest.raises(loader.LibraryRefused, match=r"declares no entry 'forward' \(it declares "
                                                    r"\['scale', 'blocks'\]\)"):
        library.entry("forward")


@compiles
def test_an_entry_the_library_does_not_export_is_refused(toy_build, tmp_path):
    manifest, paths = toy_build
    program = manifest.programs[0]
    declared = dataclasses.replace(program, entries=program.entries + (mf.Entry("extra", ()),))
    library = load_library(declared, paths[program.library])
    with pytest.raises(loader.LibraryRefused, match=f"does not export {program.library}_extra"):
        library.entry("extra")
    many = tuple(mf.Argument(f"a{i}", "i64") for i in range(65))
    with pytest.raises(loader.LibraryRefused, match="declares 65 arguments, more than 64"):
        loader.Entry(library._symbol("scale"), "many", mf.Entry("many", many))


@compiles
def test_entry_packs_each_kind_as_declared(fresh, fake):
    """pointer (an int, None or a tensor's data_ptr), i64, f32 (its fp32 bits), f64 and i32
    arrive in the kernel's parameters as given; the stream is the caller's."""
    scale = fresh(0).entry("scale")
    scale(7, **scale_arguments(x=0x1234560, n=2 ** 35, factor=0.1, offset=-1e-300))
    scale(0, **scale_arguments(x=None, n=1, factor=-3.0, offset=2.5, smem_bytes=100))
    launches = fake.launches()
    assert len(launches) == 2
    first, second = launches
    assert params(first) == (0x1234560, 2 ** 35, struct.unpack("<f", struct.pack("<f", 0.1))[0],
                             128, -1e-300)
    assert first.grid == (2 ** 28, 1, 1) and first.block == (128, 1, 1)
    assert first.smem == 0 and first.stream == 7
    assert params(second) == (0, 1, -3.0, 128, 2.5)
    assert second.grid == (1, 1, 1) and second.smem == 100 and second.stream == 0
    torch = pytest.importorskip("torch")
    x = torch.zeros(300)
    scale(0, **scale_arguments(x=x, n=x.numel()))
    assert params(fake.launches()[-1])[0] == x.data_ptr()
    assert fake.launches()[-1].grid == (3, 1, 1)


@compiles
def test_quiet_fake_counts_launches_without_recording_them(fresh, fake):
    """tools/bench/host_fake_driver.py times calls with the fake quiet: its count must be honest."""
    scale = fresh(0).entry("scale")
    scale(0, **scale_arguments())
    fake.set_quiet()
    for _ in range(3):
        scale(0, **scale_arguments())
    assert fake.launch_count() == 4 and len(fake.launches()) == 1
    fake.fail("cuLaunchKernel", 701)
    with pytest.raises(RuntimeError, match=r"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES \(701\)"):
        scale(0, **scale_arguments())  # a quiet fake still fails on request
    fake.reset()
    assert fake.launch_count() == 0
    scale(0, **scale_arguments())
    assert len(fake.launches()) == 1  # reset ends quiet mode


def in_thread_without_context(fake, function):
    """Runs ``function`` on a new thread that has no current context (as autograd's backward
    thread on device 0, whose cudaSetDevice torch skips); returns its result or raises its error."""
    outcome = {}

    def body():
        fake.drop_context()
        try:
            outcome["value"] = function()
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@compiles
@pytest.mark.parametrize("stream", [0, 0x1, 0x2])
def test_a_thread_without_context_on_a_default_stream_gets_device_0s_primary_context(
        fresh, fake, stream):
    """What the CUDA runtime would do at the thread's first call: retain device 0's primary
    context and make it current, once per thread; the launch then succeeds."""
    scale = fresh(0).entry("scale")

    def twice():
        scale(stream, **scale_arguments(smem_bytes=64 * 1024))
        scale(stream, **scale_arguments())
    in_thread_without_context(fake, twice)
    assert fake.calls("cuDevicePrimaryCtxRetain") == ["cuDevicePrimaryCtxRetain device=0 error=0"]
    assert [line.split()[1] for line in fake.calls("cuCtxSetCurrent")] == ["context=0x100"]
    assert fake.calls("cuStreamGetCtx") == []
    assert len(fake.launches()) == 2 and set_attribute_calls(fake) == [(8, 65536, 0)]


@compiles
def test_a_thread_without_context_on_a_stream_gets_the_streams_context(fresh, fake):
    scale = fresh(0).entry("scale")
    fake.set_current_device(1)  # the fake's streams belong to the current device
    in_thread_without_context(fake, lambda: scale(0x5, **scale_arguments()))
    assert len(fake.calls("cuStreamGetCtx")) == 1 and "stream=0x5 " in fake.calls("cuStreamGetCtx")[0]
    assert [line.split()[1] for line in fake.calls("cuCtxSetCurrent")] == ["context=0x101"]
    assert fake.calls("cuDevicePrimaryCtxRetain") == []
    assert [launch.stream for launch in fake.launches()] == [0x5]


@compiles
def test_a_thread_with_a_context_keeps_it(fresh, fake):
    scale = fresh(0).entry("scale")
    scale(0x5, **scale_arguments())
    scale(0, **scale_arguments())
    assert fake.calls("cuCtxSetCurrent") == fake.calls("cuStreamGetCtx") == []
    assert fake.calls("cuDevicePrimaryCtxRetain") == [] and len(fake.launches()) == 2


@compiles
def test_a_context_the_driver_cannot_make_current_is_the_entrys_error(fresh, fake):
    scale = fresh(0).entry("scale")
    fake.fail("cuDevicePrimaryCtxRetain", 2)
    with pytest.raises(RuntimeError, match=r"kernel_\w+_scale: cuDevicePrimaryCtxRetain failed: "
                                           r"CUDA_ERROR_OUT_OF_MEMORY \(2\)"):
        in_thread_without_context(fake, lambda: scale(0, **scale_arguments()))
    assert fake.launches() == []


@compiles
def test_bind_fixes_the_problem_and_takes_the_rest_per_call(fresh, fake):
    library = fresh(0)
    scale = library.entry("scale")
    bound = scale.bind(("x",), n=1000, factor=2.0, offset=0.5, smem_bytes=0)
    bound(3, 0x2000)
    bound(4, None)
    bound(5, 0x3000)
    assert [params(launch) for launch in fake.launches()] == [
        (0x2000, 1000, 2.0, 128, 0.5), (0, 1000, 2.0, 128, 0.5), (0x3000, 1000, 2.0, 128, 0.5)]
    assert [launch.stream for launch in fake.launches()] == [3, 4, 5]
    # Per-call values of other kinds are converted as declared (i64, f32), in bind's order.
    scale.bind(("factor", "x", "n"), offset=-1.0, smem_bytes=0)(6, 0.1, 0x4000, 300)
    assert params(fake.launches()[-1]) == (
        0x4000, 300, struct.unpack("<f", struct.pack("<f", 0.1))[0], 128, -1.0)
    assert fake.launches()[-1].grid == (3, 1, 1) and fake.launches()[-1].stream == 6
    bound(7, 0x5000)  # the first binding is unchanged by the calls in between
    assert params(fake.launches()[-1]) == (0x5000, 1000, 2.0, 128, 0.5)
    torch = pytest.importorskip("torch")
    x = torch.zeros(1000)
    bound(0, x)
    assert params(fake.launches()[-1])[0] == x.data_ptr()
    # A host-side entry, bound on its output pointer.
    out = ctypes.c_int64(-1)
    library.entry("blocks").bind(("out",), n=1000)(0, ctypes.addressof(out))
    assert out.value == 8
    # A call with a value missing or extra launches nothing.
    count = len(fake.launches())
    for values in ((), (0x2000, 0x3000)):
        with pytest.raises(TypeError, match="_scale: expected 1 per-call values, got"):
            bound(0, *values)
    assert len(fake.launches()) == count


@compiles
def test_bind_refuses_unknown_or_repeated_names_and_incomplete_calls(fresh, fake):
    scale = fresh(0).entry("scale")
    fixed = dict(factor=2.0, offset=0.5, smem_bytes=0)
    with pytest.raises(TypeError, match="must be distinct declared arguments"):
        scale.bind(("y",), n=5, **fixed)
    with pytest.raises(TypeError, match="must be distinct declared arguments"):
        scale.bind(("x", "x"), n=5, **fixed)
    with pytest.raises(TypeError, match=r"missing arguments \['n'\]"):
        scale.bind(("x",), **fixed)
    with pytest.raises(TypeError, match=r"unknown \['eps'\]"):
        scale.bind(("x",), n=5, eps=1.0, **fixed)
    assert fake.lines() == []


# --------------------------------------------------------------------------- the driver


RACE_SCRIPT = textwrap.dedent("""
    import json, sys, threading
    sys.path[:0] = [{repo!r}, {tests!r}]
    import fake_cuda
    if fake_cuda.real_driver_present():
        print(json.dumps("real driver"))
        raise SystemExit(0)
    fake = fake_cuda.load()
    from pathlib import Path
    from cake.core import loader, manifest as mf, trust
    program = next(p for p in mf.read(Path({manifest!r})).programs if p.library == {library!r})
    path = Path({path!r})
    scale = loader.Library(program, path, "test", trust.sha256_file(path), "test").entry("scale")
    barrier = threading.Barrier(8)
    errors = []

    def run(i):
        barrier.wait()
        try:
            scale(i + 1, x=0x1000 * (i + 1), n=1000, factor=1.0, offset=0.0, smem_bytes=65536)
        except Exception as error:
            errors.append(repr(error))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({{"loads": fake.calls("cuLibraryLoadData"),
                       "lookups": fake.calls("cuLibraryGetKernel"),
                       "attributes": fake.calls("cuKernelSetAttribute"),
                       "streams": sorted(launch.stream for launch in fake.launches()),
                       "errors": errors}}))
""")


@compiles
@pytest.mark.parametrize("round_", range(3))
def test_eight_threads_racing_on_the_first_call_load_the_image_once(toy_build, tmp_path, round_):
    """A fresh process, 8 threads released at once into the first call of an entry: one image
    load, one kernel lookup and one shared-memory raise in the process, and 8 launches."""
    manifest, paths = toy_build
    program = by_block(manifest)[0]  # TOY_BLOCK 128: 8 blocks for n = 1000
    manifest_path = tmp_path / "build.json"
    manifest_path.write_text(mf.to_json(manifest))
    script = RACE_SCRIPT.format(repo=str(REPO), tests=str(TESTS), manifest=str(manifest_path),
                                library=program.library, path=str(paths[program.library]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    if report == "real driver":
        pytest.skip("a real CUDA driver is installed here")
    assert report["errors"] == []
    assert report["streams"] == list(range(1, 9))
    assert len(report["loads"]) == 1 and "image=fatbin error=0" in report["loads"][0]
    assert len(report["lookups"]) == 1
    assert f"name=kernel_{program.library}_scale " in report["lookups"][0]
    assert len(report["attributes"]) == 1 and "attribute=8 value=65536" in report["attributes"][0]


@compiles
def test_shared_memory_limit_is_raised_once_per_kernel_and_device(fresh, fake):
    scale = fresh(0).entry("scale")

    def call(smem: int, times: int = 1) -> None:
        for _ in range(times):
            scale(0, **scale_arguments(smem_bytes=smem))

    call(0)
    call(48 * 1024, 2)  # the default limit: nothing to raise
    assert set_attribute_calls(fake) == []
    call(64 * 1024, 3)
    assert set_attribute_calls(fake) == [(8, 65536, 0)]
    call(32 * 1024)
    call(64 * 1024)
    assert set_attribute_calls(fake) == [(8, 65536, 0)]
    call(96 * 1024, 2)  # more than before: raised again, once
    call(64 * 1024)  # never lowered
    assert set_attribute_calls(fake) == [(8, 65536, 0), (8, 98304, 0)]
    fake.set_current_device(1)  # another device: its own limit
    call(64 * 1024, 2)
    assert set_attribute_calls(fake) == [(8, 65536, 0), (8, 98304, 0), (8, 65536, 1)]
    fake.set_current_device(0)
    call(96 * 1024)
    assert len(set_attribute_calls(fake)) == 3
    smem = [launch.smem for launch in fake.launches()]
    assert smem == [0, 49152, 49152, *[65536] * 3, 32768, 65536, 98304, 98304, 65536, 65536,
                    65536, 98304]
    assert len(fake.calls("cuLibraryLoadData")) == 1
    assert len(fake.calls("cuLibraryGetKernel")) == 1


@compiles
def test_each_program_loads_its_own_image_and_kernel(package, shared_cache, toy_build, fake):
    """Through the loader with the fake driver as the device's: program by program, each its
    own image, kernel and block size (the device query is the driver's too)."""
    programs = programs_of(package)
    assert loader.device(0) == loader.Device(0, "NVIDIA H200 (fake)", (9, 0))
    for program in programs.manifest.programs:
        library = programs.library(program, 0)
        library.entry("scale")(0, **scale_arguments(n=1000))
        launch = fake.launches()[-1]
        block = program.variant["block"]
        assert launch.kernel == f"kernel_{program.library}_scale"
        assert launch.block == (block, 1, 1) and launch.grid == (-(-1000 // block), 1, 1)
        assert params(launch)[3] == block


def _failing(call: str, error: int, smem: int = 0):
    def setup(driver):
        driver.fail(call, error)
        return smem
    setup.__name__ = f"{call}_{error}"
    return setup


def _no_kernels(driver):
    driver.set_kernels([])
    return 0


@compiles
@pytest.mark.parametrize("setup,where,message", [
    (_failing("cuLaunchKernel", 701), "{kernel}", "cuLaunchKernel failed: "
                                                  "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701)"),
    (_failing("cuLaunchKernel", 999), "{kernel}", "cuLaunchKernel failed: "
                                                  "unknown CUDA driver error (999)"),
    (_failing("cuLibraryLoadData", 200), "program image",
     "cuLibraryLoadData failed: CUDA_ERROR_INVALID_IMAGE (200)"),
    (_no_kernels, "{kernel}", "cuLibraryGetKernel failed: CUDA_ERROR_NOT_FOUND (500)"),
    (_failing("cuKernelSetAttribute", 1, 65536), "{kernel}",
     "cuKernelSetAttribute failed: CUDA_ERROR_INVALID_VALUE (1)"),
    (_failing("cuCtxGetDevice", 201, 65536), "{kernel}",
     "cuCtxGetDevice failed: CUDA_ERROR_INVALID_CONTEXT (201)"),
], ids=["launch", "launch-unknown", "image", "lookup", "smem", "context"])
def test_a_driver_error_becomes_a_runtime_error_naming_the_kernel(fresh, fake, setup, where,
                                                                   message):
    """The call fails with the driver's error named, nothing is launched, and once the driver
    recovers the next call works (a failed first use is not remembered as done)."""
    library = fresh(0)
    scale = library.entry("scale")
    kernel = f"kernel_{library.program.library}_scale"
    smem = setup(fake)
    expected = f"{library.program.library}_scale: {where.format(kernel=kernel)}: {message}"
    with pytest.raises(RuntimeError, match=f"^{re.escape(expected)}$") as caught:
        scale(0, **scale_arguments(smem_bytes=smem))
    assert type(caught.value) is RuntimeError
    assert all("error=0" not in line for line in fake.calls("cuLaunchKernel"))  # none ran
    fake.reset()
    fake.set_kernels(None)
    scale(0, **scale_arguments(smem_bytes=smem))
    assert [line for line in fake.calls("cuLaunchKernel") if "error=0" in line]
    if smem > 48 * 1024:
        assert set_attribute_calls(fake) == [(8, smem, 0)]  # raised now, not remembered before
