"""A repository holding only the row-scale Triton family used by tests (tests/triton_family).

``make_triton_repo(root)`` lays out ``root`` as a checkout: the family's table, templates,
shared Triton module and package from ``tests/triton_family``, the repository's ``cake`` runtime
(``cake/*.py``, ``core``, ``_shared``) and the headers the programs include, the build files
(CMakeLists.txt, pyproject.toml, tools/build_plan.py), then renders it with the real renderer.
Processes that import its ``cake`` (``PYTHONPATH=root``) run the family's public API.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake.core import manifest as mf  # noqa: E402
from tools import render  # noqa: E402

FAMILY = "cake_rowscale_det_train"
SOURCE = REPO / "tests" / "triton_family"
HEADERS = ("program.h", "driver.h", "image.h", "triton_launch.h")
BUILD_FILES = ("CMakeLists.txt", "pyproject.toml", "README.md", "tools/build_plan.py")


def make_triton_repo(root: Path) -> mf.PackageTree:
    """Writes and renders the repository under ``root``; returns the family's tree."""
    root = Path(root)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(SOURCE, root, dirs_exist_ok=True, ignore=ignore)
    for header in HEADERS:
        target = root / "csrc" / "include" / "cake" / header
        shutil.copyfile(REPO / "csrc" / "include" / "cake" / header, target)
    for module in (REPO / "cake").glob("*.py"):
        shutil.copyfile(module, root / "cake" / module.name)
    for package in ("core", "_shared"):
        shutil.copytree(REPO / "cake" / package, root / "cake" / package, ignore=ignore)
    for relative in BUILD_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / relative, root / relative)
    for path, data in render.planned_outputs(root, render.load_families(root)).items():
        mf.write_if_changed(path, data)
    return mf.repository_tree(root, FAMILY)
