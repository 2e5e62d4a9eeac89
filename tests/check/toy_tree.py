"""Helpers for the manifest tests: a small, self-contained toy repository rendered in tmp_path.

The toy tree has two families so that a template or a header can be shared by some programs
and not others. Both follow the program contract (schema 2): kernel sources of ``extern "C"
__global__`` kernels, a binding whose ``// cake:entries`` block the renderer fills from the
table's ``entries`` and whose entries launch through ``cake/driver.h``.

* ``cake_toy_det_train``: templates ``toy/kernel.cu`` (role ``kernel``), ``toy/kernel_backward.cu``
  (role ``kernel_backward``, its kernel defined through the ``CAKE_TOY_BACKWARD_KERNEL`` macro of
  ``toy/common.h``) and ``toy/binding.cu``; three specs, one of them with extra flags. Every
  program includes ``toy/common.h`` and the real ``cake/driver.h``, ``cake/program.h`` and
  ``cake/image.h``.
* ``cake_toy_nondet_train``: templates ``toy_extra/kernel.cu``, ``toy/kernel_backward.cu`` and
  ``toy/binding.cu`` (the backward kernel and binding templates are shared); two specs, one of
  them kcp. Its kernel also includes ``toy/extra.h``.

Both tables declare the entries ``forward`` (x pointer, n i32, scale f32) and ``backward`` (dy, dx
pointers, n i64). The templates are written into the tmp tree (never the repository's real
ones) and rendered by ``tools.render``, so the tests see exactly what the renderer produces.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cake.core import manifest as mf  # noqa: E402
from tools import render  # noqa: E402

CHECKER = REPO / "tools" / "check_manifests.py"
RENDERER = REPO / "tools" / "render.py"

FAMILY_A = "cake_toy_det_train"
FAMILY_B = "cake_toy_nondet_train"

# The program headers of the real tree (cake/program.h: the ABI; cake/driver.h: launches; cake/
# image.h: the embedded images), copied into every toy tree so the toy bindings are programs of
# the current contract.
REAL_HEADERS = ("cake/program.h", "cake/driver.h", "cake/image.h")

COMMON_H = """\
// Toy shared header: every toy program includes it.
#pragma once
#define TOY_SCALE 2.0f
#define TOY_THREADS 128

// The toy family's backward kernel, defined under the program's name by its kernel source.
#define CAKE_TOY_BACKWARD_KERNEL(name)                                              \\
  extern "C" __global__ void name(const float* dy, float* dx, long long n) {      \\
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;                 \\
    if (i < n) dx[i] = dy[i] * TOY_SCALE;                                           \\
  }
"""

EXTRA_H = """\
// Toy shared header that only the nondet family includes.
#pragma once
#define TOY_OFFSET 1.0f
"""

KERNEL_TOY = """\
// Toy kernel template: the forward kernel.
#include "toy/common.h"
// cake:params
#define TOY_BLOCK 128
// cake:end-params

extern "C" __global__ void __launch_bounds__(TOY_BLOCK) kernel_cake_library_forward(
    float* x, int n, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= TOY_SCALE * scale;
}
"""

KERNEL_TOY_EXTRA = """\
// Toy kernel template with a second header.
#include "toy/common.h"
#include "toy/extra.h"
// cake:params
#define TOY_WIDTH 4
// cake:end-params

extern "C" __global__ void kernel_cake_library_forward(float* x, int n, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * TOY_SCALE * scale + TOY_OFFSET * TOY_WIDTH;
}
"""

# Shared by both families: a second kernel source whose kernel comes from a family macro.
KERNEL_TOY_BACKWARD = """\
// Toy backward kernel template: its kernel is defined through toy/common.h's macro.
#include "toy/common.h"
// cake:params
// cake:end-params

CAKE_TOY_BACKWARD_KERNEL(kernel_cake_library_backward)
"""

BINDING_TOY = """\
// Toy binding template (shared by both toy families): the program's C entries.
// cake:params
// cake:end-params
// cake:entries
// cake:end-entries
#include "cake/driver.h"
#include "cake/image.h"
#include "toy/common.h"

CAKE_ARGUMENTS(ForwardArgs, CAKE_ENTRY_forward)
CAKE_ARGUMENTS(BackwardArgs, CAKE_ENTRY_backward)

static cake::Kernel forward_kernel;
static cake::Kernel backward_kernel;

static int forward(const ForwardArgs& a, void* stream, char* error, int32_t error_len) {
  if (a.n < 0)
    return cake::fail(error, error_len, cake::kInvalidArgument, "forward: n = %d < 0", a.n);
  void* x = a.x;
  int n = a.n;
  float scale = a.scale;
  void* params[] = {&x, &n, &scale};
  const cake::Dim3 grid{static_cast<unsigned>((n + TOY_THREADS - 1) / TOY_THREADS)};
  const cake::Dim3 block{TOY_THREADS};
  return cake::launch(forward_kernel, "kernel_cake_library_forward", grid, block, 0, stream,
                      params, error, error_len);
}

static int backward(const BackwardArgs& a, void* stream, char* error, int32_t error_len) {
  void* dy = a.dy;
  void* dx = a.dx;
  long long n = a.n;
  void* params[] = {&dy, &dx, &n};
  const cake::Dim3 grid{static_cast<unsigned>((n + TOY_THREADS - 1) / TOY_THREADS)};
  const cake::Dim3 block{TOY_THREADS};
  return cake::launch(backward_kernel, "kernel_cake_library_backward", grid, block, 0, stream,
                      params, error, error_len);
}

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(CAKE_ENTRY_PARAMS) {
  return cake::call_entry<ForwardArgs>(forward, "forward", CAKE_ENTRY_ARGS);
}

CAKE_EXPORT int cake_library_backward(CAKE_ENTRY_PARAMS) {
  return cake::call_entry<BackwardArgs>(backward, "backward", CAKE_ENTRY_ARGS);
}
"""

# The entries both toy families declare (the binding template is shared, so they must agree).
ENTRIES = {
    "forward": (("x", "pointer"), ("n", "i32"), ("scale", "f32")),
    "backward": (("dy", "pointer"), ("dx", "pointer"), ("n", "i64")),
}

FAMILY_TABLE = """\
from tools.render import Family, Spec

FAMILY = Family(
    name={name!r},
    templates={templates!r},
    entries={entries!r},
    specs=(
{specs}
    ),
)
"""


@dataclasses.dataclass(frozen=True)
class SpecText:
    """The source text of one ``Spec(...)`` line in a toy family table."""

    variant: dict
    params: dict
    flags: tuple = ()
    kcp: bool = False
    arches: tuple = ("sm_90a", "sm_100a")

    def text(self) -> str:
        return (f"        Spec(variant={self.variant!r}, route={{'min_tokens': 0}}, "
                f"params={self.params!r}, arches={self.arches!r}, flags={self.flags!r}, "
                f"kcp={self.kcp!r}),")


def default_specs() -> dict[str, list[SpecText]]:
    return {
        FAMILY_A: [
            SpecText({"block": 128}, {"TOY_BLOCK": 128}),
            SpecText({"block": 256}, {"TOY_BLOCK": 256}),
            SpecText({"block": 128, "fast": True}, {"TOY_BLOCK": 128}, flags=("--use_fast_math",)),
        ],
        FAMILY_B: [
            SpecText({"width": 4}, {"TOY_WIDTH": 4}),
            SpecText({"width": 8}, {"TOY_WIDTH": 8}, kcp=True),
        ],
    }


# Source role -> template; the binding last (manifest order is this order).
TEMPLATES = {
    FAMILY_A: {"kernel": "csrc/templates/toy/kernel.cu",
               "kernel_backward": "csrc/templates/toy/kernel_backward.cu",
               "binding": "csrc/templates/toy/binding.cu"},
    FAMILY_B: {"kernel": "csrc/templates/toy_extra/kernel.cu",
               "kernel_backward": "csrc/templates/toy/kernel_backward.cu",
               "binding": "csrc/templates/toy/binding.cu"},
}


class ToyRepo:
    """A toy repository checkout (``manifests/``, ``csrc/<name>/``, ``csrc/include/``)."""

    def __init__(self, root: Path):
        self.root = root
        files = {
            "csrc/include/toy/common.h": COMMON_H,
            "csrc/include/toy/extra.h": EXTRA_H,
            "csrc/templates/toy/kernel.cu": KERNEL_TOY,
            "csrc/templates/toy/binding.cu": BINDING_TOY,
            "csrc/templates/toy/kernel_backward.cu": KERNEL_TOY_BACKWARD,
            "csrc/templates/toy_extra/kernel.cu": KERNEL_TOY_EXTRA,
        }
        for relative, text in files.items():
            self.write(relative, text)
        for header in REAL_HEADERS:
            self.write(f"csrc/include/{header}", (REPO / "csrc" / "include" / header).read_bytes())
        (root / "manifests").mkdir(parents=True, exist_ok=True)
        self.entries = {name: dict(ENTRIES) for name in TEMPLATES}
        self.specs = default_specs()
        self.set_specs(self.specs)

    # ----------------------------------------------------------------- files

    def path(self, relative: str) -> Path:
        return self.root / relative

    def write(self, relative: str, text: str | bytes) -> Path:
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the root (relative path -> bytes)."""
        return {str(p.relative_to(self.root)): p.read_bytes()
                for p in sorted(self.root.rglob("*")) if p.is_file()
                and "__pycache__" not in p.parts}

    # ----------------------------------------------------------------- families

    def set_specs(self, specs: dict[str, list[SpecText]]) -> None:
        self.specs = dict(self.specs, **specs)
        for name, spec_list in specs.items():
            self.write(f"tools/families/{name}.py", FAMILY_TABLE.format(
                name=name, templates=TEMPLATES[name], entries=self.entries[name],
                specs="\n".join(s.text() for s in spec_list)))

    def set_entries(self, name: str, entries: dict) -> None:
        """Rewrites one family table with other declared entries (same specs)."""
        self.entries[name] = dict(entries)
        self.set_specs({name: self.specs[name]})

    def families(self) -> dict[str, render.Family]:
        return render.load_families(self.root)

    def render(self) -> None:
        """Writes every planned output (what ``tools/render.py`` does, in process)."""
        outputs = render.planned_outputs(self.root, self.families())
        for path, data in outputs.items():
            mf.write_if_changed(path, data)
        for path in render.stale_files(self.root, self.families(), outputs):
            path.unlink()

    def render_family(self, name: str, **kwargs) -> tuple[mf.Manifest, dict[str, bytes]]:
        return render.render_family(self.families()[name], self.root, **kwargs)

    # ----------------------------------------------------------------- layouts

    def tree(self, name: str = FAMILY_A) -> "Layout":
        return Layout(self.root, mf.repository_tree(self.root, name), check_path=self.root)

    def install(self, site: Path, name: str = FAMILY_A, package: str | None = None) -> "Layout":
        """Copies one family into an installed/vendored package layout under ``site``.

        ``package`` (dotted) defaults to ``cake.<name>``; the folders above the package get
        ``__init__.py`` files so the owner is found the way an installed package's is.
        """
        package = package or f"{mf.REPO_PACKAGE}.{name}"
        package_dir = site.joinpath(*package.split("."))
        package_dir.mkdir(parents=True)
        for depth in range(1, len(package.split(".")) + 1):
            site.joinpath(*package.split(".")[:depth], "__init__.py").touch()
        source = self.tree(name).tree
        manifest = mf.with_package(mf.read(source.manifest_path), package)
        mf.write(manifest, package_dir / mf.MANIFEST_NAME)
        shutil.copytree(source.csrc_dir, package_dir / "csrc")
        for header in manifest.headers:
            target = package_dir / "csrc" / "include" / header.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.header_path(header.path), target)
        tree = mf.package_tree(package_dir)
        return Layout(site, tree, check_path=package_dir)


class Layout:
    """One family's files in one layout, with helpers to mutate them."""

    def __init__(self, root: Path, tree: mf.PackageTree, check_path: Path):
        self.root = root
        self.tree = tree
        self.check_path = check_path
        """What to pass to the checker on the command line."""

    @property
    def manifest_path(self) -> Path:
        return self.tree.manifest_path

    def document(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def save(self, document: dict) -> None:
        self.manifest_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")

    def manifest(self) -> mf.Manifest:
        return mf.read(self.manifest_path)

    def source(self, program: int = 0, role: str = "kernel") -> Path:
        prog = self.manifest().programs[program]
        return self.tree.source_path(next(s for s in prog.sources if s.role == role))

    def header_index(self, path: str) -> int:
        """The index of a header in the manifest's ``headers`` list."""
        return next(i for i, h in enumerate(self.manifest().headers) if h.path == path)

    def source_index(self, program: int = 0, role: str = "kernel") -> int:
        prog = self.manifest().programs[program]
        return next(i for i, s in enumerate(prog.sources) if s.role == role)

    def edit_source(self, program: int, role: str, edit, update_sha: bool) -> Path:
        """Applies ``edit(bytes) -> bytes`` to a source; optionally records the new sha256."""
        path = self.source(program, role)
        path.write_bytes(edit(path.read_bytes()))
        if update_sha:
            document = self.document()
            index = self.source_index(program, role)
            document["programs"][program]["sources"][index]["sha256"] = \
                mf.sha256_hex(path.read_bytes())
            self.save(document)
        return path


def run_checker(*args: str | os.PathLike, cwd: Path | None = None,
                python: str = sys.executable, prefix: tuple = ()) -> subprocess.CompletedProcess:
    """``python tools/check_manifests.py ARGS`` as a subprocess."""
    return subprocess.run([*prefix, python, str(CHECKER), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
