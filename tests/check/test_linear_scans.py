"""The checker's work grows linearly with its input, counted, never timed.

Each adversarial source is checked at two sizes, the second ten times the first; the work the
checker does on it (``checker.Work``: the scans' operations, one a line, one a character
searched or examined and one a token taken, and the characters the entries-block search
examined) must grow about tenfold, and every payload unit must cost at least one operation (the
counter sees the payload). The source's sha256 is recorded each time, so the checker does scan
it. A source whose bytes differ from its sha256 is not scanned at all: its work does not grow,
whatever its size (tools/bench/check_manifests_speed.py times the same shapes at 10 MB).

What the counter cannot see is a regular expression's own backtracking; the tokeniser's pattern
is written so that no attempt fails after its first character (cake/core/manifest.py,
``_TOKEN_RE``), and the last test here checks that property on the line that used to defeat it.
"""

from __future__ import annotations

import pytest
from toy_tree import FAMILY_A, Layout

from cake import checker
from cake.core import manifest as mf

GROWTH = 10


def _append(payload: bytes):
    return lambda data, n: data + payload * n


def _without_end_marker(data: bytes, n: int) -> bytes:
    """Start markers with no end marker after them: a search from every start marker for an end
    marker is quadratic; the checker's is two searches."""
    return data.replace(b"// cake:end-entries\n", b"") + b"// cake:entries\n" * n


# name -> (role of the edited source, edit(bytes, n) -> bytes, n of the smaller size)
PAYLOADS = {
    # 100 KB -> 1 MB of newlines in a listed kernel source: skipped by one search
    "newlines": ("kernel", _append(b"\n"), 100_000),
    # the same inside a pending export: skipped by one match
    "newlines-in-a-pending-export": ("binding",
                                     lambda data, n: data + b"CAKE_EXPORT" + b"\n" * n, 100_000),
    # lines of one name inside a pending export: each line read on its own
    "lines-in-a-pending-export": ("binding",
                                  lambda data, n: data + b"CAKE_EXPORT\n" + b"x\n" * n, 10_000),
    # `CAKE_EXPORT x` lines x 800 -> x 8000 in the binding (an export never closed by its "(")
    "export-lines": ("binding", _append(b"CAKE_EXPORT x\n"), 800),
    # one line of quotes, each escaping the next: the old tokeniser rescanned the line from every
    # quote (cubic in practice: 8000 characters took 3 s)
    "open-literal-line": ("kernel", lambda data, n: data + b'__global__ "' + b'\\"' * n + b"\n",
                          10_000),
    # the entries block's start marker x 800 -> x 8000 and no end marker
    "entries-start-markers": ("binding", _without_end_marker, 800),
    # 800 -> 8000 kernels the manifest does not list (a CM306 finding each)
    "unlisted-kernels": ("kernel", _append(b'extern "C" __global__ void stray(float* x) {}\n'),
                         800),
    # a __launch_bounds__ whose parentheses never close
    "open-parentheses": ("kernel",
                         lambda data, n: data + b"__global__ __launch_bounds__" + b"(" * n + b"\n",
                         10_000),
    # one identifier of 100 KB -> 1 MB
    "long-identifier": ("binding", lambda data, n: data + b"CAKE_EXPORT " + b"a" * n + b"\n",
                        100_000),
}


def _check(layout: Layout) -> tuple[checker.Work, list[mf.Finding]]:
    work = checker.Work()
    findings, _ = checker.check_tree(layout.tree, work)
    return work, findings


def _work_with(layout: Layout, role: str, data: bytes, *, record_sha: bool = True):
    layout.edit_source(0, role, lambda _: data, update_sha=record_sha)
    return _check(layout)


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_source_grown_tenfold_takes_about_tenfold_work(toy, name):
    role, edit, n = PAYLOADS[name]
    layout = toy.tree(FAMILY_A)
    original = layout.source(0, role).read_bytes()
    base, _ = _work_with(layout, role, edit(original, 0))
    small, _ = _work_with(layout, role, edit(original, n))
    large, _ = _work_with(layout, role, edit(original, n * GROWTH))
    assert small.scans == large.scans == base.scans  # each source scanned once, whatever it holds
    grown_small = small.operations - base.operations
    grown_large = large.operations - base.operations
    assert grown_small >= n, f"{name}: the counter does not see the payload ({grown_small} < {n})"
    assert 0.9 * GROWTH <= grown_large / grown_small <= 1.1 * GROWTH, \
        f"{name}: {grown_small} -> {grown_large} operations for a {GROWTH}x larger payload"


@pytest.mark.parametrize("role", ["kernel", "binding"])
def test_a_source_that_fails_its_sha256_is_not_scanned(toy, role):
    layout = toy.tree(FAMILY_A)
    program = layout.manifest().programs[0]
    original = layout.source(0, role).read_bytes()
    clean, _ = _check(layout)
    works = []
    for n in (100_000, 100_000 * GROWTH):  # 100 KB -> 1 MB of newlines and export lines
        work, findings = _work_with(layout, role, original + b"\nCAKE_EXPORT x\n" * n,
                                    record_sha=False)
        field = f"programs[0].sources[{layout.source_index(0, role)}].sha256"
        assert [(f.code, f.field) for f in findings] == [("CM304", field)]
        # None of the program's sources is scanned (its symbols and includes are not checked
        # against bytes that are not the recorded ones); the other programs' are, as before.
        assert work.scans == clean.scans - len(program.sources)
        works.append(work.operations)
    assert works[0] == works[1] < clean.operations


def test_the_counter_counts_searched_and_examined_characters_lines_and_tokens():
    text = 'int a;\n#include "cake/a.h"\n__global__ void kernel_x(float* p) {}  // c\n"open \\"'
    found = mf.scan(text)
    lines = text.split("\n")
    # searched to the first word that can matter ("include"), then that line read whole (a
    # preprocessor line), the next (it starts with "__global__") up to its comment's "/", with
    # its tokens; then the search to the end, past the open literal's line
    searched = text.index("include") + len(lines[3])
    read = (1 + len(lines[1])) + (1 + lines[2].index("//") + 1)
    tokens = ["__global__", "void", "kernel_x", "(", "float", "*", "p", ")", "{", "}"]
    assert found.operations == searched + read + len(tokens)
    assert found.operations <= 3 * len(text) + len(lines)
    assert (found.kernels, found.includes) == (["kernel_x"], ["cake/a.h"])


def test_an_open_literal_is_one_token_to_the_end_of_its_line():
    """The tokeniser never falls back to a one-character token at a quote: an attempt at a quote
    ends at its closing quote or at the end of the line, so no character is examined twice (the
    old pattern failed at every quote of this line after reading the rest of it)."""
    line = '"\\' * 1000 + ' __global__ void hidden(float* p) {}'
    for quote in ('"', "'"):
        text = line.replace('"', quote)
        match = mf._TOKEN_RE.match(text)
        assert match.end() == len(text) and match.lastgroup is None
        assert mf.scan("CAKE_EXPORT " + text).kernels == []
    closed = mf._TOKEN_RE.match('"a\\"b" x')
    assert closed.group() == '"a\\"b"' and closed.lastgroup == "close"
