"""A compilable toy family for the build and loader tests (real nvcc, real program ABI).

``make_toy_repo(root)`` lays out a miniature repository (``csrc/include``, ``csrc/templates``,
``tools/families``, ``manifests``) under ``root`` with one family, ``cake_toy_det_train``, of
two programs (``TOY_BLOCK`` 128 and 256) that scale a float buffer, and renders it with the real
renderer. The programs follow the program contract: an ``extern "C" __global__`` kernel, a
binding whose declared entries (``ENTRIES``) unpack through ``CAKE_ARGUMENTS`` and launch through
``cake/driver.h``, no CUDA runtime. Tests build or JIT-compile those programs (each compile is an
``nvcc -fatbin`` of the kernel and a host compile of the binding, about a second each); they
never touch the repository's own families.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake.core import manifest as mf  # noqa: E402
from tools import render  # noqa: E402

TOY_FAMILY = "cake_toy_det_train"

# The toy family's kernel parameters, shared by its kernel and binding sources: the kernel takes
# them as one struct, so the fake driver's record of a launch (tests/fake_cuda.c: the first
# parameter's bytes) shows every value the entry received.
SCALE_H = """\
// The toy family's kernel parameters (tests/toy_programs.py): x[i] = x[i] * factor + offset.
#pragma once
#include <stdint.h>

struct ToyScaleParams {
  float* x;
  int64_t n;
  float factor;
  int32_t block;
  double offset;
};
"""

KERNEL = """\
// Toy kernel template: scales a float32 buffer in place.
// cake:params
#define TOY_BLOCK 128
// cake:end-params
#include "toy/scale.h"

extern "C" __global__ void __launch_bounds__(TOY_BLOCK) kernel_cake_library_scale(
    ToyScaleParams p) {
  const int64_t i = blockIdx.x * int64_t(TOY_BLOCK) + threadIdx.x;
  if (i < p.n) p.x[i] = p.x[i] * p.factor + static_cast<float>(p.offset);
}
"""

BINDING = """\
// Toy binding template: the entries scale (launches the kernel) and blocks (a host-side query).
// cake:params
#define TOY_BLOCK 128
// cake:end-params
// cake:entries
// cake:end-entries
#include "cake/driver.h"
#include "cake/image.h"
#include "toy/scale.h"

CAKE_ARGUMENTS(ScaleArgs, CAKE_ENTRY_scale)
CAKE_ARGUMENTS(BlocksArgs, CAKE_ENTRY_blocks)

static cake::Kernel scale_kernel;

static int scale(const ScaleArgs& a, void* stream, char* error, int32_t error_len) {
  if (a.n < 0)
    return cake::fail(error, error_len, cake::kInvalidArgument, "scale: n must be >= 0, got %lld",
                      static_cast<long long>(a.n));
  if (a.n / TOY_BLOCK >= 0x7fffffff)
    return cake::fail(error, error_len, cake::kInvalidArgument, "scale: n = %lld is too large",
                      static_cast<long long>(a.n));
  if (a.smem_bytes < 0)
    return cake::fail(error, error_len, cake::kInvalidArgument,
                      "scale: smem_bytes must be >= 0, got %d", a.smem_bytes);
  if (a.n == 0) return cake::kOk;
  ToyScaleParams params{static_cast<float*>(a.x), a.n, a.factor, TOY_BLOCK, a.offset};
  void* arguments[] = {&params};
  const cake::Dim3 grid{static_cast<unsigned>((a.n + TOY_BLOCK - 1) / TOY_BLOCK)};
  const cake::Dim3 block{TOY_BLOCK};
  return cake::launch(scale_kernel, "kernel_cake_library_scale", grid, block, a.smem_bytes,
                      stream, arguments, error, error_len);
}

static int blocks(const BlocksArgs& a, void*, char* error, int32_t error_len) {
  if (a.out == nullptr)
    return cake::fail(error, error_len, cake::kInvalidArgument, "blocks: out is null");
  *static_cast<int64_t*>(a.out) = a.n <= 0 ? 0 : (a.n + TOY_BLOCK - 1) / TOY_BLOCK;
  return cake::kOk;
}

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_scale(CAKE_ENTRY_PARAMS) {
  return cake::call_entry<ScaleArgs>(scale, "scale", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_blocks(CAKE_ENTRY_PARAMS) {
  return cake::call_entry<BlocksArgs>(blocks, "blocks", CAKE_ENTRY_ARGS);
}
"""

# scale: x[i] = x[i] * factor + offset for i < n, with smem_bytes of dynamic shared memory (which
# the toy kernel does not use: it lets the tests see the driver's shared-memory limit raised).
# blocks: *out = the blocks scale launches for n (a host int64; no driver call).
ENTRIES = {
    "scale": (("x", "pointer"), ("n", "i64"), ("factor", "f32"), ("offset", "f64"),
              ("smem_bytes", "i32")),
    "blocks": (("n", "i64"), ("out", "pointer")),
}

TABLE = f"""\
from tools.render import Family, Spec

FAMILY = Family(
    name="cake_toy_det_train",
    templates={{"kernel": "csrc/templates/toy/kernel.cu", "binding": "csrc/templates/toy/binding.cu"}},
    entries={ENTRIES!r},
    specs=tuple(Spec(variant={{"block": block}}, route={{"min_tokens": 0}},
                     params={{"TOY_BLOCK": block}}, arches=("sm_90a", "sm_100a"))
                for block in (128, 256)),
)
"""


def make_toy_repo(root: Path) -> mf.PackageTree:
    """Writes and renders the toy repository under ``root``; returns the family's tree."""
    root = Path(root)
    shutil.copytree(REPO / "csrc" / "include" / "cake", root / "csrc" / "include" / "cake")
    files = {"csrc/templates/toy/kernel.cu": KERNEL, "csrc/templates/toy/binding.cu": BINDING,
             "csrc/include/toy/scale.h": SCALE_H, f"tools/families/{TOY_FAMILY}.py": TABLE}
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    families = render.load_families(root)
    for path, data in render.planned_outputs(root, families).items():
        mf.write_if_changed(path, data)
    return mf.repository_tree(root, TOY_FAMILY)


def make_toy_package(root: Path) -> Path:
    """The toy family as an installed package ``<root>/cake/cake_toy_det_train`` (no libraries)."""
    tree = make_toy_repo(root / "repo")
    package_dir = root / "site" / "cake" / TOY_FAMILY
    package_dir.mkdir(parents=True)
    (package_dir.parent / "__init__.py").touch()
    (package_dir / "__init__.py").touch()
    shutil.copyfile(tree.manifest_path, package_dir / mf.MANIFEST_NAME)
    shutil.copytree(tree.csrc_dir, package_dir / "csrc")
    for header in mf.read(tree.manifest_path).headers:  # only the headers it lists
        target = package_dir / "csrc" / "include" / header.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree.header_path(header.path), target)
    return package_dir


def compiled_library(tree: mf.PackageTree, program: mf.Program, arch: str, cache: Path) -> Path:
    """The library of a toy ``program`` for ``arch`` in the JIT cache folder ``cache``, compiled
    there by the JIT (:func:`cake.core.jit.compile_program`) unless it already is."""
    from cake.core import jit

    saved = os.environ.get("CAKE_CACHE_DIR")
    os.environ["CAKE_CACHE_DIR"] = str(cache)
    try:
        return jit.compile_program(tree, mf.read(tree.manifest_path), program, arch)[0]
    finally:
        if saved is None:
            del os.environ["CAKE_CACHE_DIR"]
        else:
            os.environ["CAKE_CACHE_DIR"] = saved
