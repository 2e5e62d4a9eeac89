"""The user's reference documents every finding code and the pre-commit hook.

README.md stays short and links to one page per concern under docs/: the finding codes, the
exit statuses and the manifest and render reference live in docs/programs.md, the hook in
docs/vendoring.md (and README's own host configuration, which tests/vendor/test_vendor_hook.py
runs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from toy_tree import REPO

from cake.core import manifest as mf

README = REPO / "README.md"
PROGRAMS = REPO / "docs" / "programs.md"
VENDORING = REPO / "docs" / "vendoring.md"


def _section(page: Path, title: str) -> str:
    """The text under the heading ``title`` of ``page`` up to the next heading of the same or a
    higher level; ``#`` lines inside fenced code blocks are not headings."""
    assert page.is_file(), f"{page.relative_to(REPO)} is missing"
    lines = page.read_text().splitlines()
    fenced, start, level, body = False, None, 0, []
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*?)\s*$", line)
        if start is None:
            if heading and heading.group(2) == title:
                start, level = True, len(heading.group(1))
            continue
        if heading and len(heading.group(1)) <= level:
            break
        body.append(line)
    assert start, f"{page.relative_to(REPO)} has no '{title}' section"
    return "\n".join(body)


@pytest.fixture(scope="module")
def checker_section() -> str:
    return _section(PROGRAMS, "check_manifests")


@pytest.mark.parametrize("code", sorted(mf.FINDING_CODES))
def test_finding_code_documented(checker_section, code):
    """One row per code, with the meaning FINDING_CODES gives it (code spans aside)."""
    rows = re.findall(rf"^\| {code} \| (.+) \|$", checker_section, re.MULTILINE)
    assert rows, f"docs/programs.md's check_manifests table has no row for {code}"
    assert [row.replace("`", "") for row in rows] == [mf.FINDING_CODES[code]]


def test_no_undocumented_codes(checker_section):
    assert set(re.findall(r"\bCM\d{3}\b", checker_section)) <= set(mf.FINDING_CODES)


def test_exit_statuses_documented(checker_section):
    for status in ("0", "1", "2"):
        assert re.search(rf"^- {status}: ", checker_section, re.MULTILINE), \
            f"exit status {status} is not documented"


def test_hook_documented():
    hooks = re.findall(r"^- id: (\S+)", (REPO / ".pre-commit-hooks.yaml").read_text(), re.MULTILINE)
    assert hooks == ["check-manifests"]
    section = _section(VENDORING, "Pre-commit hooks")
    for hook in hooks:
        assert f"id: {hook}" in section
    assert "rev:" in section and "repo:" in section
    assert "language: script" in section


def test_readme_links_the_reference_pages():
    text = README.read_text()
    for page in (PROGRAMS, VENDORING):
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def test_manifest_and_render_sections():
    assert "cake_library" in _section(PROGRAMS, "Digest")
    assert "--check" in _section(PROGRAMS, "Rendering")
    assert "// cake:entries" in PROGRAMS.read_text()  # the rendered entries block (CM309)
