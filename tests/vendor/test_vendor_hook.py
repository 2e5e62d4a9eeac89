"""README's host pre-commit configuration for vendored packages, through the real pre-commit.

The YAML block of README.md's "Vendoring" section is used as written, with only ``repo``
pointed at a fresh git repository holding this working tree's hook files and what the gate
compares a copy with (the families' modules, manifests and sources), and ``rev`` at its commit.
The host is a fresh git repository with a FlashInfer-shaped tree into which the packages that
block names are vendored from that commit; ``flashinfer`` is unimportable throughout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from vendor_tree import PREFIX, REPO, commit_all, host_tree, run, vendor

README = REPO / "README.md"
# The hook and what its entry runs, and the upstream the gate compares a vendored copy with.
HOOK_FILES = [".pre-commit-hooks.yaml", "tools", "cake", "manifests", "csrc"]


def vendoring_section(text: str) -> str:
    """The text under '## Vendoring' up to the next '## ' heading (fences respected)."""
    body, inside, fenced = [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            if inside:
                break
            inside = line.strip() == "## Vendoring"
            continue
        if inside:
            body.append(line)
    return "\n".join(body)


def hook_config(section: str) -> str:
    assert section, "README.md has no '## Vendoring' section"
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "README's Vendoring section needs exactly one yaml block (the hook)"
    return blocks[0]


def _hook_repository(tmp_path: Path) -> tuple[Path, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in HOOK_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, hooks / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, hooks / name)
    return hooks, commit_all(hooks, "hooks")


def test_readme_hook_passes_a_clean_copy_and_fails_a_tampered_one(tmp_path):
    if importlib.util.find_spec("pre_commit") is None or shutil.which("git") is None:
        message = "pre-commit or git is not installed (pip install -e '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs the test extra: never skip silently there
        pytest.skip(message)
    assert README.is_file(), "README.md is missing"
    config = hook_config(vendoring_section(README.read_text()))
    packages = re.findall(rf"--package, {re.escape(PREFIX)}\.(\w+)", config)
    assert packages, config
    hooks, commit = _hook_repository(tmp_path)
    config = re.sub(r"repo: \S+", f"repo: {hooks}", config, count=1)
    config = re.sub(r"rev: \S+", f"rev: {commit}", config, count=1)

    host = tmp_path / "host"
    into = host_tree(host)
    result = vendor(tmp_path, into, *[a for p in packages for a in ("--package", p)],
                    repository=hooks)
    assert result.returncode == 0, result.stderr
    (host / ".pre-commit-config.yaml").write_text(config)
    commit_all(host, "vendored")

    def pre_commit():
        return run([sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"],
                   host, timeout=300, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
                   PRE_COMMIT_COLOR="never")

    clean = pre_commit()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert re.search(r"cake-train vendored gate\.+Passed", clean.stdout), clean.stdout
    assert f"ok in {len(packages)} manifest(s)" in clean.stdout

    module = into / packages[0] / "_function.py"
    module.write_text(module.read_text() + "import flashinfer\n")
    commit_all(host, "tampered")
    tampered = pre_commit()
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert re.search(r"cake-train vendored gate\.+Failed", tampered.stdout)
    assert f"{module.relative_to(host)}:line " in tampered.stdout or str(module) in tampered.stdout
    assert ": CM701 " in tampered.stdout
