"""``check_manifests``: verifies manifests against the bytes on disk (docs/programs.md).

Each check is a small function that yields :class:`~cake.manifest.Finding` objects; the
command line only finds the trees, runs the checks and reports. Standard library only.

Exit status: 0 clean, 1 findings, 2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Sequence

from .core import manifest as mf
from .core import trust
from .core.manifest import Finding, Manifest, PackageTree, Program

class UsageError(Exception):
    """A wrong argument or an I/O problem: exit 2 with one line."""


@dataclasses.dataclass
class Work:
    """What the checks of source texts did, counted as they go: the texts scanned and the
    scans' operations (:attr:`~cake.core.manifest.Scan.operations`). Tests count it to show the
    work grows linearly with the input (tests/check/test_linear_scans.py)."""

    scans: int = 0
    operations: int = 0

    def add(self, scan: mf.Scan) -> mf.Scan:
        self.scans += 1
        self.operations += scan.operations
        return scan


# --------------------------------------------------------------------------- checks


def check_tree(tree: PackageTree, work: Work | None = None) -> tuple[list[Finding], int]:
    """All findings for one package tree, and the number of programs it lists; ``work``, if
    given, counts the scans of source texts."""
    manifests = []
    findings: list[Finding] = list(_linked_folders(tree))
    for path in tree.manifest_paths():
        try:
            manifests.append((str(path), mf.parse(_read(path), str(path))))
        except mf.ManifestError as exc:
            findings.extend(exc.findings)
    checked = _TreeCheck(tree, Work() if work is None else work)
    for path, manifest in manifests:
        findings.extend(checked.manifest(path, manifest))
    if len(manifests) == len(list(tree.manifest_paths())):
        # Orphans are only meaningful when every manifest could be read.
        findings.extend(checked.orphans())
    findings.extend(check_libraries(tree))
    return findings, sum(len(m.programs) for _, m in manifests)


def _linked_folders(tree: PackageTree) -> Iterator[Finding]:
    """CM310: the manifest, the csrc folder or the include folder reached through a link (a copy
    outside the tree would pass every byte check)."""
    for what, path in (("manifest", tree.manifest_path), ("csrc folder", tree.csrc_dir),
                       ("include folder", tree.include_dir)):
        if path.is_symlink():
            yield Finding(str(tree.manifest_path), "$", "CM310",
                          f"the {what} {path} is a symbolic link (to {os.readlink(path)})")


def check_libraries(tree: PackageTree) -> Iterator[Finding]:
    """An installed (or vendored and built) package's ``lib/`` against its build record: every
    library listed, with the recorded bytes (the loader refuses any other before loading it)."""
    lib_dir = tree.manifest_path.parent / "lib"
    if tree.manifest_path.name != mf.MANIFEST_NAME or not lib_dir.is_dir():
        return
    record_path = lib_dir / trust.RECORD_NAME
    try:
        record = trust.read_record(lib_dir) or {}
    except trust.Untrusted as exc:
        yield Finding(str(record_path), "$", "CM803", str(exc))
        return
    present = sorted(p.name for p in lib_dir.glob("*.so"))
    for name in present:
        if name not in record:
            yield Finding(str(record_path), "libraries", "CM801",
                          f"lib/{name} is not in the build record")
        elif mf.sha256_hex(_read(lib_dir / name)) != record[name]:
            yield Finding(str(record_path), f"libraries.{name}", "CM802",
                          f"lib/{name} differs from its recorded sha256; reinstall")
    for name in sorted(set(record) - set(present)):
        yield Finding(str(record_path), f"libraries.{name}", "CM801",
                      f"lib/{name} is in the build record but missing")


class _TreeCheck:
    """Checks the manifests of one tree, remembering what they list for the orphan check."""

    def __init__(self, tree: PackageTree, work: Work):
        self.tree = tree
        self.work = work
        self.listed: set[str] = set()
        self.digests: set[str] = set()
        self.libraries: set[str] = set()

    def manifest(self, path: str, manifest: Manifest) -> Iterator[Finding]:
        owner = self.tree.owner
        if manifest.package != owner:
            yield Finding(path, "package", "CM201",
                          f"is {manifest.package!r}, but this manifest belongs to {owner!r}")
        prefix = mf.expected_prefix(owner)
        if manifest.library_prefix != prefix:
            yield Finding(path, "library_prefix", "CM202",
                          f"is {manifest.library_prefix!r}; package {owner!r} needs {prefix!r}")
        header_ok = {}
        for i, header in enumerate(manifest.headers):
            problems = list(self.header(path, f"headers[{i}]", header))
            header_ok[header.path] = not problems
            yield from problems
        for i, program in enumerate(manifest.programs):
            yield from self.program(path, f"programs[{i}]", program, prefix, manifest, header_ok)

    def header(self, path: str, field: str, header: mf.Header) -> Iterator[Finding]:
        problem = _path_problem(self.tree.include_dir, header.path)
        if problem:
            yield Finding(path, f"{field}.path", *problem)
            return
        file = self.tree.header_path(header.path)
        self.listed.add(os.path.normpath(file))
        if not file.is_file():
            yield Finding(path, f"{field}.path", "CM601", f"header {header.path} is missing")
        elif mf.sha256_hex(_read(file)) != header.sha256:
            yield Finding(path, f"{field}.sha256", "CM602",
                          f"header {header.path} has changed (sha256 differs)")

    def program(self, path: str, field: str, program: Program, prefix: str,
                manifest: Manifest, header_ok: dict) -> Iterator[Finding]:
        problems: list[Finding] = []
        add = problems.append
        if not mf.is_digest(program.digest):
            add(Finding(path, f"{field}.digest", "CM204",
                        f"{program.digest!r} is not {mf.DIGEST_LENGTH} lowercase hex digits"))
            # The expected library name is built from the digest: with a malformed digest
            # a CM203 would only repeat this finding.
        else:
            expected = mf.library_name(prefix, program.digest, program.kcp)
            if program.library != expected:
                add(Finding(path, f"{field}.library", "CM203",
                            f"is {program.library!r}, expected {expected!r}"))
        if program.digest in self.digests or program.library in self.libraries:
            add(Finding(path, f"{field}.digest", "CM205",
                        f"program {program.library} is listed more than once"))
        self.digests.add(program.digest)
        self.libraries.add(program.library)
        roles = [source.role for source in program.sources]
        if len(set(roles)) != len(roles) or "binding" not in roles or len(roles) < 2:
            add(Finding(path, f"{field}.sources", "CM206",
                        f"roles {roles}: each role once, one binding and at least one kernel"))
        for j, header_path in enumerate(program.headers):
            if header_path not in header_ok:
                add(Finding(path, f"{field}.headers[{j}]", "CM603",
                            f"{header_path} is not in the manifest's headers"))
        texts = {}
        for j, source in enumerate(program.sources):
            data, source_problems = self.source(path, f"{field}.sources[{j}]", program, source)
            problems.extend(source_problems)
            # A source whose bytes are not the recorded ones is not scanned: its finding says
            # enough, and no text of any shape can make the checker slow.
            if data is not None and not any(p.code == "CM304" for p in source_problems):
                texts[source.role] = data
        if len(texts) == len(program.sources):
            scans = _scans(program, texts, self.work)
            problems.extend(_symbol_problems(path, field, program, texts, scans, self.work))
            problems.extend(_include_problems(path, field, program, scans))
        yield from problems
        if not problems and all(header_ok.get(h) for h in program.headers):
            recomputed = recompute_digest(program, manifest, texts)
            if recomputed != program.digest:
                yield Finding(path, f"{field}.digest", "CM401",
                              f"recorded {program.digest}, recomputed {recomputed}")

    def source(self, path: str, field: str, program: Program,
               source: mf.Source) -> tuple[bytes | None, list[Finding]]:
        csrc = self.tree.csrc_dir
        self.listed.add(os.path.normpath(csrc / source.path))
        problem = _path_problem(csrc, source.path)
        if problem:
            return None, [Finding(path, f"{field}.path", *problem)]
        file = self.tree.source_path(source)
        if not file.is_file():
            return None, [Finding(path, f"{field}.path", "CM301", f"{source.path} is missing")]
        data = _read(file)
        problems = []
        if mf.sha256_hex(data) != source.sha256:
            problems.append(Finding(path, f"{field}.sha256", "CM304",
                                    f"{source.path} differs from its recorded sha256"))
        wanted = mf.source_file_name(program.library, source.role, program.kind)
        if PurePosixPath(source.path).name != wanted:
            problems.append(Finding(path, f"{field}.path", "CM305",
                                    f"{source.path} should be named {wanted}"))
        return data, problems

    def orphans(self) -> Iterator[Finding]:
        csrc = self.tree.csrc_dir
        if not csrc.is_dir():
            return
        for directory, dirnames, filenames in os.walk(csrc, onerror=_raise):
            # Bytecode an import of a Triton source may leave is not a source; a linked folder
            # is never walked, so it is a finding of its own.
            for name in sorted(dirnames):
                if os.path.islink(os.path.join(directory, name)):
                    relative = os.path.relpath(os.path.join(directory, name), csrc)
                    yield Finding(str(self.tree.manifest_path), "programs", "CM310",
                                  f"{csrc.name}/{relative} is a symbolic link to a folder")
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__"
                                 and not os.path.islink(os.path.join(directory, d)))
            for name in sorted(filenames):
                file = os.path.normpath(os.path.join(directory, name))
                if file not in self.listed:
                    relative = os.path.relpath(file, csrc)
                    yield Finding(str(self.tree.manifest_path), "programs", "CM307",
                                  f"{csrc.name}/{relative} is not listed by any program")


def recompute_digest(program: Program, manifest: Manifest, texts: dict) -> str:
    header_shas = [manifest.header(h).sha256 for h in program.headers]
    sources = [(s.role, texts[s.role]) for s in program.sources]
    return mf.program_digest(program.library, sources, header_shas, list(program.flags))


def _path_problem(base: Path, relative: str) -> tuple[str, str] | None:
    """(code, message) if ``relative`` is unsafe under ``base``: escapes it or crosses a link."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or ".." in pure.parts:
        return "CM302", f"{relative} is not inside {base.name}/"
    current = base
    for part in pure.parts:
        current = current / part
        if current.is_symlink():
            return "CM303", f"{relative} goes through the symbolic link {part}"
    return None


def _scans(program: Program, texts: dict, work: Work) -> dict:
    """Each source's :func:`~cake.core.manifest.scan`, once: role -> (C++ scan: entries and
    includes, kernels of a CUDA program; kernels of a Triton program's source or None)."""
    scans = {}
    for role, data in texts.items():
        text = data.decode("utf-8", "replace")
        cuda = work.add(mf.scan(text))
        triton = (work.add(mf.scan(text, "triton"))
                  if program.kind == "triton" and role != "binding" else None)
        scans[role] = (cuda, triton)
    return scans


def _symbol_problems(path: str, field: str, program: Program, texts: dict, scans: dict,
                     work: Work) -> Iterator[Finding]:
    library = program.library
    if "binding" not in texts:
        return  # CM206 says the binding is missing; its exports cannot be checked
    binding_scan = scans["binding"][0]
    exported = binding_scan.entries
    declared = [f"{library}_{name}" for name in mf.IDENTITY_EXPORTS]
    declared += [f"{library}_{entry.name}" for entry in program.entries]
    exported_set, declared_set = set(exported), set(declared)
    for symbol in declared:
        if symbol not in exported_set:
            yield Finding(path, f"{field}.entries", "CM308",
                          f"the binding does not export {symbol}")
    for symbol in exported:
        if symbol not in declared_set:
            yield Finding(path, f"{field}.entries", "CM308",
                          f"the binding exports {symbol}, which the manifest does not declare")
    binding = texts["binding"].decode("utf-8", "replace")
    if mf.rendered_entries(binding, work) != program.entries:
        yield Finding(path, f"{field}.entries", "CM309",
                      "the binding's '// cake:entries' block does not declare these entries")
    kernel_name = "kernel_" + library
    defined = []
    for role, (cuda, triton) in scans.items():
        if role != "binding":
            defined += (triton or cuda).kernels
    defined_set, listed_set = set(defined), set(program.kernels)
    for j, symbol in enumerate(program.kernels):
        if symbol != kernel_name and not symbol.startswith(kernel_name + "_"):
            yield Finding(path, f"{field}.kernels[{j}]", "CM306",
                          f"kernel {symbol} does not start with {kernel_name}")
        elif symbol not in defined_set:
            yield Finding(path, f"{field}.kernels[{j}]", "CM306",
                          f"kernel {symbol} is not defined by a kernel source")
    for name in defined:
        if name not in listed_set:
            yield Finding(path, f"{field}.kernels", "CM306",
                          f"kernel {name} of a kernel source is not a listed kernel")


def _include_problems(path: str, field: str, program: Program,
                      scans: dict) -> Iterator[Finding]:
    listed = set(program.headers)
    for role, (cuda, _) in sorted(scans.items(), key=lambda item: item[0]):
        for name in cuda.includes:
            if name not in listed:
                yield Finding(path, f"{field}.headers", "CM603",
                              f"{role} source includes {name}, which the program does not list")


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _raise(exc: OSError) -> None:
    raise UsageError(f"{exc.filename}: cannot read directory: {exc.strerror or exc}")


# --------------------------------------------------------------------------- discovery


def find_trees(paths: Sequence[str], default_root: Path) -> list[PackageTree]:
    """The package trees that the command-line paths name (files or folders); without paths,
    the manifests of the git repository ``default_root`` is in (:func:`repository_trees`)."""
    if not paths:
        return repository_trees(default_root)
    trees: dict[Path, PackageTree] = {}
    for argument in paths:
        for tree in _trees_for(Path(argument)):
            trees.setdefault(tree.manifest_path.resolve(), tree)
    return list(trees.values())


def repository_trees(directory: Path) -> list[PackageTree]:
    """The manifests of the git repository holding ``directory``: its ``manifests/`` folder and
    every ``build.json`` git tracks (vendored packages included); never a walk of every folder
    below. Outside a git repository: ``directory``'s own ``manifests/`` or ``build.json``."""
    directory = Path(directory)
    root = _git_root(directory)
    if root is None:
        if (directory / "manifests").is_dir() or (directory / mf.MANIFEST_NAME).is_file():
            return list(_trees_for(directory))
        return []
    trees = [mf.repository_tree(root, name) for name in mf.repository_families(root)]
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "*build.json"],
                            capture_output=True, check=False)
    for relative in sorted(filter(None, listed.stdout.decode("utf-8", "replace").split("\0"))):
        if Path(relative).name == mf.MANIFEST_NAME:
            trees.append(mf.package_tree(root / Path(relative).parent))
    return trees


def _git_root(directory: Path) -> Path | None:
    try:
        found = subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel"],
                               capture_output=True, text=True, check=False)
    except OSError:  # no git
        return None
    return Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else None


def _trees_for(path: Path) -> Iterable[PackageTree]:
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if path.is_file():
        return [_tree_for_manifest(path)]
    if (path / "manifests").is_dir():
        root = path
        return [mf.repository_tree(root, name) for name in mf.repository_families(root)]
    if (path / mf.MANIFEST_NAME).is_file():
        return [mf.package_tree(path)]
    found = []
    for directory, dirnames, filenames in os.walk(path, onerror=_raise):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if mf.MANIFEST_NAME in filenames:
            found.append(mf.package_tree(Path(directory)))
    if not found:
        raise UsageError(f"{path}: no manifests/ folder and no {mf.MANIFEST_NAME} below it")
    return found


def _tree_for_manifest(path: Path) -> PackageTree:
    if path.name in (mf.MANIFEST_NAME, mf.TEST_MANIFEST_NAME):
        return mf.package_tree(path.parent)
    if path.parent.name == "manifests" and path.suffix == ".json":
        name = path.name[: -len(".test.json")] if path.name.endswith(".test.json") else path.stem
        return mf.repository_tree(path.parent.parent, name)
    raise UsageError(f"{path}: not a manifest (expected manifests/<package>.json or "
                     f"{mf.MANIFEST_NAME})")


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="check_manifests",
        description="Verify cake-train manifests, program digests, csrc bytes and installed "
                    "libraries. Exit 0 clean, 1 findings (one line each, with a stable code), 2 "
                    "usage or I/O error.")
    parser.add_argument("paths", nargs="*",
                        help="manifests, package folders or a repository root (default: the "
                             "manifests of the current git repository: manifests/*.json and "
                             "its tracked build.json files)")
    parser.add_argument("--json", action="store_true", help="print one JSON report")
    parser.add_argument("--vendored-gate", action="store_true",
                        help="check a vendored copy: --package names it, --root is the host "
                             "repository root")
    parser.add_argument("--package", action="append", default=[],
                        help="dotted name of a vendored package (with --vendored-gate)")
    parser.add_argument("--root", default=".", help="host repository root (default: .)")
    return parser


def run(args: argparse.Namespace) -> tuple[list[Finding], int, int]:
    """Runs the checks; returns (findings, manifests, programs)."""
    if args.vendored_gate:
        if not args.package:
            raise UsageError("--vendored-gate needs --package NAME")
        from .vendored import gate_trees  # only the gate needs the vendoring rules

        trees, extra = gate_trees(Path(args.root), args.package, _raise_usage)
    else:
        if args.package:
            raise UsageError("--package only goes with --vendored-gate")
        trees, extra = find_trees(args.paths, Path(".")), []
    if not trees and not args.vendored_gate:
        return [], 0, 0
    findings = list(extra)
    programs = 0
    for tree in trees:
        tree_findings, count = check_tree(tree)
        findings.extend(tree_findings)
        programs += count
    return findings, len(trees), programs


def _raise_usage(message: str) -> None:
    raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed one usage line
        return 2 if exc.code else 0
    try:
        findings, manifests, programs = run(args)
    except UsageError as exc:
        print(f"check_manifests: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a stat (is_symlink, is_file) on a path we may not look at
        print(f"check_manifests: error: {exc.filename}: cannot read: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    findings.sort()
    if manifests == 0 and not args.json:
        print("check_manifests: no cake-train manifests in this repository: nothing to check")
        return 0
    if args.json:
        print(json.dumps({
            "ok": not findings, "manifests": manifests, "programs": programs,
            "findings": [f.__dict__ for f in findings]}, indent=2, sort_keys=True))
    else:
        for finding in findings:
            print(finding)
        verdict = f"{len(findings)} finding(s)" if findings else "ok"
        print(f"check_manifests: {verdict} in {manifests} manifest(s), {programs} program(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
