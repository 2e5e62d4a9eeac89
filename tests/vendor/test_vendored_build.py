"""The vendored build and run (docs/vendoring.md): ci/build_vendored.sh on a FlashInfer-shaped tree.

One host tree holds the toy family and every real family, vendored from a copy of this
checkout with the toy family added (the gate compares each copy with the cake-train it runs
from, so one upstream holds them all). That copy's ``ci/build_vendored.sh DIR sm_90a
TARGET...`` builds it with ``flashinfer`` unimportable in every process (the gate, CMake's
configure step running tools/build_plan.py, nvcc). To keep CI short it builds, for sm_90a
only, the toy family's first program and the first program of each real family (one
library each, about 10 s on two cores), and records them in each package's build record
(lib/libraries.json); the toy's second program stays unbuilt to show the JIT fallback. The
vendored packages are then imported as top-level packages with ``flashinfer`` and ``cake``
blocked, on a simulated H200 (``loader.device`` replaced as in tests/loader): built programs
load from ``<package>/lib`` and their embedded digests match the manifest; the unbuilt one is
refused with CAKE_JIT=0 and JIT-compiled otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from vendor_tree import (BUILD_VENDORED, PREFIX, REPO, TOY_FAMILY, gate, host_tree,
                         make_source_repo, manifest_of, real_families, run, run_vendored, vendor)

from cake.core import trust

pytestmark = pytest.mark.nvcc
ARCH = "sm_90a"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, dict[str, list[str]]]:
    """(work folder, the vendored cake/ folder, package -> libraries built)."""
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("nvcc is not installed")
    work = tmp_path_factory.mktemp("vendored-build")
    into = host_tree(work / "host")
    result = vendor(work, into, repository=make_source_repo(upstream(work), whole_checkout=True))
    assert result.returncode == 0, result.stderr
    wanted = {TOY_FAMILY: [manifest_of(into / TOY_FAMILY).programs[0].library]}
    for name in real_families():
        wanted[name] = [next(p.library for p in manifest_of(into / name).programs
                             if ARCH in p.arches)]
    targets = [f"{library}_{ARCH}" for libraries in wanted.values() for library in libraries]
    result = build(work, into, targets)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return work, into, wanted


def upstream(work: Path) -> Path:
    """The cake-train checkout the families are vendored from, built with and gated by."""
    return work / "src"


def build_script(work: Path) -> Path:
    return upstream(work) / BUILD_VENDORED.relative_to(REPO)


def build(work: Path, into: Path, targets: list[str]):
    return run(["bash", build_script(work), into, ARCH, *targets], work, timeout=1800,
               PYTHON=sys.executable, CAKE_BUILD_DIR=str(work / "build"))


def test_libraries_are_built_into_each_package(built):
    """Each package's lib/ holds the libraries built for it and their build record."""
    work, into, wanted = built
    for name, libraries in wanted.items():
        lib = into / name / "lib"
        expected = sorted(f"{library}_{ARCH}.so" for library in libraries)
        assert sorted(p.name for p in lib.iterdir()) == sorted([*expected, trust.RECORD_NAME])
        assert trust.read_record(lib) == {n: trust.sha256_file(lib / n) for n in expected}


def test_a_build_of_every_target_records_its_libraries(built, tmp_path):
    """Without TARGETs (a copy of the toy package): every library, and the build record that
    CMake writes (cake_add_record) listing each with its sha256."""
    work, into, _ = built
    host = tmp_path / "host"
    shutil.copytree(work / "host", host)
    package = host.joinpath(*PREFIX.split("."), TOY_FAMILY)
    shutil.rmtree(package / "lib")
    result = run(["bash", build_script(work), package, ARCH], tmp_path, timeout=1800,
                 PYTHON=sys.executable, CAKE_BUILD_DIR=str(tmp_path / "build"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    names = sorted(f"{p.library}_{ARCH}.so" for p in manifest_of(package).programs)
    assert sorted(p.name for p in (package / "lib").iterdir()) == \
        sorted([*names, trust.RECORD_NAME])
    assert trust.read_record(package / "lib") == \
        {n: trust.sha256_file(package / "lib" / n) for n in names}


def test_a_second_build_does_nothing(built):
    work, into, wanted = built
    targets = [f"{library}_{ARCH}" for libraries in wanted.values() for library in libraries]
    result = build(work, into, targets)
    assert result.returncode == 0, result.stderr
    assert "ninja: no work to do." in result.stdout


def test_the_gate_still_passes_after_the_build(built):
    work, into, wanted = built
    result = gate(work, work / "host", *wanted, upstream=upstream(work))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_tampered_tree_is_not_built(built, tmp_path):
    work, into, _ = built
    host = tmp_path / "host"
    shutil.copytree(work / "host", host)
    package = host.joinpath(*PREFIX.split("."), TOY_FAMILY)
    shutil.rmtree(package / "lib")
    module = package / "_function.py"
    module.write_text(module.read_text() + "import flashinfer\n")
    result = run(["bash", build_script(work), package.parent, ARCH], tmp_path,
                 PYTHON=sys.executable, CAKE_BUILD_DIR=str(tmp_path / "build"))
    assert result.returncode != 0 and ": CM701 " in result.stdout, result.stdout
    assert not (package / "lib").exists()


LOAD = """
    import importlib
    import os
    import sys
    import types
    from pathlib import Path
    # Under a neutral parent package, as in a host: a KCP family imports its base family beside it.
    parent = types.ModuleType("vendored")
    parent.__path__ = [{into!r}]
    sys.modules["vendored"] = parent
    family = importlib.import_module("vendored.{name}")
    loader = importlib.import_module("vendored.{name}.core.loader")
    H200 = loader.Device(0, "Simulated H200", (9, 0))
    loader.device = lambda index: H200
    programs = loader.ProgramSet.for_package(Path(family.__file__).parent)
    for program in programs.manifest.programs:
        state = programs.state(program, "sm_90a")
        if program.library in {built!r}:
            library = programs.library(program, 0)
            digest = loader.embedded_digest(library.path, program.library,
                                            programs.record()[library.path.name])
            print("built", program.library, library.origin, state, digest == program.digest,
                  library.path.parent == Path(family.__file__).parent / "lib")
        elif {jit!r} == program.library:
            try:
                library = programs.library(program, 0)
            except loader.ProgramUnavailable as exc:
                print("refused", program.library, "CAKE_JIT=0 forbids compiling" in str(exc))
            else:
                print("jit", program.library, library.origin,
                      library.path.is_relative_to(os.environ["CAKE_CACHE_DIR"]))
    print("outside", sorted({{m.split(".")[0] for m in sys.modules}} & {{"cake", "flashinfer"}}))
"""


@pytest.mark.parametrize("name", [TOY_FAMILY, *real_families()])
def test_vendored_package_loads_its_prebuilt_libraries(built, tmp_path, name):
    work, into, wanted = built
    script = LOAD.format(name=name, built=wanted[name], jit="", into=str(into))
    result = run_vendored(tmp_path, into, script, CAKE_JIT="0",
                          CAKE_CACHE_DIR=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "outside []"
    assert sorted(lines[:-1]) == sorted(f"built {library} prebuilt prebuilt True True"
                                        for library in wanted[name])


def test_an_unbuilt_program_falls_back_to_the_jit(built, tmp_path):
    work, into, wanted = built
    unbuilt = manifest_of(into / TOY_FAMILY).programs[1].library
    script = LOAD.format(name=TOY_FAMILY, built=[], jit=unbuilt, into=str(into))
    cache = str(tmp_path / "cache")
    refused = run_vendored(tmp_path, into, script, CAKE_JIT="0", CAKE_CACHE_DIR=cache)
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.splitlines() == [f"refused {unbuilt} True", "outside []"]
    compiled = run_vendored(tmp_path, into, script, CAKE_CACHE_DIR=cache)
    assert compiled.returncode == 0, compiled.stderr
    assert compiled.stdout.splitlines() == [f"jit {unbuilt} compiled True", "outside []"]
    assert compiled.stderr.count("cake: compiling") == 1
