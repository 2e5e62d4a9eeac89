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
    "schema_version 1": (_set("schema_version", 1), "CM102"),  # the v1 contract is gone
    "schema_version 3": (_set("schema_version", 3), "CM102"),
    "schema_version true": (_set("schema_version", True), "CM102"),
    "schema_version string": (_set("schema_version", "2"), "CM102"),
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
    "source role kernel_": (_set("programs.0.sources.0.role", "kernel_"), "CM102"),
    "source role upper case": (_set("programs.0.sources.0.role", "kernel_Backward"), "CM102"),
    "source role bindings": (_set("programs.0.sources.0.role", "binding_x"), "CM102"),
    "source missing sha256": (_set("programs.0.sources.0.sha256", DELETE), "CM102"),
    "source unknown field": (_set("programs.0.sources.0.mode", "x"), "CM103"),
    "entry a string (v1)": (_set("programs.0.entries.0", "cake_x_forward"), "CM102"),
    "entry not identifier": (_set("programs.0.entries.0.name", "a b"), "CM102"),
    "entry missing args": (_set("programs.0.entries.0.args", DELETE), "CM102"),
    "entry args not a list": (_set("programs.0.entries.0.args", {}), "CM102"),
    "entry unknown field": (_set("programs.0.entries.0.returns", "int"), "CM103"),
    "argument kind unknown": (_set("programs.0.entries.0.args.1.kind", "u8"), "CM102"),
    "argument kind tensor": (_set("programs.0.entries.0.args.0.kind", "tensor"), "CM102"),
    "argument name not identifier": (_set("programs.0.entries.0.args.0.name", "0x"), "CM102"),
    "argument missing kind": (_set("programs.0.entries.0.args.0.kind", DELETE), "CM102"),
    "argument unknown field": (_set("programs.0.entries.0.args.0.const", True), "CM103"),
    "argument a string": (_set("programs.0.entries.0.args.0", "x"), "CM102"),
    "kind unknown": (_set("programs.0.kind", "hip"), "CM102"),
    "kind missing": (_set("programs.0.kind", DELETE), "CM102"),
    "kind not a string": (_set("programs.0.kind", 1), "CM102"),
    "flags not strings": (_set("programs.0.flags", [1]), "CM102"),
    "program headers not a list": (_set("programs.0.headers", "toy/common.h"), "CM102"),
    "program missing kernels": (_set("programs.0.kernels", DELETE), "CM102"),
    "document is a list": (lambda d: d.clear(), "CM102"),
}


def test_valid_manifest_passes_both(document):
    assert validate(mf.json_schema(), document) == []
    mf.parse(json.dumps(document).encode(), "build.json")


VALID = {
    "schema 2 fields": lambda d: None,
    "triton kind": _set("programs.0.kind", "triton"),
    "every argument kind": _set("programs.0.entries.0.args", [
        {"name": f"a_{kind}", "kind": kind} for kind in mf.ARGUMENT_KINDS]),
    "entry without arguments": _set("programs.0.entries.0.args", []),
    "no entries": _set("programs.0.entries", []),
    "kernel_<name> roles": _set("programs.0.sources.0.role", "kernel_fwd_2"),
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_schema_and_model_accept_the_v2_forms(document, case):
    """Schema 2's fields in the forms both the schema and the parser accept (the checker's
    semantic rules, CM206 and CM308/CM309, are not the schema's business)."""
    document = copy.deepcopy(document)
    VALID[case](document)
    assert validate(mf.json_schema(), document) == []
    manifest = mf.parse(json.dumps(document).encode(), "build.json")
    assert manifest.schema_version == mf.SCHEMA_VERSION == 2
    program = manifest.programs[0]
    assert program.kind == document["programs"][0]["kind"]
    assert program.entries == tuple(
        mf.Entry(e["name"], tuple(mf.Argument(a["name"], a["kind"]) for a in e["args"]))
        for e in document["programs"][0]["entries"])
    assert [s.role for s in program.sources] == \
        [s["role"] for s in document["programs"][0]["sources"]]


def test_rendered_manifest_holds_the_v2_fields(toy):
    """What the renderer writes: schema 2, kind cuda, the table's entries as declarations,
    several kernel sources, and the model's JSON round trip."""
    from toy_tree import ENTRIES

    text = toy.tree(FAMILY_A).manifest_path.read_text()
    document = json.loads(text)
    assert document["schema_version"] == 2
    for program in document["programs"]:
        assert program["kind"] == "cuda"
        assert program["entries"] == [
            {"name": name, "args": [{"name": a, "kind": k} for a, k in args]}
            for name, args in ENTRIES.items()]
        assert [s["role"] for s in program["sources"]] == ["kernel", "kernel_backward", "binding"]
    assert mf.to_json(mf.parse(text.encode(), "build.json")) == text


def test_schema_names_the_argument_and_program_kinds():
    defs = mf.json_schema()["$defs"]
    assert defs["Argument"]["properties"]["kind"]["enum"] == list(mf.ARGUMENT_KINDS) == \
        ["pointer", "i32", "i64", "f32", "f64"]
    assert defs["Program"]["properties"]["kind"]["enum"] == list(mf.PROGRAM_KINDS) == \
        ["cuda", "triton"]
    assert defs["Program"]["properties"]["entries"]["items"] == {"$ref": "#/$defs/Entry"}
    assert defs["Entry"]["properties"]["args"]["items"] == {"$ref": "#/$defs/Argument"}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_schema_and_model_agree(document, case):
    mutate, code = INVALID[case]
    if case == "document is a list":
        document = []
    else:
        document = copy.deepcopy(document)
        mutate(document)
    assert validate(mf.json_schema(), document), f"the schema accepts {case}"
    with pytest.raises(mf.ManifestError, match=rf"^build\.json:\S+: {code} ") as raised:
        mf.parse(json.dumps(document).encode(), "build.json")
    assert {f.code for f in raised.value.findings} == {code}, raised.value.findings


def test_every_model_field_has_a_description():
    schema = mf.json_schema()
    records = [schema, *schema["$defs"].values()]
    for record in records:
        for key, prop in record["properties"].items():
            assert prop["description"], f"{record['description']!r}: field {key} has no docstring"
