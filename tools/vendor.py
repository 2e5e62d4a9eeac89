#!/usr/bin/env python3
"""Copies cake-train family packages into a host library as self-contained packages.

Usage::

    python tools/vendor.py --into DIR --package-prefix PREFIX [--package NAME ...] [--force]
        [--repository ROOT]

For FlashInfer: ``--into flashinfer/experimental/cake --package-prefix
flashinfer.experimental.cake``. Each chosen family ``cake.<name>`` (default: every family
with a manifest in ``manifests/`` and a package in ``cake/``) becomes ``DIR/<name>/``:

* the family's modules (``cake/<name>/``), byte for byte except for one rewrite: family
  modules import the shared runtime only as ``from ..core import ...`` /
  ``from ..core.<module> import ...`` (or host code several families share as
  ``from .._shared.<module> import ...``) and that prefix becomes ``from .core`` (``from
  ._shared``). Nothing else is rewritten; any other import of ``cake`` (``import cake``,
  ``from cake.core ...``, ``from .. import core``, ``from ..checker ...``) stops the tool with
  the file and line;
* ``core/``: a verbatim copy of ``cake/core/`` (manifest model, loader, JIT, toolchain, the
  Triton compile, torch-side checks, plans and autograd), which imports only itself, the
  standard library and torch (and Triton, where it compiles or interprets Triton programs);
* ``_shared/``: verbatim copies of the ``cake/_shared/`` modules the family imports (they
  import only ``..core``, the standard library and torch), when it imports any;
* ``build.json``: the manifest with only ``package`` rewritten to ``PREFIX.<name>``;
* ``csrc/``: the sources the manifest lists and ``csrc/include/<header>`` for its headers,
  bytes unchanged (test-only programs of ``manifests/<name>.test.json`` are not vendored);
* ``VENDORED.json``: the source package, the cake-train version and git commit (of ``ROOT``
  when it is a git checkout; uncommitted changes are not recorded), the sha256 of the upstream
  manifest's canonical text and every file written with its sha256 (see
  :mod:`cake.vendor_plan`).

Re-running is idempotent: unchanged files are not touched. A file is overwritten or removed
only when the previous run's ``VENDORED.json`` lists it with the bytes it still has; a file
the tool did not write, or one edited since, stops the run (exit 1) unless ``--force``.
``PREFIX`` must be the package that ``DIR`` is in the host (``DIR/__init__.py`` and the
folders above it), so the vendored copy checks clean and imports as ``PREFIX.<name>``.
Every family must pass ``check_manifests`` before it is copied, and the copy must pass
``check_manifests --vendored-gate`` after, compared with ``ROOT`` (the gate of a host compares
it with the cake-train it runs from). What is written is :func:`cake.vendor_plan.plan`, which
the gate recomputes. Exit status: 0 done, 1 refused or findings, 2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake import checker, vendored  # noqa: E402
from cake.core import manifest as mf  # noqa: E402
from cake.vendor_plan import (SIDECAR_NAME, Plan, SidecarError, Upstream,  # noqa: E402
                              VendorError, kcp_base, plan, read_sidecar)


class UsageError(Exception):
    """A wrong argument or an I/O problem; exit 2 with the message."""


# --------------------------------------------------------------------------- the copy


def vendor_package(target: Path, planned: Plan, force: bool) -> tuple[int, int, int]:
    """Writes one vendored package; returns (written, unchanged, removed) file counts."""
    files = planned.files
    try:
        previous = read_sidecar(target)
    except SidecarError as exc:
        if not force:
            raise VendorError(f"{exc}; pass --force to rewrite the package") from None
        previous = None
    ours = previous.files if previous else {}
    stale = sorted(set(ours) - set(files))
    conflicts = []
    for relative in [*files, *stale]:
        path = target / relative
        if path.is_symlink() or (path.exists() and not path.is_file()):
            conflicts.append(f"{path} (not a regular file)")
        elif path.is_file():
            current = mf.sha256_hex(path.read_bytes())
            wanted = files.get(relative)
            if wanted is not None and current == mf.sha256_hex(wanted):
                continue
            if ours.get(relative) != current:
                why = "edited since it was vendored" if relative in ours else \
                    "not written by vendor.py"
                conflicts.append(f"{path} ({why})")
    if conflicts and not force:
        raise VendorError(f"refusing to overwrite or remove {len(conflicts)} file(s) that "
                          "tools/vendor.py did not write (or that were edited since); move them "
                          "away or pass --force:\n  " + "\n  ".join(conflicts))
    written = unchanged = removed = 0
    for relative, data in sorted(files.items()):
        path = target / relative
        if path.is_symlink() or path.is_dir():
            _remove(path)
        if mf.write_if_changed(path, data):
            written += 1
        else:
            unchanged += 1
    for relative in stale:
        path = target / relative
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed += 1
        for parent in PurePosixPath(relative).parents:
            folder = target / parent
            if folder != target and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    mf.write_if_changed(target / SIDECAR_NAME, planned.sidecar.to_json().encode())
    return written, unchanged, removed


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


def check_prefix(into: Path, prefix: str) -> None:
    """``PREFIX`` must be the package ``DIR`` is, or the copy would not check or import."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", prefix):
        raise UsageError(f"--package-prefix {prefix!r} is not a dotted Python package name")
    found = mf.dotted_package_name(into) if (into / "__init__.py").is_file() else None
    if found != prefix:
        where = (f"its __init__.py files make it the package {found!r}" if found
                 else f"{into / '__init__.py'} does not exist")
        raise UsageError(f"--package-prefix {prefix} does not match --into {into}: {where}. "
                         f"The host must make {into} the package {prefix} (an __init__.py in it "
                         "and in each folder above it up to the host's root)")


def vendor(root: Path, into: Path, prefix: str, names: Sequence[str],
           force: bool) -> list[str]:
    """Vendors the families; returns one report line each. Raises VendorError/UsageError."""
    check_prefix(into, prefix)
    try:
        upstream = Upstream.at(root / mf.REPO_PACKAGE)
    except VendorError as exc:
        raise UsageError(f"--repository {root}: {exc}") from None
    available = upstream.families()
    wanted = []
    for name in names or available:
        short = name[len(mf.REPO_PACKAGE) + 1:] if name.startswith(mf.REPO_PACKAGE + ".") else name
        if short not in available:
            raise UsageError(f"--package {name}: no manifests/{short}.json with a cake/{short}/ "
                             f"package in {root} (families: {', '.join(available) or 'none'})")
        base = kcp_base(short)
        wanted += [base, short] if base else [short]  # a KCP family runs its base's programs
    if not wanted:
        raise UsageError(f"{root}: no family to vendor (no manifests/<name>.json with a "
                         f"cake/<name>/ package)")
    plans = {name: plan(upstream, name, f"{prefix}.{name}") for name in dict.fromkeys(wanted)}
    lines = []
    for name, planned in plans.items():
        target = into / name
        written, unchanged, removed = vendor_package(target, planned, force)
        sidecar = planned.sidecar
        findings = gate(target, sidecar.package, upstream)
        if findings:
            raise VendorError(f"{target}: the vendored copy fails the vendored gate:\n  "
                              + "\n  ".join(str(f) for f in findings))
        lines.append(f"vendor: {sidecar.source_package} -> {target} as {sidecar.package} "
                     f"({written} written, {unchanged} unchanged, {removed} removed)")
    return lines


def gate(package_dir: Path, package: str, upstream: Upstream) -> list:
    """What ``check_manifests --vendored-gate --package <package>`` finds in the copy when it
    runs from ``upstream``."""
    tree = mf.package_tree(package_dir, owner=package)
    return sorted(vendored.check_package(package_dir, package, upstream)
                  + checker.check_tree(tree)[0])


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vendor", description="Copy cake-train family packages into a host library.")
    parser.add_argument("--into", type=Path, required=True,
                        help="host folder that receives <package>/ (e.g. "
                             "flashinfer/experimental/cake)")
    parser.add_argument("--package-prefix", required=True,
                        help="dotted package of --into (e.g. flashinfer.experimental.cake)")
    parser.add_argument("--package", action="append", default=[],
                        help="family to vendor, cake_<op>_<mode>_train or cake.<that> "
                             "(repeatable; default: every family)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite or remove files vendor.py did not write")
    parser.add_argument("--repository", type=Path, default=REPO,
                        help="cake-train checkout to copy from (default: this one)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        lines = vendor(args.repository.resolve(), args.into.resolve(), args.package_prefix,
                       args.package, args.force)
    except VendorError as exc:
        print(f"vendor: error: {exc}", file=sys.stderr)
        return 1
    except (UsageError, checker.UsageError) as exc:
        print(f"vendor: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, mf.ManifestError) as exc:
        print(f"vendor: error: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
