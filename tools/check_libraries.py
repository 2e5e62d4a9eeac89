#!/usr/bin/env python3
"""Checks that program libraries suit the manylinux wheel of one host machine.

Usage::

    python tools/check_libraries.py --machine aarch64 dist/cake_train-...aarch64.whl
    python tools/check_libraries.py --machine x86_64 build/.../lib/ some_library.so

Every ``.so`` in the given wheels, folders (recursively) and files must be:

- a 64-bit ELF shared library for ``--machine`` (``readelf -h``);
- NEEDED ``libc.so.6`` alone, with no RPATH or RUNPATH (``readelf -d``);
- bound to no glibc symbol version newer than the machine's glibc baseline, GLIBC_2.2.5 on
  x86_64 and GLIBC_2.17 on aarch64 (``readelf -V``): cake/driver.h binds dlopen, dlsym and
  dlerror to those versions, so auditwheel can give the wheel the oldest manylinux tag.

Prints one line a library with a problem, then a summary; exit 0 when every library passes,
1 otherwise, 2 on usage errors (no library found, readelf missing). binutils' ``readelf`` reads
any machine's ELF files, so this runs on the x86_64 build machine for aarch64 libraries too.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# readelf -h's "Machine:" text, and the oldest glibc symbol version, per host machine.
MACHINES = {
    "x86_64": ("Advanced Micro Devices X86-64", (2, 2, 5)),
    "aarch64": ("AArch64", (2, 17)),
}
ALLOWED_NEEDED = ("libc.so.6",)
_GLIBC_RE = re.compile(r"Name: GLIBC_(\d+(?:\.\d+)+)")


def glibc_versions(library: Path) -> list[tuple[int, ...]]:
    """The glibc symbol versions the library needs (its .gnu.version_r)."""
    text = _readelf("-V", library)
    needs = text.split("Version needs section", 1)
    return [tuple(int(part) for part in version.split("."))
            for version in _GLIBC_RE.findall(needs[1] if len(needs) > 1 else "")]


def problems(library: Path, machine: str) -> list[str]:
    """What is wrong with one library for ``machine`` (empty: nothing)."""
    expected_machine, baseline = MACHINES[machine]
    found = []
    header = _readelf("-h", library)
    if "ELF64" not in header or "DYN (Shared object file)" not in header:
        found.append("not a 64-bit ELF shared library")
    line = re.search(r"Machine:\s+(.+)", header)
    if line is None or line.group(1).strip() != expected_machine:
        found.append(f"built for {line.group(1).strip() if line else 'no machine'}, "
                     f"not {expected_machine}")
    dynamic = _readelf("-d", library)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    if tuple(needed) != ALLOWED_NEEDED:
        found.append(f"NEEDED {needed}, expected {list(ALLOWED_NEEDED)}")
    if "(RPATH)" in dynamic or "(RUNPATH)" in dynamic:
        found.append("has an RPATH or RUNPATH")
    newest = max(glibc_versions(library), default=None)
    if newest is not None and newest > baseline:
        found.append(f"needs GLIBC_{_dotted(newest)}, newer than GLIBC_{_dotted(baseline)}")
    return found


def libraries(paths: list[Path], scratch: Path) -> list[tuple[str, Path]]:
    """(name to report, file) for every .so in the wheels, folders and files given."""
    found = []
    for path in paths:
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                for member in sorted(n for n in wheel.namelist() if n.endswith(".so")):
                    target = scratch / str(len(found)) / Path(member).name
                    target.parent.mkdir(parents=True)
                    target.write_bytes(wheel.read(member))
                    found.append((f"{path.name}:{member}", target))
        elif path.is_dir():
            found += [(str(p), p) for p in sorted(path.rglob("*.so"))]
        else:
            found.append((str(path), path))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True, choices=sorted(MACHINES))
    parser.add_argument("paths", nargs="+", type=Path, help="wheels, folders or .so files")
    args = parser.parse_args(argv)
    if shutil.which("readelf") is None:
        print("check_libraries: readelf (binutils) is not on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        found = libraries(args.paths, Path(scratch))
        if not found:
            print("check_libraries: no .so file in the paths given", file=sys.stderr)
            return 2
        failed = 0
        newest = (0,)
        for name, library in found:
            for problem in problems(library, args.machine):
                print(f"{name}: {problem}")
                failed += 1
            newest = max(newest, *glibc_versions(library))
    expected_machine, _ = MACHINES[args.machine]
    print(f"check_libraries: {len(found)} libraries, {expected_machine}, NEEDED "
          f"{', '.join(ALLOWED_NEEDED)}, newest glibc symbol version GLIBC_{_dotted(newest)}: "
          f"{'ok' if not failed else f'{failed} problem(s)'}")
    return 1 if failed else 0


def _readelf(option: str, library: Path) -> str:
    return subprocess.run(["readelf", "-W", option, str(library)], capture_output=True,
                          text=True, check=True).stdout


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


if __name__ == "__main__":
    raise SystemExit(main())
