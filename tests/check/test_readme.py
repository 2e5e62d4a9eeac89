"""README.md documents every finding code and the pre-commit hook (the user's reference)."""

from __future__ import annotations

import re

import pytest
from toy_tree import REPO

from cake.core import manifest as mf

README = REPO / "README.md"


def _section(title: str) -> str:
    """The text under the heading ``title`` up to the next heading of the same or a higher
    level; ``#`` lines inside fenced code blocks are not headings."""
    lines = README.read_text().splitlines()
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
    assert start, f"README.md has no '{title}' section"
    return "\n".join(body)


@pytest.fixture(scope="module")
def checker_section() -> str:
    assert README.is_file(), "README.md is missing"
    return _section("check_manifests")


@pytest.mark.parametrize("code", sorted(mf.FINDING_CODES))
def test_finding_code_documented(checker_section, code):
    assert re.search(rf"^\| {code} \| .+ \|$", checker_section, re.MULTILINE), \
        f"README.md's check_manifests table has no row for {code}"


def test_no_undocumented_codes_in_readme(checker_section):
    assert set(re.findall(r"\bCM\d{3}\b", checker_section)) <= set(mf.FINDING_CODES)


def test_hook_documented(checker_section):
    hooks = re.findall(r"^- id: (\S+)", (REPO / ".pre-commit-hooks.yaml").read_text(), re.MULTILINE)
    assert hooks == ["check-manifests"]
    for hook in hooks:
        assert f"id: {hook}" in checker_section
    assert "rev:" in checker_section and "repo:" in checker_section
    for status in ("0", "1", "2"):
        assert re.search(rf"^- {status}: ", checker_section, re.MULTILINE), \
            f"exit status {status} is not documented"


def test_manifest_and_render_sections():
    assert "cake_library" in _section("Manifests and digests")
    assert "--check" in _section("Rendering programs")
