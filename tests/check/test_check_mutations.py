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

from cake import checker
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
    extra = b"\n__global__ void stray_kernel(float* x) { x[0] = 0.0f; }\n"
    layout.edit_source(0, "kernel", lambda b: b + extra, update_sha=True)
    return "programs[0].kernels"


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
    return "headers[0].path"


def header_changed(layout):  # CM602
    path = layout.tree.header_path("toy/common.h")
    path.write_bytes(path.read_bytes().replace(b"2.0f", b"3.0f"))
    return "headers[0].sha256"


def unlisted_header(layout):  # CM603
    include = b'#include "toy/extra.h"\n'
    layout.edit_source(0, "kernel", lambda b: include + b, update_sha=True)
    return "programs[0].headers"


MUTATIONS = {
    "CM101": unparsable,
    "CM102": schema_invalid,
    "CM103": unknown_field,
    "CM201": wrong_package,
    "CM202": wrong_prefix,
    "CM203": library_digest_mismatch,
    "CM204": malformed_digest,
    "CM205": duplicate_program,
    "CM301": missing_source,
    "CM302": dotdot_path,
    "CM303": symlink_escape,
    "CM304": flip_source_byte,
    "CM305": rename_source_file,
    "CM306": symbol_without_library,
    "CM307": orphan_file,
    "CM401": digest_recorded_wrong,
    "CM501": unknown_arch,
    "CM601": header_missing,
    "CM602": header_changed,
    "CM603": unlisted_header,
}
# CM7xx belong to the vendored gate (--vendored-gate), not to the manifest checks: CM701 is
# tested below through checker.check_vendored_imports, the rest with the vendoring tool.
MANIFEST_CODES = sorted(code for code in mf.FINDING_CODES if not code.startswith("CM7"))


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


@pytest.mark.parametrize("layout_kind", ["repository", "installed"])
@pytest.mark.parametrize("code", MANIFEST_CODES)
def test_mutation_triggers_only_its_code(toy, tmp_path, layout_kind, code):
    layout = _layout(layout_kind, toy, tmp_path)
    field = MUTATIONS[code](layout)
    result = run_checker(layout.check_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert _codes(result.stdout) == {code}, result.stdout
    wanted = f"{layout.manifest_path}:{field}: {code} "
    assert any(line.startswith(wanted) for line in result.stdout.splitlines()), \
        f"no line starting with {wanted!r} in:\n{result.stdout}"


def _drop_first_entry(layout):
    document = layout.document()
    dropped = document["programs"][0]["entries"].pop(0)
    layout.save(document)
    return dropped


def _rename_listed_entry(layout):
    document = layout.document()
    entries = document["programs"][0]["entries"]
    library = document["programs"][0]["library"]
    entries[0] = f"{library}_never_defined"
    layout.save(document)
    return entries[0]


@pytest.mark.parametrize("mutate,message", [
    (_drop_first_entry, "in the binding source is not a listed entry"),
    (_rename_listed_entry, "is not a CAKE_EXPORT function of the binding source"),
])
def test_entries_must_match_the_bindings_exports(toy, tmp_path, mutate, message):
    """CM306 also when the listed entries and the binding's CAKE_EXPORT functions differ."""
    layout = _layout("repository", toy, tmp_path)
    name = mutate(layout)
    result = run_checker(layout.check_path)
    assert result.returncode == 1 and _codes(result.stdout) == {"CM306"}, result.stdout
    assert any(name in line and message in line for line in result.stdout.splitlines()), \
        result.stdout


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
    package = _vendored_package(tmp_path, "from __future__ import annotations\n"
                                           "import json\nfrom .core import loader\n"
                                           "import torch.nn\n\ndef run():\n    import math\n")
    assert list(checker.check_vendored_imports(package)) == []


@pytest.mark.parametrize("statement", ["import flashinfer", "from cake.core import loader",
                                       "import numpy as np", "    import triton"])
def test_vendored_imports_cm701(tmp_path, statement):
    body = "import json\n\ndef run():\n    pass\n" + (
        f"\ndef later():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n")
    package = _vendored_package(tmp_path, body)
    findings = list(checker.check_vendored_imports(package))
    assert [f.code for f in findings] == ["CM701"]
    line = str(findings[0])
    assert str(package / "_function.py") in line and "line " in line
    assert statement.split()[1].split(".")[0] in line


def test_vendored_imports_unparsable(tmp_path):
    package = _vendored_package(tmp_path, "def broken(:\n")
    findings = list(checker.check_vendored_imports(package))
    assert [f.code for f in findings] == ["CM701"] and "cannot parse" in findings[0].message


def test_installed_layout_orphan_in_include(toy, tmp_path):
    """In an installed package csrc/include/ lies inside csrc/: unlisted headers are orphans."""
    layout = toy.install(tmp_path / "site", FAMILY_A)
    shutil.copyfile(toy.path("csrc/include/toy/extra.h"),
                    layout.tree.include_dir / "toy" / "extra.h")
    result = run_checker(layout.check_path)
    assert result.returncode == 1 and _codes(result.stdout) == {"CM307"}, result.stdout
    assert "include/toy/extra.h" in result.stdout
