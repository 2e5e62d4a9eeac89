"""The committed JSON Schema is the model's, and the schema and the parser agree."""

from __future__ import annotations

import copy
import json
import re

import pytest
from toy_tree import FAMILY_A, REPO

from cake.core import manifest as mf

SCHEMA_PATH = REPO / "manifests" / "schema.json"


def test_committed_schema_is_current():
    expected = json.dumps(mf.json_schema(), indent=2, sort_keys=True) + "\n"
    assert SCHEMA_PATH.is_file(), "manifests/schema.json is missing: run 'python tools/render.py'"
    assert SCHEMA_PATH.read_text() == expected, \
        "manifests/schema.json is out of date: run 'python tools/render.py' and commit it"


# --------------------------------------------------------------------------- a small validator
# Just the keywords json_schema() uses (no jsonschema dependency). Errors are (path, keyword).


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
}
_KNOWN = {"$schema", "$defs", "$ref", "title", "description", "type", "properties", "required",
          "additionalProperties", "items", "enum", "const", "pattern", "minLength"}


def _json_equal(a, b) -> bool:
    """JSON equality: true is not 1, unlike in Python."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _ecma_search(pattern: str, value: str) -> bool:
    # ECMA-262 '$' (no multiline) matches only at the very end; Python's also before a final \n.
    return re.search(re.sub(r"\$$", r"\\Z", pattern), value) is not None


def validate(schema: dict, value, root: dict | None = None, path: str = "$") -> list[tuple]:
    root = root or schema
    unknown = set(schema) - _KNOWN
    assert not unknown, f"validator does not know the keywords {unknown}: extend it"
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return validate(root["$defs"][name], value, root, path)
    errors = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [(path, "type")]
    if "const" in schema and not _json_equal(value, schema["const"]):
        errors.append((path, "const"))
    if "enum" in schema and not any(_json_equal(value, e) for e in schema["enum"]):
        errors.append((path, "enum"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append((path, "minLength"))
        if "pattern" in schema and not _ecma_search(schema["pattern"], value):
            errors.append((path, "pattern"))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, root, f"{path}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append((f"{path}.{key}", "required"))
        for key, item in value.items():
            if key in properties:
                errors += validate(properties[key], item, root, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append((f"{path}.{key}", "additionalProperties"))
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += validate(schema["additionalProperties"], item, root, f"{path}.{key}")
    return errors


# --------------------------------------------------------------------------- agreement table


@pytest.fixture
def document(toy) -> dict:
    return json.loads(toy.tree(FAMILY_A).manifest_path.read_text())


def _set(path: str, value):
    """A mutation that sets (or, with value ``DELETE``, removes) a dotted/indexed key."""
    def mutate(document):
        *parents, last = re.findall(r"[^.\[\]]+", path)
        target = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is DELETE:
            del target[last]
        elif last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value
    return mutate


DELETE = object()

INVALID = {
    "schema_version wrong": (_set("schema_version", 2), "CM102"),
    "schema_version true": (_set("schema_version", True), "CM102"),
    "schema_version string": (_set("schema_version", "1"), "CM102"),
    "package missing": (_set("package", DELETE), "CM102"),
    "package not dotted name": (_set("package", "cake..x"), "CM102"),
    "package with newline": (_set("package", "cake.x\n"), "CM102"),
    "prefix not identifier": (_set("library_prefix", "cake-x"), "CM102"),
    "unknown top-level field": (_set("comment", "x"), "CM103"),
    "headers not a list": (_set("headers", {}), "CM102"),
    "header sha256 upper case": (_set("headers.0.sha256", "A" * 64), "CM102"),
    "header sha256 short": (_set("headers.0.sha256", "a" * 63), "CM102"),
    "header path empty": (_set("headers.0.path", ""), "CM102"),
    "header path backslash": (_set("headers.0.path", "toy\\common.h"), "CM102"),
    "header unknown field": (_set("headers.0.size", 3), "CM103"),
    "program not an object": (_set("programs.0", []), "CM102"),
    "library with newline": (_set("programs.0.library", "cake_x\n"), "CM102"),
    "digest not a string": (_set("programs.0.digest", 5), "CM102"),
    "kcp not a bool": (_set("programs.0.kcp", 0), "CM102"),
    "variant nested": (_set("programs.0.variant", {"a": [1]}), "CM102"),
    "route null value": (_set("programs.0.route", {"a": None}), "CM102"),
    "arch unknown": (_set("programs.0.arches.0", "sm_80"), "CM501"),
    "arch not a string": (_set("programs.0.arches.0", 90), "CM102"),
    "source role unknown": (_set("programs.0.sources.0.role", "host"), "CM102"),
    "source missing sha256": (_set("programs.0.sources.0.sha256", DELETE), "CM102"),
    "source unknown field": (_set("programs.0.sources.0.mode", "x"), "CM103"),
    "entry not identifier": (_set("programs.0.entries.0", "a b"), "CM102"),
    "flags not strings": (_set("programs.0.flags", [1]), "CM102"),
    "program headers not a list": (_set("programs.0.headers", "toy/common.h"), "CM102"),
    "program missing kernels": (_set("programs.0.kernels", DELETE), "CM102"),
    "document is a list": (lambda d: d.clear(), "CM102"),
}


def test_valid_manifest_passes_both(document):
    assert validate(mf.json_schema(), document) == []
    mf.parse(json.dumps(document).encode(), "build.json")


@pytest.mark.parametrize("case", sorted(INVALID))
def test_schema_and_model_agree(document, case):
    mutate, code = INVALID[case]
    if case == "document is a list":
        document = []
    else:
        document = copy.deepcopy(document)
        mutate(document)
    assert validate(mf.json_schema(), document), f"the schema accepts {case}"
    with pytest.raises(mf.ManifestError) as raised:
        mf.parse(json.dumps(document).encode(), "build.json")
    assert {f.code for f in raised.value.findings} == {code}, raised.value.findings


def test_every_model_field_has_a_description():
    schema = mf.json_schema()
    records = [schema, *schema["$defs"].values()]
    for record in records:
        for key, prop in record["properties"].items():
            assert prop["description"], f"{record['description']!r}: field {key} has no docstring"
