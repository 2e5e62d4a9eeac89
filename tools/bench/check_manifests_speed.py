#!/usr/bin/env python3
"""How fast ``check_manifests`` checks the real tree, a large tree and a 10 MB input.

Three figures, each the median wall time of ``--repeat`` runs in process (files already in the
page cache, imports done):

* **the real tree**: the manifests of this repository (what ``check_manifests`` checks with no
  argument here);
* **``--programs`` programs** (default 1,000): a synthetic repository layout in a temporary
  folder, ``--families`` families, each program a kernel and a binding source of about
  ``--source-kib`` KiB (default 5: about 10 MB of sources), all including one shared header;
  it must check clean;
* **a ``--input-mb`` MB input** (default 10): one program of a small tree whose kernel (or
  binding) source is that many MB of one adversarial shape, its sha256 recorded so the checker
  scans it: newlines (alone, then inside a pending ``CAKE_EXPORT``), lines of one name inside a
  pending ``CAKE_EXPORT``, ``CAKE_EXPORT x`` lines,
  one line of quotes each escaping the next, entries-block start markers without an end marker,
  one identifier, kernels the manifest does not list, unclosed ``__launch_bounds__(``
  parentheses; and as many newlines failing the sha256 (not scanned). The shapes are
  tests/check/test_linear_scans.py's, whose counted work grows tenfold when they do.

``--cli`` also times the command line on the synthetic tree (``python tools/check_manifests.py
ROOT``), interpreter start included.

Usage: ``python tools/bench/check_manifests_speed.py [--programs 1000] [--input-mb 10] [--cli]``
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake import checker  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

HEADER = "cake/bench.h"
ENTRIES = (mf.Entry("forward", (mf.Argument("x", "pointer"), mf.Argument("n", "i32"))),)


def _body(kib: int, seed: int) -> str:
    """About ``kib`` KiB of plausible CUDA-looking text, different per program."""
    line = "  acc = fmaf(x[i + {k}], w[{k} % 64], acc);  // step {k} of program {seed}\n"
    lines, size, k = [], 0, 0
    while size < kib * 1024:
        text = line.format(k=k, seed=seed)
        lines.append(text)
        size += len(text)
        k += 1
    return "".join(lines)


def _texts(kib: int, seed: int) -> dict:
    """The sources of one program (the library name still the placeholder): a kernel and a
    binding that exports the declared entry and the identity exports."""
    library = mf.LIBRARY_PLACEHOLDER
    return {
        "kernel": (f'#include "{HEADER}"\n'
                   f'extern "C" __global__ void kernel_{library}_forward('
                   f"const float* x, const float* w, float* y) {{\n  float acc = 0;\n"
                   f"  int i = threadIdx.x;\n{_body(kib, seed)}  y[i] = acc;\n}}\n"),
        "binding": (f'#include "{HEADER}"\n{mf.entries_block(ENTRIES)}'
                    f'CAKE_EXPORT const char* {library}_digest(void) {{ return ""; }}\n'
                    f"CAKE_EXPORT int {library}_abi_version(void) {{ return 2; }}\n"
                    f"CAKE_EXPORT int {library}_forward(const long* args, int nargs) {{\n"
                    f"{_body(kib, seed)}  return 0;\n}}\n"),
    }


def build_tree(root: Path, families: int, programs: int, kib: int) -> int:
    """Writes the synthetic tree; returns the number of files the checker reads."""
    include = root / "csrc" / "include"
    (include / "cake").mkdir(parents=True)
    header_bytes = b"#pragma once\n#define CAKE_EXPORT extern \"C\"\n"
    (include / HEADER).write_bytes(header_bytes)
    header = mf.Header(HEADER, mf.sha256_hex(header_bytes))
    (root / "manifests").mkdir()
    files = 1
    for f in range(families):
        name = f"cake_bench{f}_det_train"
        csrc = root / "csrc" / name
        csrc.mkdir(parents=True)
        listed = []
        count = programs // families + (1 if f < programs % families else 0)
        for p in range(count):
            seed = f * 100_000 + p
            texts = _texts(kib, seed)
            digest = mf.program_digest(mf.LIBRARY_PLACEHOLDER,
                                       [(r, t.encode()) for r, t in texts.items()],
                                       [header.sha256], [])
            library = mf.library_name(name, digest, False)
            sources = []
            for role, text in texts.items():
                data = text.replace(mf.LIBRARY_PLACEHOLDER, library).encode()
                file_name = mf.source_file_name(library, role)
                (csrc / file_name).write_bytes(data)
                sources.append(mf.Source(role, file_name, mf.sha256_hex(data)))
                files += 1
            listed.append(mf.Program(
                library=library, digest=digest, kind="cuda", kcp=False, variant={"seed": seed},
                route={"min_tokens": 0}, arches=("sm_90a", "sm_100a"), sources=tuple(sources),
                headers=(HEADER,), entries=ENTRIES, kernels=(f"kernel_{library}_forward",),
                flags=()))
        manifest = mf.Manifest(mf.SCHEMA_VERSION, f"{mf.REPO_PACKAGE}.{name}", name, (header,),
                               tuple(sorted(listed, key=lambda p: p.library)))
        mf.write(manifest, root / "manifests" / f"{name}.json")
        files += 1
    return files


def check_once(root: Path, paths: list | None = None) -> tuple[float, int, int]:
    """One check of the trees ``paths`` name (default: ``root`` itself; ``[]``: the manifests of
    the git repository ``root`` is in); (seconds, findings, programs)."""
    start = time.perf_counter()
    findings, programs = [], 0
    for tree in checker.find_trees([str(root)] if paths is None else paths, root):
        tree_findings, count = checker.check_tree(tree)
        findings += tree_findings
        programs += count
    elapsed = time.perf_counter() - start
    return elapsed, len(findings), programs


def median_check(root: Path, repeat: int, paths: list | None = None) -> tuple[float, int, int]:
    check_once(root, paths)  # warm-up: page cache, imports, regex compilation
    runs = [check_once(root, paths) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]


# name -> (role of the source that grows, what comes first, one unit of it): the shapes of
# tests/check/test_linear_scans.py
SHAPES = {
    "newlines": ("kernel", b"", b"\n"),
    "newlines in a pending export": ("binding", b"CAKE_EXPORT", b"\n"),
    "lines of a name, pending export": ("binding", b"CAKE_EXPORT\n", b"x\n"),
    "CAKE_EXPORT x lines": ("binding", b"", b"CAKE_EXPORT x\n"),
    "one line of escaped quotes": ("kernel", b'__global__ "', b'\\"'),
    "entries start markers, no end": ("binding", b"", b"// cake:entries\n"),
    "one identifier": ("binding", b"CAKE_EXPORT ", b"a"),
    "unlisted kernels": ("kernel", b"", b'extern "C" __global__ void stray(float* x) {}\n'),
    "unclosed __launch_bounds__(": ("kernel", b"__global__ __launch_bounds__", b"("),
}
FAILING = "newlines failing the sha256"


def input_figures(megabytes: float, repeat: int) -> list[tuple[str, float, int]]:
    """(shape, median seconds, findings) of a check of a one-program tree whose source holds
    ``megabytes`` MB of each adversarial shape, its sha256 recorded, then of as many newlines
    failing the source's sha256."""
    results = []
    with tempfile.TemporaryDirectory(prefix="cake-bench-input-") as temporary:
        root = Path(temporary)
        build_tree(root, 1, 1, 1)
        path = root / "manifests" / "cake_bench0_det_train.json"
        manifest = mf.read(path)
        program = manifest.programs[0]
        size = int(megabytes * 1e6)
        for shape, (role, first, unit) in [*SHAPES.items(), (FAILING, ("kernel", b"", b"\n"))]:
            index = next(i for i, s in enumerate(program.sources) if s.role == role)
            source = program.sources[index]
            file = root / "csrc" / "cake_bench0_det_train" / source.path
            original = file.read_bytes()
            data = original.replace(b"// cake:end-entries\n", b"", 1) \
                if shape.startswith("entries") else original
            data += first + unit * ((size - len(first)) // len(unit)) + b"\n"
            file.write_bytes(data)
            sha = source.sha256 if shape == FAILING else mf.sha256_hex(data)
            sources = list(program.sources)
            sources[index] = mf.Source(source.role, source.path, sha)
            edited = dataclasses.replace(program, sources=tuple(sources))
            mf.write(dataclasses.replace(manifest, programs=(edited,)), path)
            seconds, findings, _ = median_check(root, repeat)
            results.append((shape, seconds, findings))
            file.write_bytes(original)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--families", type=int, default=4)
    parser.add_argument("--source-kib", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--input-mb", type=float, default=10.0,
                        help="size of the adversarial input (default: 10 MB)")
    parser.add_argument("--cli", action="store_true", help="also time the command line")
    args = parser.parse_args(argv)
    seconds, findings, programs = median_check(REPO, args.repeat, paths=[])
    print(f"the real tree: median {seconds:.3f} s of {args.repeat} (target: under 1 s), "
          f"{programs} program(s), {findings} finding(s)")
    print(f"a {args.input_mb:g} MB input, one program (median of {args.repeat}):")
    for shape, seconds, findings in input_figures(args.input_mb, args.repeat):
        print(f"  {shape:32s} {seconds:7.3f} s  {args.input_mb / seconds:6.1f} MB/s  "
              f"{findings} finding(s)")
    with tempfile.TemporaryDirectory(prefix="cake-bench-") as temporary:
        root = Path(temporary)
        files = build_tree(root, args.families, args.programs, args.source_kib)
        megabytes = sum(p.stat().st_size for p in (root / "csrc").rglob("*") if p.is_file()) / 1e6
        print(f"tree: {args.programs} programs in {args.families} families, {files} files, "
              f"{megabytes:.1f} MB of sources and headers")
        check_once(root)  # warm-up: page cache, imports, regex compilation
        times = []
        for _ in range(args.repeat):
            elapsed, findings, programs = check_once(root)
            if findings or programs != args.programs:
                print(f"unexpected: {findings} finding(s), {programs} program(s)", file=sys.stderr)
                return 1
            times.append(elapsed)
        median = statistics.median(times)
        print(f"check_manifests (in process): median {median:.3f} s of {args.repeat} "
              f"(target: under 1 s) "
              f"(min {min(times):.3f} s, max {max(times):.3f} s), "
              f"{files / median:,.0f} files/s, {megabytes / median:.0f} MB/s")
        if args.cli:
            cli = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = subprocess.run([sys.executable, str(REPO / "tools" / "check_manifests.py"),
                                         str(root)], capture_output=True, text=True)
                cli.append(time.perf_counter() - start)
                if result.returncode != 0:
                    print(result.stdout + result.stderr, file=sys.stderr)
                    return 1
            print(f"check_manifests (command line): median {statistics.median(cli):.3f} s "
                  f"of {args.repeat}, {files / statistics.median(cli):,.0f} files/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
