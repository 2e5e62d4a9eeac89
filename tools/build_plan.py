#!/usr/bin/env python3
"""Writes the CMake build plan: one ``cake_add_program(...)`` call per (program, arch).

Usage (CMakeLists.txt runs it at configure time)::

    python tools/build_plan.py --output PLAN.cmake --build-dir DIR
        --archs auto|none|"sm_90a;sm_100a" [--nvcc PATH] [--cxx PATH] [--python PATH]
        (--repository ROOT | --package DIR [--package DIR ...])

It reads the manifests only through :mod:`cake.core.manifest`, runs the checker on every
tree first and fails (exit 1, the checker's lines on stderr) when it finds anything, so the
build refuses manifests that fail ``check_manifests``. Both layouts go through the same code:
a repository checkout (``manifests/<name>.json``, ``csrc/<name>/``, ``csrc/include/``;
libraries are installed into ``cake/<name>/lib``) and installed or vendored package folders
holding ``build.json`` and ``csrc/`` (libraries are built into ``<package dir>/lib``).

The plan is plain CMake: ``set(...)`` lines for the selected arches and the files whose change
must re-plan, then ``cake_add_package(...)`` per family and ``cake_add_program(...)`` per
library, which carries the library's build commands from :func:`cake.core.toolchain.library_steps`
(the commands the JIT runs), so prebuilt and JIT libraries are built alike.
It is rewritten only when its text changes. Exit status: 0 written, 1 findings or a bad
arch list, 2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake import checker  # noqa: E402
from cake.core import manifest as mf  # noqa: E402
from cake.core import toolchain as tc  # noqa: E402

# The Python files whose change changes the plan; CMake re-runs the plan when they change.
PLAN_CODE = (
    Path(__file__).resolve(),
    Path(mf.__file__).resolve(),
    Path(tc.__file__).resolve(),
    Path(checker.__file__).resolve(),
)


class PlanError(Exception):
    """A problem the user must fix before the build can go on (exit 1)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One package tree and how its built files are laid out."""

    name: str
    tree: mf.PackageTree
    manifest: mf.Manifest
    install_dir: str | None
    """Install destination relative to the wheel root (repository layout), else None."""
    output_dir: Path | None
    """Folder the libraries are built into (package layout), else None (build tree)."""


# --------------------------------------------------------------------------- arches


def resolve_arches(request: str, nvcc: str | None) -> list[str]:
    """The arches to build: ``none``, ``auto`` (what nvcc supports) or an explicit list."""
    words = [w for w in re.split(r"[;,\s]+", request.strip()) if w]
    if words in ([], ["auto"]):
        if not nvcc:
            raise PlanError("CAKE_CUDA_ARCHS=auto needs nvcc to find the arches it supports")
        arches = _nvcc_arches(nvcc)
        if not arches:
            raise PlanError(f"{nvcc} supports none of {', '.join(tc.DEFAULT_BUILD_ARCHES)}; "
                            "install CUDA 12.9 or newer, or set CAKE_CUDA_ARCHS=none")
        return arches
    if words == ["none"]:
        return []
    unknown = [w for w in words if w not in mf.KNOWN_ARCHES]
    if unknown:
        raise PlanError(f"CAKE_CUDA_ARCHS: unknown arch(es) {', '.join(unknown)}; use 'auto', "
                        f"'none' or a ';'-separated list of {', '.join(mf.KNOWN_ARCHES)}")
    if nvcc:
        supported = _nvcc_arches(nvcc, candidates=mf.KNOWN_ARCHES)
        missing = [w for w in words if w not in supported]
        if missing:
            raise PlanError(f"CAKE_CUDA_ARCHS asks for {', '.join(missing)}, which {nvcc} "
                            f"cannot compile (it supports {', '.join(supported) or 'none'}); "
                            "use a newer CUDA toolkit or leave those arches out")
    return list(dict.fromkeys(words))


def _nvcc_arches(nvcc: str, candidates: Sequence[str] = tc.DEFAULT_BUILD_ARCHES) -> list[str]:
    try:
        return tc.nvcc_supported_arches(nvcc, candidates)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PlanError(f"cannot run '{nvcc} --list-gpu-code': {exc}") from None


# --------------------------------------------------------------------------- trees


def repository_families(root: Path) -> list[Family]:
    families = []
    for name in mf.repository_families(root):
        tree = mf.repository_tree(root, name)
        families.append(Family(name, tree, _read(tree.manifest_path),
                               install_dir=f"{mf.REPO_PACKAGE}/{name}", output_dir=None))
    return families


def package_families(package_dirs: Iterable[Path]) -> list[Family]:
    families = []
    for package_dir in package_dirs:
        package_dir = Path(package_dir).resolve()
        if not (package_dir / mf.MANIFEST_NAME).is_file():
            raise PlanError(f"{package_dir}: no {mf.MANIFEST_NAME} (CAKE_PACKAGE_ROOT lists "
                            "package folders that hold build.json and csrc/)")
        tree = mf.package_tree(package_dir)
        families.append(Family(package_dir.name, tree, _read(tree.manifest_path),
                               install_dir=None, output_dir=package_dir / "lib"))
    return families


def _read(path: Path) -> mf.Manifest:
    try:
        return mf.read(path)
    except mf.ManifestError:
        return None  # the checker reports why; check() fails before the manifest is used
    except OSError as exc:
        raise checker.UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None


def check(families: Sequence[Family]) -> None:
    """Runs ``check_manifests`` on every tree; raises PlanError with its lines on findings."""
    findings = []
    for family in families:
        findings.extend(checker.check_tree(family.tree)[0])
    if findings:
        lines = [str(f) for f in sorted(findings)]
        raise PlanError("the manifests fail check_manifests, so nothing is built:\n  "
                        + "\n  ".join(lines)
                        + "\nfix the sources or re-render them (python tools/render.py), check "
                          "with 'python tools/check_manifests.py', then build again")


# --------------------------------------------------------------------------- plan text


def cmake_quote(value: str | Path) -> str:
    text = str(value)
    if ";" in text:
        raise PlanError(f"{text!r}: a ';' cannot appear in a build path or flag")
    return '"' + re.sub(r'([\\"$@])', r"\\\1", text) + '"'


def _args(values: Iterable[str | Path]) -> str:
    return " ".join(cmake_quote(v) for v in values)


def plan_text(families: Sequence[Family], arches: Sequence[str], layout: str,
              tools: tc.Tools | None = None, build_dir: Path | None = None,
              watch: Sequence[Path] = ()) -> str:
    """The plan; ``watch`` adds folders whose change (a manifest added) must re-plan.

    Each ``cake_add_program`` carries the library's build commands
    (:func:`toolchain.library_steps`, the JIT's commands) and its output file: package
    layout, ``<package>/lib/``; repository layout, ``<build dir>/lib/<family>/``, installed into
    the wheel's ``cake/<family>/lib``. Images go to ``<build dir>/images/``. Each family's
    ``cake_add_record`` then writes ``libraries.json`` next to its libraries: their sha256, which
    the loader checks before it loads one.
    """
    if arches and (tools is None or build_dir is None):
        raise PlanError("building for an arch needs the tools and a build folder")
    inputs: list[Path] = list(PLAN_CODE)
    lines = [
        "# Generated by tools/build_plan.py at configure time; do not edit.",
        f"set(CAKE_PLAN_LAYOUT {layout})",
        f"set(CAKE_PLAN_ARCHES {_args(arches)})",
    ]
    libraries = 0
    body: list[str] = []
    for family in families:
        tree, manifest = family.tree, family.manifest
        inputs.extend(tree.manifest_paths())
        inputs.extend(tree.header_path(h.path) for h in manifest.headers)
        inputs.extend(tree.source_path(s) for p in manifest.programs for s in p.sources)
        where = (f"INSTALL_DIR {cmake_quote(family.install_dir)}" if family.install_dir
                 else f"OUTPUT_DIR {cmake_quote(family.output_dir)}")
        body.append("")
        body.append(f"cake_add_package({family.name} {where}")
        body.append(f"  MANIFEST {cmake_quote(tree.manifest_path)}")
        body.append(f"  CSRC_DIR {cmake_quote(tree.csrc_dir)}")
        body.append(f"  INCLUDE_DIR {cmake_quote(tree.include_dir)}")
        body.append(f"  SOURCES {_args(sorted({s.path for p in manifest.programs for s in p.sources}))}")
        body.append(f"  HEADERS {_args(h.path for h in manifest.headers)})")
        output_dir = family.output_dir or (Path(build_dir or ".") / "lib" / family.name)
        outputs = []
        for program in manifest.programs:
            sources = [tc.Source(s.role, str(tree.source_path(s))) for s in program.sources]
            headers = [tree.header_path(h) for h in program.headers]
            for arch in [a for a in arches if a in program.arches]:
                libraries += 1
                output = output_dir / f"{program.library}_{arch}.so"
                outputs.append(output)
                steps = tc.library_steps(
                    tools, kind=program.kind, library=program.library, digest=program.digest,
                    arch=arch, include_dir=str(tree.include_dir), flags=program.flags,
                    sources=sources, work_dir=str(Path(build_dir) / "images"),
                    output=f"{output}.tmp")
                if len(steps) > MAX_STEPS:
                    raise PlanError(f"{program.library}: {len(steps)} build steps, at most "
                                    f"{MAX_STEPS} (one a kernel source, and the binding)")
                body.append(
                    f"cake_add_program({program.library} ARCH {arch} DIGEST {program.digest}"
                    f" PACKAGE {family.name} OUTPUT {cmake_quote(output)}\n"
                    f"  SOURCES {_args(s.path for s in sources)}\n"
                    f"  HEADERS {_args(headers)}")
                for i, step in enumerate(steps, 1):
                    body.append(f"  STEP{i} {_args(step)}")
                body[-1] += ")"
        if outputs:
            record = tc.record_step(tools.python, str(output_dir), [str(o) for o in outputs])
            body.append(f"cake_add_record({family.name} OUTPUT "
                        f"{cmake_quote(output_dir / 'libraries.json')}\n"
                        f"  LIBRARIES {_args(outputs)}\n  COMMAND {_args(record)})")
    # A new or removed manifest changes its folder, so watch the folders too.
    inputs.extend(sorted({f.tree.manifest_path.parent for f in families} | set(watch)))
    lines.append(f"set(CAKE_PLAN_LIBRARY_COUNT {libraries})")
    lines.append(f"set(CAKE_PLAN_PACKAGES {_args(f.name for f in families)})")
    lines.append("set(CAKE_PLAN_INPUTS")
    lines.extend(f"  {cmake_quote(p)}" for p in dict.fromkeys(inputs))
    lines.append(")")
    return "\n".join(lines + body) + "\n"


# cake_add_program's STEP1 .. STEP<MAX_STEPS> keywords (CMakeLists.txt's CAKE_MAX_STEPS).
MAX_STEPS = 32


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="build_plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="the plan file to write")
    parser.add_argument("--archs", default="auto",
                        help="'auto' (every arch nvcc supports among "
                             f"{', '.join(tc.DEFAULT_BUILD_ARCHES)}), 'none', or a list")
    parser.add_argument("--nvcc", help="nvcc: CUDA programs' images and the arches it supports")
    parser.add_argument("--cxx", help="the host C++ compiler (default: $CXX, c++ or g++)")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python with the pinned Triton, for Triton programs")
    parser.add_argument("--build-dir", type=Path, help="the build folder (libraries, images)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--repository", type=Path, help="a repository checkout root")
    where.add_argument("--package", type=Path, action="append",
                       help="a package folder with build.json and csrc/ (repeatable)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.repository is not None:
            root = args.repository.resolve()
            families, layout = repository_families(root), "repository"
            watch = [root / "manifests" if (root / "manifests").is_dir() else root]
        else:
            families, layout, watch = package_families(args.package), "package", []
        check(families)
        arches = resolve_arches(args.archs, args.nvcc)
        tools = None
        if arches:
            cxx = args.cxx or tc.find_cxx()
            if cxx is None:
                raise PlanError("no host C++ compiler ($CXX, c++ or g++) for the program "
                                "libraries; install g++ or set CXX")
            tools = tc.Tools(nvcc=args.nvcc, cxx=cxx, python=args.python, ptxas=tc.find_ptxas(),
                             fatbinary=tc.find_fatbinary())
        text = plan_text(families, arches, layout, tools, args.build_dir, watch)
        mf.write_if_changed(args.output, text.encode())
    except PlanError as exc:
        print(f"build_plan: error: {exc}", file=sys.stderr)
        return 1
    except (checker.UsageError, OSError) as exc:
        print(f"build_plan: error: {exc}", file=sys.stderr)
        return 2
    count = text.count("\ncake_add_program(")
    print(f"build_plan: {len(families)} package(s), {count} librar"
          f"{'y' if count == 1 else 'ies'} for {', '.join(arches) or 'no arch (JIT only)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
