"""Helpers for the build tests: a toy repository that the real CMakeLists.txt builds.

``make_build_repo(root)`` renders the shared toy family (``tests/toy_programs.py``) under
``root`` and copies in the build's own files (CMakeLists.txt, tools/build_plan.py and the
``cake`` package code it imports), so CMake configures ``root`` exactly as it configures the
repository, without touching the repository's families.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from toy_programs import REPO, TOY_FAMILY, make_toy_repo

from cake.core import jit
from cake.core import manifest as mf

BUILD_FILES = ("CMakeLists.txt", "tools/build_plan.py", "cake/__init__.py", "cake/checker.py")
# What a program library may need at run time (docs/build.md): libc, plus the C++ runtime only
# where a binding needs it. Never a CUDA library: the driver is opened at first use (dlopen) and
# there is no CUDA runtime. The toy programs need libc alone.
ALLOWED_NEEDED = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1"}
TOY_NEEDED = ["libc.so.6"]


def dynamic_section(library: Path) -> tuple[list[str], str]:
    """(NEEDED entries, the whole ``readelf -d`` text) of a shared library."""
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out), out


def undefined_symbols(library: Path) -> list[str]:
    """The undefined dynamic symbols of a shared library, without versions."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def cuda_symbols(names: list[str]) -> list[str]:
    """The CUDA runtime (cuda*, __cuda*) and driver (cu*) functions among symbol names."""
    return [n for n in names if "cuda" in n.lower() or n.startswith("cu")]


def make_build_repo(root: Path) -> mf.PackageTree:
    """The toy repository with the build files; returns the toy family's tree."""
    root = Path(root)
    tree = make_toy_repo(root)
    for relative in BUILD_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / relative, root / relative)
    (root / "cake" / "core").mkdir(parents=True, exist_ok=True)
    for module in (REPO / "cake" / "core").glob("*.py"):
        shutil.copyfile(module, root / "cake" / "core" / module.name)
    return tree


def nvcc() -> str | None:
    """The nvcc the build would find (the JIT's search: $CUDA_HOME/bin, else PATH)."""
    return jit.find_nvcc()


def env_without_nvcc() -> dict:
    """The environment with every folder holding an nvcc dropped from PATH, and no CUDA_HOME."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "CAKE_CUDA_ARCHS")}
    folders = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(f for f in folders if f and not (Path(f) / "nvcc").exists())
    return env


def cmake(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["cmake", *args], capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"cmake {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def configure(source: Path, build: Path, archs: str, env: dict | None = None,
              check: bool = True, extra: tuple = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env.pop("CAKE_CUDA_ARCHS", None)
    return cmake("-S", str(source), "-B", str(build), "-G", "Ninja",
                 f"-DCAKE_CUDA_ARCHS={archs}", *extra, env=env, check=check)


def build(build_dir: Path, env: dict | None = None,
          check: bool = True) -> subprocess.CompletedProcess:
    return cmake("--build", str(build_dir), env=env, check=check)


def install(build_dir: Path, prefix: Path) -> Path:
    """Installs into ``prefix`` and makes ``cake`` a package there; returns ``prefix/cake``."""
    cmake("--install", str(build_dir), "--prefix", str(prefix))
    package = Path(prefix) / "cake"
    (package / "__init__.py").touch()
    for family in package.iterdir():
        if family.is_dir():
            (family / "__init__.py").touch()
    return package


def toy_libraries(tree: mf.PackageTree, arch: str) -> dict[str, mf.Program]:
    """Library file name -> program, for the toy programs that list ``arch``."""
    manifest = mf.read(tree.manifest_path)
    return {f"{p.library}_{arch}.so": p for p in manifest.programs if arch in p.arches}


__all__ = ["ALLOWED_NEEDED", "REPO", "TOY_FAMILY", "TOY_NEEDED", "build", "cmake", "configure",
           "cuda_symbols", "dynamic_section", "env_without_nvcc", "install", "make_build_repo",
           "nvcc", "toy_libraries", "undefined_symbols"]
