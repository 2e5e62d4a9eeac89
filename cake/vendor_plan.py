"""What tools/vendor.py writes for one family, computed from an upstream cake-train.

A vendored family package is a self-contained copy of ``cake.<name>`` inside a host library,
e.g. ``flashinfer/experimental/cake/<name>/`` (docs/vendoring.md)::

    <name>/__init__.py, _function.py, ...   the family's modules (``from ..core`` -> ``from .core``)
    <name>/core/                            a verbatim copy of ``cake/core/`` (the runtime it needs)
    <name>/_shared/                         verbatim copies of the ``cake/_shared`` modules it uses
    <name>/build.json                       the manifest, only ``package`` rewritten
    <name>/csrc/<library>_{kernel,binding}.cu and csrc/include/<header>   bytes unchanged
    <name>/VENDORED.json                    the record of the copy (:class:`Sidecar`)
    <name>/lib/<library>_<arch>.so          built by ci/build_vendored.sh (optional; else JIT)

:func:`plan` computes every file and the record from an :class:`Upstream`, a cake-train
checkout or installation. tools/vendor.py writes the plan; the gate (cake/vendored.py)
computes it again from the cake-train it runs from and compares the copy with it, so the copy's
own record is never what the copy is checked against. Standard library only.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path, PurePosixPath

from . import checker
from .core import manifest as mf

SIDECAR_NAME = "VENDORED.json"
SIDECAR_VERSION = 2
CORE = "core"
SHARED = "_shared"
# The runtime packages a family module may import (the rewrite moves them one level in).
_RUNTIME = (CORE, SHARED)
# Names the vendored layout uses next to the family's own modules.
_RESERVED = {CORE, SHARED, "csrc", "lib", mf.MANIFEST_NAME, mf.TEST_MANIFEST_NAME, SIDECAR_NAME}
# What an installation adds to a family folder next to its modules (CMakeLists.txt:
# cake_add_package and the libraries).
_INSTALLED_LAYOUT = {"csrc", "lib", mf.MANIFEST_NAME}
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = {".pyc", ".pyo", ".so"}
# pyproject.toml's version provider reads the same line.
_VERSION_RE = re.compile(r'^__version__ = "([^"\n]+)"', re.MULTILINE)
# Variables that point git at another repository. A pre-commit hook inherits the host's, and
# the upstream's commit must come from the upstream's own checkout.
_GIT_LOCATION_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR",
                           "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                           "GIT_NAMESPACE")


class VendorError(Exception):
    """A family that cannot be vendored as it is; the message names the file and the fix."""


def kcp_base(name: str) -> str | None:
    """The family a context-parallel family builds on (``cake_x_det_train_kcp`` ->
    ``cake_x_det_train``), None for any other. A KCP family runs its base family's programs, so
    it imports that family (``from ..<base> import ...``), which is vendored beside it."""
    return name[: -len("_kcp")] if name.endswith("_kcp") else None


# --------------------------------------------------------------------------- the upstream


def git(directory: Path, *arguments: str, own_repository: bool = False) -> str | None:
    """``git -C directory ARGUMENTS``'s output, or None when git fails or is not installed.
    ``own_repository`` ignores the caller's git location variables (see above)."""
    environment = None
    if own_repository:
        environment = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARIABLES}
    try:
        done = subprocess.run(["git", "-C", str(directory), *arguments], capture_output=True,
                              text=True, errors="surrogateescape", env=environment, check=False)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def checkout_commit(root: Path) -> str:
    """HEAD of the git checkout whose top folder is ``root``; "" when ``root`` is no such top
    folder (an installed cake-train, or a copy inside some other repository)."""
    top = git(root, "rev-parse", "--show-toplevel", own_repository=True)
    if top is None or Path(top.strip()).resolve() != Path(root).resolve():
        return ""
    return (git(root, "rev-parse", "HEAD", own_repository=True) or "").strip()


def package_version(package_dir: Path) -> str:
    """``__version__`` of the cake-train whose ``cake/`` folder is ``package_dir``."""
    init = Path(package_dir) / "__init__.py"
    found = _VERSION_RE.search(init.read_text()) if init.is_file() else None
    if found is None:
        raise VendorError(f"{init}: no __version__ line, so {package_dir} is not a cake-train "
                          "package")
    return found.group(1)


@dataclasses.dataclass(frozen=True)
class Upstream:
    """A cake-train that families are vendored from, or that a vendored copy is compared with:
    a checkout (``cake/`` next to ``manifests/`` and ``csrc/``) or an installed package."""

    package_dir: Path
    """Its ``cake/`` folder."""
    version: str
    """Its ``cake.__version__``."""
    commit: str
    """HEAD of its git checkout; "" when it is not one (an installed cake-train)."""

    @classmethod
    def at(cls, package_dir: Path) -> Upstream:
        package_dir = Path(package_dir).resolve()
        return cls(package_dir, package_version(package_dir), checkout_commit(package_dir.parent))

    @classmethod
    def running(cls) -> Upstream:
        """The cake-train this module belongs to: the one whose checker or tool is running."""
        return cls.at(Path(__file__).parent)

    @property
    def is_checkout(self) -> bool:
        return (self.package_dir.parent / "manifests").is_dir()

    def describe(self) -> str:
        return describe_cake_train(self.version, self.commit) + f" ({self.package_dir})"

    def families(self) -> list[str]:
        """Families with a manifest and a package: what is vendored when no --package is given."""
        if self.is_checkout:
            names = mf.repository_families(self.package_dir.parent)
        else:
            names = sorted(p.parent.name for p in self.package_dir.glob(f"*/{mf.MANIFEST_NAME}"))
        return [name for name in names if (self.package_dir / name / "__init__.py").is_file()]

    def tree(self, name: str) -> mf.PackageTree:
        if self.is_checkout:
            return mf.repository_tree(self.package_dir.parent, name)
        return mf.package_tree(self.package_dir / name, owner=f"{mf.REPO_PACKAGE}.{name}")

    def family_modules(self, name: str) -> list[tuple[PurePosixPath, Path]]:
        found = _module_files(self.package_dir / name)
        if self.is_checkout:
            return found
        return [(relative, path) for relative, path in found
                if relative.parts[0] not in _INSTALLED_LAYOUT]


def describe_cake_train(version: str, commit: str) -> str:
    """``cake-train 0.1.0 at commit 1e38857...`` (without a commit when there is none)."""
    return f"cake-train {version}" + (f" at commit {commit}" if commit else "")


# --------------------------------------------------------------------------- the record


class SidecarError(ValueError):
    """A sidecar that cannot be read or does not follow its format."""


@dataclasses.dataclass(frozen=True)
class Sidecar:
    """``VENDORED.json``: what tools/vendor.py wrote, and from what."""

    package: str
    """The vendored dotted package, e.g. ``flashinfer.experimental.cake.cake_x_det_train``."""
    source_package: str
    """The cake-train package it was copied from, e.g. ``cake.cake_x_det_train``."""
    cake_train_version: str
    """``cake.__version__`` of the cake-train it was copied from."""
    cake_train_commit: str
    """The git commit of the cake-train checkout it was copied from ("" if not a checkout)."""
    upstream_manifest_sha256: str
    """sha256 of ``cake.core.manifest.to_json`` of the upstream manifest."""
    files: dict
    """Every file the tool wrote (package-relative, ``/``-separated) -> its sha256."""

    def to_json(self) -> str:
        document = dict(dataclasses.asdict(self), format=SIDECAR_VERSION,
                        written_by="cake-train tools/vendor.py; do not edit")
        return json.dumps(document, indent=2, sort_keys=True) + "\n"


def parse_sidecar(data: bytes, path: str) -> Sidecar:
    """Parses sidecar bytes; raises :class:`SidecarError` naming the problem."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SidecarError(f"{path}: cannot parse: {exc}") from None
    fields = {f.name for f in dataclasses.fields(Sidecar)}
    expected = fields | {"format", "written_by"}
    if isinstance(document, dict) and document.get("format", SIDECAR_VERSION) != SIDECAR_VERSION:
        raise SidecarError(f"{path}: format {document.get('format')!r}, expected "
                           f"{SIDECAR_VERSION}: re-vendor with tools/vendor.py --force")
    if not isinstance(document, dict) or set(document) != expected:
        keys = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise SidecarError(f"{path}: expected the fields {sorted(expected)}, got {keys}")
    files = document["files"]
    if not (isinstance(files, dict) and all(
            isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v)
            for k, v in files.items())):
        raise SidecarError(f"{path}: files must map relative paths to sha256 hex digests")
    for name in fields - {"files"}:
        if not isinstance(document[name], str):
            raise SidecarError(f"{path}: {name} must be a string")
    return Sidecar(**{name: document[name] for name in fields})


def read_sidecar(package_dir: Path) -> Sidecar | None:
    """The sidecar of a vendored package, or None when there is none."""
    path = Path(package_dir) / SIDECAR_NAME
    if not path.is_file():
        return None
    return parse_sidecar(path.read_bytes(), str(path))


def upstream_manifest_sha256(manifest: mf.Manifest, source_package: str) -> str:
    """The sidecar's fingerprint of a manifest once ``package`` is set back to upstream's."""
    return mf.sha256_hex(mf.to_json(mf.with_package(manifest, source_package)).encode())


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class Plan:
    """One vendored family as tools/vendor.py writes it."""

    files: dict
    """Package-relative path -> bytes of every file but the record."""
    sidecar: Sidecar
    """The record, ``VENDORED.json``."""


def plan(upstream: Upstream, name: str, package: str) -> Plan:
    """What vendoring ``cake.<name>`` of ``upstream`` as ``package`` writes. Raises
    :class:`VendorError` when the family cannot be vendored as it is."""
    tree = upstream.tree(name)
    findings, _ = checker.check_tree(tree)
    if findings:
        raise VendorError(f"{tree.owner} fails check_manifests, so it is not vendored:\n  "
                          + "\n  ".join(str(f) for f in sorted(findings)))
    manifest = mf.read(tree.manifest_path)
    family, shared = _family_files(upstream, name)
    files = {**family, **_shared_files(upstream, shared), **_core_files(upstream),
             **_program_files(tree, manifest, package)}
    source_package = f"{mf.REPO_PACKAGE}.{name}"
    sidecar = Sidecar(
        package=package, source_package=source_package, cake_train_version=upstream.version,
        cake_train_commit=upstream.commit,
        upstream_manifest_sha256=upstream_manifest_sha256(manifest, source_package),
        files={relative: mf.sha256_hex(data) for relative, data in sorted(files.items())})
    return Plan(files, sidecar)


def _family_files(upstream: Upstream, name: str) -> tuple[dict[str, bytes], list[str]]:
    """The family's modules, imports rewritten, and the ``_shared`` modules they use."""
    files, shared = {}, []
    for relative, path in upstream.family_modules(name):
        if relative.parts[0] in _RESERVED:
            raise VendorError(f"{path}: the name {relative.parts[0]!r} is taken by the vendored "
                              "layout (core/, _shared/, csrc/, lib/, build.json, VENDORED.json)")
        data = path.read_bytes()
        if path.suffix == ".py":
            text = data.decode("utf-8")
            shared += _shared_modules(text, str(path))
            data = rewrite_core_imports(text, str(path), len(relative.parts) - 1,
                                        base=kcp_base(name)).encode("utf-8")
        files[relative.as_posix()] = data
    return files, shared


def _shared_files(upstream: Upstream, modules: list[str]) -> dict[str, bytes]:
    """``_shared/__init__.py`` and the shared modules a family uses, verbatim (none if it uses
    none)."""
    if not modules:
        return {}
    files = {}
    for module in ["__init__", *dict.fromkeys(modules)]:
        path = upstream.package_dir / SHARED / f"{module}.py"
        if not path.is_file():
            raise VendorError(f"{path}: a family imports it, and it does not exist")
        data = path.read_bytes()
        _check_core_imports(data.decode("utf-8"), str(path), 0, allowed="..core")
        files[f"{SHARED}/{module}.py"] = data
    return files


def _core_files(upstream: Upstream) -> dict[str, bytes]:
    """``cake/core/``, verbatim."""
    files = {}
    for relative, path in _module_files(upstream.package_dir / CORE):
        data = path.read_bytes()
        if path.suffix == ".py":
            _check_core_imports(data.decode("utf-8"), str(path), len(relative.parts) - 1)
        files[f"{CORE}/{relative.as_posix()}"] = data
    return files


def _program_files(tree: mf.PackageTree, manifest: mf.Manifest,
                   package: str) -> dict[str, bytes]:
    """The manifest with ``package`` rewritten, and its sources and headers, bytes unchanged."""
    files = {mf.MANIFEST_NAME: mf.to_json(mf.with_package(manifest, package)).encode()}
    for program in manifest.programs:
        for source in program.sources:
            files[f"csrc/{source.path}"] = tree.source_path(source).read_bytes()
    for header in manifest.headers:
        files[f"csrc/include/{header.path}"] = tree.header_path(header.path).read_bytes()
    return files


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


# --------------------------------------------------------------------------- import rewrite


def rewrite_core_imports(text: str, path: str, depth: int, base: str | None = None) -> str:
    """``from ..core`` -> ``from .core`` (and ``from .._shared`` -> ``from ._shared``) in one
    family module, ``depth`` folders below the family.

    A KCP family's import of its ``base`` family (``from ..<base> import ...``) stays as it is:
    the base is vendored beside it. Every other import that leaves the family package (or names
    ``cake``) raises :class:`VendorError` naming the file and line.
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
            if node.level < up or (node.level == up and base is not None
                                    and module.split(".")[0] == base):
                continue  # inside the family package, or the KCP family's base beside it
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
