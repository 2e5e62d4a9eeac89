#!/usr/bin/env python3
"""What a wheel's program libraries weigh, against the size targets.

Usage: ``python tools/sizes.py WHEEL [--json FILE]``

Prints one line per arch (libraries, median and largest library, their bytes in the wheel) and
the targets: the median sm_90a library at most 120 KB; a wheel of every program for sm_90a,
sm_100a and sm_103a at most 9 MB; and the projection per 100 programs for three arches (the
wheel's compressed library bytes per (program, arch), times 300) at most 20 MB, the budget
that keeps a wheel of a few hundred programs under PyPI's 100 MB. Exit 0 when every target that
applies to the wheel is met, 1 otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import zipfile
from pathlib import Path

KB, MB = 1000, 1000 * 1000
TARGETS = {"median_sm_90a_library": 120 * KB, "three_arch_wheel": 9 * MB,
           "per_100_programs_3_arches": 20 * MB}
_LIBRARY_RE = re.compile(r".*/lib/(?P<library>\w+)_(?P<arch>sm_\d+a)\.so$")


def measure(wheel: Path) -> dict:
    """Sizes of the wheel and of its program libraries, by arch."""
    libraries = {}
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            match = _LIBRARY_RE.fullmatch(info.filename)
            if match:
                libraries.setdefault(match["arch"], []).append(
                    (match["library"], info.file_size, info.compress_size))
    programs = {name for rows in libraries.values() for name, _, _ in rows}
    compressed = sum(c for rows in libraries.values() for _, _, c in rows)
    count = sum(len(rows) for rows in libraries.values())
    return {
        "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "programs": len(programs),
        "arches": {arch: {"libraries": len(rows),
                          "median_bytes": int(statistics.median(s for _, s, _ in rows)),
                          "largest_bytes": max(s for _, s, _ in rows),
                          "bytes": sum(s for _, s, _ in rows),
                          "compressed_bytes": sum(c for _, _, c in rows)}
                   for arch, rows in sorted(libraries.items())},
        "per_100_programs_3_arches_bytes": int(compressed / count * 300) if count else 0,
    }


def verdicts(sizes: dict) -> list[tuple[str, int, int, bool]]:
    """(target, measured, limit, met) for each target the wheel can be held to."""
    found = []
    if "sm_90a" in sizes["arches"]:
        median = sizes["arches"]["sm_90a"]["median_bytes"]
        found.append(("median sm_90a library", median, TARGETS["median_sm_90a_library"],
                      median <= TARGETS["median_sm_90a_library"]))
    if {"sm_90a", "sm_100a", "sm_103a"} <= set(sizes["arches"]):
        found.append(("wheel for sm_90a + sm_100a + sm_103a", sizes["wheel_bytes"],
                      TARGETS["three_arch_wheel"],
                      sizes["wheel_bytes"] <= TARGETS["three_arch_wheel"]))
    if sizes["arches"]:
        projected = sizes["per_100_programs_3_arches_bytes"]
        found.append(("projection per 100 programs x 3 arches", projected,
                      TARGETS["per_100_programs_3_arches"],
                      projected <= TARGETS["per_100_programs_3_arches"]))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="sizes", description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    sizes = measure(args.wheel)
    print(f"{sizes['wheel']}: {sizes['wheel_bytes'] / MB:.2f} MB, {sizes['programs']} programs")
    print(f"{'arch':<8} {'libraries':>9} {'median':>10} {'largest':>10} {'total':>10} "
          f"{'in wheel':>10}")
    for arch, row in sizes["arches"].items():
        print(f"{arch:<8} {row['libraries']:>9} {row['median_bytes'] / KB:>7.1f} KB "
              f"{row['largest_bytes'] / KB:>7.1f} KB {row['bytes'] / MB:>7.2f} MB "
              f"{row['compressed_bytes'] / MB:>7.2f} MB")
    results = verdicts(sizes)
    for target, measured, limit, met in results:
        print(f"{'met ' if met else 'MISSED'} {target}: {measured / MB:.3f} MB "
              f"(at most {limit / MB:.3f} MB)")
    if args.json:
        args.json.write_text(json.dumps(
            dict(sizes, targets=[dict(zip(("target", "measured", "limit", "met"), r))
                                 for r in results]), indent=2) + "\n")
    return 0 if all(met for *_, met in results) else 1


if __name__ == "__main__":
    sys.exit(main())
