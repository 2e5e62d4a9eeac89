"""Mutation suite: every finding code, triggered alone, in both layouts.

Each mutation edits one thing in a clean toy tree and returns the field it broke. The checker
must then report exactly that code (no knock-on findings), exit 1, and print one line naming
the manifest file and the field.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from toy_tree import FAMILY_A, FAMILY_B, Layout, ToyRepo, run_checker

from cake import vendored
from cake.core import manifest as mf


def _program(layout: Layout, index: int = 0) -> dict:
    return layout.document()["programs"][index]


def _update(layout: Layout, change) -> None:
    document = layout.document()
    change(document)
    layout.save(document)


def _source_field(layout: Layout, key: str, program: int = 0, role: str = "kernel") -> str:
    return f"programs[{program}].sources[{layout.source_index(program, role)}].{key}"


def _outside(layout: Layout) -> Path:
    outside = layout.root / "outside"
    outside.mkdir(exist_ok=True)
    return outside


# --------------------------------------------------------------------------- mutations
# Each takes a clean Layout and returns the field (as the checker prints it) that it broke.


def flip_source_byte(layout):  # CM304
    layout.edit_source(0, "kernel", lambda b: b.replace(b"Toy", b"Tox", 1), update_sha=False)
    return _source_field(layout, "sha256")


def rename_source_file(layout):  # CM305
    path = layout.source(0, "kernel")
    path.rename(path.with_name("renamed_kernel.cu"))
    index = layout.source_index(0, "kernel")
    _update(layout, lambda d: d["programs"][0]["sources"][index].update(path="renamed_kernel.cu"))
    return _source_field(layout, "path")


def orphan_file(layout):  # CM307
    (layout.tree.csrc_dir / "stray_kernel.cu").write_text("// nobody lists me\n")
    return "programs"


def wrong_package(layout):  # CM201
    _update(layout, lambda d: d.update(package="cake.cake_other_det_train"))
    return "package"


def wrong_prefix(layout):  # CM202
    _update(layout, lambda d: d.update(library_prefix="cake_other_det_train"))
    return "library_prefix"


def library_digest_mismatch(layout):  # CM203
    _update(layout, lambda d: d["programs"][0].update(digest="0123456789abcdef0123"))
    return "programs[0].library"


def malformed_digest(layout):  # CM204
    _update(layout, lambda d: d["programs"][0].update(digest="0123456789ABCDEF"))
    return "programs[0].digest"


def digest_recorded_wrong(layout):  # CM401
    # The source changes and its sha256 follows, so only the recomputed digest differs.
    layout.edit_source(0, "kernel", lambda b: b.replace(b"Toy", b"Tox", 1), update_sha=True)
    return "programs[0].digest"


def duplicate_program(layout):  # CM205
    def change(document):
        document["programs"].append(dict(document["programs"][0]))
    _update(layout, change)
    return f"programs[{len(layout.document()['programs']) - 1}].digest"


def symbol_without_library(layout):  # CM306
    extra = b'\nextern "C" __global__ void stray_kernel(float* x) { x[0] = 0.0f; }\n'
    layout.edit_source(0, "kernel", lambda b: b + extra, update_sha=True)
    return "programs[0].kernels"


def duplicate_source_role(layout):  # CM206
    def change(document):
        sources = document["programs"][0]["sources"]
        sources.append(dict(sources[layout.source_index(0, "kernel")]))
    _update(layout, change)
    return "programs[0].sources"


def binding_lacks_an_export(layout):  # CM308
    library = layout.manifest().programs[0].library
    old = f"CAKE_EXPORT int {library}_backward(".encode()
    new = f"static int {library}_backward(".encode()
    layout.edit_source(0, "binding", lambda b: _replace_once(b, old, new), update_sha=True)
    return "programs[0].entries"


def entry_kind_differs_from_binding(layout):  # CM309
    # The manifest says n is an i64; the binding's rendered block still says i32.
    def change(document):
        forward = next(e for e in document["programs"][0]["entries"] if e["name"] == "forward")
        next(a for a in forward["args"] if a["name"] == "n")["kind"] = "i64"
    _update(layout, change)
    return "programs[0].entries"


def _replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def dotdot_path(layout):  # CM302
    path = layout.source(0, "kernel")
    moved = _outside(layout) / path.name
    path.rename(moved)
    relative = os.path.relpath(moved, layout.tree.csrc_dir)
    assert relative.startswith("..")
    index = layout.source_index(0, "kernel")
    _update(layout, lambda d: d["programs"][0]["sources"][index].update(path=relative))
    return _source_field(layout, "path")


def symlink_escape(layout):  # CM303
    path = layout.source(0, "kernel")
    moved = _outside(layout) / path.name
    path.rename(moved)
    path.symlink_to(moved)
    return _source_field(layout, "path")


def missing_source(layout):  # CM301
    layout.source(0, "binding").unlink()
    return _source_field(layout, "path", role="binding")


def unknown_arch(layout):  # CM501
    _update(layout, lambda d: d["programs"][0].update(arches=["sm_80"]))
    return "programs[0].arches[0]"


def unknown_field(layout):  # CM103
    _update(layout, lambda d: d["programs"][0].update(comment="hello"))
    return "programs[0].comment"


def schema_invalid(layout):  # CM102
    _update(layout, lambda d: d["programs"][0].update(kcp="no"))
    return "programs[0].kcp"


def unparsable(layout):  # CM101
    layout.manifest_path.write_text('{"schema_version": 1,\n')
    return "$"


def header_missing(layout):  # CM601
    layout.tree.header_path("toy/common.h").unlink()
    return f"headers[{layout.header_index('toy/common.h')}].path"


def header_changed(layout):  # CM602
    path = layout.tree.header_path("toy/common.h")
    path.write_bytes(path.read_bytes().replace(b"2.0f", b"3.0f"))
    return f"headers[{layout.header_index('toy/common.h')}].sha256"


def unlisted_header(layout):  # CM603
    include = b'#include "toy/extra.h"\n'
    layout.edit_source(0, "kernel", lambda b: include + b, update_sha=True)
    return "programs[0].headers"


def _edit_manifest_text(layout, old: str, new: str) -> None:
    text = layout.manifest_path.read_text()
    assert old in text, old
    layout.manifest_path.write_text(text.replace(old, new, 1))


def duplicate_key(layout):  # CM104
    _edit_manifest_text(layout, '"package": ', '"package": "cake.cake_x_det_train",\n  "package": ')
    return "$"


def not_a_number(layout):  # CM105
    _edit_manifest_text(layout, '"kcp": false', '"kcp": NaN')
    return "$"


def nested_too_deep(layout):  # CM106
    _edit_manifest_text(layout, '"min_tokens": 0', '"min_tokens": ' + "[" * 70 + "]" * 70)
    return "$"


def huge_integer(layout):  # CM107
    _edit_manifest_text(layout, '"min_tokens": 0', '"min_tokens": 1' + "0" * 100)
    return "$"


def lone_surrogate(layout):  # CM108
    _edit_manifest_text(layout, '"min_tokens": 0', '"min_tokens": 0, "note": "\\ud800"')
    return "$"


def linked_csrc_folder(layout):  # CM310
    csrc = layout.tree.csrc_dir
    moved = _outside(layout) / "csrc"
    csrc.rename(moved)
    csrc.symlink_to(moved, target_is_directory=True)
    return "$"


def _lib(layout) -> Path:
    lib = layout.tree.manifest_path.parent / "lib"
    lib.mkdir(exist_ok=True)
    return lib


def _library_file(layout, lib: Path) -> Path:
    library = lib / f"{layout.manifest().programs[0].library}_sm_90a.so"
    library.write_bytes(b"\x7fELF stand-in library bytes")
    return library


def unrecorded_library(layout):  # CM801
    _library_file(layout, _lib(layout))
    return _lib(layout) / "libraries.json", "libraries"


def library_bytes_differ(layout):  # CM802
    lib = _lib(layout)
    library = _library_file(layout, lib)
    (lib / "libraries.json").write_text(json.dumps(
        {"schema": 1, "libraries": {library.name: mf.sha256_hex(b"other bytes")}}))
    return lib / "libraries.json", f"libraries.{library.name}"


def unreadable_record(layout):  # CM803
    lib = _lib(layout)
    _library_file(layout, lib)
    (lib / "libraries.json").write_text('{"libraries": [')
    return lib / "libraries.json", "$"


MUTATIONS = {
    "CM101": unparsable,
    "CM102": schema_invalid,
    "CM103": unknown_field,
    "CM104": duplicate_key,
    "CM105": not_a_number,
    "CM106": nested_too_deep,
    "CM107": huge_integer,
    "CM108": lone_surrogate,
    "CM201": wrong_package,
    "CM202": wrong_prefix,
    "CM203": library_digest_mismatch,
    "CM204": malformed_digest,
    "CM205": duplicate_program,
    "CM206": duplicate_source_role,
    "CM301": missing_source,
    "CM302": dotdot_path,
    "CM303": symlink_escape,
    "CM304": flip_source_byte,
    "CM305": rename_source_file,
    "CM306": symbol_without_library,
    "CM307": orphan_file,
    "CM308": binding_lacks_an_export,
    "CM309": entry_kind_differs_from_binding,
    "CM310": linked_csrc_folder,
    "CM401": digest_recorded_wrong,
    "CM501": unknown_arch,
    "CM601": header_missing,
    "CM602": header_changed,
    "CM603": unlisted_header,
    "CM801": unrecorded_library,
    "CM802": library_bytes_differ,
    "CM803": unreadable_record,
}
# CM7xx belong to the vendored gate (--vendored-gate), not to the manifest checks: CM701 and
# CM710 are tested below through vendored.check_vendored_imports and vendored._base_findings,
# the rest with the vendoring tool.
MANIFEST_CODES = sorted(code for code in mf.FINDING_CODES if not code.startswith("CM7"))
# A build record (lib/libraries.json) belongs to an installed or built package only.
INSTALLED_ONLY = {"CM801", "CM802", "CM803"}
CASES = [(kind, code) for code in MANIFEST_CODES for kind in ("repository", "installed")
         if kind == "installed" or code not in INSTALLED_ONLY]


def test_every_manifest_code_has_a_mutation():
    assert sorted(MUTATIONS) == MANIFEST_CODES


def _layout(kind: str, toy: ToyRepo, tmp_path: Path) -> Layout:
    if kind == "repository":
        return toy.tree(FAMILY_A)
    return toy.install(tmp_path / "site", FAMILY_A)


def _codes(stdout: str) -> set[str]:
    return set(re.findall(r": (CM\d{3}) ", stdout))


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
def test_clean_tree_passes(toy, tmp_path, layout_kind):
    layout = _layout(layout_kind, toy, tmp_path)
    result = run_checker(layout.check_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("program(s)") and " ok in " in result.stdout


@pytest.mark.parametrize("layout_kind,code", CASES, ids=[f"{c}-{k}" for k, c in CASES])
def test_mutation_triggers_only_its_code(toy, tmp_path, layout_kind, code):
    layout = _layout(layout_kind, toy, tmp_path)
    where = MUTATIONS[code](layout)
    path, field = where if isinstance(where, tuple) else (layout.manifest_path, where)
    result = run_checker(layout.check_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert _codes(result.stdout) == {code}, result.stdout
    wanted = f"{path}:{field}: {code} "
    assert any(line.startswith(wanted) for line in result.stdout.splitlines()), \
        f"no line starting with {wanted!r} in:\n{result.stdout}"


def _run(layout: Layout):
    result = run_checker(layout.check_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    return result


def _lines_with(result, code: str, *needles: str) -> list[str]:
    return [line for line in result.stdout.splitlines()
            if f": {code} " in line and all(n in line for n in needles)]


# --------------------------------------------------------------------------- CM206


def _no_kernel_source(layout):
    """A program of a binding alone: its kernel sources dropped (files and listed kernels too,
    so that nothing else is wrong)."""
    document = layout.document()
    program = document["programs"][0]
    for source in program["sources"]:
        if source["role"] != "binding":
            (layout.tree.csrc_dir / source["path"]).unlink()
    program["sources"] = [s for s in program["sources"] if s["role"] == "binding"]
    program["kernels"] = []
    layout.save(document)


def _two_bindings(layout):
    document = layout.document()
    sources = document["programs"][0]["sources"]
    sources.insert(0, dict(sources[layout.source_index(0, "binding")]))
    layout.save(document)


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
@pytest.mark.parametrize("mutate", [_no_kernel_source, _two_bindings, duplicate_source_role])
def test_cm206_roles(toy, tmp_path, layout_kind, mutate):
    """CM206: each role once, one binding and at least one kernel source."""
    layout = _layout(layout_kind, toy, tmp_path)
    mutate(layout)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM206"}, result.stdout
    assert _lines_with(result, "CM206", f"{layout.manifest_path}:programs[0].sources: "), \
        result.stdout


def test_cm206_without_binding_is_the_one_finding(toy):
    """No binding at all: CM206 alone (its exports and entries block cannot be checked, so no
    CM308/CM309 repeat that the binding is missing)."""
    layout = toy.tree(FAMILY_A)
    document = layout.document()
    program = document["programs"][0]
    binding = next(s for s in program["sources"] if s["role"] == "binding")
    (layout.tree.csrc_dir / binding["path"]).unlink()
    program["sources"].remove(binding)
    layout.save(document)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM206"}, result.stdout
    assert _lines_with(result, "CM206", "one binding"), result.stdout


# --------------------------------------------------------------------------- CM308, CM309


def _binding_drops_export(name):
    def mutate(layout):
        library = layout.manifest().programs[0].library
        old = f"CAKE_EXPORT {'const char*' if name == 'digest' else 'int'} {library}_{name}("
        layout.edit_source(0, "binding", lambda b: _replace_once(
            b, old.encode(), old.replace("CAKE_EXPORT", "static").encode()), update_sha=True)
        return f"{library}_{name}", "the binding does not export"
    mutate.__name__ = f"drops_{name}"
    return mutate


def _binding_adds_export(layout):
    library = layout.manifest().programs[0].library
    extra = (f"\nCAKE_EXPORT int {library}_debug(CAKE_ENTRY_PARAMS) {{ return 0; }}\n").encode()
    layout.edit_source(0, "binding", lambda b: b + extra, update_sha=True)
    return f"{library}_debug", "which the manifest does not declare"


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
@pytest.mark.parametrize("mutate", [
    _binding_drops_export("forward"), _binding_drops_export("digest"),
    _binding_drops_export("abi_version"), _binding_adds_export],
    ids=lambda m: m.__name__.strip("_"))
def test_cm308_exports_must_be_the_declared_entries(toy, tmp_path, layout_kind, mutate):
    """CM308 when the binding's CAKE_EXPORT functions are not exactly digest, abi_version and
    one ``<library>_<entry>`` per declared entry: one missing, or one more."""
    layout = _layout(layout_kind, toy, tmp_path)
    symbol, message = mutate(layout)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM308"}, result.stdout
    lines = _lines_with(result, "CM308", symbol, message)
    assert len(lines) == 1 and lines[0].startswith(
        f"{layout.manifest_path}:programs[0].entries: CM308 "), result.stdout


def test_an_entry_dropped_from_the_manifest_is_cm308_and_cm309(toy):
    """The binding still exports it and still declares it in its entries block."""
    layout = toy.tree(FAMILY_A)
    document = layout.document()
    library = document["programs"][0]["library"]
    dropped = document["programs"][0]["entries"].pop(0)["name"]
    layout.save(document)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM308", "CM309"}, result.stdout
    assert _lines_with(result, "CM308", f"exports {library}_{dropped}, which the manifest"), \
        result.stdout


def test_an_entry_added_to_the_manifest_is_cm308_and_cm309(toy):
    layout = toy.tree(FAMILY_A)
    document = layout.document()
    library = document["programs"][0]["library"]
    document["programs"][0]["entries"].append({"name": "never_defined", "args": []})
    layout.save(document)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM308", "CM309"}, result.stdout
    assert _lines_with(result, "CM308", f"does not export {library}_never_defined"), result.stdout


def _block_kind(layout):
    layout.edit_source(0, "binding", lambda b: _replace_once(
        b, b"X(i32, n) X(f32, scale)", b"X(i64, n) X(f32, scale)"), update_sha=True)


def _block_argument_order(layout):
    layout.edit_source(0, "binding", lambda b: _replace_once(
        b, b"X(pointer, dy) X(pointer, dx)", b"X(pointer, dx) X(pointer, dy)"), update_sha=True)


def _block_entry_removed(layout):
    line = next(line for line in layout.source(0, "binding").read_bytes().splitlines(True)
                if line.startswith(b"#define CAKE_ENTRY_backward(X)"))
    layout.edit_source(0, "binding", lambda b: _replace_once(b, line, b""), update_sha=True)


def _block_removed(layout):
    def edit(data: bytes) -> bytes:
        start = data.index(b"// cake:entries\n")
        end = data.index(b"// cake:end-entries\n") + len(b"// cake:end-entries\n")
        return data[:start] + data[end:]
    layout.edit_source(0, "binding", edit, update_sha=True)


def _block_argument_renamed_in_manifest(layout):
    def change(document):
        document["programs"][0]["entries"][0]["args"][0]["name"] = "input"
    _update(layout, change)


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
@pytest.mark.parametrize("mutate", [_block_kind, _block_argument_order, _block_entry_removed,
                                    _block_removed, _block_argument_renamed_in_manifest,
                                    entry_kind_differs_from_binding],
                         ids=lambda m: m.__name__.strip("_"))
def test_cm309_the_rendered_block_must_be_the_manifests_entries(toy, tmp_path, layout_kind,
                                                                 mutate):
    """CM309 alone (the exports are unchanged) for any difference between the binding's
    ``// cake:entries`` block and the manifest's entries, in either file."""
    layout = _layout(layout_kind, toy, tmp_path)
    mutate(layout)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM309"}, result.stdout
    assert _lines_with(result, "CM309", f"{layout.manifest_path}:programs[0].entries: "), \
        result.stdout


# --------------------------------------------------------------------------- CM306


def test_a_kernel_defined_through_a_family_macro_is_seen(toy):
    """The backward kernel exists only as ``CAKE_TOY_BACKWARD_KERNEL(<symbol>)`` in its source:
    the renderer lists it, and the checker finds it defined."""
    for name in (FAMILY_A, FAMILY_B):
        layout = toy.tree(name)
        for index, program in enumerate(layout.manifest().programs):
            assert program.kernels == (f"kernel_{program.library}_forward",
                                       f"kernel_{program.library}_backward")
            text = layout.source(index, "kernel_backward").read_text()
            assert f"CAKE_TOY_BACKWARD_KERNEL(kernel_{program.library}_backward)" in text
            assert "__global__" not in text
    assert run_checker(toy.root).returncode == 0


def _macro_kernel_renamed(layout):
    library = layout.manifest().programs[0].library
    layout.edit_source(0, "kernel_backward", lambda b: _replace_once(
        b, f"KERNEL(kernel_{library}_backward)".encode(), b"KERNEL(stray_backward)"),
        update_sha=True)
    return [f"kernel_{library}_backward is not defined by a kernel source",
            "kernel stray_backward of a kernel source is not a listed kernel"]


def _macro_kernel_removed(layout):
    library = layout.manifest().programs[0].library
    layout.edit_source(0, "kernel_backward", lambda b: _replace_once(
        b, f"CAKE_TOY_BACKWARD_KERNEL(kernel_{library}_backward)\n".encode(), b""),
        update_sha=True)
    return [f"kernel_{library}_backward is not defined by a kernel source"]


def _plain_kernel_renamed(layout):
    library = layout.manifest().programs[0].library
    layout.edit_source(0, "kernel", lambda b: _replace_once(
        b, f"kernel_{library}_forward(".encode(), f"kernel_{library}_forwards(".encode()),
        update_sha=True)
    return [f"kernel_{library}_forward is not defined by a kernel source",
            f"kernel kernel_{library}_forwards of a kernel source is not a listed kernel"]


def _listed_kernel_without_library(layout):
    def change(document):
        document["programs"][0]["kernels"][0] = "kernel_forward"
    _update(layout, change)
    library = layout.manifest().programs[0].library
    return [f"kernel kernel_forward does not start with kernel_{library}",
            f"kernel kernel_{library}_forward of a kernel source is not a listed kernel"]


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
@pytest.mark.parametrize("name", [FAMILY_A, FAMILY_B])
@pytest.mark.parametrize("mutate", [_macro_kernel_renamed, _macro_kernel_removed,
                                    _plain_kernel_renamed, _listed_kernel_without_library],
                         ids=lambda m: m.__name__.strip("_"))
def test_cm306_kernels_of_every_kernel_source(toy, tmp_path, layout_kind, name, mutate):
    """CM306 (kernels only) for a kernel renamed or removed in either kernel source, whether it
    is a plain ``__global__`` or defined through a family macro."""
    layout = (toy.tree(name) if layout_kind == "repository"
              else toy.install(tmp_path / "site", name))
    messages = mutate(layout)
    result = _run(layout)
    assert _codes(result.stdout) == {"CM306"}, result.stdout
    for message in messages:
        assert _lines_with(result, "CM306", message), (message, result.stdout)
    assert all(line.startswith(f"{layout.manifest_path}:programs[0].kernels")
               for line in _lines_with(result, "CM306")), result.stdout


def test_json_report(toy):
    layout = toy.tree(FAMILY_A)
    flip_source_byte(layout)
    result = run_checker("--json", toy.root)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["manifests"] == 2 and report["programs"] == 5
    assert [(f["code"], f["path"]) for f in report["findings"]] == \
        [("CM304", str(layout.manifest_path))]
    from_inside = run_checker("--json", cwd=toy.root)
    assert from_inside.returncode == 1
    assert [f["path"] for f in json.loads(from_inside.stdout)["findings"]] == \
        [f"manifests/{FAMILY_A}.json"]  # paths as given: relative to the current directory


def test_other_family_unaffected(toy):
    """A mutation in one family never produces findings for the other one."""
    flip_source_byte(toy.tree(FAMILY_A))
    result = run_checker(toy.tree(FAMILY_B).manifest_path)
    assert result.returncode == 0, result.stdout


def test_vendored_copy_with_rewritten_package_passes(toy, tmp_path):
    layout = toy.install(tmp_path / "host", FAMILY_B,
                         package="flashinfer.experimental.cake.cake_toy_nondet_train")
    result = run_checker(tmp_path / "host")  # found by walking down to build.json
    assert result.returncode == 0, result.stdout + result.stderr
    _update(layout, lambda d: d.update(package="cake.cake_toy_nondet_train"))
    result = run_checker(layout.manifest_path)
    assert result.returncode == 1 and _codes(result.stdout) == {"CM201"}, result.stdout


def test_test_manifest_is_checked(toy):
    """``manifests/<name>.test.json`` is checked like the main manifest, and lists files too."""
    layout = toy.tree(FAMILY_A)
    document = layout.document()
    test_program = document["programs"].pop()
    layout.save(document)
    test_path = toy.path(f"manifests/{FAMILY_A}.test.json")
    test_path.write_text(json.dumps(dict(document, programs=[test_program])))
    assert run_checker(toy.root).returncode == 0
    test_path.unlink()
    result = run_checker(toy.root)
    assert result.returncode == 1 and _codes(result.stdout) == {"CM307"}, result.stdout


# --------------------------------------------------------------------------- CM701


def _vendored_package(tmp_path: Path, body: str) -> Path:
    package = tmp_path / "vendored" / "cake_toy_det_train"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("from ._function import run\n")
    (package / "core" / "__init__.py").write_text("import os\nimport torch\n")
    (package / "_function.py").write_text(body)
    return package


def test_vendored_imports_clean(tmp_path):
    """Relative imports, the standard library, torch, and Triton (the vendored core compiles
    and interprets Triton programs) are allowed."""
    package = _vendored_package(tmp_path, "from __future__ import annotations\n"
                                           "import json\nfrom .core import loader\n"
                                           "import torch.nn\n\ndef run():\n    import math\n"
                                           "    import triton.language as tl\n")
    assert list(vendored.check_vendored_imports(package)) == []


@pytest.mark.parametrize("statement", ["import flashinfer", "from cake.core import loader",
                                       "import numpy as np", "    import flashinfer.gemm",
                                       "    from cake import checker"])
def test_vendored_imports_cm701(tmp_path, statement):
    body = "import json\n\ndef run():\n    pass\n" + (
        f"\ndef later():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n")
    package = _vendored_package(tmp_path, body)
    findings = list(vendored.check_vendored_imports(package))
    assert [f.code for f in findings] == ["CM701"]
    line = str(findings[0])
    assert str(package / "_function.py") in line and "line " in line
    assert statement.split()[1].split(".")[0] in line


def test_vendored_imports_unparsable(tmp_path):
    package = _vendored_package(tmp_path, "def broken(:\n")
    findings = list(vendored.check_vendored_imports(package))
    assert [f.code for f in findings] == ["CM701"] and "cannot parse" in findings[0].message


# --------------------------------------------------------------------------- CM710


def _sidecar(package_dir: Path, package: str, commit: str = "1e38857") -> None:
    """A VENDORED.json for ``package`` in ``package_dir`` (the fields CM710 reads matter)."""
    from cake.vendor_plan import Sidecar

    package_dir.mkdir(parents=True, exist_ok=True)
    short = package.rsplit(".", 1)[-1]
    record = Sidecar(package=package, source_package=f"cake.{short}", cake_train_version="0.1.0",
                     cake_train_commit=commit, upstream_manifest_sha256="0" * 64, files={})
    (package_dir / "VENDORED.json").write_text(record.to_json())


KCP, BASE = "cake_toy_det_train_kcp", "cake_toy_det_train"


@pytest.mark.parametrize("base_state", ["beside", "missing", "other_parent", "other_commit"])
def test_a_kcp_package_needs_its_base_beside_it_cm710(tmp_path, base_state):
    """CM710: a KCP package imports its base family as a sibling, so the base must be vendored
    next to it, under the same parent package, from the same cake-train."""
    host = tmp_path / "host"
    _sidecar(host / KCP, f"host.{KCP}")
    if base_state != "missing":
        parent = "elsewhere" if base_state == "other_parent" else "host"
        _sidecar(host / BASE, f"{parent}.{BASE}",
                 commit="0000000" if base_state == "other_commit" else "1e38857")
    findings = list(vendored._base_findings(host / KCP, f"host.{KCP}"))
    if base_state == "beside":
        assert findings == []
        return
    assert [f.code for f in findings] == ["CM710"], findings
    line = str(findings[0])
    assert str(host / BASE) in line and f"host.{BASE}" in line
    assert ("re-vendor both" if base_state == "other_commit" else "vendor both") in line


def test_only_kcp_packages_are_checked_for_a_base_cm710(tmp_path):
    _sidecar(tmp_path / "host" / BASE, f"host.{BASE}")
    assert list(vendored._base_findings(tmp_path / "host" / BASE, f"host.{BASE}")) == []


def test_installed_layout_orphan_in_include(toy, tmp_path):
    """In an installed package csrc/include/ lies inside csrc/: unlisted headers are orphans."""
    layout = toy.install(tmp_path / "site", FAMILY_A)
    shutil.copyfile(toy.path("csrc/include/toy/extra.h"),
                    layout.tree.include_dir / "toy" / "extra.h")
    result = run_checker(layout.check_path)
    assert result.returncode == 1 and _codes(result.stdout) == {"CM307"}, result.stdout
    assert "include/toy/extra.h" in result.stdout
