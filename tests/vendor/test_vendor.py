"""tools/vendor.py and ``check_manifests --vendored-gate`` (docs/vendoring.md), on the CPU.

Every family is vendored into a FlashInfer-shaped tree (``flashinfer/experimental/cake/``)
by a subprocess in which ``flashinfer`` cannot be imported; the vendored packages are then
imported as top-level packages (their host cannot be imported) with ``cake`` blocked too.
The toy family (``tests/toy_programs.py`` plus a toy Python package) covers the tool's
rules, vendored from and gated by a miniature cake-train checkout (the gate compares a copy
with the cake-train it runs from); every real family (``manifests/cake_*.json`` with a
``cake/<name>/`` package) is vendored, gated and imported as well.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from vendor_tree import (PREFIX, REPO, TOY_FAMILY, codes, gate, host_tree, manifest_of,
                         real_families, run, run_vendored, sidecar, vendor)

from cake import vendor_plan, vendored
from cake.core import manifest as mf
from cake.core import trust

TORCH = importlib.util.find_spec("torch") is not None


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the copy


def test_copy_layout(toy, source):
    upstream = mf.repository_tree(source, TOY_FAMILY)
    manifest = mf.read(upstream.manifest_path)
    assert (toy / "build.json").read_text() == \
        mf.to_json(mf.with_package(manifest, f"{PREFIX}.{TOY_FAMILY}"))
    for program in manifest.programs:
        for item in program.sources:
            assert (toy / "csrc" / item.path).read_bytes() == \
                upstream.source_path(item).read_bytes()
    for header in manifest.headers:
        assert (toy / "csrc/include" / header.path).read_bytes() == \
            upstream.header_path(header.path).read_bytes()
    core = source / "cake" / "core"
    assert sorted(p.name for p in (toy / "core").iterdir()) == \
        sorted(p.name for p in core.glob("*.py"))
    for module in core.glob("*.py"):
        assert (toy / "core" / module.name).read_bytes() == module.read_bytes()
    family = source / "cake" / TOY_FAMILY
    assert (toy / "__init__.py").read_bytes() == (family / "__init__.py").read_bytes()
    original = (family / "_function.py").read_text()
    assert (toy / "_function.py").read_text() == original.replace("from ..core", "from .core")
    record = sidecar(toy)
    assert record["package"] == f"{PREFIX}.{TOY_FAMILY}"
    assert record["source_package"] == f"cake.{TOY_FAMILY}"
    assert record["cake_train_version"] == vendor_plan.package_version(source / "cake")
    assert record["cake_train_commit"] == ""  # the source is not a git checkout
    assert record["upstream_manifest_sha256"] == mf.sha256_hex(mf.to_json(manifest).encode())
    assert sorted(record["files"]) == \
        sorted(set(vendored.list_package(toy).files) - {"VENDORED.json"})
    for relative, sha256 in record["files"].items():
        assert mf.sha256_hex((toy / relative).read_bytes()) == sha256


def test_rerun_is_idempotent(tmp_path, source, into, toy):
    before = snapshot(toy)
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 0, result.stderr
    assert f"(0 written, {len(before) - 1} unchanged, 0 removed)" in result.stdout
    assert snapshot(toy) == before  # not even rewritten with the same bytes


def test_rerun_updates_its_own_files(tmp_path, source, into, toy):
    family = source / "cake" / TOY_FAMILY
    (family / "_function.py").write_text((family / "_function.py").read_text() + "# new\n")
    (family / "extra.py").write_text("from ..core import manifest\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 0 and "(2 written," in result.stdout, result.stderr
    assert (toy / "extra.py").read_text() == "from .core import manifest\n"
    (family / "extra.py").unlink()
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 0 and "1 removed)" in result.stdout, result.stderr
    assert not (toy / "extra.py").exists() and "extra.py" not in sidecar(toy)["files"]


def test_refuses_to_overwrite_an_edited_file(tmp_path, source, into, toy):
    edited = toy / "_function.py"
    edited.write_text(edited.read_text() + "# local change\n")
    family = source / "cake" / TOY_FAMILY
    (family / "_function.py").write_text((family / "_function.py").read_text() + "# new\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 1
    assert f"{edited} (edited since it was vendored)" in result.stderr
    assert "--force" in result.stderr and "local change" in edited.read_text()
    result = vendor(tmp_path, into, "--force", repository=source)
    assert result.returncode == 0, result.stderr
    assert edited.read_text().endswith("# new\n")


def test_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, source, into):
    foreign = into / TOY_FAMILY / "__init__.py"
    foreign.parent.mkdir()
    foreign.write_text("# the host's own file\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 1 and f"{foreign} (not written by vendor.py)" in result.stderr
    assert foreign.read_text() == "# the host's own file\n"
    assert not (into / TOY_FAMILY / "build.json").exists()  # nothing written
    assert vendor(tmp_path, into, "--force", repository=source).returncode == 0


def test_a_foreign_file_next_to_the_copy_fails_its_gate(tmp_path, source, into, toy):
    (toy / "notes.py").write_text("x = 1\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 1
    assert f"{toy / 'notes.py'}:$: CM705 is not a file of the upstream package" in result.stderr


@pytest.mark.parametrize("statement", [
    "import cake", "import cake.core.loader", "from cake.core import loader",
    "from .. import core", "from ..checker import main", "from ...x import y",
    "    from ..vendored import gate_trees"])
def test_other_cake_imports_stop_the_tool(tmp_path, source, into, statement):
    module = source / "cake" / TOY_FAMILY / "_function.py"
    body = f"\ndef later():\n{statement}\n" if statement.startswith(" ") else f"{statement}\n"
    module.write_text(module.read_text() + body)
    line = len(module.read_text().splitlines())
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 1, result.stdout
    assert f"{module}:{line}: " in result.stderr and "'from ..core import ...'" in result.stderr
    assert not (into / TOY_FAMILY).exists()


def test_core_in_a_subpackage_is_rewritten_by_depth(tmp_path, source, into):
    sub = source / "cake" / TOY_FAMILY / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text(
        "from ...core import loader; from ...core.jit import find_nvcc\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 0, result.stderr
    assert (into / TOY_FAMILY / "sub" / "__init__.py").read_text() == \
        "from ..core import loader; from ..core.jit import find_nvcc\n"


def test_a_family_failing_the_checker_is_not_vendored(tmp_path, source, into):
    tree = mf.repository_tree(source, TOY_FAMILY)
    program = mf.read(tree.manifest_path).programs[0]
    path = tree.source_path(program.sources[0])
    path.write_bytes(path.read_bytes() + b"\n")
    result = vendor(tmp_path, into, repository=source)
    assert result.returncode == 1 and "fails check_manifests" in result.stderr
    assert ": CM304 " in result.stderr and not (into / TOY_FAMILY).exists()


@pytest.mark.parametrize("case", ["wrong prefix", "no __init__", "bad name", "unknown package"])
def test_usage_errors(tmp_path, source, into, case):
    arguments = {"wrong prefix": ["--package-prefix", "flashinfer.cake"],
                 "bad name": ["--package-prefix", "flash-infer.cake"],
                 "unknown package": ["--package", "cake_nothing_det_train"]}.get(case, [])
    if case == "no __init__":
        (into / "__init__.py").unlink()
    result = vendor(tmp_path, into, *arguments, repository=source)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("vendor: error: ") and "Traceback" not in result.stderr
    assert not (into / TOY_FAMILY).exists()


# --------------------------------------------------------------------------- the gate


def test_gate_passes_a_clean_copy(toy, toy_gate):
    result = toy_gate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_manifests: ok in 1 manifest(s), 2 program(s)" in result.stdout


def _tamper_source(package: Path) -> Path:
    source = sorted((package / "csrc").glob("*_kernel.cu"))[0]
    data = source.read_bytes()
    assert b"p.x[i] * p.factor" in data
    source.write_bytes(data.replace(b"p.x[i] * p.factor", b"p.x[i] * p.factor * 2"))
    return package / "build.json"


def _rewrite_field(package: Path) -> Path:
    document = json.loads((package / "build.json").read_text())
    document["programs"][0]["route"]["min_tokens"] = 4096
    (package / "build.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return package / "build.json"


def _rewrite_package(package: Path) -> Path:
    document = json.loads((package / "build.json").read_text())
    document["package"] = f"cake.{TOY_FAMILY}"
    (package / "build.json").write_text(json.dumps(document))
    return package / "build.json"


def _import_host(package: Path) -> Path:
    module = package / "_function.py"
    module.write_text(module.read_text() + "\nimport flashinfer\n")
    return module


def _import_above(package: Path) -> Path:
    module = package / "_function.py"
    module.write_text(module.read_text() + "\nfrom ..gemm import something\n")
    return module


def _edit_python(package: Path) -> Path:
    module = package / "core" / "loader.py"
    text = module.read_text()
    assert "ABI_VERSION = 2" in text
    module.write_text(text.replace("ABI_VERSION = 2", "ABI_VERSION = 3"))
    return module


def _add_module(package: Path) -> Path:
    (package / "patch.py").write_text("import os\n")
    return package / "patch.py"


def _remove_module(package: Path) -> Path:
    (package / "core" / "jit.py").unlink()
    return package / "core" / "jit.py"


def _remove_sidecar(package: Path) -> Path:
    (package / "VENDORED.json").unlink()
    return package / "VENDORED.json"


def _break_sidecar(package: Path) -> Path:
    (package / "VENDORED.json").write_text('{"files": {}}')
    return package / "VENDORED.json"


@pytest.mark.parametrize("mutate,code", [
    (_tamper_source, "CM304"), (_rewrite_field, "CM702"), (_rewrite_package, "CM201"),
    (_import_host, "CM701"), (_import_above, "CM701"), (_edit_python, "CM703"),
    (_add_module, "CM705"), (_remove_module, "CM703"), (_remove_sidecar, "CM704"),
    (_break_sidecar, "CM704")], ids=lambda v: getattr(v, "__name__", v).strip("_"))
def test_gate_finds_each_mutation_with_its_own_code(toy, toy_gate, mutate, code):
    path = mutate(toy)
    result = toy_gate()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout
    assert codes(result.stdout) == [code], result.stdout
    assert any(line.startswith(f"{path}:") and f": {code} " in line
               for line in result.stdout.splitlines()), result.stdout


def test_gate_on_a_missing_package_is_a_usage_error(tmp_path, source, toy):
    result = gate(tmp_path, tmp_path / "host", "cake_nothing_det_train", upstream=source)
    assert result.returncode == 2
    assert "no build.json" in result.stderr and "tools/vendor.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_gate_checks_built_libraries_against_their_record(toy, toy_gate):
    """Build outputs (lib/ with its build record) are not vendored files (no CM705); the
    libraries are checked against their record instead (CM801)."""
    (toy / "lib").mkdir()
    (toy / "lib" / "whatever_sm_90a.so").write_bytes(b"\x7fELF")
    trust.write_record(toy / "lib", [toy / "lib" / "whatever_sm_90a.so"])
    result = toy_gate()
    assert result.returncode == 0, result.stdout + result.stderr
    (toy / "lib" / "stray_sm_90a.so").write_bytes(b"\x7fELF")
    result = toy_gate()
    assert result.returncode == 1 and codes(result.stdout) == ["CM801"], result.stdout
    assert "lib/stray_sm_90a.so is not in the build record" in result.stdout


# --------------------------------------------------------------------------- vendored runs


def test_blocker_blocks(tmp_path, into):
    result = run_vendored(tmp_path, into, """
        for name in ("flashinfer", "flashinfer.experimental.cake", "cake", "cake.core"):
            try:
                __import__(name)
            except ImportError as exc:
                assert "is blocked" in str(exc), exc
            else:
                raise SystemExit(f"{name} was importable")
        print("blocked")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "blocked", result.stderr


def test_vendored_toy_imports_without_cake_or_its_host(tmp_path, into, toy):
    result = run_vendored(tmp_path, into, f"""
        import sys
        import {TOY_FAMILY} as family
        programs = family.programs()
        print(programs.manifest.package, programs.tree.owner, len(programs.manifest.programs))
        print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"cake", "flashinfer"}}))
    """)
    assert result.returncode == 0, result.stderr
    package = f"{PREFIX}.{TOY_FAMILY}"
    assert result.stdout.splitlines() == [f"{package} {package} 2", "[]"]


@pytest.fixture(scope="module")
def real_tree(tmp_path_factory) -> tuple[Path, Path]:
    """Every real family vendored into one host tree: (work folder, the cake/ folder)."""
    assert real_families(), "no family in this checkout"
    work = tmp_path_factory.mktemp("real")
    into = host_tree(work / "host")
    result = vendor(work, into)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(real_families())
    return work, into


@pytest.mark.parametrize("name", real_families())
def test_real_family_vendors_and_passes_the_gate(real_tree, name):
    work, into = real_tree
    result = gate(work, work / "host", name)
    assert result.returncode == 0, result.stdout + result.stderr
    upstream = mf.read(REPO / "manifests" / f"{name}.json")
    assert manifest_of(into / name) == mf.with_package(upstream, f"{PREFIX}.{name}")


@pytest.mark.skipif(not TORCH, reason="torch is not installed")
@pytest.mark.parametrize("name", real_families())
def test_real_family_imports_without_cake_or_its_host(real_tree, name):
    work, into = real_tree
    public = sorted(n for n in _public_names(name))
    # The families under a neutral parent package (not the host's): a KCP family imports its
    # base family as a sibling.
    result = run_vendored(work, into, f"""
        import importlib, sys, types
        parent = types.ModuleType("vendored")
        parent.__path__ = [{str(into)!r}]
        sys.modules["vendored"] = parent
        family = importlib.import_module("vendored.{name}")
        assert sorted(family.__all__) == {public!r}, family.__all__
        outside = sorted({{m.split(".")[0] for m in sys.modules}} & {{"cake", "flashinfer"}})
        assert not outside, outside
        files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
        print(sorted(f for f in files if {str(REPO)!r} in f))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # nothing loaded from the cake-train checkout


def _public_names(name: str) -> list[str]:
    """``__all__`` of the installed family, read without importing it (no torch needed)."""
    import ast

    tree = ast.parse((REPO / "cake" / name / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


@pytest.mark.skipif(not TORCH, reason="torch is not installed")
@pytest.mark.parametrize("name", real_families())
def test_installed_and_vendored_register_distinct_torch_ops(real_tree, name):
    """Both copies in one process: the vendored import must not replace an installed op.

    torch.library.custom_op silently replaces an op of the same qualified name, so a
    vendored copy registering ``cake::...`` would run for the installed package's calls too.
    """
    work, into = real_tree
    result = run([os.sys.executable, "-c", f"""
import importlib, sys, types
sys.path[:0] = [{str(REPO)!r}]
from torch._library import custom_ops
import cake.{name}
installed = dict(custom_ops.OPDEFS)
parent = types.ModuleType("vendored")  # a neutral parent: a KCP family imports its base beside it
parent.__path__ = [{str(into)!r}]
sys.modules["vendored"] = parent
importlib.import_module("vendored.{name}")
replaced = sorted(q for q, op in installed.items() if custom_ops.OPDEFS[q] is not op)
print(replaced)
"""], work)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", (
        f"importing the vendored {name} replaced the installed package's torch ops "
        f"{result.stdout.strip()}: op names must depend on the owning package")


def test_every_finding_code_of_the_gate_is_known():
    text = (REPO / "cake" / "vendored.py").read_text()
    used = set(re.findall(r'"(CM7\d\d)"', text)) | {"CM701"}
    assert used == {c for c in mf.FINDING_CODES if c.startswith("CM7")}
