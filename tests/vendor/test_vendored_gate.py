"""The vendored gate compares a copy with its upstream, not with the copy's own record (issue 45).

The first four tests are the attacks that passed ``check_manifests --vendored-gate`` while it
trusted ``VENDORED.json``: a forged record, a module hidden in ``lib/``, planted bytecode and a
linked folder. The rest cover each finding code of the comparison: CM705 (a file upstream does
not have), CM706 (links), CM707 (bytecode), CM708 (``importlib``, ``__import__``, ``exec``,
``eval``), CM709 (a gate running another cake-train than the copy came from) and CM704 for a
record that differs from the one tools/vendor.py writes; and a gate run from an installed
cake-train. Each copy is the toy family vendored from a miniature cake-train checkout, whose own
gate checks it (``toy_gate``).
"""

from __future__ import annotations

import hashlib
import json
import py_compile
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from vendor_tree import (TOY_FAMILY, codes, commit_all, git, install_upstream,
                         installed_gate, run_vendored, vendor)

from cake import vendored


def findings(result, code: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if f": {code} " in line]


def assert_refused(result, *expected: str) -> None:
    """The gate failed (exit 1) with at least the ``expected`` codes, without a traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert set(expected) <= set(codes(result.stdout)), result.stdout


def planted_bytecode(package: Path, edited_source: str, work: Path) -> Path:
    """``package/__pycache__/__init__.<tag>.pyc`` compiled (in ``work``) from ``edited_source``
    with unchecked-hash invalidation: Python runs it without comparing it with ``__init__.py``."""
    edited = work / "edited" / "__init__.py"
    edited.parent.mkdir()
    edited.write_text(edited_source)
    pyc = package / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(edited), cfile=str(pyc), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return pyc


# --------------------------------------------------------------------------- the four attacks


def test_a_forged_record_does_not_vouch_for_an_added_module(toy, toy_gate):
    module = toy / "plugin.py"
    module.write_text('import importlib\n\nhost = importlib.import_module("flash" + "infer")\n')
    record = json.loads((toy / "VENDORED.json").read_text())
    record["files"]["plugin.py"] = hashlib.sha256(module.read_bytes()).hexdigest()
    (toy / "VENDORED.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    result = toy_gate()
    assert_refused(result, "CM704", "CM705", "CM708")
    assert f"{module}:$: CM705 is not a file of the upstream package" in result.stdout
    assert f"{toy / 'VENDORED.json'}:files.plugin.py: CM704 lists a file tools/vendor.py " \
        "does not write" in result.stdout
    assert all(line.startswith(f"{module}:line ") for line in findings(result, "CM708"))


def test_a_module_hidden_in_lib_is_found(toy, toy_gate):
    (toy / "lib").mkdir()
    evil = toy / "lib" / "evil.py"
    evil.write_text('cake = __import__("c" + "ake")\n')
    result = toy_gate()
    assert_refused(result, "CM705", "CM708")
    assert f"{evil}:$: CM705 " in result.stdout
    assert f"{evil}:line 1: CM708 uses __import__" in result.stdout


def test_planted_unchecked_hash_bytecode_is_found(tmp_path, into, toy, toy_gate):
    source = (toy / "__init__.py").read_text()
    pyc = planted_bytecode(toy, source + "\nprint('planted code ran')\n", tmp_path)
    ran = run_vendored(tmp_path, into, f"import {TOY_FAMILY}")
    assert ran.returncode == 0 and "planted code ran" in ran.stdout, ran.stderr  # the attack
    assert (toy / "__init__.py").read_text() == source  # no .py file changed
    result = toy_gate()
    assert_refused(result, "CM707")
    assert f"{pyc}:$: CM707 is bytecode and the host is not a git checkout" in result.stdout


def test_a_linked_folder_in_csrc_is_found(tmp_path, toy, toy_gate):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "extra.cu").write_text("// not a vendored source\n")
    (toy / "csrc" / "more").symlink_to(outside, target_is_directory=True)
    result = toy_gate()
    assert_refused(result, "CM706")
    assert f"{toy / 'csrc' / 'more'}:$: CM706 is a symbolic link (to {outside})" in result.stdout


# --------------------------------------------------------------------------- CM705: extra files


@pytest.mark.parametrize("relative", ["notes.txt", "core/extra.py", "lib/notes.txt",
                                      "lib/sub/x.so", "build.test.json"])
def test_a_file_upstream_does_not_have_is_cm705(toy, toy_gate, relative):
    path = toy / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n")
    result = toy_gate()
    assert_refused(result, "CM705")
    assert f"{path}:$: CM705 " in result.stdout


def test_a_module_of_the_upstream_family_is_not_extra(tmp_path, source, into, toy, toy_gate):
    """A module the upstream family has, vendored, passes; the copy is upstream's bytes."""
    (source / "cake" / TOY_FAMILY / "helpers.py").write_text("from ..core import manifest\n")
    assert vendor(tmp_path, into, repository=source).returncode == 0
    result = toy_gate()
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- CM706: links


def _link_folder(toy: Path, outside: Path) -> Path:
    outside.mkdir()
    (outside / "notes.py").write_text("x = 1\n")
    (toy / "more").symlink_to(outside, target_is_directory=True)
    return toy / "more"


def _link_module(toy: Path, outside: Path) -> Path:
    """core/jit.py replaced by a link to a copy with the same bytes."""
    outside.mkdir()
    shutil.copyfile(toy / "core" / "jit.py", outside / "jit.py")
    (toy / "core" / "jit.py").unlink()
    (toy / "core" / "jit.py").symlink_to(outside / "jit.py")
    return toy / "core" / "jit.py"


def _link_core(toy: Path, outside: Path) -> Path:
    """core/ replaced by a link to a copy of it."""
    shutil.move(toy / "core", outside)
    (toy / "core").symlink_to(outside, target_is_directory=True)
    return toy / "core"


@pytest.mark.parametrize("make_link", [_link_folder, _link_module, _link_core],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_link_anywhere_is_cm706_alone(tmp_path, toy, toy_gate, make_link):
    """The link is the finding: the files it points at (same bytes or not) are not reported
    again as missing or extra."""
    link = make_link(toy, tmp_path / "outside")
    result = toy_gate()
    assert_refused(result, "CM706")
    assert codes(result.stdout) == ["CM706"], result.stdout
    assert f"{link}:$: CM706 is a symbolic link (to {tmp_path / 'outside'}" in result.stdout


def test_a_linked_package_folder_is_cm706(tmp_path, toy, toy_gate):
    moved = shutil.move(toy, tmp_path / "elsewhere")
    toy.symlink_to(moved, target_is_directory=True)
    result = toy_gate()
    assert_refused(result, "CM706")
    assert f"{toy}:$: CM706 the package folder is a symbolic link" in result.stdout


# --------------------------------------------------------------------------- CM707: bytecode


def test_bytecode_outside_git_is_cm707_wherever_it_is(toy, toy_gate):
    for relative in ["core/__pycache__/loader.cpython-311.pyc", "csrc/__pycache__/x.pyc",
                     "stale.pyc"]:
        (toy / relative).parent.mkdir(exist_ok=True)
        (toy / relative).write_bytes(b"\0")
    result = toy_gate()
    assert_refused(result, "CM707")
    assert codes(result.stdout) == ["CM707"] and len(findings(result, "CM707")) == 3


def test_bytecode_an_import_leaves_in_a_git_host_is_fine_until_tracked(tmp_path, into, toy,
                                                                       toy_gate):
    host = tmp_path / "host"
    commit_all(host, "vendored")
    imported = run_vendored(tmp_path, into, f"import {TOY_FAMILY}._function",
                            PYTHONDONTWRITEBYTECODE="")
    assert imported.returncode == 0, imported.stderr
    left = sorted(p.relative_to(toy).as_posix() for p in toy.rglob("*.pyc"))
    assert left and all("__pycache__/" in p for p in left), left
    clean = toy_gate()
    assert clean.returncode == 0, clean.stdout + clean.stderr  # untracked: an import's cache
    git(host, "add", "-f", str(toy / left[0]))
    tracked = toy_gate()
    assert_refused(tracked, "CM707")
    assert findings(tracked, "CM707") == \
        [f"{toy / left[0]}:$: CM707 is bytecode and git tracks it; delete it (and never "
         "commit bytecode)"]


def test_planted_bytecode_committed_to_a_git_host_is_cm707(tmp_path, toy, toy_gate):
    pyc = planted_bytecode(toy, "print('planted')\n", tmp_path)
    commit_all(tmp_path / "host", "vendored, with a planted .pyc")
    result = toy_gate()
    assert_refused(result, "CM707")
    assert f"{pyc}:$: CM707 is bytecode and git tracks it" in result.stdout


# --------------------------------------------------------------------------- CM708: dynamic code


def _package(tmp_path: Path, modules: dict[str, str]) -> Path:
    package = tmp_path / "vendored" / TOY_FAMILY
    for relative, text in {"__init__.py": "", **modules}.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    return package


@pytest.mark.parametrize("statement,used", [
    ("import importlib", "importlib"),
    ("import importlib.util as util", "importlib.util"),
    ("from importlib import import_module", "importlib"),
    ("module = __import__('os')", "__import__"),
    ("exec('x = 1')", "exec"),
    ("value = eval('1')", "eval"),
    ("run = exec", "exec"),
    ("import builtins\nbuiltins.exec('x = 1')", ".exec"),
    ("import sys\nsys.modules['importlib'].import_module('os')", ".import_module"),
    ("from builtins import eval", "eval"),
    ("def later():\n    return __import__('json')", "__import__"),
])
def test_dynamic_code_is_cm708(tmp_path, statement, used):
    package = _package(tmp_path, {"_function.py": statement + "\n"})
    found = list(vendored.check_dynamic_code(package))
    assert found and {f.code for f in found} == {"CM708"}, found
    assert any(f"uses {used};" in f.message for f in found), found
    assert all(f.path == str(package / "_function.py") for f in found)


def test_csrc_and_plain_code_are_not_cm708(tmp_path):
    """Triton sources under csrc/ are program sources (sha256-checked); compile() and the
    string "exec" alone run nothing."""
    package = _package(tmp_path, {
        "csrc/x_kernel_a.py": "exec('1')\n",
        "_function.py": "code = compile('1', 'x', 'exec')\nmode = 'eval'\n"})
    assert list(vendored.check_dynamic_code(package)) == []


TRITON_LOADER = textwrap.dedent("""\
    def _run(file, name, cake_include):
        code = compile(file.read_text(), str(file), "exec")
        exec(code, {})
""")


def test_the_triton_loader_is_the_one_exception(tmp_path):
    package = _package(tmp_path, {"core/triton_aot.py": TRITON_LOADER})
    assert list(vendored.check_dynamic_code(package)) == []


@pytest.mark.parametrize("modules", [
    {"core/triton_aot.py": TRITON_LOADER + "exec('1')\n"},  # another call in that file
    {"core/triton_aot.py": TRITON_LOADER + "    eval('1')\n"},  # another callee in _run
    {"core/triton_aot.py": TRITON_LOADER + "    exec('1')\n"},  # a second exec in _run
    {"core/loader.py": TRITON_LOADER},  # the same function in another file
    {"_function.py": TRITON_LOADER},
], ids=["file", "callee", "second", "core-file", "family-file"])
def test_the_exception_is_that_file_and_that_call_only(tmp_path, modules):
    package = _package(tmp_path, modules)
    assert list(vendored.check_vendored_imports(package)) == []  # parsed
    assert [f.code for f in vendored.check_dynamic_code(package)]


def test_the_gate_reports_dynamic_code_in_a_vendored_module(toy, toy_gate):
    module = toy / "core" / "loader.py"
    module.write_text(module.read_text() + "\nhost = __import__('flash' + 'infer')\n")
    result = toy_gate()
    assert_refused(result, "CM708")
    assert codes(result.stdout) == ["CM708"], result.stdout  # CM708 says how it changed


# --------------------------------------------------------------------------- CM709 and CM704


def test_a_gate_of_another_version_refuses_with_cm709(toy, source, toy_gate):
    init = source / "cake" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "9.', 1))
    result = toy_gate()
    assert_refused(result, "CM709")
    assert codes(result.stdout) == ["CM709"], result.stdout
    line = findings(result, "CM709")[0]
    assert "run the gate from the cake-train the copy came from" in line
    assert "re-vendor" in line


def test_a_gate_of_another_commit_refuses_until_re_vendored(tmp_path, source, into, toy_gate):
    vendored_from = commit_all(source, "cake-train")
    assert vendor(tmp_path, into, repository=source).returncode == 0
    record = json.loads((into / TOY_FAMILY / "VENDORED.json").read_text())
    assert record["cake_train_commit"] == vendored_from
    assert toy_gate().returncode == 0
    running = commit_all(source, "a later commit")
    result = toy_gate()
    assert_refused(result, "CM709")
    assert codes(result.stdout) == ["CM709"], result.stdout
    assert f"vendored from cake-train {record['cake_train_version']} at commit {vendored_from}" \
        in result.stdout and f"at commit {running} ({source / 'cake'})" in result.stdout
    assert vendor(tmp_path, into, repository=source).returncode == 0
    assert toy_gate().returncode == 0


def test_a_gate_without_the_family_refuses_with_cm709(toy, source, toy_gate):
    (source / "manifests" / f"{TOY_FAMILY}.json").unlink()
    result = toy_gate()
    assert_refused(result, "CM709")
    assert f"has no family {TOY_FAMILY}" in result.stdout


@pytest.mark.parametrize("field,value", [
    ("source_package", "cake.cake_other_det_train"), ("package", "flashinfer.other"),
    ("upstream_manifest_sha256", "0" * 64)])
def test_a_record_that_vendor_py_does_not_write_is_cm704(toy, toy_gate, field, value):
    record = json.loads((toy / "VENDORED.json").read_text())
    record[field] = value
    (toy / "VENDORED.json").write_text(json.dumps(record))
    result = toy_gate()
    assert_refused(result, "CM704")
    assert codes(result.stdout) == ["CM704"], result.stdout
    assert f"{toy / 'VENDORED.json'}:{field}: CM704 is {value!r}" in result.stdout


def test_a_record_of_the_previous_format_asks_to_re_vendor(toy, toy_gate):
    record = json.loads((toy / "VENDORED.json").read_text())
    del record["cake_train_commit"]
    record["format"] = 1
    (toy / "VENDORED.json").write_text(json.dumps(record))
    result = toy_gate()
    assert_refused(result, "CM704")
    assert "format 1, expected 2: re-vendor with tools/vendor.py --force" in result.stdout


# --------------------------------------------------------------------------- installed upstream


def test_the_gate_of_an_installed_cake_train(tmp_path, source, into, toy):
    """An installed cake-train knows no commit: the version must match, the bytes do the rest.
    The copy was vendored from a git checkout, so its record names a commit."""
    commit_all(source, "cake-train")
    assert vendor(tmp_path, into, repository=source).returncode == 0
    site = tmp_path / "site"
    install_upstream(source, site)
    clean = installed_gate(tmp_path, tmp_path / "host", site, TOY_FAMILY)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    module = toy / "_function.py"
    module.write_text(module.read_text() + "# edited\n")
    edited = installed_gate(tmp_path, tmp_path / "host", site, TOY_FAMILY)
    assert_refused(edited, "CM703")
    assert f"{module}:$: CM703 differs from what tools/vendor.py makes" in edited.stdout
