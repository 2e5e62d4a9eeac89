"""ci/tag_release.sh: the release tag is v<__version__>, at a clean HEAD, never moved."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, text=True,
                          capture_output=True).stdout.strip()


@pytest.fixture
def release_repo(tmp_path) -> Path:
    """A git repository with the script and a cake/__init__.py of version 0.3.1, committed."""
    (tmp_path / "ci").mkdir()
    shutil.copy2(REPO / "ci" / "tag_release.sh", tmp_path / "ci" / "tag_release.sh")
    (tmp_path / "cake").mkdir()
    (tmp_path / "cake" / "__init__.py").write_text('"""cake"""\n\n__version__ = "0.3.1"\n')
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "release 0.3.1")
    return tmp_path


def tag_release(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "ci/tag_release.sh"], cwd=repo, env=GIT_ENV, text=True,
                          capture_output=True)


def test_tags_head_with_the_package_version_annotated(release_repo):
    result = tag_release(release_repo)
    assert result.returncode == 0, result.stderr
    assert git(release_repo, "rev-parse", "v0.3.1^{commit}") == git(release_repo, "rev-parse", "HEAD")
    assert git(release_repo, "cat-file", "-t", "v0.3.1") == "tag"  # annotated, not lightweight
    assert "git push origin v0.3.1" in result.stdout
    again = tag_release(release_repo)
    assert again.returncode == 0 and "already tags HEAD" in again.stdout


def test_refuses_a_tree_with_changes(release_repo):
    (release_repo / "stray.txt").write_text("not committed\n")
    result = tag_release(release_repo)
    assert result.returncode == 1
    assert "stray.txt" in result.stderr
    assert git(release_repo, "tag", "--list") == ""


def test_never_moves_a_tag_to_another_commit(release_repo):
    assert tag_release(release_repo).returncode == 0
    first = git(release_repo, "rev-parse", "v0.3.1^{commit}")
    (release_repo / "cake" / "extra.py").write_text("X = 1\n")
    git(release_repo, "add", ".")
    git(release_repo, "commit", "-q", "-m", "after the release, version not raised")
    result = tag_release(release_repo)
    assert result.returncode == 1
    assert "raise __version__" in result.stderr
    assert git(release_repo, "rev-parse", "v0.3.1^{commit}") == first
