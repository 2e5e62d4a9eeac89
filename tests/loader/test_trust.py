"""A library is checked before any of its code runs, and the JIT cache must be private.

Each test plants what an attacker or an accident could leave (a library whose ELF constructor
writes a marker file, a truncated library, a shared cache, a lock file made into a link) and
shows it is refused before load: the constructor's marker never appears. Each of them failed on
the loader before this check (which called dlopen first and looked at the digest after).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from cake.core import jit, loader, toolchain, trust
from cake.core import manifest as mf

REPO = Path(__file__).resolve().parents[2]
CONSTRUCTOR = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen(MARKER, "w");
  if (f) { fputs("ran", f); fclose(f); }
}
__attribute__((visibility("default"))) const char* LIBRARY_digest(void) { return DIGEST; }
__attribute__((visibility("default"))) int LIBRARY_abi_version(void) { return 2; }
"""


def planted_library(tmp_path: Path, library: str, digest: str, marker: Path) -> bytes:
    """A shared library that writes ``marker`` when loaded and claims to be ``library``."""
    compiler = toolchain.find_cxx()
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "planted.c"
    source.write_text(CONSTRUCTOR.replace("LIBRARY", library))
    output = tmp_path / "planted.so"
    subprocess.run([compiler, "-x", "c", "-shared", "-fPIC", f'-DMARKER="{marker}"',
                    f'-DDIGEST="{digest}"', str(source), "-o", str(output)], check=True)
    return output.read_bytes()


@pytest.fixture
def program():
    manifest = mf.read(REPO / "manifests" / "cake_causal_conv1d_det_train.json")
    return manifest.programs[0]


def test_a_library_whose_bytes_differ_from_its_record_never_runs(tmp_path, program):
    marker = tmp_path / "ran"
    data = planted_library(tmp_path, program.library, program.digest, marker)
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    with pytest.raises(trust.Untrusted, match=r"refused before loading: its sha256 is .*reinstall"):
        trust.load(path, "0" * 64, "reinstall cake-train")
    assert not marker.exists()
    # With its own bytes recorded it loads (and its constructor runs): the check is the record.
    trust.load(path, mf.sha256_hex(data), "reinstall cake-train")
    assert marker.read_text() == "ran"


def test_a_truncated_library_is_refused_not_a_crash(tmp_path, program):
    data = planted_library(tmp_path, program.library, program.digest, tmp_path / "ran")
    for keep in (4096, len(data) - 872, 10):
        path = tmp_path / f"short{keep}.so"
        path.write_bytes(data[:keep])
        with pytest.raises(trust.Untrusted, match="refused before loading"):
            trust.load(path, mf.sha256_hex(data), "reinstall cake-train")
        truncated_but_recorded = mf.sha256_hex(data[:keep])
        if keep == 10:
            with pytest.raises(trust.Untrusted, match="not an ELF file"):
                trust.load(path, truncated_but_recorded, "reinstall cake-train")


def test_the_elf_header_must_be_this_machines(tmp_path):
    header = bytearray(b"\x7fELF" + bytes(60))
    header[4], header[5] = 2, 1
    header[16:18] = (3).to_bytes(2, "little")
    header[18:20] = (183 if os.uname().machine == "x86_64" else 62).to_bytes(2, "little")
    assert "ELF machine" in trust.elf_problem(bytes(header))
    header[16:18] = (2).to_bytes(2, "little")  # an executable
    header[18:20] = (62 if os.uname().machine == "x86_64" else 183).to_bytes(2, "little")
    assert trust.elf_problem(bytes(header)) == "it is not a shared library"


def _cache_entry(program: mf.Program, arch: str) -> Path:
    return jit.entry_dir(program, arch) / f"{program.library}_{arch}.so"


@pytest.mark.skipif(jit.find_nvcc() is None or toolchain.find_cxx() is None,
                    reason="the cache key names nvcc's and the host compiler's versions")
def test_a_planted_cache_entry_without_its_record_is_not_loaded(tmp_path, program, monkeypatch):
    monkeypatch.setenv("CAKE_CACHE_DIR", str(tmp_path / "cache"))
    marker = tmp_path / "ran"
    data = planted_library(tmp_path, program.library, program.digest, marker)
    path = _cache_entry(program, "sm_90a")
    trust.make_private(path.parent)
    path.write_bytes(data)
    assert jit.cached(program, "sm_90a") is None  # no record: not an entry
    path.with_name(path.name + ".sha256").write_text("f" * 64 + "\n")
    found = jit.cached(program, "sm_90a")
    with pytest.raises(loader.LibraryRefused, match="refused before loading"):
        loader.Library(program, found[0], "cached", found[1], "compile it again")
    assert not marker.exists()


@pytest.mark.skipif(jit.find_nvcc() is None or toolchain.find_cxx() is None,
                    reason="the cache key names nvcc's and the host compiler's versions")
def test_a_cache_others_can_write_is_refused(tmp_path, program, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # a /tmp-like folder: sticky, so its parent is fine
    cache = shared / "cake"
    cache.mkdir()
    monkeypatch.setenv("CAKE_CACHE_DIR", str(cache))
    os.chmod(cache, 0o777)
    with pytest.raises(trust.Untrusted, match=r"writable by group or others \(mode 777\).*chmod go-w"):
        jit.cached(program, "sm_90a")
    os.chmod(cache, 0o700)
    assert jit.cached(program, "sm_90a") is None
    inner = jit.entry_dir(program, "sm_90a")
    trust.make_private(inner)
    os.chmod(inner.parent, 0o775)
    with pytest.raises(trust.Untrusted, match="writable by group or others"):
        jit.cached(program, "sm_90a")
    os.chmod(inner.parent, 0o700)
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)  # writable by others and not sticky
    monkeypatch.setenv("CAKE_CACHE_DIR", str(open_parent / "cake"))
    trust.make_private(open_parent / "cake")
    with pytest.raises(trust.Untrusted, match="writable by others and not sticky"):
        jit.cached(program, "sm_90a")


def test_a_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache).st_uid + 1)
    with pytest.raises(trust.Untrusted, match="not to this user"):
        trust.check_private(cache)


def test_a_symlinked_cache_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(trust.Untrusted, match="symbolic link"):
        trust.check_private(tmp_path / "cache")


def test_new_cache_folders_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        trust.make_private(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for folder in ("a", "a/b", "a/b/c"):
        assert stat.S_IMODE(os.stat(tmp_path / folder).st_mode) == 0o700
    trust.check_private(tmp_path / "a", tmp_path / "a" / "b" / "c")


def test_a_lock_file_made_into_a_link_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(OSError, match=re.escape(os.strerror(errno.ELOOP))) as raised:
        with jit._exclusive(tmp_path / "lock"):
            pass
    assert raised.value.errno == errno.ELOOP  # O_NOFOLLOW refused the link
    assert not target.exists()


def test_durable_writes_leave_no_temporary_and_take_the_mode(tmp_path):
    trust.write_durably(tmp_path / "x.so", b"data", mode=0o700)
    assert (tmp_path / "x.so").read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(tmp_path / "x.so").st_mode) == 0o700
    assert [p.name for p in tmp_path.iterdir()] == ["x.so"]


@pytest.mark.parametrize("value", ["nan", "-5", "inf", "soon"])
def test_a_lock_timeout_that_is_not_a_finite_count_of_seconds_is_refused(value, monkeypatch):
    monkeypatch.setenv("CAKE_JIT_LOCK_TIMEOUT", value)
    with pytest.raises(ValueError, match="CAKE_JIT_LOCK_TIMEOUT: expected a finite number"):
        jit.lock_timeout_s()


def test_the_build_record_round_trips_and_a_broken_one_is_refused(tmp_path):
    (tmp_path / "a.so").write_bytes(b"x")
    trust.write_record(tmp_path, [tmp_path / "a.so"])
    assert trust.read_record(tmp_path) == {"a.so": mf.sha256_hex(b"x")}
    (tmp_path / trust.RECORD_NAME).write_text('{"schema": 1, "libraries": ["a.so"]}')
    with pytest.raises(trust.Untrusted, match="not a build record"):
        trust.read_record(tmp_path)
    assert trust.read_record(tmp_path / "nowhere") is None
