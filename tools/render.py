#!/usr/bin/env python3
"""Renders digest-named programs and manifests from kernel templates and family tables.

Usage: ``python tools/render.py [--check]``

Each family table (``tools/families/<package name>.py``) names its templates (one per source
role: ``binding`` and ``kernel`` or several ``kernel_<name>``, under ``csrc/templates/``),
declares its C entries and lists its specializations. A CUDA template is a short program
source: its specialization knobs (``#define`` lines between ``// cake:params`` and
``// cake:end-params``), then an include of the family's header, then its kernels or entries
under the library name :data:`cake.manifest.LIBRARY_PLACEHOLDER`. A binding template also holds
an empty ``// cake:entries`` block, which rendering fills with the declared entries' X-macros
(cake/program.h). Rendering one specialization sets the knobs and the entries, hashes the text
(the digest) and puts the resulting library name in place of the placeholder. Output:
``csrc/<name>/<library>_<role>.cu`` and ``manifests/<name>.json``, plus ``manifests/schema.json``
from the manifest model. Same input, same bytes; files the tables no longer produce are
removed. ``--check`` writes nothing and exits 1 when a fresh render would change anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake.core import manifest as mf  # noqa: E402
from cake.core import triton_aot  # noqa: E402

_PARAMS_RE = re.compile(r"((?://|#) cake:params\n)(.*?)((?://|#) cake:end-params\n)", re.DOTALL)
_ENTRIES_RE = re.compile(r"// cake:entries\n(.*?)// cake:end-entries\n", re.DOTALL)
_DEFINE_RE = re.compile(r"#define (\w+) (.+)")
# A Triton template's knob: NAME = value, or NAME = tl.constexpr(value) for a constexpr.
_ASSIGN_RE = re.compile(r"(\w+) = (tl\.constexpr\()?(.+?)(\))?")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One specialization of a family: one program."""

    variant: dict
    """What it computes; copied into the manifest for the family's router."""
    route: dict
    """When the router picks it (channel band, token floor, ...)."""
    params: dict
    """Values for the templates' ``#define`` knobs (strings, numbers or booleans)."""
    arches: tuple = ("sm_90a", "sm_100a", "sm_103a")
    flags: tuple = ()
    kcp: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """A family table: its templates, its entries and the specializations to render."""

    name: str
    """The package's last component, e.g. ``cake_causal_conv1d_det_train``."""
    templates: dict
    """Source role -> template path relative to the repository root (the binding's last)."""
    specs: tuple
    entries: dict = dataclasses.field(default_factory=dict)
    """Entry name -> its arguments, ``((name, kind), ...)`` (kinds: cake.manifest.ARGUMENT_KINDS)."""
    kind: str = "cuda"


class RenderError(Exception):
    pass


def load_families(root: Path = REPO) -> dict[str, Family]:
    families = {}
    for path in sorted((root / "tools" / "families").glob("cake_*.py")):
        spec = importlib.util.spec_from_file_location(f"_cake_family_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        family = module.FAMILY
        if family.name != path.stem:
            raise RenderError(f"{path}: FAMILY.name is {family.name!r}, expected {path.stem!r}")
        families[family.name] = family
    return families


def specialize(template: str, params: dict, where: str) -> tuple[str, set]:
    """Sets the knobs of the template's params block (``#define NAME value`` lines in C++,
    ``NAME = value`` or ``NAME = tl.constexpr(value)`` lines in a Triton template); returns
    (text, knobs set)."""
    match = _PARAMS_RE.search(template)
    if not match:
        raise RenderError(f"{where}: no 'cake:params' ... 'cake:end-params' block")
    python = match.group(1).startswith("#")
    lines, seen = [], set()
    for line in match.group(2).splitlines():
        knob = (_ASSIGN_RE if python else _DEFINE_RE).fullmatch(line)
        if knob is None:
            lines.append(line)
            continue
        name = knob.group(1)
        if name not in params:
            raise RenderError(f"{where}: knob {name} has no value in the family table")
        seen.add(name)
        if python:
            value = repr(params[name])
            line = f"{name} = tl.constexpr({value})" if knob.group(2) else f"{name} = {value}"
        else:
            line = f"#define {name} {_c_value(params[name])}"
        lines.append(line)
    body = "\n".join(lines) + "\n"
    return template[: match.start(2)] + body + template[match.end(2):], seen


def with_entries(template: str, entries: tuple, where: str) -> str:
    """Fills a binding template's ``// cake:entries`` block (empty in the template)."""
    match = _ENTRIES_RE.search(template)
    if not match:
        raise RenderError(f"{where}: a binding needs a '// cake:entries' ... "
                          "'// cake:end-entries' block")
    if match.group(1):
        raise RenderError(f"{where}: the template's '// cake:entries' block must be empty "
                          "(the renderer writes it from the family table)")
    return template[: match.start()] + mf.entries_block(entries) + template[match.end():]


def program_flags(family: Family, spec: Spec) -> tuple:
    """A program's flags (in its digest): the table's, and for a Triton program what decides its
    cubins besides its sources: the pinned Triton and the compile options
    (cake/core/triton_aot.py)."""
    if family.kind != "triton":
        return tuple(spec.flags)
    return (f"triton=={triton_aot.TRITON_VERSION}", *triton_aot.COMPILE_OPTIONS, *spec.flags)


def declared_entries(family: Family) -> tuple:
    """The family table's entries as manifest :class:`~cake.core.manifest.Entry` records."""
    entries = []
    for name, args in family.entries.items():
        for arg, kind in args:
            if kind not in mf.ARGUMENT_KINDS:
                raise RenderError(f"{family.name}: entry {name} argument {arg}: kind {kind!r} is "
                                  f"not one of {', '.join(mf.ARGUMENT_KINDS)}")
        entries.append(mf.Entry(name, tuple(mf.Argument(arg, kind) for arg, kind in args)))
    if not entries:
        raise RenderError(f"{family.name}: the table declares no entries")
    return tuple(entries)


def _c_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def header_closure(texts: Sequence[str], include_dir: Path) -> list[str]:
    """Quoted includes that resolve in ``include_dir``, transitively, in first-seen order."""
    order: list[str] = []
    pending = [name for text in texts for name in mf.included_headers(text)]
    while pending:
        name = pending.pop(0)
        if name in order:
            continue
        path = include_dir / name
        if not path.is_file():
            raise RenderError(f"include \"{name}\" is not a file under {include_dir}")
        order.append(name)
        pending.extend(mf.included_headers(path.read_text()))
    return order


def render_family(family: Family, root: Path = REPO, prefix: str | None = None,
                  package: str | None = None) -> tuple[mf.Manifest, dict[str, bytes]]:
    """The manifest and the program files (name -> bytes) of one family.

    ``prefix``/``package`` render the same programs under another name (used by the
    rename-invariance test); by default both follow ``family.name``.
    """
    package = package or f"{mf.REPO_PACKAGE}.{family.name}"
    prefix = prefix or mf.expected_prefix(package)
    include_dir = root / "csrc" / "include"
    templates = {role: (root / path).read_text() for role, path in family.templates.items()}
    if "binding" not in templates:
        raise RenderError(f"{family.name}: no binding template")
    entries = declared_entries(family)
    headers: dict[str, mf.Header] = {}
    programs, files = [], {}
    for index, spec in enumerate(family.specs):
        where = f"{family.name} spec {index}"
        texts, used = {}, set()
        for role, template in templates.items():
            text, knobs = specialize(template, spec.params, f"{where} ({role})")
            if role == "binding":
                text = with_entries(text, entries, f"{where} (binding)")
            comment = "#" if family.templates[role].endswith(".py") else "//"
            texts[role] = (f"{comment} Generated by tools/render.py from {family.templates[role]}; "
                           f"do not edit.\n{text}")
            used |= knobs
        unknown = sorted(set(spec.params) - used)
        if unknown:
            raise RenderError(f"{where}: no template has the knob(s) {', '.join(unknown)}")
        names = header_closure(list(texts.values()), include_dir)
        for name in names:
            headers.setdefault(name, mf.Header(name, mf.sha256_hex((include_dir / name).read_bytes())))
        flags = program_flags(family, spec)
        digest = mf.program_digest(mf.LIBRARY_PLACEHOLDER,
                                   [(role, text.encode()) for role, text in texts.items()],
                                   [headers[n].sha256 for n in names], list(flags))
        library = mf.library_name(prefix, digest, spec.kcp)
        sources, kernels = [], []
        for role, text in texts.items():
            data = text.replace(mf.LIBRARY_PLACEHOLDER, library).encode()
            file_name = mf.source_file_name(library, role, family.kind)
            files[file_name] = data
            sources.append(mf.Source(role, file_name, mf.sha256_hex(data)))
            if role != "binding":
                kernels += mf.kernel_symbols(data.decode(), family.kind)
        programs.append(mf.Program(
            library=library, digest=digest, kind=family.kind, kcp=spec.kcp,
            variant=dict(spec.variant), route=dict(spec.route), arches=tuple(spec.arches),
            sources=tuple(sources), headers=tuple(names), entries=entries,
            kernels=tuple(kernels), flags=flags))
    libraries = [p.library for p in programs]
    duplicates = sorted({name for name in libraries if libraries.count(name) > 1})
    if duplicates:
        raise RenderError(f"{family.name}: specs render identical programs: {duplicates}")
    manifest = mf.Manifest(schema_version=mf.SCHEMA_VERSION, package=package,
                           library_prefix=prefix,
                           headers=tuple(sorted(headers.values(), key=lambda h: h.path)),
                           programs=tuple(sorted(programs, key=lambda p: p.library)))
    return manifest, files


def planned_outputs(root: Path, families: dict[str, Family]) -> dict[Path, bytes]:
    """Every file the renderer owns, with the bytes it should hold."""
    outputs = {root / "manifests" / "schema.json":
               (json.dumps(mf.json_schema(), indent=2, sort_keys=True) + "\n").encode()}
    for name, family in sorted(families.items()):
        manifest, files = render_family(family, root)
        outputs[root / "manifests" / f"{name}.json"] = mf.to_json(manifest).encode()
        for file_name, data in files.items():
            outputs[root / "csrc" / name / file_name] = data
    return outputs


def stale_files(root: Path, families: dict[str, Family], outputs: dict[Path, bytes]) -> list[Path]:
    """Rendered files on disk that the tables no longer produce."""
    stale = []
    for name in families:
        folder = root / "csrc" / name
        if folder.is_dir():
            stale.extend(p for p in sorted(folder.rglob("*")) if p.is_file() and p not in outputs)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a fresh render would change a file")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        families = load_families(args.root)
        outputs = planned_outputs(args.root, families)
    except (RenderError, OSError) as exc:
        print(f"render: error: {exc}", file=sys.stderr)
        return 2
    changed = [p for p, data in outputs.items() if not p.is_file() or p.read_bytes() != data]
    stale = stale_files(args.root, families, outputs)
    if args.check:
        for path in changed:
            print(f"render --check: {path.relative_to(args.root)} differs from a fresh render")
        for path in stale:
            print(f"render --check: {path.relative_to(args.root)} is no longer rendered")
        if changed or stale:
            print("render --check: run 'python tools/render.py' and commit the result")
            return 1
        print(f"render --check: ok ({len(outputs)} files up to date)")
        return 0
    for path in changed:
        mf.write_if_changed(path, outputs[path])
    for path in stale:
        path.unlink()
    print(f"render: {len(changed)} written, {len(stale)} removed, "
          f"{len(outputs) - len(changed)} unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
