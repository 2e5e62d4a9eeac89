"""The manifest model: read, validate, digest and write ``build.json`` manifests.

This module is the single implementation of docs/programs.md. The checker, the renderer,
the CMake build plan and the runtime loader all go through it. Standard library only:
it runs from a bare checkout, inside a build environment and inside a vendored copy.

A manifest describes one family package::

    {
      "schema_version": 2,
      "package": "cake.cake_causal_conv1d_det_train",
      "library_prefix": "cake_causal_conv1d_det_train",
      "headers": [{"path": "cake/program.h", "sha256": "..."}],
      "programs": [{"library": "<prefix>_<digest>", "digest": "<20 hex>", "kind": "cuda",
                    "kcp": false, "variant": {...}, "route": {...}, "arches": ["sm_90a"],
                    "sources": [{"role": "kernel", "path": "<library>_kernel.cu", "sha256": "..."},
                                {"role": "binding", "path": "<library>_binding.cu", "sha256": "..."}],
                    "headers": ["cake/program.h"],
                    "entries": [{"name": "forward",
                                 "args": [{"name": "x", "kind": "pointer"}, ...]}],
                    "kernels": ["kernel_<library>_forward"], "flags": []}]
    }

A program is CUDA (``kind`` ``cuda``: kernel sources compiled by nvcc, a binding compiled by the
host compiler) or Triton (``triton``: one ``.py`` kernel source per kernel, compiled by the pinned
Triton, and a rendered launcher binding). Its sources are one ``binding`` and one or more
kernels, with roles ``kernel`` or ``kernel_<name>``. Each entry is exported by the binding as
``<library>_<name>`` and takes one int64 slot per declared argument (cake/program.h).

Source paths are relative to the package's csrc folder; header paths are relative to the
include folder (``csrc/include`` in the repository, ``<package>/csrc/include`` installed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 2
DIGEST_LENGTH = 20
# Every occurrence of a program's library name is replaced by this before hashing, so a
# program keeps its digest when its family is renamed. Templates use it as the library name.
LIBRARY_PLACEHOLDER = "cake_library"
# Compute capability -> arch (docs/loader.md). An "a" build runs only on its exact capability.
ARCH_BY_CAPABILITY = {
    (9, 0): "sm_90a",
    (10, 0): "sm_100a",
    (10, 3): "sm_103a",
    (11, 0): "sm_110a",
    (12, 0): "sm_120a",
    (12, 1): "sm_121a",
}
KNOWN_ARCHES = tuple(ARCH_BY_CAPABILITY.values())
PROGRAM_KINDS = ("cuda", "triton")
ARGUMENT_KINDS = ("pointer", "i32", "i64", "f32", "f64")
# Exports every binding has besides its declared entries (cake/program.h).
IDENTITY_EXPORTS = ("digest", "abi_version")
MANIFEST_NAME = "build.json"
TEST_MANIFEST_NAME = "build.test.json"

_DIGEST_RE = re.compile(r"[0-9a-f]{%d}" % DIGEST_LENGTH)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROLE_RE = re.compile(r"binding|kernel(_[a-z0-9]+(_[a-z0-9]+)*)?")
_PACKAGE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_SCALAR = (str, int, float, bool)


# --------------------------------------------------------------------------- findings


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One problem in one field of one file. ``code`` is stable across releases."""

    path: str
    field: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.field}: {self.code} {self.message}"


# Every finding code with its one-line meaning; docs/programs.md lists the same set (a test
# checks it: tests/check/test_readme.py).
FINDING_CODES = {
    "CM101": "manifest is not valid JSON or not UTF-8",
    "CM102": "manifest does not follow the schema (missing field, wrong type, bad value)",
    "CM103": "manifest has a field the schema does not know",
    "CM104": "manifest JSON has a key twice in one object",
    "CM105": "manifest JSON has NaN or Infinity",
    "CM106": "manifest JSON is nested deeper than 64 levels",
    "CM107": "manifest JSON has an integer of more than 100 digits",
    "CM108": "manifest JSON has a string that is not Unicode text (a lone surrogate)",
    "CM201": "package is not the package the manifest belongs to",
    "CM202": "library_prefix does not match the package name",
    "CM203": "library is not <library_prefix>_<digest>[_kcp]",
    "CM204": "digest is not 20 lowercase hex digits",
    "CM205": "digest or library listed twice",
    "CM206": "program lists a source role more than once, or no binding and kernel",
    "CM301": "listed source file is missing",
    "CM302": "source path is absolute or leaves the package's csrc folder",
    "CM303": "source path goes through a symbolic link",
    "CM304": "source bytes differ from the recorded sha256",
    "CM305": "source file name does not carry the library name",
    "CM306": "kernel or entry symbol does not carry the library name or is not in its source",
    "CM307": "file in the csrc folder that no manifest lists",
    "CM310": "the manifest, the csrc folder, the include folder or a folder inside csrc is a "
             "symbolic link",
    "CM308": "binding does not export exactly the declared entries (plus digest and abi_version)",
    "CM309": "binding's rendered argument declaration differs from the manifest's entry",
    "CM401": "recomputed digest differs from the recorded digest",
    "CM501": "unknown arch",
    "CM601": "header file is missing",
    "CM602": "header bytes differ from the recorded sha256",
    "CM603": "program uses a header the manifest does not list",
    "CM701": "vendored Python file imports something other than its own package, the standard "
             "library, torch or triton",
    "CM702": "vendored manifest differs from upstream in a field other than package",
    "CM703": "vendored file differs from what tools/vendor.py makes of upstream's, or is missing",
    "CM704": "vendored package has no valid VENDORED.json (the record tools/vendor.py writes), "
             "or it differs from the record tools/vendor.py writes for the copy",
    "CM705": "file in a vendored package that is not an upstream file, nor a library in lib/",
    "CM706": "symbolic link in a vendored package",
    "CM707": "bytecode (.pyc, __pycache__) in a vendored package that git tracks, or any where "
             "the host is not a git checkout",
    "CM708": "vendored Python file uses importlib, __import__, exec or eval",
    "CM709": "the cake-train running the gate is not the version or commit the vendored copy "
             "came from (VENDORED.json), or has no such family",
    "CM710": "a vendored KCP package's base family is not vendored beside it, or was vendored "
             "from another cake-train",
    "CM801": "installed library missing from the build record (lib/libraries.json), or listed "
             "there and missing",
    "CM802": "installed library's bytes differ from the sha256 in the build record",
    "CM803": "the build record (lib/libraries.json) cannot be read as one",
}


class ManifestError(Exception):
    """A manifest that cannot be used at all; carries the findings that say why."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(str(f) for f in findings))


# --------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class Source:
    """One source file of a program."""

    role: str
    """``binding`` (the C entry points), ``kernel`` or ``kernel_<name>`` (device code)."""
    path: str
    """Relative to the package's csrc folder, ``/``-separated."""
    sha256: str
    """Lowercase hex sha256 of the file's bytes."""


@dataclasses.dataclass(frozen=True)
class Argument:
    """One declared argument of a C entry."""

    name: str
    """A C identifier; the binding's argument struct has a field of this name."""
    kind: str
    """``pointer``, ``i32``, ``i64``, ``f32`` or ``f64``: how its int64 slot is read."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One C entry of a program, exported as ``<library>_<name>``."""

    name: str
    """The entry's name, e.g. ``forward``."""
    args: tuple
    """Its :class:`Argument` list, in slot order (the stream is a separate parameter)."""


@dataclasses.dataclass(frozen=True)
class Header:
    """A shared header that programs include."""

    path: str
    """Relative to the include folder, e.g. ``cake/program.h``."""
    sha256: str
    """Lowercase hex sha256 of the file's bytes."""


@dataclasses.dataclass(frozen=True)
class Program:
    """One digest-named program: a kernel source and a binding source."""

    library: str
    """``<library_prefix>_<digest>``, plus ``_kcp`` for context-parallel-only programs."""
    digest: str
    """First 20 hex digits of the program digest (see :func:`program_digest`)."""
    kind: str
    """``cuda`` or ``triton``: how its kernel sources are compiled."""
    kcp: bool
    """True for programs that only context parallelism uses."""
    variant: dict
    """What the program computes (dtypes, bias, activation, ...): flat str -> scalar."""
    route: dict
    """When the family's router picks it (channel band, token floor, ...): flat str -> scalar."""
    arches: tuple
    """GPU arches it is built for, e.g. ``("sm_90a", "sm_100a")``."""
    sources: tuple
    """Its :class:`Source` files, in digest order."""
    headers: tuple
    """Paths of the shared headers it includes, in digest order."""
    entries: tuple
    """Its declared C :class:`Entry` points."""
    kernels: tuple
    """Kernel symbols, each ``kernel_<library>[_<name>]``."""
    flags: tuple
    """Extra compile flags (nvcc's, or a Triton program's compiler and options); in the digest."""

    def entry(self, name: str) -> "Entry | None":
        return next((e for e in self.entries if e.name == name), None)

    def source(self, role: str) -> "Source | None":
        return next((s for s in self.sources if s.role == role), None)

    def kernel_sources(self) -> tuple:
        """The sources of device code, in manifest order."""
        return tuple(s for s in self.sources if s.role != "binding")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The manifest of one family package."""

    schema_version: int
    """Always :data:`SCHEMA_VERSION`."""
    package: str
    """Dotted Python package that owns the programs."""
    library_prefix: str
    """``cake_<op>_<mode>_train``: the package's last component without ``_kcp``."""
    headers: tuple
    """The shared :class:`Header` files the programs may include."""
    programs: tuple
    """The :class:`Program` entries."""

    def header(self, path: str) -> Header | None:
        return next((h for h in self.headers if h.path == path), None)


# Field name -> (type checker, required). Drives parsing, validation and the JSON Schema.
_FIELDS = {
    Manifest: {
        "schema_version": "int",
        "package": "package",
        "library_prefix": "identifier",
        "headers": ["Header"],
        "programs": ["Program"],
    },
    Header: {"path": "relpath", "sha256": "sha256"},
    Source: {"role": "role", "path": "relpath", "sha256": "sha256"},
    Argument: {"name": "identifier", "kind": "argkind"},
    Entry: {"name": "identifier", "args": ["Argument"]},
    Program: {
        "library": "identifier",
        "digest": "string",
        "kind": "programkind",
        "kcp": "bool",
        "variant": "scalars",
        "route": "scalars",
        "arches": ["arch"],
        "sources": ["Source"],
        "headers": ["relpath"],
        "entries": ["Entry"],
        "kernels": ["identifier"],
        "flags": ["string"],
    },
}
_CLASSES = {"Manifest": Manifest, "Header": Header, "Source": Source, "Argument": Argument,
            "Entry": Entry, "Program": Program}


class _Parser:
    """Turns decoded JSON into the dataclasses, collecting findings instead of raising."""

    def __init__(self, path: str):
        self.path = path
        self.findings: list[Finding] = []

    def error(self, field: str, code: str, message: str) -> None:
        self.findings.append(Finding(self.path, field, code, message))

    def record(self, cls: type, value: Any, field: str) -> Any:
        if not isinstance(value, dict):
            self.error(field or "$", "CM102", f"expected an object, got {type(value).__name__}")
            return None
        spec = _FIELDS[cls]
        for key in sorted(set(value) - set(spec)):
            self.error(_join(field, key), "CM103", f"unknown field {key!r}")
        kwargs = {}
        for key, kind in spec.items():
            sub = _join(field, key)
            if key not in value:
                self.error(sub, "CM102", "missing required field")
                return None
            kwargs[key] = self.value(kind, value[key], sub)
        if any(v is _INVALID for v in kwargs.values()):
            return None
        return cls(**kwargs)

    def value(self, kind: Any, value: Any, field: str) -> Any:
        if isinstance(kind, list):
            if not isinstance(value, list):
                self.error(field, "CM102", f"expected a list, got {type(value).__name__}")
                return _INVALID
            items = [self.value(kind[0], item, f"{field}[{i}]") for i, item in enumerate(value)]
            return _INVALID if any(i is _INVALID or i is None for i in items) else tuple(items)
        if kind in _CLASSES:
            result = self.record(_CLASSES[kind], value, field)
            return _INVALID if result is None else result
        problem = _check_scalar(kind, value)
        if problem:
            code = "CM501" if kind == "arch" and isinstance(value, str) else "CM102"
            self.error(field, code, problem)
            return _INVALID
        return dict(value) if kind == "scalars" else value


_INVALID = object()


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _check_scalar(kind: str, value: Any) -> str | None:
    """Returns why ``value`` is not of ``kind``, or None."""
    checks = {
        "int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v == SCHEMA_VERSION,
                f"expected schema version {SCHEMA_VERSION}"),
        "bool": (lambda v: isinstance(v, bool), "expected true or false"),
        "string": (lambda v: isinstance(v, str), "expected a string"),
        "identifier": (lambda v: isinstance(v, str) and _IDENTIFIER_RE.fullmatch(v),
                       "expected a C identifier"),
        "package": (lambda v: isinstance(v, str) and _PACKAGE_RE.fullmatch(v),
                    "expected a dotted Python package name"),
        "sha256": (lambda v: isinstance(v, str) and _SHA256_RE.fullmatch(v),
                   "expected 64 lowercase hex digits"),
        "relpath": (lambda v: isinstance(v, str) and v != "" and "\\" not in v,
                    "expected a non-empty /-separated path"),
        "role": (lambda v: isinstance(v, str) and _ROLE_RE.fullmatch(v),
                 "expected binding, kernel or kernel_<name>"),
        "argkind": (lambda v: v in ARGUMENT_KINDS, f"expected one of {', '.join(ARGUMENT_KINDS)}"),
        "programkind": (lambda v: v in PROGRAM_KINDS, f"expected one of {', '.join(PROGRAM_KINDS)}"),
        "arch": (lambda v: v in KNOWN_ARCHES, f"unknown arch; known: {', '.join(KNOWN_ARCHES)}"),
        "scalars": (lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and isinstance(x, _SCALAR) for k, x in v.items()),
            "expected an object of strings, numbers and booleans"),
    }
    ok, message = checks[kind]
    return None if ok(value) else f"{message}, got {value!r}"


# What a manifest's JSON may not be (CM104..CM108): such text is refused before its structure
# is looked at, with one finding, whatever its size or depth.
MAX_DEPTH = 64
MAX_INTEGER_DIGITS = 100


class _Unusable(ValueError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _unique_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Unusable("CM104", f"key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def _no_constant(name):
    raise _Unusable("CM105", f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _Unusable("CM105", f"{text} is not a finite number")
    return value


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Unusable("CM107", f"an integer of {len(text)} digits (at most "
                                 f"{MAX_INTEGER_DIGITS})")
    return int(text)


def _depth_problem(text: str) -> str | None:
    """Nesting deeper than MAX_DEPTH, found by one pass over the text (brackets outside
    strings), before the parser recurses."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
        elif char in "]}":
            depth -= 1
    return None


def _surrogate(value) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_surrogate(k) or _surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_surrogate(v) for v in value)
    return False


def parse(data: bytes, path: str) -> Manifest:
    """Parses manifest bytes; raises :class:`ManifestError` with CM1xx/CM501 findings."""
    try:
        text = data.decode("utf-8")
        depth = _depth_problem(text)
        if depth:
            raise _Unusable("CM106", depth)
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                              parse_int=_integer, parse_float=_float)
        if _surrogate(document):
            raise _Unusable("CM108", "a string holds a lone surrogate (not Unicode text)")
    except _Unusable as exc:
        raise ManifestError([Finding(path, "$", exc.code, str(exc))]) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ManifestError([Finding(path, "$", "CM101", f"cannot parse: {exc}")]) from None
    parser = _Parser(path)
    manifest = parser.record(Manifest, document, "")
    if parser.findings or manifest is None:
        raise ManifestError(parser.findings)
    return manifest


def read(path: Path) -> Manifest:
    """Reads and parses a manifest file. OSError propagates (an I/O problem, not a finding)."""
    return parse(Path(path).read_bytes(), str(path))


def to_json(manifest: Manifest) -> str:
    """The canonical text of a manifest: sorted keys, two-space indent, trailing newline."""
    return json.dumps(_to_plain(manifest), indent=2, sort_keys=True) + "\n"


def write(manifest: Manifest, path: Path) -> bool:
    """Writes the canonical text; returns False (and leaves the file alone) if unchanged."""
    return write_if_changed(Path(path), to_json(manifest).encode())


def write_if_changed(path: Path, data: bytes) -> bool:
    """Writes ``data`` unless the file already holds exactly it, so build tools see no change."""
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    temporary.replace(path)
    return True


def with_package(manifest: Manifest, package: str) -> Manifest:
    """The same manifest owned by another package (vendoring); programs unchanged."""
    return dataclasses.replace(manifest, package=package)


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    return value


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) equivalent to the parser's rules; committed in manifests/."""
    patterns = {
        "int": {"const": SCHEMA_VERSION},
        "bool": {"type": "boolean"},
        "string": {"type": "string"},
        "identifier": {"type": "string", "pattern": f"^{_IDENTIFIER_RE.pattern}$"},
        "package": {"type": "string", "pattern": f"^{_PACKAGE_RE.pattern}$"},
        "sha256": {"type": "string", "pattern": f"^{_SHA256_RE.pattern}$"},
        "relpath": {"type": "string", "minLength": 1, "pattern": r"^[^\\]*$"},
        "role": {"type": "string", "pattern": f"^({_ROLE_RE.pattern})$"},
        "argkind": {"enum": list(ARGUMENT_KINDS)},
        "programkind": {"enum": list(PROGRAM_KINDS)},
        "arch": {"enum": list(KNOWN_ARCHES)},
        "scalars": {"type": "object",
                    "additionalProperties": {"type": ["string", "number", "boolean"]}},
    }

    def schema_of(kind: Any) -> dict:
        if isinstance(kind, list):
            return {"type": "array", "items": schema_of(kind[0])}
        if kind in _CLASSES:
            return {"$ref": f"#/$defs/{kind}"}
        return patterns[kind]

    def record(cls: type) -> dict:
        docs = _field_docs(cls)
        properties = {}
        for key, kind in _FIELDS[cls].items():
            properties[key] = dict(schema_of(kind), description=docs.get(key, ""))
        return {"type": "object", "description": (cls.__doc__ or "").strip(),
                "properties": properties, "required": list(_FIELDS[cls]),
                "additionalProperties": False}

    schema = record(Manifest)
    schema.update({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cake-train manifest (build.json)",
        "$defs": {name: record(cls) for name, cls in _CLASSES.items() if cls is not Manifest},
    })
    return schema


def _field_docs(cls: type) -> dict:
    """Field docstrings (the string literal after each field) from the class source."""
    import inspect

    lines = inspect.getsource(cls).splitlines()
    docs = {}
    for i, line in enumerate(lines[:-1]):
        match = re.match(r"\s+(\w+): .+", line)
        nxt = lines[i + 1].strip()
        if match and nxt.startswith('"""') and nxt.endswith('"""') and len(nxt) > 6:
            docs[match.group(1)] = nxt[3:-3]
    return docs


# --------------------------------------------------------------------------- digest


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def program_digest(library: str, sources: list[tuple[str, bytes]],
                   header_sha256s: list[str], flags: list[str]) -> str:
    """The program digest (docs/programs.md, Digest).

    sha256 over, in manifest order, each source's role and its bytes with every occurrence
    of ``library`` replaced by :data:`LIBRARY_PLACEHOLDER`, then the sha256 of each header the
    program includes, then its extra flags; the first 20 hex digits. Lengths are hashed in
    front of variable-length parts so that no two different inputs share a byte stream.
    """
    placeholder = LIBRARY_PLACEHOLDER.encode()
    name = library.encode()
    h = hashlib.sha256(b"cake-program-digest-v1\n")
    for role, data in sources:
        body = data.replace(name, placeholder) if name else data
        h.update(f"source {role} {len(body)}\n".encode())
        h.update(body)
    for header_sha in header_sha256s:
        h.update(f"header {header_sha}\n".encode())
    for flag in flags:
        h.update(f"flag {len(flag.encode())}\n".encode())
        h.update(flag.encode())
    return h.hexdigest()[:DIGEST_LENGTH]


_ENTRIES_START = "// cake:entries\n"
_ENTRIES_END = "// cake:end-entries\n"
_ENTRY_DEFINE_RE = re.compile(r"#define CAKE_ENTRY_(\w+)\(X\)((?: X\(\w+, \w+\))*)")
_ENTRY_ARG_RE = re.compile(r" X\((\w+), (\w+)\)")
# One token of a source line: an identifier, a string or character literal, or any other
# character. No alternative can fail after its first character (a literal without its closing
# quote runs to the end of the line, its closing group unmatched), so an attempt examines only
# the characters it consumes and tokenising a line is linear in its length. (Requiring the
# closing quote made every quote of a line like ``"\"\"\"...`` rescan the rest of the line.)
_TOKEN_RE = re.compile(r"""[A-Za-z_]\w*|"(?:[^"\\\n]|\\.)*(?P<close>")?"""
                       r"""|'(?:[^'\\\n]|\\.)*(?P<close_char>')?|\S""")
_PLAIN_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\S")  # the same on a line without quotes
_INCLUDE_LINE_RE = re.compile(r'[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"')


@dataclasses.dataclass
class Scan:
    """What a source defines and uses, found in one pass (:func:`scan`)."""

    kernels: list = dataclasses.field(default_factory=list)
    """Kernel symbols: ``__global__`` functions, kernels defined through a family header's
    ``CAKE_<...>KERNEL(<symbol>, ...)`` macro, or a Triton source's ``@triton.jit`` functions."""
    entries: list = dataclasses.field(default_factory=list)
    """Functions marked ``CAKE_EXPORT`` (not on preprocessor lines: a header may define it)."""
    includes: list = dataclasses.field(default_factory=list)
    """Include-folder files it uses: quoted ``#include``s, ``cake_include("...")`` calls."""
    operations: int = 0
    """The scan's work: one a line, one a character its tokenising examined (up to the end of
    its last token, or the whole of a preprocessor line), one a character the search for the
    next line to read passed, and one a token the state machine took: at most three times the
    text's length plus its lines. :func:`rendered_entries` adds the characters its search
    examined."""


def scan(text: str, kind: str = "cuda") -> Scan:
    """Kernels, entries and includes of a source in one linear pass over its lines and tokens
    (no backtracking regex over the whole text: a source of any shape cannot make it slow).
    Comments (``//`` in C++, ``#`` in Triton sources) are skipped, and so is the rest of a line
    after a string or character literal that the line does not close.

    While no definition is pending, the lines up to the next one holding a word that can start
    something (:data:`_CANDIDATE_RE`) are skipped by one search: a line without one feeds the
    state machine nothing it acts on, and most lines of a source have none."""
    found = Scan()
    state = _ScanState()
    after_decorator = False
    position, length = 0, len(text)
    while position <= length:
        if state.idle() and not after_decorator:
            candidate = _CANDIDATE_RE.search(text, position)
            found.operations += (length if candidate is None else candidate.start()) - position
            if candidate is None:
                break
            newline = text.rfind("\n", position, candidate.start())
            position = position if newline < 0 else newline + 1
        else:  # blank lines feed nothing, but end a Triton decorator's wait for its def
            blank = _BLANK_LINES_RE.match(text, position)
            if blank is not None:
                found.operations += blank.end() - position
                position, after_decorator = blank.end(), False
                continue
        end = text.find("\n", position)
        end = length if end < 0 else end
        after_decorator = _scan_line(text[position:end], kind, found, state, after_decorator)
        position = end + 1
    found.kernels = list(dict.fromkeys(found.kernels))
    found.entries = list(dict.fromkeys(found.entries))
    return found


_BLANK_LINES_RE = re.compile(r"[ \t\r\f\v\n]*\n")  # backs off at most one line's indent
# A line the scan must read while its state machine is idle holds one of these: the words a
# definition, an export, a family kernel macro or an include starts with, or Triton's decorator.
_CANDIDATE_RE = re.compile(r"CAKE_|__global__|include|@triton\.jit")


def _scan_line(line: str, kind: str, found: Scan, state: "_ScanState",
               after_decorator: bool) -> bool:
    """One line of :func:`scan`; returns whether it is a Triton ``@triton.jit`` line."""
    found.operations += 1
    stripped = line.lstrip()
    if kind != "triton" and stripped.startswith("#"):
        found.operations += len(line)
        include = _INCLUDE_LINE_RE.match(line)
        if include:
            found.includes.append(include.group(1))
        return False  # a preprocessor line: no definition of ours
    if kind == "triton":
        if after_decorator and stripped.startswith("def "):
            name = stripped[4:].split("(", 1)[0].strip()
            if name.isidentifier():
                found.kernels.append(name)
    comment = "#" if kind == "triton" else "//"
    if comment not in line and '"' not in line and "'" not in line:
        # No comment and no literal: every token counts, and the last ends at the last non-blank.
        tokens = _PLAIN_TOKEN_RE.findall(line)
        found.operations += len(line.rstrip())
        state.feed(tokens, found)
        return kind == "triton" and stripped.startswith("@triton.jit")
    tokens = []
    examined = 0
    for match in _TOKEN_RE.finditer(line):
        found.operations += match.end() - examined  # the blanks before it and the token
        examined = match.end()
        token = match.group()
        if token == "/" and comment == "//" and line.startswith("//", match.start()):
            break
        if token == "#" and comment == "#":
            break
        if token[0] in "\"'" and match.lastgroup is None:
            break  # a literal left open: the rest of the line is inside it
        tokens.append(token)
    state.feed(tokens, found)
    return kind == "triton" and stripped.startswith("@triton.jit")


class _ScanState:
    """The token state machine of :func:`scan`, carried across lines."""

    def __init__(self):
        self.mode = None      # "export" or "global": waiting for the defined name's "("
        self.include = False  # after cake_include: waiting for its "file"
        self.last = None      # the last identifier of the definition so far
        self.bounds = 0       # parentheses open in a __launch_bounds__(...), -1 before them

    def idle(self) -> bool:
        """Nothing pending: a line without a :data:`_CANDIDATE_RE` word changes nothing."""
        return self.mode is None and not self.include

    def feed(self, tokens: list, found: Scan) -> None:
        found.operations += len(tokens)
        for index, token in enumerate(tokens):
            if self.include:  # cake_include ( "x" )
                if token.startswith('"'):
                    found.includes.append(token[1:-1])
                    self.include = False
                elif token != "(":
                    self.include = False
            elif self.mode is not None:
                self._definition(token, found)
            elif token == "CAKE_EXPORT":
                self.mode, self.last = "export", None
            elif token == "__global__":
                self.mode, self.last = "global", None
            elif token == "cake_include":
                self.include = True
            elif (index == 0 and token.startswith("CAKE_") and token.endswith("KERNEL")
                  and len(tokens) > 2 and tokens[1] == "(" and _is_name(tokens[2])):
                found.kernels.append(tokens[2])

    def _definition(self, token: str, found: Scan) -> None:
        if self.bounds:
            if token == "(":
                self.bounds = 1 if self.bounds < 0 else self.bounds + 1
            elif token == ")" and self.bounds > 0:
                self.bounds -= 1
        elif token == "__launch_bounds__":
            self.bounds = -1
        elif token == "(":
            if self.last is not None:
                (found.entries if self.mode == "export" else found.kernels).append(self.last)
            self.mode = None
        elif token in (";", "{", "}", "="):
            self.mode = None
        elif _is_name(token):
            self.last = token


def _is_name(token: str) -> bool:
    return token[0].isalpha() or token[0] == "_"


def kernel_symbols(text: str, kind: str = "cuda") -> list[str]:
    """Names of the kernels a kernel source defines, in order (:func:`scan`)."""
    return scan(text, kind).kernels


def included_headers(text: str) -> list[str]:
    """The include folder's files a source uses, in order (:func:`scan`): ``#include "..."`` of
    C++ and ``cake_include("...")`` of Triton sources (which a C++ scan sees as well)."""
    return scan(text).includes


def entry_symbols(text: str) -> list[str]:
    """Names of the ``CAKE_EXPORT`` functions defined in a binding source, in order."""
    return scan(text).entries


def entries_block(entries: tuple) -> str:
    """The ``// cake:entries`` block of a binding: one X-macro a declared entry (cake/program.h),
    the C side of the declaration that Python packs calls from."""
    lines = ["// cake:entries"]
    for entry in entries:
        args = "".join(f" X({a.kind}, {a.name})" for a in entry.args)
        lines.append(f"#define CAKE_ENTRY_{entry.name}(X){args}")
    return "\n".join(lines + ["// cake:end-entries"]) + "\n"


def rendered_entries(text: str, work: Any = None) -> tuple | None:
    """The entries a binding's ``// cake:entries`` block declares (None without the block): the
    lines from the first ``// cake:entries`` marker to the first ``// cake:end-entries`` marker
    after it. Two searches and one pass over the block (a search from every start marker for an
    end marker would be quadratic in a text of start markers alone); ``work`` (a :class:`Scan`
    or anything with an ``operations`` count), if given, gets the characters they examined."""
    start = text.find(_ENTRIES_START)
    end = -1 if start < 0 else text.find(_ENTRIES_END, start + len(_ENTRIES_START))
    if work is not None:
        work.operations += len(text) if end < 0 else end + len(_ENTRIES_END)
    if end < 0:
        return None
    entries = []
    for line in text[start + len(_ENTRIES_START):end].splitlines():
        define = _ENTRY_DEFINE_RE.fullmatch(line)
        if define is None:
            return None
        args = tuple(Argument(name, kind) for kind, name in _ENTRY_ARG_RE.findall(define.group(2)))
        entries.append(Entry(define.group(1), args))
    return tuple(entries)


def expected_prefix(package: str) -> str:
    """``cake.cake_x_det_train[_kcp]`` -> ``cake_x_det_train`` (docs/architecture.md, Names)."""
    last = package.rsplit(".", 1)[-1]
    return last[: -len("_kcp")] if last.endswith("_kcp") else last


def library_name(prefix: str, digest: str, kcp: bool) -> str:
    return f"{prefix}_{digest}" + ("_kcp" if kcp else "")


def is_digest(value: str) -> bool:
    return bool(_DIGEST_RE.fullmatch(value))


def source_file_name(library: str, role: str, kind: str = "cuda") -> str:
    """``<library>_<role>.cu``, or ``.py`` for a Triton program's kernel sources."""
    suffix = ".py" if kind == "triton" and role != "binding" else ".cu"
    return f"{library}_{role}{suffix}"


# --------------------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class PackageTree:
    """Where one family's manifest, program sources and headers live on disk.

    Two layouts share this shape: the repository (``manifests/<name>.json``,
    ``csrc/<name>/``, ``csrc/include/``) and an installed or vendored package
    (``<package dir>/build.json``, ``<package dir>/csrc/``, ``<package dir>/csrc/include/``).
    """

    manifest_path: Path
    csrc_dir: Path
    include_dir: Path
    owner: str
    """The dotted package the manifest must name."""
    test_manifest_path: Path | None = None

    def source_path(self, source: Source) -> Path:
        return self.csrc_dir / source.path

    def header_path(self, header_path: str) -> Path:
        return self.include_dir / header_path

    def manifest_paths(self) -> Iterator[Path]:
        yield self.manifest_path
        if self.test_manifest_path is not None and self.test_manifest_path.exists():
            yield self.test_manifest_path


REPO_PACKAGE = "cake"


def repository_tree(root: Path, name: str) -> PackageTree:
    """The family ``name`` in a repository checkout rooted at ``root``."""
    root = Path(root)
    return PackageTree(
        manifest_path=root / "manifests" / f"{name}.json",
        csrc_dir=root / "csrc" / name,
        include_dir=root / "csrc" / "include",
        owner=f"{REPO_PACKAGE}.{name}",
        test_manifest_path=root / "manifests" / f"{name}.test.json",
    )


def package_tree(package_dir: Path, owner: str | None = None) -> PackageTree:
    """An installed or vendored package directory holding ``build.json`` and ``csrc/``.

    Without ``owner`` the dotted name is found by walking up through ``__init__.py`` files.
    """
    package_dir = Path(package_dir)
    return PackageTree(
        manifest_path=package_dir / MANIFEST_NAME,
        csrc_dir=package_dir / "csrc",
        include_dir=package_dir / "csrc" / "include",
        owner=owner or dotted_package_name(package_dir),
        test_manifest_path=package_dir / TEST_MANIFEST_NAME,
    )


def dotted_package_name(package_dir: Path) -> str:
    parts = [package_dir.name]
    parent = package_dir.resolve().parent
    while (parent / "__init__.py").is_file():
        parts.append(parent.name)
        parent = parent.parent
    return ".".join(reversed(parts))


def repository_families(root: Path) -> list[str]:
    """Names of the families whose manifests are in ``root/manifests``."""
    return sorted(p.stem for p in (Path(root) / "manifests").glob("*.json")
                  if not p.name.endswith(".test.json") and p.name != "schema.json")
