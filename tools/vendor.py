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
* ``VENDORED.json``: the source package, the cake-train version, the sha256 of the upstream
  manifest's canonical text and every file written with its sha256 (see :mod:`cake.vendored`).

Re-running is idempotent: unchanged files are not touched. A file is overwritten or removed
only when the previous run's ``VENDORED.json`` lists it with the bytes it still has; a file
the tool did not write, or one edited since, stops the run (exit 1) unless ``--force``.
``PREFIX`` must be the package that ``DIR`` is in the host (``DIR/__init__.py`` and the
folders above it), so the vendored copy checks clean and imports as ``PREFIX.<name>``.
Every family must pass ``check_manifests`` before it is copied, and the copy must pass
``check_manifests --vendored-gate`` after. Exit status: 0 done, 1 refused or findings,
2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import cake  # noqa: E402
from cake import checker, vendored  # noqa: E402
from cake.core import manifest as mf  # noqa: E402

CORE = "core"
SHARED = "_shared"
# The runtime packages a family module may import (the rewrite moves them one level in).
_RUNTIME = (CORE, SHARED)
# Names the vendored layout uses next to the family's own modules.
_RESERVED = {CORE, SHARED, "csrc", "lib", mf.MANIFEST_NAME, mf.TEST_MANIFEST_NAME,
             vendored.SIDECAR_NAME}
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = {".pyc", ".pyo", ".so"}


class VendorError(Exception):
    """Something the maintainer must fix; exit 1 with the message."""


class UsageError(Exception):
    """A wrong argument or an I/O problem; exit 2 with the message."""


# --------------------------------------------------------------------------- import rewrite


def rewrite_core_imports(text: str, path: str, depth: int) -> str:
    """``from ..core`` -> ``from .core`` (and ``from .._shared`` -> ``from ._shared``) in one
    family module, ``depth`` folders below the family.

    Every other import that leaves the family package (or names ``cake``) raises
    :class:`VendorError` naming the file and line.
    """
    try:
        tree = ast.parse(text, path)
    except SyntaxError as exc:
        raise VendorError(f"{path}:{exc.lineno}: cannot parse: {exc.msg}") from None
    up = depth + 2  # the dots that reach cake/ from this file
    core_dots = "." * up + CORE
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == mf.REPO_PACKAGE:
                    raise _other_cake_import(path, node.lineno, f"import {alias.name}", core_dots)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] == mf.REPO_PACKAGE:
                raise _other_cake_import(path, node.lineno, f"from {module}", core_dots)
            if node.level < up:
                continue  # inside the family package
            # A shared module by name (from .._shared.<module> import ..., or
            # from .._shared import <module>, ...), never the folder's * .
            if node.level == up and module.split(".")[0] in _RUNTIME and (
                    module != SHARED or all(alias.name != "*" for alias in node.names)):
                edits.append(node)
            else:
                raise _other_cake_import(path, node.lineno,
                                         f"from {'.' * node.level}{module}", core_dots)
    if not edits:
        return text
    lines = text.splitlines(keepends=True)
    pattern = re.compile(rb"from(\s+)" + re.escape(b"." * up) + rb"(core|_shared)\b")
    # Right to left, so that an earlier edit never moves a later one's column.
    for node in sorted(edits, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        line = lines[node.lineno - 1].encode()
        match = pattern.match(line, node.col_offset)
        if match is None:
            raise VendorError(f"{path}:{node.lineno}: cannot rewrite this import of {core_dots} "
                              f"(write it on one line as 'from {core_dots} import ...')")
        replacement = b"from" + match.group(1) + b"." * (up - 1) + match.group(2)
        lines[node.lineno - 1] = (line[:match.start()] + replacement
                                  + line[match.end():]).decode()
    rewritten = "".join(lines)
    _check_rewrite(tree, ast.parse(rewritten, path), path)
    return rewritten


def _other_cake_import(path: str, line: int, what: str, core_dots: str) -> VendorError:
    return VendorError(f"{path}:{line}: '{what}' reaches cake-train outside the family; a "
                       f"family module may import the shared runtime only as "
                       f"'from {core_dots} import ...' (vendoring rewrites exactly that)")


def _check_rewrite(before: ast.AST, after: ast.AST, path: str) -> None:
    """The rewrite changed nothing but the level of the ``core`` imports, by one."""
    old = [n for n in ast.walk(before) if isinstance(n, ast.ImportFrom)]
    new = [n for n in ast.walk(after) if isinstance(n, ast.ImportFrom)]
    changed = [(a.module, b.module, a.level - b.level) for a, b in zip(old, new)
               if (a.module, a.level) != (b.module, b.level)]
    if len(old) != len(new) or any(m != n or d != 1 for m, n, d in changed):
        raise VendorError(f"{path}: the import rewrite changed more than 'from ..core' "
                          "(please report this as a cake-train bug)")


def _check_core_imports(text: str, path: str, depth: int, allowed: str | None = None) -> None:
    """``cake/core`` must import only itself (a shared module: itself and ``allowed``,
    ``..core``): both are copied verbatim."""
    for node in ast.walk(ast.parse(text, path)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > depth + 1:
                names = ["." * node.level + (node.module or "")]
            elif node.level == 0:
                names = [node.module or ""]
        for name in names:
            if allowed and (name == allowed or name.startswith(allowed + ".")):
                continue
            if name.startswith(".") or name.split(".")[0] == mf.REPO_PACKAGE:
                raise VendorError(f"{path}:{node.lineno}: {path} imports {name}; it is copied "
                                  "verbatim into each vendored package, so it may import only "
                                  "itself (relatively), ..core (a shared module), the standard "
                                  "library, torch and triton")


def _shared_modules(text: str, path: str) -> list[str]:
    """The ``cake/_shared`` modules one family module imports (``from .._shared.<name> import
    ...`` or ``from .._shared import <name>, ...``)."""
    found = []
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            module = node.module or ""
            if module.startswith(SHARED + "."):
                found.append(module.split(".")[1])
            elif module == SHARED:
                found.extend(alias.name for alias in node.names)
    return found


# --------------------------------------------------------------------------- the copy


def family_names(root: Path) -> list[str]:
    """Families with a manifest and a package: what is vendored when no --package is given."""
    return [name for name in mf.repository_families(root)
            if (root / mf.REPO_PACKAGE / name / "__init__.py").is_file()]


def planned_files(root: Path, name: str, package: str) -> tuple[dict[str, bytes], str]:
    """(package-relative path -> bytes, upstream manifest sha256) for one vendored family."""
    tree = mf.repository_tree(root, name)
    findings, _ = checker.check_tree(tree)
    if findings:
        raise VendorError(f"{tree.owner} fails check_manifests, so it is not vendored:\n  "
                          + "\n  ".join(str(f) for f in sorted(findings)))
    manifest = mf.read(tree.manifest_path)
    files: dict[str, bytes] = {}
    family_dir = root / mf.REPO_PACKAGE / name
    shared: list[str] = []
    for relative, path in _module_files(family_dir):
        if relative.parts[0] in _RESERVED:
            raise VendorError(f"{path}: the name {relative.parts[0]!r} is taken by the vendored "
                              "layout (core/, _shared/, csrc/, lib/, build.json, VENDORED.json)")
        data = path.read_bytes()
        if path.suffix == ".py":
            text = data.decode("utf-8")
            shared += _shared_modules(text, str(path))
            data = rewrite_core_imports(text, str(path), len(relative.parts) - 1).encode("utf-8")
        files[relative.as_posix()] = data
    if shared:
        for module in ["__init__", *dict.fromkeys(shared)]:
            path = root / mf.REPO_PACKAGE / SHARED / f"{module}.py"
            if not path.is_file():
                raise VendorError(f"{path}: a family imports it, and it does not exist")
            data = path.read_bytes()
            _check_core_imports(data.decode("utf-8"), str(path), 0, allowed="..core")
            files[f"{SHARED}/{module}.py"] = data
    for relative, path in _module_files(root / mf.REPO_PACKAGE / CORE):
        data = path.read_bytes()
        if path.suffix == ".py":
            _check_core_imports(data.decode("utf-8"), str(path), len(relative.parts) - 1)
        files[f"{CORE}/{relative.as_posix()}"] = data
    files[mf.MANIFEST_NAME] = mf.to_json(mf.with_package(manifest, package)).encode()
    for program in manifest.programs:
        for source in program.sources:
            files[f"csrc/{source.path}"] = tree.source_path(source).read_bytes()
    for header in manifest.headers:
        files[f"csrc/include/{header.path}"] = tree.header_path(header.path).read_bytes()
    upstream = mf.sha256_hex(mf.to_json(manifest).encode())
    return files, upstream


def _module_files(directory: Path) -> list[tuple[PurePosixPath, Path]]:
    if not (directory / "__init__.py").is_file():
        raise VendorError(f"{directory}: not a Python package (no __init__.py)")
    found = []
    for path in sorted(directory.rglob("*")):
        relative = PurePosixPath(path.relative_to(directory).as_posix())
        if path.is_symlink():
            raise VendorError(f"{path}: a symbolic link; vendoring copies regular files only")
        if (path.is_file() and path.suffix not in _SKIPPED_SUFFIXES
                and not _SKIPPED_DIRS & set(relative.parts)):
            found.append((relative, path))
    return found


def vendor_package(target: Path, files: dict[str, bytes], sidecar: vendored.Sidecar,
                   force: bool) -> tuple[int, int, int]:
    """Writes one vendored package; returns (written, unchanged, removed) file counts."""
    try:
        previous = vendored.read_sidecar(target)
    except vendored.SidecarError as exc:
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
    mf.write_if_changed(target / vendored.SIDECAR_NAME, sidecar.to_json().encode())
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
    available = mf.repository_families(root)
    wanted = []
    for name in names or family_names(root):
        short = name[len(mf.REPO_PACKAGE) + 1:] if name.startswith(mf.REPO_PACKAGE + ".") else name
        if short not in available:
            raise UsageError(f"--package {name}: no manifests/{short}.json in {root} "
                             f"(families: {', '.join(available) or 'none'})")
        wanted.append(short)
    if not wanted:
        raise UsageError(f"{root}: no family to vendor (no manifests/<name>.json with a "
                         f"cake/<name>/ package)")
    plans = {}
    for name in dict.fromkeys(wanted):
        package = f"{prefix}.{name}"
        files, upstream = planned_files(root, name, package)
        sidecar = vendored.Sidecar(
            package=package, source_package=f"{mf.REPO_PACKAGE}.{name}",
            cake_train_version=cake.__version__, upstream_manifest_sha256=upstream,
            files={relative: mf.sha256_hex(data) for relative, data in sorted(files.items())})
        plans[name] = (files, sidecar)
    lines = []
    for name, (files, sidecar) in plans.items():
        target = into / name
        written, unchanged, removed = vendor_package(target, files, sidecar, force)
        findings = gate(target, sidecar.package)
        if findings:
            raise VendorError(f"{target}: the vendored copy fails the vendored gate:\n  "
                              + "\n  ".join(str(f) for f in findings))
        lines.append(f"vendor: {sidecar.source_package} -> {target} as {sidecar.package} "
                     f"({written} written, {unchanged} unchanged, {removed} removed)")
    return lines


def gate(package_dir: Path, package: str) -> list:
    """What ``check_manifests --vendored-gate --package <package>`` finds in the copy."""
    tree = mf.package_tree(package_dir, owner=package)
    return sorted(vendored.check_package(package_dir, package) + checker.check_tree(tree)[0])


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
