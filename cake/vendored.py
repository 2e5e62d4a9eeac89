"""``check_manifests --vendored-gate``: a vendored family package against its upstream.

The upstream is the cake-train the gate runs from (for the pre-commit hook, its clone at the
hook's ``rev``), which must be the version and commit the copy's ``VENDORED.json`` records
(CM709). The gate computes what tools/vendor.py writes for the family from that upstream, with
the tool's own functions (:func:`cake.vendor_plan.plan`), and compares the copy with it: the
record the copy carries is checked, never trusted. Standard library only: it runs in the
pre-commit of host repositories.

- CM701: a module imports something other than itself, the standard library, torch or Triton;
- CM702: ``build.json`` differs from the upstream manifest in another field than ``package``
  (then the manifest checks, CM201 to CM603, hold every source and header to upstream's bytes);
- CM703: a module differs from upstream's (after the import rewrite), or one is missing;
- CM704: ``VENDORED.json`` is missing, unreadable, or not the record the tool writes;
- CM705: a file that is not an upstream file, nor in ``lib/`` (the built libraries, which
  CM801 to CM803 hold to the build record ``lib/libraries.json``);
- CM706: a symbolic link anywhere in the package;
- CM707: bytecode (``.pyc``, ``__pycache__``) that git tracks, or any where no git does;
- CM708: ``importlib``, ``__import__``, ``exec`` or ``eval`` in a module;
- CM709: the running cake-train is not the one the copy was vendored from;
- CM710: a KCP package's base family is not vendored beside it from the same cake-train.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from .core import manifest as mf
from .core import trust
from .core.manifest import Finding, PackageTree
from .vendor_plan import (SIDECAR_NAME, Sidecar, SidecarError, Upstream, VendorError,
                          describe_cake_train, git, kcp_base, plan, read_sidecar,
                          upstream_manifest_sha256)

_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_LIBRARY_DIR = "lib"
_BYTECODE_DIR = "__pycache__"
_BYTECODE_SUFFIXES = (".pyc", ".pyo")
# Ways to run code the import rule cannot see: a module named by a computed string, or text.
_DYNAMIC_NAMES = frozenset({"importlib", "__import__", "exec", "eval"})
_DYNAMIC_ATTRIBUTES = _DYNAMIC_NAMES | {"import_module"}
# The one dynamic call a vendored package makes: the Triton source loader runs the kernel source
# file whose path it is given (a file the manifest lists, checked by sha256), never a module
# found by name, so Triton programs need no import path. Its file, its function, its callee.
_TRITON_LOADER = ("core/triton_aot.py", "_run", "exec")


# --------------------------------------------------------------------------- the package's files


@dataclasses.dataclass
class Listing:
    """What a vendored package folder holds (package-relative, ``/``-separated), found without
    following a symbolic link."""

    files: list = dataclasses.field(default_factory=list)
    """Regular files, bytecode aside."""
    bytecode: list = dataclasses.field(default_factory=list)
    """``.pyc``/``.pyo`` files and anything in a ``__pycache__`` folder."""
    links: list = dataclasses.field(default_factory=list)
    """Symbolic links (to files or folders; a linked folder is not entered)."""


def list_package(package_dir: Path) -> Listing:
    listing = Listing()
    for directory, dirnames, filenames in os.walk(package_dir, onerror=_raise):
        here = PurePosixPath(Path(directory).relative_to(package_dir).as_posix())
        for name in sorted(dirnames + filenames):
            relative = (here / name).as_posix()
            if os.path.islink(os.path.join(directory, name)):
                listing.links.append(relative)
            elif name in filenames:
                is_bytecode = _BYTECODE_DIR in here.parts or name.endswith(_BYTECODE_SUFFIXES)
                (listing.bytecode if is_bytecode else listing.files).append(relative)
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(directory, d)))
    return listing


def _raise(exc: OSError) -> None:
    raise exc  # an unreadable folder: check_manifests reports it as an I/O error (exit 2)


def _is_build_output(relative: str) -> bool:
    """``lib/libraries.json`` and ``lib/<name>.so``: what ci/build_vendored.sh adds."""
    parts = PurePosixPath(relative).parts
    return (len(parts) == 2 and parts[0] == _LIBRARY_DIR
            and (parts[1] == trust.RECORD_NAME or parts[1].endswith(".so")))


def _is_manifest_checked(relative: str) -> bool:
    """The manifest and csrc/: held to upstream by CM702 and then the manifest checks."""
    return relative == mf.MANIFEST_NAME or relative.startswith("csrc/")


# --------------------------------------------------------------------------- modules


def _parsed_modules(package_dir: Path) -> Iterator[tuple[Path, str, ast.AST | SyntaxError]]:
    """Each vendored Python module, its package-relative path, its tree or why it has none.
    Triton sources under csrc/ are program sources, checked by sha256 like any source."""
    package_dir = Path(package_dir)
    for relative in list_package(package_dir).files:
        if relative.endswith(".py") and not relative.startswith("csrc/"):
            file = package_dir / relative
            try:
                yield file, relative, ast.parse(file.read_bytes(), str(file))
            except SyntaxError as exc:
                yield file, relative, exc
            except ValueError as exc:  # Python 3.10: a null byte in the source
                yield file, relative, SyntaxError(str(exc))


def check_vendored_imports(package_dir: Path) -> Iterator[Finding]:
    """CM701: a vendored package may import only itself (relatively), stdlib, torch and Triton
    (its core compiles and interprets Triton programs; torch's CUDA builds depend on Triton);
    a KCP package also its base family beside it (CM710 checks that one)."""
    allowed = set(sys.stdlib_module_names) | {"torch", "triton", "__future__"}
    base = kcp_base(Path(package_dir).name)
    for file, relative, tree in _parsed_modules(package_dir):
        if isinstance(tree, SyntaxError):
            where = f"line {tree.lineno}" if tree.lineno else "$"
            yield Finding(str(file), where, "CM701", f"cannot parse: {tree.msg}")
            continue
        # A relative import of more dots than this leaves the vendored package (into the host).
        most_dots = len(PurePosixPath(relative).parts)
        for node in ast.walk(tree):
            for name, line in _absolute_imports(node):
                if name.split(".")[0] not in allowed:
                    yield Finding(str(file), f"line {line}", "CM701",
                                  f"imports {name}; only relative, stdlib and torch are allowed")
            if isinstance(node, ast.ImportFrom) and node.level > most_dots:
                if node.level == most_dots + 1 and base and \
                        (node.module or "").split(".")[0] == base:
                    continue
                name = "." * node.level + (node.module or "")
                yield Finding(str(file), f"line {node.lineno}", "CM701",
                              f"imports {name}, which leaves the vendored package")


def _absolute_imports(node: ast.AST) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        yield node.module or "", node.lineno


def check_dynamic_code(package_dir: Path) -> Iterator[Finding]:
    """CM708: ``importlib``, ``__import__``, ``exec`` or ``eval`` in a vendored module, as a
    name, an attribute or an import (so also every call of them): they reach modules or run
    code that CM701 cannot see. The Triton source loader's call is the one exception."""
    for file, relative, tree in _parsed_modules(package_dir):
        if isinstance(tree, SyntaxError):
            continue  # CM701 reports it
        allowed = _triton_loader_call(tree) if relative == _TRITON_LOADER[0] else None
        for node in ast.walk(tree):
            name = _dynamic_name(node)
            if name and node is not allowed:
                yield Finding(str(file), f"line {node.lineno}", "CM708",
                              f"uses {name}; a vendored module may reach code only by import "
                              "statements (CM701)")


def _dynamic_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id in _DYNAMIC_NAMES:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in _DYNAMIC_ATTRIBUTES:
        return f".{node.attr}"
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.split(".")[0] == "importlib"), None)
    if isinstance(node, ast.ImportFrom):
        if (node.module or "").split(".")[0] == "importlib":
            return node.module
        return next((a.name for a in node.names if a.name in _DYNAMIC_NAMES), None)
    return None


def _triton_loader_call(tree: ast.AST) -> ast.AST | None:
    """The callee of the one ``exec(...)`` in the Triton loader's function, if it has one."""
    _, function, callee = _TRITON_LOADER
    calls = [node.func for top in getattr(tree, "body", [])
             if isinstance(top, ast.FunctionDef) and top.name == function
             for node in ast.walk(top) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == callee]
    return calls[0] if len(calls) == 1 else None


# --------------------------------------------------------------------------- links and bytecode


def _link_findings(package_dir: Path, listing: Listing) -> Iterator[Finding]:
    """CM706: a link makes the package hold what lies elsewhere (and what git does not hold)."""
    if package_dir.is_symlink():
        yield Finding(str(package_dir), "$", "CM706",
                      f"the package folder is a symbolic link (to {os.readlink(package_dir)})")
    for relative in listing.links:
        path = package_dir / relative
        yield Finding(str(path), "$", "CM706", f"is a symbolic link (to {os.readlink(path)}); "
                      "a vendored package holds regular files only: re-vendor")


def _bytecode_findings(package_dir: Path, listing: Listing) -> Iterator[Finding]:
    """CM707: Python runs bytecode instead of the source it was compiled from, and an
    unchecked-hash ``.pyc`` is never compared with that source, so a committed one can run
    anything. The ``__pycache__`` an import leaves in a git working tree is not committed."""
    if not listing.bytecode:
        return
    tracked = _tracked_files(package_dir)
    for relative in listing.bytecode:
        if tracked is None or relative in tracked:
            where = "git tracks it" if tracked is not None else "the host is not a git checkout"
            yield Finding(str(package_dir / relative), "$", "CM707",
                          f"is bytecode and {where}; delete it (and never commit bytecode)")


def _tracked_files(package_dir: Path) -> set[str] | None:
    """Package-relative paths the host's git tracks, None when it is not a git checkout."""
    listed = git(package_dir, "ls-files", "-z", "--", ".")
    return None if listed is None else set(filter(None, listed.split("\0")))


# --------------------------------------------------------------------------- upstream


def _compare_with_upstream(package_dir: Path, package: str, upstream: Upstream,
                           listing: Listing, explained: set[str]) -> list[Finding]:
    """CM702 to CM705 and CM709: the copy against what tools/vendor.py makes from upstream.
    ``explained`` are files whose CM701/CM708 findings already say how they changed."""
    sidecar_path = package_dir / SIDECAR_NAME
    try:
        recorded = read_sidecar(package_dir)
    except SidecarError as exc:
        return [Finding(str(sidecar_path), "$", "CM704", str(exc).split(": ", 1)[1])]
    if recorded is None:
        return [Finding(str(sidecar_path), "$", "CM704",
                        f"{SIDECAR_NAME} is missing: re-vendor with tools/vendor.py")]
    name = package.rsplit(".", 1)[-1]
    mismatch = _upstream_mismatch(recorded, upstream, name)
    if mismatch:
        return [Finding(str(sidecar_path), "$", "CM709", mismatch)]
    expected = plan(upstream, name, package)
    return [*_sidecar_vs_plan(sidecar_path, recorded, expected.sidecar),
            *_manifest_vs_upstream(package_dir / mf.MANIFEST_NAME, expected.sidecar),
            *_files_vs_plan(package_dir, listing, expected.files, explained)]


def _upstream_mismatch(recorded: Sidecar, upstream: Upstream, name: str) -> str | None:
    """Why the running cake-train cannot tell what the copy should hold. An installed one
    knows no commit: its version must match, and its bytes do the rest."""
    vendored_from = describe_cake_train(recorded.cake_train_version, recorded.cake_train_commit)
    if recorded.cake_train_version != upstream.version or (
            upstream.commit and recorded.cake_train_commit != upstream.commit):
        return (f"the copy was vendored from {vendored_from}, and the gate runs "
                f"{upstream.describe()}: run the gate from the cake-train the copy came from "
                "(the pre-commit hook's rev), or re-vendor with this one (tools/vendor.py)")
    if name not in upstream.families():
        return (f"{upstream.describe()} has no family {name} to compare the copy with: run the "
                f"gate from {vendored_from}")
    return None


def _sidecar_vs_plan(path: Path, recorded: Sidecar, expected: Sidecar) -> Iterator[Finding]:
    """CM704 per field (and per listed file) that is not what tools/vendor.py writes. The
    version and commit were compared with the running cake-train already (CM709)."""
    for field in ("package", "source_package", "upstream_manifest_sha256"):
        if getattr(recorded, field) != getattr(expected, field):
            yield Finding(str(path), field, "CM704", f"is {getattr(recorded, field)!r}; "
                          f"tools/vendor.py writes {getattr(expected, field)!r}")
    for relative in sorted(set(recorded.files) | set(expected.files)):
        wanted = expected.files.get(relative)
        if recorded.files.get(relative) != wanted:
            what = ("lists a file tools/vendor.py does not write" if wanted is None else
                    "does not list this file" if relative not in recorded.files else
                    "records another sha256 than upstream's")
            yield Finding(str(path), f"files.{relative}", "CM704", what)


def _manifest_vs_upstream(path: Path, expected: Sidecar) -> Iterator[Finding]:
    try:
        manifest = mf.read(path)
    except (mf.ManifestError, OSError):
        return  # the manifest checks report it (CM1xx) or the gate's caller fails
    if upstream_manifest_sha256(manifest, expected.source_package) != \
            expected.upstream_manifest_sha256:
        yield Finding(str(path), "$", "CM702",
                      f"differs from the {expected.source_package} manifest it was vendored "
                      f"from in a field other than package; re-vendor with tools/vendor.py")


def _files_vs_plan(package_dir: Path, listing: Listing, planned: dict,
                   explained: set[str]) -> Iterator[Finding]:
    """CM703 and CM705 for the files outside the manifest's reach (:func:`_is_manifest_checked`);
    a link is CM706's, bytecode CM707's."""
    present = set(listing.files)
    for relative in sorted(present | set(planned)):
        if relative == SIDECAR_NAME or _is_manifest_checked(relative):
            continue
        path = package_dir / relative
        if relative not in planned:
            if not _is_build_output(relative):
                yield Finding(str(path), "$", "CM705",
                              "is not a file of the upstream package (tools/vendor.py does not "
                              "write it); remove it")
        elif relative not in present:
            if not _under_link(relative, listing.links):
                yield Finding(str(path), "$", "CM703", "is missing: tools/vendor.py writes it")
        elif path.read_bytes() != planned[relative] and str(path) not in explained:
            yield Finding(str(path), "$", "CM703",
                          "differs from what tools/vendor.py makes of upstream's file; "
                          "re-vendor instead of editing a vendored copy")


def _under_link(relative: str, links: list) -> bool:
    return any(relative == link or relative.startswith(link + "/") for link in links)


# --------------------------------------------------------------------------- the gate


def resolve(root: Path, package: str) -> Path:
    """``a.b.c`` -> ``<root>/a/b/c``: where a dotted vendored package lives in the host tree."""
    return Path(root).joinpath(*package.split("."))


def gate_trees(root: Path, packages: list[str],
               fail: Callable[[str], None]) -> tuple[list[PackageTree], list[Finding]]:
    """The trees ``check_manifests --vendored-gate`` checks, and the vendoring findings.

    Each tree is owned by the vendored dotted name, so the normal checks verify the
    rewritten ``package`` (CM201) and every source and header byte (CM304, CM602); the
    vendoring findings (CM7xx) compare the copy with the running cake-train.
    ``fail`` is called with one line for a usage problem (unknown package, no manifest, a
    running cake-train that cannot vendor the family itself).
    """
    trees, findings = [], []
    try:
        upstream = Upstream.running()
    except VendorError as exc:
        fail(str(exc))
    for package in dict.fromkeys(packages):
        if not _DOTTED_RE.fullmatch(package):
            fail(f"--package {package!r} is not a dotted Python package name")
        package_dir = resolve(root, package)
        if not (package_dir / mf.MANIFEST_NAME).is_file():
            fail(f"{package_dir}: no {mf.MANIFEST_NAME}, so {package} is not a vendored "
                 f"cake-train package under --root {root} (vendor it with tools/vendor.py)")
        trees.append(mf.package_tree(package_dir, owner=package))
        try:
            findings.extend(check_package(package_dir, package, upstream))
        except VendorError as exc:
            fail(f"{upstream.describe()} cannot vendor {package} itself, so it cannot check "
                 f"the copy: {exc}")
    return trees, findings


def check_package(package_dir: Path, package: str, upstream: Upstream) -> list[Finding]:
    """CM701 to CM709 for one vendored package (the manifest checks run separately). Raises
    VendorError when ``upstream`` cannot vendor the family itself."""
    package_dir = Path(package_dir)
    listing = list_package(package_dir)
    code = [*check_vendored_imports(package_dir), *check_dynamic_code(package_dir)]
    explained = {finding.path for finding in code}
    return [*code, *_link_findings(package_dir, listing),
            *_bytecode_findings(package_dir, listing),
            *_compare_with_upstream(package_dir, package, upstream, listing, explained),
            *_base_findings(package_dir, package)]


def _base_findings(package_dir: Path, package: str) -> Iterator[Finding]:
    """CM710: a KCP package imports its base family as a sibling, so that family must be
    vendored beside it, from the cake-train this copy came from (the gate checks the base when
    it is named with --package too)."""
    base = kcp_base(package.rsplit(".", 1)[-1])
    if base is None:
        return
    sibling = package_dir.parent / base
    expected = f"{package.rsplit('.', 1)[0]}.{base}"
    try:
        own, theirs = read_sidecar(package_dir), read_sidecar(sibling)
    except SidecarError:
        return  # CM704 says what is wrong with a record
    if theirs is None or theirs.package != expected:
        yield Finding(str(sibling), "$", "CM710",
                      f"{package} runs its base family's programs, and {expected} is not "
                      f"vendored here: vendor both (tools/vendor.py vendors the base with it)")
    elif own is not None and (own.cake_train_version, own.cake_train_commit) != \
            (theirs.cake_train_version, theirs.cake_train_commit):
        yield Finding(str(sibling), "$", "CM710",
                      f"{expected} was vendored from "
                      f"{describe_cake_train(theirs.cake_train_version, theirs.cake_train_commit)}"
                      f", {package} from "
                      f"{describe_cake_train(own.cake_train_version, own.cake_train_commit)}: "
                      "re-vendor both from one cake-train")
