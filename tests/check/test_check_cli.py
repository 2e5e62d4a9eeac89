"""``tools/check_manifests.py`` on bad input: one line naming the file and the problem, exit 1
(findings) or 2 (usage or I/O), never a traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from toy_tree import CHECKER, FAMILY_A, REPO, ToyRepo, run_checker


def _one_error_line(result, *needles: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) >= 1, result.stderr
    error = lines[-1]
    assert error.startswith("check_manifests: error: "), result.stderr
    for needle in needles:
        assert needle in error, f"{needle!r} not in {error!r}"
    return error


def test_malformed_manifest_is_a_finding(toy):
    path = toy.tree(FAMILY_A).manifest_path
    path.write_bytes(b"\xff\xfe not json")
    result = run_checker(path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    findings = [line for line in result.stdout.splitlines() if ": CM" in line]
    assert findings == [line for line in findings if line.startswith(f"{path}:$: CM101 ")]
    assert len(findings) == 1


def test_empty_manifest_is_a_finding(toy):
    path = toy.tree(FAMILY_A).manifest_path
    path.write_text("")
    result = run_checker(toy.root)
    assert result.returncode == 1 and f"{path}:$: CM101 " in result.stdout


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere"
    result = run_checker(missing)
    assert result.returncode == 2
    _one_error_line(result, str(missing), "no such file or directory")


def test_folder_without_manifests(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_checker(tmp_path / "empty")
    assert result.returncode == 2
    _one_error_line(result, str(tmp_path / "empty"), "no manifests/ folder")


def test_file_that_is_not_a_manifest(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("{}")
    result = run_checker(other)
    assert result.returncode == 2
    _one_error_line(result, str(other), "not a manifest")


def test_unreadable_manifest_simulated(toy):
    """An OSError while reading (here: a directory where a manifest file should be)."""
    path = toy.path("manifests/cake_toy_zzz_det_train.json")
    path.mkdir()
    result = run_checker(toy.root)
    assert result.returncode == 2
    _one_error_line(result, str(path), "cannot read")


def test_source_path_is_a_directory(toy):
    layout = toy.tree(FAMILY_A)
    source = layout.source(0, "kernel")
    source.unlink()
    source.mkdir()
    result = run_checker(toy.root)
    assert "Traceback" not in result.stderr
    assert result.returncode == 1 and ": CM301 " in result.stdout


def _as_nobody() -> tuple | None:
    """A command prefix that runs as an unprivileged user, or None when that is impossible."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if not setpriv:
        return None
    prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    probe = subprocess.run([*prefix, sys.executable, str(CHECKER), "--help"],
                           capture_output=True, text=True, timeout=60)
    return prefix if probe.returncode == 0 else None


def test_unreadable_directory():
    """A csrc folder nobody may list: exit 2 naming it (run unprivileged; root reads anything)."""
    prefix = _as_nobody()
    if prefix is None:
        pytest.skip("running as root and neither python nor this checkout is usable by an "
                    "unprivileged user; test_unreadable_manifest_simulated covers the I/O path")
    base = Path(tempfile.mkdtemp(prefix="cake-unreadable-"))
    toy = ToyRepo(base / "repo")
    hidden = toy.path(f"csrc/{FAMILY_A}")
    try:
        toy.render()
        for path in [base, *base.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IROTH | stat.S_IXOTH
                       if path.is_dir() else path.stat().st_mode | stat.S_IROTH)
        hidden.chmod(0)
        result = run_checker(toy.root, prefix=prefix)
        assert result.returncode == 2, result.stdout + result.stderr
        _one_error_line(result, str(hidden), "cannot read")
    finally:
        if hidden.exists():
            hidden.chmod(0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("argv,needle", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--package", "cake.x"], "--package only goes with --vendored-gate"),
    (["--vendored-gate"], "--vendored-gate needs --package NAME"),
])
def test_wrong_argument(toy, argv, needle):
    result = run_checker(*argv, toy.root)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert needle in result.stderr.strip().splitlines()[-1]


def test_help():
    result = run_checker("--help")
    assert result.returncode == 0 and "--json" in result.stdout


def test_default_is_current_directory(toy):
    assert run_checker(cwd=toy.root).returncode == 0
    toy.tree(FAMILY_A).source(0).write_text("changed")
    result = run_checker(cwd=toy.root)
    assert result.returncode == 1 and ": CM304 " in result.stdout


def test_repository_checks_clean():
    """This checkout's own manifests (whatever families it has) pass the checker."""
    result = subprocess.run([sys.executable, str(CHECKER), str(REPO)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
