#!/usr/bin/env python3
"""Shows that two builds compiled the same device images: every image (fatbin or cubin) of the
second folder that the first also holds has the same bytes.

Usage: ``python tools/compare_images.py build/py3-none-linux_x86_64/images
build/py3-none-linux_aarch64/images``

A library's device code does not depend on the CPU it is built on, so the x86_64 wheel and the
cross-built aarch64 wheel carry the same images (ci/build_wheel.sh, CAKE_WHEEL_HOST=aarch64).
Exit 0 when at least one image is shared and all shared ones are equal, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path


IMAGE_SUFFIXES = (".fatbin", ".cubin")


def compare(first: Path, second: Path) -> tuple[list[str], list[str]]:
    """(names of the images in both folders, those whose bytes differ)."""
    shared = sorted(p.name for p in second.iterdir()
                    if p.suffix in IMAGE_SUFFIXES and (first / p.name).is_file())
    differ = [n for n in shared if (first / n).read_bytes() != (second / n).read_bytes()]
    return shared, differ


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(Path(a).is_dir() for a in args):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    first, second = (Path(a) for a in args)
    shared, differ = compare(first, second)
    print(f"compare_images: {len(shared)} images of {second} are also in {first}: "
          f"{len(shared) - len(differ)} byte-identical"
          + (f"; DIFFERENT: {', '.join(differ)}" if differ else ""))
    return 1 if differ or not shared else 0


if __name__ == "__main__":
    raise SystemExit(main())
