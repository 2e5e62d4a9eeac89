"""Helpers for the vendoring tests: a FlashInfer-shaped host tree and an import blocker.

* :func:`host_tree` makes ``<tmp>/host/flashinfer/experimental/cake/`` with the ``__init__.py``
  files a host has, so the vendored packages are ``flashinfer.experimental.cake.<name>``.
* :func:`blocked_env` is the environment of every subprocess these tests start: a
  ``sitecustomize.py`` on ``PYTHONPATH`` installs a meta-path finder that raises ImportError
  for ``flashinfer`` and ``flashinfer.*`` (and, for a vendored run, ``cake`` and ``cake.*``),
  so the tool, the gate, the build and the vendored run all prove they never import them.
* :func:`make_source_repo` is a cake-train checkout in miniature: the compilable toy family
  of ``tests/toy_programs.py`` plus the real ``cake/core/``, the checker and the vendoring
  tools (the gate compares a copy with the cake-train it runs from, so the gate of a toy copy
  runs from here) and a toy family package that imports the runtime as real families do
  (``from ..core import ...``). :func:`install_upstream` lays such a checkout out as pip
  installs cake-train.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Sequence

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from toy_programs import REPO, TOY_FAMILY, make_toy_repo  # noqa: E402

from cake.core import manifest as mf  # noqa: E402

VENDOR = REPO / "tools" / "vendor.py"
CHECKER = REPO / "tools" / "check_manifests.py"
BUILD_VENDORED = REPO / "ci" / "build_vendored.sh"
PREFIX = "flashinfer.experimental.cake"
# A cake-train checkout, as far as vendoring, the gate and ci/build_vendored.sh use it.
CHECKOUT = ["cake", "tools", "ci", "csrc", "manifests", "CMakeLists.txt"]
GIT = ["git", "-c", "user.name=cake tests", "-c", "user.email=tests@cake.invalid",
       "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
HOST_BLOCKED = ("flashinfer",)
RUN_BLOCKED = ("flashinfer", "cake")

SITECUSTOMIZE = '''\
"""tests/vendor: makes the host library (and for vendored runs cake-train) unimportable."""
import os
import sys


class _Blocked:
    """A meta-path finder that refuses the names in CAKE_TEST_BLOCKED and their submodules."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is blocked: vendored code must not import it")
        return None


sys.meta_path.insert(0, _Blocked(n for n in os.environ["CAKE_TEST_BLOCKED"].split(",") if n))
'''

TOY_INIT = '''\
"""Toy family package for the vendoring tests: doubles a float32 CUDA buffer in place."""

from ._function import programs, scale_

__all__ = ["programs", "scale_"]
'''

TOY_FUNCTION = '''\
"""The toy family's entry: picks the program by block size and launches it."""

from __future__ import annotations

from pathlib import Path

from ..core import loader
from ..core.manifest import Program


def programs() -> loader.ProgramSet:
    return loader.ProgramSet.for_package(Path(__file__).parent)


def program(block: int) -> Program:
    return next(p for p in programs().manifest.programs if p.variant["block"] == block)


def scale_(pointer: int, count: int, *, block: int = 128, device_index: int = 0,
           stream: int = 0) -> None:
    """Doubles ``count`` float32 values at device address ``pointer``."""
    entry = programs().library(program(block), device_index).entry("scale")
    entry(stream, x=pointer, n=count, factor=2.0, offset=0.0, smem_bytes=0)
'''


def host_tree(root: Path) -> Path:
    """``root/flashinfer/experimental/cake`` with the host's ``__init__.py`` files; returns it."""
    into = Path(root).joinpath(*PREFIX.split("."))
    into.mkdir(parents=True)
    for depth in range(1, len(PREFIX.split(".")) + 1):
        Path(root).joinpath(*PREFIX.split(".")[:depth], "__init__.py").write_text(
            "raise ImportError('the host library must never be imported by cake code')\n"
            if depth == 1 else "")
    return into


def make_source_repo(root: Path, whole_checkout: bool = False) -> Path:
    """A miniature cake-train checkout with the toy family as a Python package; returns root.
    ``whole_checkout`` adds the rest of this one: the real families, the build and ci/."""
    root = Path(root)
    make_toy_repo(root)
    copied = CHECKOUT if whole_checkout else [
        "cake/core", *[f"cake/{p.name}" for p in (REPO / "cake").glob("*.py")],
        f"tools/{CHECKER.name}", f"tools/{VENDOR.name}"]  # the package, the checker, the tools
    for relative in copied:
        if (REPO / relative).is_dir():
            shutil.copytree(REPO / relative, root / relative, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            shutil.copy2(REPO / relative, root / relative)
    family = root / "cake" / TOY_FAMILY
    family.mkdir()
    (family / "__init__.py").write_text(TOY_INIT)
    (family / "_function.py").write_text(TOY_FUNCTION)
    return root


def install_upstream(source: Path, site: Path) -> Path:
    """``source``'s ``cake/`` as pip installs it (CMakeLists.txt: cake_add_package): each
    family's manifest as ``build.json``, its sources and headers under ``csrc/``; returns
    ``site/cake``."""
    package = Path(site) / "cake"
    shutil.copytree(Path(source) / "cake", package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in mf.repository_families(source):
        tree = mf.repository_tree(source, name)
        manifest = mf.read(tree.manifest_path)
        files = {mf.MANIFEST_NAME: tree.manifest_path}
        files.update((f"csrc/{s.path}", tree.source_path(s))
                     for program in manifest.programs for s in program.sources)
        files.update((f"csrc/include/{h.path}", tree.header_path(h.path))
                     for h in manifest.headers)
        for relative, path in files.items():
            (package / name / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, package / name / relative)
    return package


def real_families() -> list[str]:
    """The repository's families that have a package to vendor (``manifests/cake_*.json``)."""
    return [p.stem for p in sorted((REPO / "manifests").glob("cake_*.json"))
            if not p.name.endswith(".test.json")
            and (REPO / "cake" / p.stem / "__init__.py").is_file()]


def blocked_env(tmp_path: Path, blocked: Sequence[str] = HOST_BLOCKED,
                path: Sequence[Path] = ()) -> dict:
    """os.environ with the blocker's sitecustomize (and ``path``) on PYTHONPATH."""
    site = Path(tmp_path) / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, CAKE_TEST_BLOCKED=",".join(blocked), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(str(p) for p in [site, *path]))
    return env


def run(command: Sequence, tmp_path: Path, blocked: Sequence[str] = HOST_BLOCKED,
        path: Sequence[Path] = (), timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """Runs ``command`` with the blocker, from ``tmp_path`` (never the repository)."""
    environment = dict(blocked_env(tmp_path, blocked, path), **env)
    return subprocess.run([str(c) for c in command], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=timeout)


def vendor(tmp_path: Path, into: Path, *arguments: str, repository: Path = REPO):
    return run([sys.executable, VENDOR, "--into", into, "--package-prefix", PREFIX,
                "--repository", repository, *arguments], tmp_path)


def gate(tmp_path: Path, host: Path, *packages: str, upstream: Path = REPO):
    """``check_manifests --vendored-gate`` of the cake-train checkout ``upstream``."""
    arguments = [a for p in packages for a in ("--package", f"{PREFIX}.{p}")]
    checker = Path(upstream) / "tools" / CHECKER.name
    return run([sys.executable, checker, "--vendored-gate", "--root", host, *arguments], tmp_path)


def installed_gate(tmp_path: Path, host: Path, site: Path, *packages: str):
    """``check_manifests --vendored-gate`` of a cake-train installed in ``site`` (its console
    script)."""
    arguments = [a for p in packages for a in ("--package", f"{PREFIX}.{p}")]
    script = "import sys; from cake.checker import main; raise SystemExit(main(sys.argv[1:]))"
    return run([sys.executable, "-c", script, "--vendored-gate", "--root", host, *arguments],
               tmp_path, path=[site])


def run_vendored(tmp_path: Path, into: Path, script: str, **env) -> subprocess.CompletedProcess:
    """Runs ``script`` with ``into`` on sys.path and flashinfer and cake blocked."""
    return run([sys.executable, "-c", textwrap.dedent(script)], tmp_path, RUN_BLOCKED,
               [into], **env)


def git(cwd: Path, *arguments: str) -> str:
    """Runs git in ``cwd`` with a test identity; returns its output."""
    return subprocess.run([*GIT, *arguments], cwd=cwd, check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def commit_all(cwd: Path, message: str) -> str:
    """Commits every file of the git repository ``cwd`` (made if needed); returns the commit."""
    if not (Path(cwd) / ".git").exists():
        git(cwd, "init", "-q")
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "--allow-empty", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


def codes(stdout: str) -> list[str]:
    return sorted({word for line in stdout.splitlines() for word in line.split()
                   if len(word) == 5 and word.startswith("CM") and word[2:].isdigit()})


def sidecar(package_dir: Path) -> dict:
    return json.loads((package_dir / "VENDORED.json").read_text())


def manifest_of(package_dir: Path) -> mf.Manifest:
    return mf.read(package_dir / mf.MANIFEST_NAME)
