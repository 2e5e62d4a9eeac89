"""The renderer: rename invariance, what a digest depends on, idempotence and ``--check``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from toy_tree import (ENTRIES, FAMILY_A, FAMILY_B, RENDERER, SpecText, default_specs,
                      run_checker)

from cake.core import manifest as mf


def _digests(toy, name, **kwargs) -> dict[str, str]:
    """variant (as JSON) -> digest, for one family rendered in memory."""
    manifest, _ = toy.render_family(name, **kwargs)
    return {json.dumps(p.variant, sort_keys=True): p.digest for p in manifest.programs}


def _all_digests(toy) -> dict[tuple[str, str], str]:
    return {(name, variant): digest for name in (FAMILY_A, FAMILY_B)
            for variant, digest in _digests(toy, name).items()}


def _render_cli(toy, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RENDERER), "--root", str(toy.root), *args],
                          capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- rename invariance


@pytest.mark.parametrize("name", [FAMILY_A, FAMILY_B])
def test_rename_keeps_digests_and_changes_every_library(toy, name):
    original, original_files = toy.render_family(name)
    renamed, renamed_files = toy.render_family(
        name, prefix="cake_renamed_det_train", package="flashinfer.cake.cake_renamed_det_train")
    assert renamed.package == "flashinfer.cake.cake_renamed_det_train"
    assert renamed.library_prefix == "cake_renamed_det_train"
    by_variant = {json.dumps(p.variant, sort_keys=True): p for p in original.programs}
    assert len(renamed.programs) == len(original.programs) == len(by_variant)
    for program in renamed.programs:
        before = by_variant[json.dumps(program.variant, sort_keys=True)]
        assert program.digest == before.digest
        assert program.library != before.library
        assert program.library.startswith("cake_renamed_det_train_")
        assert program.entries == before.entries  # declarations carry no library name
        assert all(k.startswith("kernel_" + program.library) for k in program.kernels)
        binding = renamed_files[f"{program.library}_binding.cu"].decode()
        assert mf.entry_symbols(binding) == [
            f"{program.library}_{name}" for name in ("digest", "abi_version", "forward",
                                                     "backward")]
        assert mf.rendered_entries(binding) == program.entries
    assert not set(renamed_files) & set(original_files)
    assert not any(name.encode() in data for data in renamed_files.values())


# --------------------------------------------------------------------------- digest sensitivity


def _changed_after(toy, mutate) -> set[tuple[str, str]]:
    before = _all_digests(toy)
    mutate()
    after = _all_digests(toy)
    assert set(after) == set(before)
    return {key for key in before if before[key] != after[key]}


def _edit(toy, relative, old, new):
    path = toy.path(relative)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


A_ALL = {(FAMILY_A, v) for v in ('{"block": 128}', '{"block": 256}',
                                   '{"block": 128, "fast": true}')}
B_ALL = {(FAMILY_B, v) for v in ('{"width": 4}', '{"width": 8}')}


def test_digest_depends_on_own_template_only(toy):
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/templates/toy/kernel.cu",
                                                "*= TOY_SCALE", "*= (TOY_SCALE)"))
    assert changed == A_ALL
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/templates/toy_extra/kernel.cu",
                                                "Toy kernel", "Toy  kernel"))
    assert changed == B_ALL


def test_digest_depends_on_shared_template(toy):
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/templates/toy/binding.cu",
                                                "n = %d < 0", "n = %d is negative"))
    assert changed == A_ALL | B_ALL
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/templates/toy/kernel_backward.cu",
                                                "Toy backward", "Toy  backward"))
    assert changed == A_ALL | B_ALL


def test_digest_depends_on_the_declared_entries_of_its_table(toy):
    """The entries block is part of the binding's text: another declaration, another program."""
    entries = dict(ENTRIES, forward=(("x", "pointer"), ("n", "i64"), ("scale", "f32")))
    assert _changed_after(toy, lambda: toy.set_entries(FAMILY_B, entries)) == B_ALL
    entries = dict(ENTRIES, extra=())
    assert _changed_after(toy, lambda: toy.set_entries(FAMILY_A, entries)) == A_ALL


def test_digest_depends_on_included_headers_only(toy):
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/include/toy/extra.h", "1.0f", "1.5f"))
    assert changed == B_ALL
    changed = _changed_after(toy, lambda: _edit(toy, "csrc/include/toy/common.h", "2.0f", "2.5f"))
    assert changed == A_ALL | B_ALL


def test_digest_depends_on_params_and_flags_of_one_spec(toy):
    specs = default_specs()

    def change_flags():
        spec = specs[FAMILY_A][2]
        specs[FAMILY_A][2] = SpecText(spec.variant, spec.params, flags=("--use_fast_math", "-G"))
        toy.set_specs(specs)

    assert _changed_after(toy, change_flags) == {(FAMILY_A, '{"block": 128, "fast": true}')}

    def change_params():
        specs[FAMILY_B][0] = SpecText({"width": 4}, {"TOY_WIDTH": 5})
        toy.set_specs(specs)

    assert _changed_after(toy, change_params) == {(FAMILY_B, '{"width": 4}')}


def test_digest_ignores_arch_and_route(toy):
    specs = default_specs()

    def change_arches():
        spec = specs[FAMILY_A][0]
        specs[FAMILY_A][0] = SpecText(spec.variant, spec.params, arches=("sm_103a",))
        toy.set_specs(specs)

    assert _changed_after(toy, change_arches) == set()


def test_rendered_digest_matches_checker_recomputation(toy):
    """The renderer and the checker compute the same digest (the tree checks clean)."""
    result = run_checker(toy.root)
    assert result.returncode == 0, result.stdout


# --------------------------------------------------------------------------- entries


def test_renderer_fills_the_entries_block_from_the_table(toy):
    """Each binding's block is the table's entries as X-macros, in table order; the manifest
    declares the same entries; nothing else of the template changes."""
    template = toy.path("csrc/templates/toy/binding.cu").read_text()
    assert "// cake:entries\n// cake:end-entries\n" in template
    block = ("// cake:entries\n"
             "#define CAKE_ENTRY_forward(X) X(pointer, x) X(i32, n) X(f32, scale)\n"
             "#define CAKE_ENTRY_backward(X) X(pointer, dy) X(pointer, dx) X(i64, n)\n"
             "// cake:end-entries\n")
    for name in (FAMILY_A, FAMILY_B):
        layout = toy.tree(name)
        for index, program in enumerate(layout.manifest().programs):
            assert program.entries == (
                mf.Entry("forward", (mf.Argument("x", "pointer"), mf.Argument("n", "i32"),
                                     mf.Argument("scale", "f32"))),
                mf.Entry("backward", (mf.Argument("dy", "pointer"), mf.Argument("dx", "pointer"),
                                      mf.Argument("n", "i64"))))
            text = layout.source(index, "binding").read_text()
            assert text.count(block) == 1
            assert mf.rendered_entries(text) == program.entries
            head, _, rest = text.partition("\n")
            assert head.startswith("// Generated by tools/render.py from ")
            unrendered = (rest.replace(block, "// cake:entries\n// cake:end-entries\n")
                          .replace(program.library, mf.LIBRARY_PLACEHOLDER))
            assert unrendered == template.replace("// cake:params\n", "// cake:params\n\n")


def test_renderer_fills_an_entry_without_arguments(toy):
    toy.set_entries(FAMILY_B, dict(ENTRIES, ping=()))
    manifest, files = toy.render_family(FAMILY_B)
    program = manifest.programs[0]
    assert program.entries[-1] == mf.Entry("ping", ())
    binding = files[f"{program.library}_binding.cu"].decode()
    assert "#define CAKE_ENTRY_ping(X)\n// cake:end-entries\n" in binding
    assert mf.rendered_entries(binding) == program.entries


def _render_error(toy) -> str:
    result = _render_cli(toy)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("render: error: "), result.stderr
    return lines[0]


def test_renderer_refuses_a_template_block_that_is_not_empty(toy):
    before = toy.snapshot()
    _edit(toy, "csrc/templates/toy/binding.cu", "// cake:entries\n",
          "// cake:entries\n#define CAKE_ENTRY_forward(X) X(pointer, x)\n")
    error = _render_error(toy)
    assert "'// cake:entries' block must be empty" in error and "binding" in error
    after = toy.snapshot()
    assert {k: v for k, v in after.items() if not k.startswith("csrc/templates/")} == \
        {k: v for k, v in before.items() if not k.startswith("csrc/templates/")}


def test_renderer_refuses_a_binding_template_without_the_block(toy):
    _edit(toy, "csrc/templates/toy/binding.cu", "// cake:entries\n// cake:end-entries\n", "")
    assert "a binding needs a '// cake:entries'" in _render_error(toy)


def test_renderer_refuses_a_table_without_entries(toy):
    toy.set_entries(FAMILY_A, {})
    assert f"{FAMILY_A}: the table declares no entries" in _render_error(toy)


def test_renderer_refuses_an_unknown_argument_kind(toy):
    toy.set_entries(FAMILY_A, dict(ENTRIES, forward=(("x", "pointer"), ("n", "u32"))))
    error = _render_error(toy)
    assert "entry forward argument n: kind 'u32'" in error
    assert all(kind in error for kind in mf.ARGUMENT_KINDS)


def test_rendered_binding_compiles_against_the_real_headers(toy, tmp_path):
    """The toy binding is a program of the current contract: the host compiler takes it with
    the build's flags (cake/core/toolchain.py) against this checkout's cake/*.h."""
    from cake.core import toolchain

    cxx = toolchain.find_cxx()
    if cxx is None:
        pytest.skip("no host C++ compiler")
    layout = toy.tree(FAMILY_B)
    program = layout.manifest().programs[0]
    image = tmp_path / "image.fatbin"
    image.write_bytes(b"\0" * 64)
    command = [cxx, *toolchain.HOST_FLAGS, "-Wall", "-Werror", f"-I{layout.tree.include_dir}",
               toolchain.digest_define(program.digest), "-DCAKE_IMAGE_COUNT=1",
               toolchain.images_define([str(image)]), "-x", "c++",
               str(layout.source(0, "binding")),
               "-o", str(tmp_path / "toy.so")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if shutil.which("nm"):
        exported = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "toy.so")],
                                  capture_output=True, text=True, check=True).stdout
        names = {line.split()[-1] for line in exported.splitlines() if line.strip()}
        assert names == {f"{program.library}_{n}" for n in
                         ("digest", "abi_version", "forward", "backward")}


# --------------------------------------------------------------------------- idempotence, --check


def test_render_is_idempotent(toy):
    before = toy.snapshot()
    result = _render_cli(toy)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("render: 0 written, 0 removed"), result.stdout
    assert toy.snapshot() == before
    mtimes = {p: p.stat().st_mtime_ns for p in toy.root.rglob("*") if p.is_file()}
    _render_cli(toy)
    assert {p: p.stat().st_mtime_ns for p in toy.root.rglob("*") if p.is_file()} == mtimes


def test_render_cli_matches_in_process_render(tmp_path):
    """A fresh tree rendered by the command line is the same as the fixture's render."""
    from toy_tree import ToyRepo

    cli = ToyRepo(tmp_path / "cli")
    result = _render_cli(cli)
    assert result.returncode == 0, result.stderr
    in_process = ToyRepo(tmp_path / "in_process")
    in_process.render()
    assert cli.snapshot() == in_process.snapshot()


def test_check_clean(toy):
    result = _render_cli(toy, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok" in result.stdout


def test_check_names_hand_edited_file(toy):
    layout = toy.tree(FAMILY_A)
    path = layout.source(1, "binding")
    before = toy.snapshot()
    path.write_bytes(path.read_bytes() + b"// hand edit\n")
    result = _render_cli(toy, "--check")
    assert result.returncode == 1
    relative = str(path.relative_to(toy.root))
    assert f"{relative} differs from a fresh render" in result.stdout
    assert "tools/render.py" in result.stdout  # says what to run
    assert toy.snapshot() != before  # --check wrote nothing: the edit is still there
    assert _render_cli(toy).returncode == 0
    assert toy.snapshot() == before


def test_check_names_hand_edited_manifest(toy):
    path = toy.tree(FAMILY_B).manifest_path
    path.write_text(path.read_text().replace('"min_tokens": 0', '"min_tokens": 1'))
    result = _render_cli(toy, "--check")
    assert result.returncode == 1
    assert f"manifests/{FAMILY_B}.json differs from a fresh render" in result.stdout


def test_check_names_stale_program_file(toy):
    stale = toy.path(f"csrc/{FAMILY_A}/{FAMILY_A}_0123456789abcdef0123_kernel.cu")
    stale.write_text("// left over from an old table\n")
    result = _render_cli(toy, "--check")
    assert result.returncode == 1
    assert f"csrc/{FAMILY_A}/{stale.name} is no longer rendered" in result.stdout
    assert stale.exists()
    assert _render_cli(toy).returncode == 0
    assert not stale.exists()


def test_removed_spec_removes_its_programs(toy):
    layout = toy.tree(FAMILY_A)
    dropped = layout.manifest().programs
    specs = default_specs()
    del specs[FAMILY_A][1]
    toy.set_specs(specs)
    check = _render_cli(toy, "--check")
    assert check.returncode == 1 and "is no longer rendered" in check.stdout
    result = _render_cli(toy)
    files = {len(p.sources) for p in dropped}
    assert files == {3}  # each program: kernel, kernel_backward and binding
    assert result.returncode == 0 and "3 removed" in result.stdout, result.stdout
    kept = {p.library for p in layout.manifest().programs}
    assert len(kept) == 2
    gone = [p for p in dropped if p.library not in kept]
    assert len(gone) == 1
    for source in gone[0].sources:
        assert not layout.tree.source_path(source).exists()
    assert _render_cli(toy, "--check").returncode == 0
    assert run_checker(toy.root).returncode == 0


def test_render_error_is_one_line(toy):
    _edit(toy, "csrc/templates/toy/kernel.cu", "// cake:end-params", "// cake:end")
    result = _render_cli(toy)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("render: error:") and "cake:params" in result.stderr


def test_repository_render_is_current():
    """This checkout's generated programs and manifests are what its tables render."""
    result = subprocess.run([sys.executable, str(RENDERER), "--check"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, \
        result.stdout + result.stderr + "\nrun 'python tools/render.py' and commit the result"
