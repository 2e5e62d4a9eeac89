"""``import cake`` stays light; ``python -m cake info`` and ``selftest`` on the CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toy_programs import REPO, TOY_FAMILY, compiled_library, make_toy_package

from cake.core import jit
from cake.core import manifest as mf
from cake.core import toolchain, trust


def run_cake(*args: str, pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-m", "cake", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_cake_does_not_import_torch():
    code = ("import sys, cake, cake.checker, cake.core.loader, cake.core.jit\n"
            "assert 'torch' not in sys.modules, 'import cake imported torch'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.fixture
def site(tmp_path) -> Path:
    """An installed-looking ``cake`` (this checkout's Python files) holding the toy family."""
    package = make_toy_package(tmp_path)
    site = package.parent.parent
    for item in (REPO / "cake").iterdir():
        if item.name.startswith("cake_") or item.name == "__pycache__":
            continue  # only the toy family, so the test does not depend on the real ones
        target = site / "cake" / item.name
        if item.is_dir():
            shutil.copytree(item, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(item, target)
    return site


def test_info_lists_every_program_and_its_state(site, tmp_path):
    result = run_cake("info", pythonpath=site, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = mf.read(site / "cake" / TOY_FAMILY / mf.MANIFEST_NAME)
    assert f"cake.{TOY_FAMILY}: 2 program(s)" in result.stdout
    for program in manifest.programs:
        assert program.library in result.stdout
    assert "sm_90a:" in result.stdout and str(site / "cake") in result.stdout


INFO_ON_FAKE_GPU = """
import sys
sys.path[:0] = [{site!r}, {tests!r}]
import fake_cuda
if fake_cuda.real_driver_present():
    print("real driver")
    raise SystemExit(0)
fake_cuda.load()
from cake.__main__ import main
raise SystemExit(main(["info"]))
"""


def test_info_on_a_gpu_shows_the_device_and_each_programs_state_for_its_arch(site, tmp_path):
    """With the fake CUDA driver (an H200): the device, its arch, and each program's state for
    that arch only."""
    env = dict(os.environ, CAKE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CAKE_JIT", None)
    script = INFO_ON_FAKE_GPU.format(site=str(site), tests=str(REPO / "tests"))
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.strip() == "real driver":
        pytest.skip("a real CUDA driver is installed here")
    assert "CUDA driver 13.0" in result.stdout
    assert "GPU 0 (NVIDIA H200 (fake), compute capability 9.0): arch sm_90a" in result.stdout
    state = "would compile" if jit.unavailable_reason() is None else "unsupported"
    for program in mf.read(site / "cake" / TOY_FAMILY / mf.MANIFEST_NAME).programs:
        line = next(line for line in result.stdout.splitlines() if program.library in line)
        assert line.rstrip().endswith(f"sm_90a:{state}"), line
        assert "sm_100a" not in line


@pytest.mark.nvcc
@pytest.mark.skipif(jit.find_nvcc() is None or toolchain.find_cxx() is None,
                    reason="nvcc or a host C++ compiler is not installed")
def test_selftest_verifies_manifests_and_library_digests(site, tmp_path, toy_jit_cache):
    package = site / "cake" / TOY_FAMILY
    manifest = mf.read(package / mf.MANIFEST_NAME)
    first, second = manifest.programs
    (package / "lib").mkdir()
    tree = mf.package_tree(package)
    # The JIT's library, as the build would install it (both run toolchain.library_steps),
    # with the build's record of its sha256.
    lib = package / "lib"
    shutil.copyfile(compiled_library(tree, first, "sm_90a", toy_jit_cache),
                    lib / f"{first.library}_sm_90a.so")
    trust.write_record(lib, sorted(lib.glob("*.so")))

    clean = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 prebuilt libraries verified" in clean.stdout
    assert "selftest: passed" in clean.stdout

    # A library named after the second program but holding the first one's code (its bytes
    # recorded, so that only what it embeds is wrong).
    shutil.copyfile(lib / f"{first.library}_sm_90a.so", lib / f"{second.library}_sm_90a.so")
    trust.write_record(lib, sorted(lib.glob("*.so")))
    wrong = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert wrong.returncode == 1
    failures = [line for line in wrong.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 2, wrong.stdout  # the library, then its family's summary
    assert f"{second.library}_sm_90a.so" in failures[0]
    assert f"does not export {second.library}_digest" in failures[0]
    # Not in the build record: refused before it is loaded.
    trust.write_record(lib, [lib / f"{first.library}_sm_90a.so"])
    unrecorded = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert unrecorded.returncode == 1
    assert f"lib/{second.library}_sm_90a.so is not in the build record" in unrecorded.stdout
    (lib / f"{second.library}_sm_90a.so").unlink()
    assert run_cake("selftest", pythonpath=site, cwd=tmp_path).returncode == 0

    source = tree.source_path(first.sources[0])
    source.write_bytes(source.read_bytes() + b"\n")
    tampered = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert tampered.returncode == 1 and "CM304" in tampered.stdout
