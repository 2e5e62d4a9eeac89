"""The vendoring rules shared by ``tools/vendor.py`` and ``check_manifests --vendored-gate``.

A vendored family package is a self-contained copy of ``cake.<name>`` inside a host library,
e.g. ``flashinfer/experimental/cake/<name>/`` (docs/vendoring.md)::

    <name>/__init__.py, _function.py, ...   the family's modules (``from ..core`` -> ``from .core``)
    <name>/core/                            a verbatim copy of ``cake/core/`` (the runtime it needs)
    <name>/build.json                       the manifest, only ``package`` rewritten
    <name>/csrc/<library>_{kernel,binding}.cu and csrc/include/<header>   bytes unchanged
    <name>/VENDORED.json                    the sidecar written by tools/vendor.py (below)
    <name>/lib/<library>_<arch>.so          built by ci/build_vendored.sh (optional; else JIT)

The sidecar records what the copy was made from and every file the tool wrote with its
sha256. The tool uses it to rewrite only its own files; the gate uses it to prove that the
manifest differs from upstream in ``package`` alone (CM702) and that no vendored file was
edited (CM703). Standard library only.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Callable, Iterator

from .core import manifest as mf
from .core.manifest import Finding, PackageTree

SIDECAR_NAME = "VENDORED.json"
SIDECAR_VERSION = 1
# Built libraries and byte-code appear in a vendored package without vendor.py writing them.
_BUILD_OUTPUT_DIR = "lib"
_BYTECODE_DIR = "__pycache__"
_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_vendored_imports(package_dir: Path) -> Iterator[Finding]:
    """CM701: a vendored package may import only itself (relatively), stdlib, torch and Triton
    (its core compiles and interprets Triton programs; torch's CUDA builds depend on Triton)."""
    allowed = set(sys.stdlib_module_names) | {"torch", "triton", "__future__"}
    package_dir = Path(package_dir)
    for file in sorted(package_dir.rglob("*.py")):
        if file.relative_to(package_dir).parts[0] == "csrc":
            continue  # Triton sources: program sources, checked by sha256 like any source
        try:
            tree = ast.parse(Path(file).read_bytes(), str(file))
        except SyntaxError as exc:
            yield Finding(str(file), f"line {exc.lineno}", "CM701", f"cannot parse: {exc.msg}")
            continue
        # A relative import of more dots than this leaves the vendored package (into the host).
        most_dots = len(file.relative_to(package_dir).parts)
        for node in ast.walk(tree):
            for name, line in _absolute_imports(node):
                if name.split(".")[0] not in allowed:
                    yield Finding(str(file), f"line {line}", "CM701",
                                  f"imports {name}; only relative, stdlib and torch are allowed")
            if isinstance(node, ast.ImportFrom) and node.level > most_dots:
                name = "." * node.level + (node.module or "")
                yield Finding(str(file), f"line {node.lineno}", "CM701",
                              f"imports {name}, which leaves the vendored package")


def _absolute_imports(node: ast.AST) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        yield node.module or "", node.lineno


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
    """``cake.__version__`` of the cake-train that vendored it."""
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
    if not isinstance(document, dict) or set(document) != expected:
        keys = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise SidecarError(f"{path}: expected the fields {sorted(expected)}, got {keys}")
    if document["format"] != SIDECAR_VERSION:
        raise SidecarError(f"{path}: format {document['format']!r}, expected {SIDECAR_VERSION}")
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


def package_files(package_dir: Path) -> Iterator[str]:
    """Package-relative paths of the files in a vendored package, build outputs left out."""
    package_dir = Path(package_dir)
    for path in sorted(package_dir.rglob("*")):
        parts = path.relative_to(package_dir).parts
        if (path.is_file() and parts != (SIDECAR_NAME,) and parts[0] != _BUILD_OUTPUT_DIR
                and _BYTECODE_DIR not in parts):
            yield "/".join(parts)


def manifest_checked(relative: str) -> bool:
    """Files the gate checks through the manifest (CM1xx..CM6xx), not through the sidecar."""
    return relative == mf.MANIFEST_NAME or relative.startswith("csrc/")


# --------------------------------------------------------------------------- the gate


def resolve(root: Path, package: str) -> Path:
    """``a.b.c`` -> ``<root>/a/b/c``: where a dotted vendored package lives in the host tree."""
    return Path(root).joinpath(*package.split("."))


def gate_trees(root: Path, packages: list[str],
               fail: Callable[[str], None]) -> tuple[list[PackageTree], list[Finding]]:
    """The trees ``check_manifests --vendored-gate`` checks, and the vendoring findings.

    Each tree is owned by the vendored dotted name, so the normal checks verify the
    rewritten ``package`` (CM201) and every source and header byte (CM304, CM602). The extra
    findings are CM701 (imports), CM702 (manifest differs from upstream in another field),
    CM703 (a vendored file was edited, removed or added) and CM704 (sidecar missing or bad).
    ``fail`` is called with one line for a usage problem (unknown package, no manifest).
    """
    trees, findings = [], []
    for package in dict.fromkeys(packages):
        if not _DOTTED_RE.fullmatch(package):
            fail(f"--package {package!r} is not a dotted Python package name")
        package_dir = resolve(root, package)
        if not (package_dir / mf.MANIFEST_NAME).is_file():
            fail(f"{package_dir}: no {mf.MANIFEST_NAME}, so {package} is not a vendored "
                 f"cake-train package under --root {root} (vendor it with tools/vendor.py)")
        trees.append(mf.package_tree(package_dir, owner=package))
        findings.extend(check_package(package_dir, package))
    return trees, findings


def check_package(package_dir: Path, package: str) -> list[Finding]:
    """CM701..CM704 for one vendored package (the manifest checks run separately)."""
    package_dir = Path(package_dir)
    findings = list(check_vendored_imports(package_dir))
    sidecar_path = package_dir / SIDECAR_NAME
    try:
        sidecar = read_sidecar(package_dir)
    except SidecarError as exc:
        return findings + [Finding(str(sidecar_path), "$", "CM704", str(exc).split(": ", 1)[1])]
    if sidecar is None:
        return findings + [Finding(str(sidecar_path), "$", "CM704",
                                   f"{SIDECAR_NAME} is missing: re-vendor with tools/vendor.py")]
    if sidecar.package != package:
        findings.append(Finding(str(sidecar_path), "package", "CM704",
                                f"is {sidecar.package!r}, but the gate checks {package!r}"))
    findings.extend(_manifest_vs_upstream(package_dir / mf.MANIFEST_NAME, sidecar))
    import_problems = {f.path for f in findings if f.code == "CM701"}
    findings.extend(f for f in _files_vs_sidecar(package_dir, sidecar)
                    if f.path not in import_problems)  # CM701 already says what changed
    return findings


def _manifest_vs_upstream(path: Path, sidecar: Sidecar) -> Iterator[Finding]:
    try:
        manifest = mf.read(path)
    except (mf.ManifestError, OSError):
        return  # the manifest checks report it (CM1xx) or the gate's caller fails
    if upstream_manifest_sha256(manifest, sidecar.source_package) != \
            sidecar.upstream_manifest_sha256:
        yield Finding(str(path), "$", "CM702",
                      f"differs from the {sidecar.source_package} manifest it was vendored "
                      f"from in a field other than package; re-vendor with tools/vendor.py")


def _files_vs_sidecar(package_dir: Path, sidecar: Sidecar) -> Iterator[Finding]:
    present = set(package_files(package_dir))
    for relative in sorted(present | set(sidecar.files)):
        if manifest_checked(relative):
            continue
        path = package_dir / relative
        if relative not in sidecar.files:
            yield Finding(str(path), "$", "CM703",
                          f"was not written by tools/vendor.py (not in {SIDECAR_NAME})")
        elif relative not in present:
            yield Finding(str(path), "$", "CM703", "is missing: tools/vendor.py wrote it")
        elif mf.sha256_hex(path.read_bytes()) != sidecar.files[relative]:
            yield Finding(str(path), "$", "CM703",
                          "differs from what tools/vendor.py wrote; re-vendor instead of "
                          "editing a vendored copy")
