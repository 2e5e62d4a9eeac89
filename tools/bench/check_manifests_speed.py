#!/usr/bin/env python3
"""How fast ``check_manifests`` checks a large tree.

Builds a synthetic repository layout in a temporary folder: ``--families`` families with
``--programs`` programs in all (default 1,000), each a kernel and a binding source of about
``--source-kib`` KiB (default 5: about 10 MB of sources), all including one shared header; then
times ``check_manifests`` over it (in process, the tree already in the page cache) and prints
the median wall time of ``--repeat`` runs and the files (sources + headers + manifests) per
second. ``--cli`` also times the command line (``python tools/check_manifests.py ROOT``),
interpreter start included.

Usage: ``python tools/bench/check_manifests_speed.py [--programs 1000] [--cli]``
"""

from __future__ import annotations

import argparse
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
            texts = {
                "kernel": (f'#include "{HEADER}"\n'
                           f"__global__ void kernel_{mf.LIBRARY_PLACEHOLDER}_forward("
                           f"const float* x, const float* w, float* y) {{\n  float acc = 0;\n"
                           f"  int i = threadIdx.x;\n{_body(kib, seed)}  y[i] = acc;\n}}\n"),
                "binding": (f'#include "{HEADER}"\n'
                            f"CAKE_EXPORT int {mf.LIBRARY_PLACEHOLDER}_forward("
                            f"const long* args, int nargs) {{\n{_body(kib, seed)}  return 0;\n}}\n"),
            }
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
                library=library, digest=digest, kcp=False, variant={"seed": seed},
                route={"min_tokens": 0}, arches=("sm_90a", "sm_100a"), sources=tuple(sources),
                headers=(HEADER,), entries=(f"{library}_forward",),
                kernels=(f"kernel_{library}_forward",), flags=()))
        manifest = mf.Manifest(mf.SCHEMA_VERSION, f"{mf.REPO_PACKAGE}.{name}", name, (header,),
                               tuple(sorted(listed, key=lambda p: p.library)))
        mf.write(manifest, root / "manifests" / f"{name}.json")
        files += 1
    return files


def check_once(root: Path) -> tuple[float, int, int]:
    start = time.perf_counter()
    findings, programs = [], 0
    for tree in checker.find_trees([str(root)], root):
        tree_findings, count = checker.check_tree(tree)
        findings += tree_findings
        programs += count
    elapsed = time.perf_counter() - start
    return elapsed, len(findings), programs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--families", type=int, default=4)
    parser.add_argument("--source-kib", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="also time the command line")
    args = parser.parse_args(argv)
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
