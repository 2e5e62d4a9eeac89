"""The ``check-manifests`` hook through the real pre-commit tool (``pre-commit try-repo``).

The hook repository is a fresh git repository holding a copy of this working tree's hook
files (so the test does not depend on what is committed in the checkout); the target is
another fresh git repository holding a toy package tree.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from toy_tree import FAMILY_A, FAMILY_B, REPO, ToyRepo

# Copied into the hook repository: the hook definition and what its entry runs.
HOOK_FILES = [".pre-commit-hooks.yaml", "tools", "cake"]


def _require_tools() -> None:
    missing = [name for name, ok in [
        ("pre-commit", importlib.util.find_spec("pre_commit") is not None),
        ("git", shutil.which("git") is not None)] if not ok]
    if missing:
        message = f"{' and '.join(missing)} not installed (pip install -e '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs the test extra: never skip silently there
        pytest.skip(message)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=cake tests", "-c", "user.email=tests@cake.invalid",
                    "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", *args],
                   cwd=cwd, check=True, capture_output=True, timeout=60)


def _commit_all(cwd: Path, message: str) -> None:
    _git(cwd, "add", "-A")
    _git(cwd, "commit", "-q", "--allow-empty", "-m", message)


def _hook_repository(tmp_path: Path) -> Path:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in HOOK_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, hooks / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, hooks / name)
    _git(hooks, "init", "-q")
    _commit_all(hooks, "hooks")
    return hooks


def _try_repo(hooks: Path, target: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
               PRE_COMMIT_COLOR="never")
    env.pop("PRE_COMMIT", None)
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(hooks),
                           "check-manifests", "--all-files", "--verbose"],
                          cwd=target, env=env, capture_output=True, text=True, timeout=300)


def _repository_target(tmp_path: Path):
    toy = ToyRepo(tmp_path / "target")
    toy.render()
    return toy.root, toy.tree(FAMILY_A)


def _vendored_target(tmp_path: Path):
    toy = ToyRepo(tmp_path / "toy")
    toy.render()
    host = tmp_path / "target"
    layout = toy.install(host, FAMILY_B, package="flashinfer.experimental.cake.cake_toy_nondet_train")
    (host / "README.md").write_text("a host library with a vendored cake package\n")
    return host, layout


@pytest.mark.parametrize("make_target", [_repository_target, _vendored_target],
                         ids=["repository", "vendored"])
def test_hook_passes_clean_and_fails_tampered(tmp_path, make_target):
    _require_tools()
    hooks = _hook_repository(tmp_path)
    target, layout = make_target(tmp_path)
    _git(target, "init", "-q")
    _commit_all(target, "clean tree")

    clean = _try_repo(hooks, target, tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "check cake-train manifests" in clean.stdout and "Passed" in clean.stdout
    assert " ok in 1 manifest(s)" in clean.stdout or " ok in 2 manifest(s)" in clean.stdout

    source = layout.source(0, "kernel")
    source.write_bytes(source.read_bytes().replace(b"Toy", b"Tox", 1))
    _commit_all(target, "tampered source")
    tampered = _try_repo(hooks, target, tmp_path)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "Failed" in tampered.stdout
    assert ": CM304 " in tampered.stdout
    assert str(layout.manifest_path.relative_to(target)) in tampered.stdout


def test_hook_definition():
    """The offered hook runs the checker as a script (nothing to install, no CUDA build)."""
    text = (REPO / ".pre-commit-hooks.yaml").read_text()
    lines = {line.strip() for line in text.splitlines()}
    assert "- id: check-manifests" in lines
    assert "language: script" in lines
    assert "entry: tools/check_manifests.py" in lines
    assert "pass_filenames: false" in lines
    assert os.access(REPO / "tools" / "check_manifests.py", os.X_OK)
    assert (REPO / "tools" / "check_manifests.py").read_text().startswith("#!/usr/bin/env python3")
    config = (REPO / ".pre-commit-config.yaml").read_text()
    assert "entry: tools/check_manifests.py" in config
    assert "entry: tools/render.py --check" in config
