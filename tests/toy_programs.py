"""A compilable toy family for the build and loader tests (real nvcc, real program ABI).

``make_toy_repo(root)`` lays out a miniature repository (``csrc/include``, ``csrc/templates``,
``tools/families``, ``manifests``) under ``root`` with one family, ``cake_toy_det_train``, of
two programs that scale a float buffer, and renders it with the real renderer. Tests build or
JIT-compile those programs; they never touch the repository's own families.
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

TOY_FAMILY = "cake_toy_det_train"

KERNEL = """\
#include "cake/program.h"
// cake:params
#define TOY_BLOCK 128
// cake:end-params

__global__ void __launch_bounds__(TOY_BLOCK) kernel_cake_library_scale(float* x, int64_t n) {
  int64_t i = blockIdx.x * int64_t(TOY_BLOCK) + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}

int cake_library_launch_scale(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return 0;
  kernel_cake_library_scale<<<(n + TOY_BLOCK - 1) / TOY_BLOCK, TOY_BLOCK, 0, stream>>>(x, n);
  return 0;
}
"""

BINDING = """\
#include "cake/program.h"
// cake:params
// cake:end-params

int cake_library_launch_scale(float* x, int64_t n, cudaStream_t stream);

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

// args: x pointer, element count.
CAKE_EXPORT int cake_library_scale(const int64_t* values, int32_t count, void* stream,
                                   char* error, int32_t error_len) {
  if (count != 2) return cake::fail(error, error_len, cake::kInvalidArgument,
                                    "scale: expected 2 arguments, got %d", count);
  cake::Args args{values, count};
  if (args.i64(1) < 0) return cake::fail(error, error_len, cake::kInvalidArgument,
                                         "scale: n must be >= 0, got %lld",
                                         static_cast<long long>(args.i64(1)));
  cake_library_launch_scale(args.ptr<float>(0), args.i64(1), static_cast<cudaStream_t>(stream));
  return cake::launch_status(error, error_len, "scale");
}
"""

TABLE = """\
from tools.render import Family, Spec

FAMILY = Family(
    name="cake_toy_det_train",
    templates={"kernel": "csrc/templates/toy/kernel.cu", "binding": "csrc/templates/toy/binding.cu"},
    specs=tuple(Spec(variant={"block": block}, route={"min_tokens": 0},
                     params={"TOY_BLOCK": block}, arches=("sm_90a", "sm_100a"))
                for block in (128, 256)),
)
"""


def make_toy_repo(root: Path) -> mf.PackageTree:
    """Writes and renders the toy repository under ``root``; returns the family's tree."""
    root = Path(root)
    shutil.copytree(REPO / "csrc" / "include" / "cake", root / "csrc" / "include" / "cake")
    files = {"csrc/templates/toy/kernel.cu": KERNEL, "csrc/templates/toy/binding.cu": BINDING,
             f"tools/families/{TOY_FAMILY}.py": TABLE}
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
