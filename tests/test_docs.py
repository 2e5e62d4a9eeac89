"""The README and docs/ point only at things that exist: every relative link (and its anchor),
every repository path written in code, and every results file the tables cite; and every results
file kept under tools/bench/results/ is cited by one of them. No GPU, no build."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "tools" / "bench" / "results"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_FENCE_RE = re.compile(r"^(```|~~~)")
_LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_HEADING_RE = re.compile(r"^(#{1,6}) (.*?)\s*#*\s*$")
# Characters that make a word a placeholder or a pattern, not a path of this repository.
_NOT_A_PATH = set("<>*{}$|\\?[]()=\"'")
_TRAILING = ",.;:)"


def _relative(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@lru_cache(maxsize=None)
def _top_level() -> frozenset:
    """The names at the repository root that hold files git tracks or would track (``cake``,
    ``docs``, ``README.md``, ``.ci``, ...): a word is taken for a repository path when it starts
    with one. Build outputs (``build/``, ``dist/``) are ignored, so ``build/dev`` is not checked."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True)
    names = {p.split("/", 1)[0] for p in listed.stdout.decode().split("\0") if p}
    if listed.returncode != 0 or not names:  # no git: the checkout's own entries
        names = {p.name for p in REPO.iterdir()
                 if p.name not in {".git", "build", "dist"} and not p.name.endswith(".egg-info")}
    return frozenset(names)


def _split(page: Path) -> tuple[list[str], list[str]]:
    """(prose lines, code lines) of a page: code lines are those inside fenced blocks."""
    prose, code, fenced = [], [], False
    for line in page.read_text().splitlines():
        if _FENCE_RE.match(line.lstrip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset:
    found, seen = set(), {}
    for line in _split(page)[0]:
        heading = _HEADING_RE.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    prose, _ = _split(page)
    text = "\n".join(_CODE_SPAN_RE.sub("", line) for line in prose)
    return _LINK_RE.findall(text)


def repository_paths(page: Path) -> list[str]:
    """Words that name a file or folder of this repository: in code spans and code blocks,
    starting with a top-level name, without placeholders (``<family>``) or patterns."""
    prose, code = _split(page)
    words = []
    # A code span may wrap onto the next line of its paragraph, never past a blank line.
    for paragraph in "\n".join(prose).split("\n\n"):
        for _, span in _CODE_SPAN_RE.findall(paragraph):
            words += span.split()
    for line in code:
        words += line.split()
    found = []
    for word in words:
        word = word.rstrip(_TRAILING)
        if not word or _NOT_A_PATH & set(word) or "..." in word or "://" in word:
            continue
        first = word.split("/", 1)[0]
        if first in _top_level() and ("/" in word or (REPO / first).is_file()):
            found.append(word)
    return sorted(set(found))


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_relative_links_exist(page):
    problems = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: {path} does not exist")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{target}: {_relative(file)} has no heading #{anchor}")
    assert not problems, f"{_relative(page)}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_cited_repository_paths_exist(page):
    missing = [p for p in repository_paths(page) if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"{_relative(page)} cites paths that do not exist: {missing}"


def test_the_docs_are_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md")}
    unlinked = [_relative(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md links to no {unlinked}"


def test_every_results_file_is_cited_and_every_cited_one_is_kept():
    """tools/bench/results/ keeps only the files a README or docs table cites (one current file
    per family and GPU); git history keeps the rest."""
    text = "\n".join(page.read_text() for page in PAGES)
    cited = set(re.findall(r"tools/bench/results/([\w.-]+\.\w+)", text))
    kept = {p.name for p in RESULTS.iterdir() if p.is_file()} if RESULTS.is_dir() else set()
    assert not kept - cited, f"results files no README or docs table cites: {sorted(kept - cited)}"
    assert not cited - kept, f"results files cited but missing: {sorted(cited - kept)}"


def test_no_placeholder():
    """No page leaves a value to fill (TBD, TODO)."""
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            assert "TBD" not in line and "TODO" not in line, \
                f"{_relative(page)}:{number}: a placeholder: {line}"


def test_ci_runs_the_readme_commands():
    """.ci/run runs the two commands the README opens with (``pip`` as ``python -m pip``)."""
    block = re.search(r"```console\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block, "README.md opens with no console block of commands"
    commands = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, commands
    ci = (REPO / ".ci" / "run").read_text()
    for command in commands:
        assert command in ci or f"python -m {command}" in ci, f".ci/run does not run: {command}"


def test_the_checker_finds_what_it_should():
    """The helpers above find what a page cites (so the tests cannot pass by finding nothing)."""
    readme = REPO / "README.md"
    assert "docs/build.md" in links(readme)
    assert "tools/sizes.py" in repository_paths(readme)
    assert slug("Causal conv1d (`cake.cake_causal_conv1d_det_train`)") == \
        "causal-conv1d-cakecake_causal_conv1d_det_train"
    assert "finding-codes" in anchors(REPO / "docs" / "programs.md")
