"""``import cake`` stays light; ``python -m cake info`` and ``selftest`` on the CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toy_programs import REPO, TOY_FAMILY, make_toy_package

from cake.core import jit
from cake.core import manifest as mf


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


@pytest.mark.nvcc
def test_selftest_verifies_manifests_and_library_digests(site, tmp_path):
    package = site / "cake" / TOY_FAMILY
    manifest = mf.read(package / mf.MANIFEST_NAME)
    first, second = manifest.programs
    (package / "lib").mkdir()
    tree = mf.package_tree(package)
    command = jit.compile_command(jit.find_nvcc(), tree, first, "sm_90a",
                                  package / "lib" / f"{first.library}_sm_90a.so")
    subprocess.run(command, check=True)

    clean = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 prebuilt libraries verified" in clean.stdout
    assert "selftest: passed" in clean.stdout

    # A library named after the second program but holding the first one's code.
    shutil.copyfile(package / "lib" / f"{first.library}_sm_90a.so",
                    package / "lib" / f"{second.library}_sm_90a.so")
    wrong = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert wrong.returncode == 1
    assert f"{second.library}_sm_90a.so" in wrong.stdout
    (package / "lib" / f"{second.library}_sm_90a.so").unlink()

    source = tree.source_path(first.sources[0])
    source.write_bytes(source.read_bytes() + b"\n")
    tampered = run_cake("selftest", pythonpath=site, cwd=tmp_path)
    assert tampered.returncode == 1 and "CM304" in tampered.stdout
