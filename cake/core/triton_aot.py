"""Triton programs: their kernel sources, and their ahead-of-time compile to a cubin.

A Triton program's kernel source (``<library>_kernel_<name>.py``, rendered from a family
template) is a small module: its knobs (``NUM_WARPS``, ``NUM_STAGES`` and the constexprs), its
kernel's ``SIGNATURE`` (argument -> Triton type, e.g. ``*bf16``, ``i32``, ``fp32``) and ``HINTS``
(argument -> the divisibility the compile may assume: 16-byte aligned pointers, ints that are
multiples of 16), and one ``@triton.jit`` function ``kernel_<library>_<name>``, which calls the
family's shared Triton code. Shared Triton modules live in the include folder, like headers, and
a source loads one with ``cake_include("cake/triton/<module>.py")``: :func:`load_source` runs
sources with that function in their globals, so no import path is touched. This module is the one
place that runs Triton source files (the tests' interpreter runs and the compile both use it).

Compiling (``python triton_aot.py --source ... --arch sm_90a ...``, a step of
:func:`toolchain.library_steps`) needs no GPU: ``triton.compile`` for the arch's capability,
with line info off and fp fusion set explicitly (so cubins are byte-identical across machines
and checkouts), ptxas from the CUDA toolkit when given (cubins a CUDA 13.0 driver loads), and a
private Triton cache. It writes the cubin and a header of the kernel's launch metadata (name,
shared memory, warps, signature, hints) that the program's launcher (cake/triton_launch.h)
includes, and prints the kernel's resources. A kernel that spills, needs more shared memory than
the arch has, or needs what the launcher cannot give (global scratch, tensor descriptors,
clusters, cooperative or PDL launches) fails the compile with the program named.

Standard library only at import (triton is imported when a compile or a source load runs), and
runnable as a script: no ``cake`` imports, as vendoring copies this folder verbatim.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Sequence

# The Triton that compiles every Triton program (pyproject.toml's build requirement pins the same;
# a test keeps them together), and the compile options besides the sources: both are in each
# Triton program's digest (its flags). Line info off: cubins do not depend on source paths; fp
# fusion set explicitly (Triton 3.9 warns that its default changes in 3.10).
TRITON_VERSION = "3.9.0"
COMPILE_OPTIONS = ("fp-fusion=1", "line-info=0")
# The kernel's extra parameters after its declared ones (Triton >= 3.5: global and profile
# scratch), which the launcher passes as null.
TRAILING_SCRATCH_PARAMS = 2
# Shared memory an SM gives one CTA, by compute capability (bytes).
MAX_SHARED = {90: 232448, 100: 232448, 103: 232448}
# Triton types -> the entry argument kinds (cake/program.h).
_SCALAR_KINDS = {"i32": "i32", "i64": "i64", "fp32": "f32", "fp64": "f64"}
_INCLUDE_RE = re.compile(r'cake_include\(\s*"([^"]+)"\s*\)')


def includes(text: str) -> list[str]:
    """The shared modules a Triton source loads, in order (for the renderer and the checker)."""
    return _INCLUDE_RE.findall(text)


def argument_kind(triton_type: str) -> str:
    """``*bf16`` -> ``pointer``, ``i32`` -> ``i32``, ``fp32`` -> ``f32``."""
    if triton_type.startswith("*"):
        return "pointer"
    if triton_type not in _SCALAR_KINDS:
        raise ValueError(f"unsupported Triton argument type {triton_type!r} (pointers, i32, "
                         "i64, fp32, fp64)")
    return _SCALAR_KINDS[triton_type]


# --------------------------------------------------------------------------- versions


def required_version(flags: Sequence[str]) -> str | None:
    """The Triton version a program's flags pin (``triton==3.9.0``)."""
    for flag in flags:
        if flag.startswith("triton=="):
            return flag[len("triton=="):]
    return None


def installed_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def unavailable_reason(flags: Sequence[str]) -> str | None:
    """Why a program pinned to a Triton version cannot be compiled here, or None."""
    wanted = required_version(flags)
    have = installed_version()
    if have is None:
        return (f"Triton is not installed, and this program is compiled with Triton {wanted}; "
                f"remedy: pip install triton=={wanted}, or install a cake-train wheel built "
                "for this GPU")
    if have != wanted:
        return (f"the installed Triton is {have}, and this program is compiled with Triton "
                f"{wanted} (its cubins depend on the version); remedy: pip install "
                f"triton=={wanted} in this environment, or install a cake-train wheel built for "
                "this GPU")
    return None


# --------------------------------------------------------------------------- sources


def load_source(path: str | Path, include_dir: str | Path) -> types.ModuleType:
    """Runs a Triton program's kernel source (and the shared modules it includes) as a module.

    ``cake_include(name)`` in any of them loads ``include_dir/name`` once per call of this
    function and returns it as a module. Under ``TRITON_INTERPRET=1`` the ``@triton.jit``
    functions become interpreted ones (Triton decides when a function is defined).
    """
    include_dir = Path(include_dir)
    loaded: dict[str, types.ModuleType] = {}

    def cake_include(name: str) -> types.ModuleType:
        if name not in loaded:
            file = include_dir / name
            if ".." in Path(name).parts or not file.is_file():
                raise ImportError(f"cake_include({name!r}): no such module under {include_dir}")
            loaded[name] = _run(file, f"cake_triton_include.{name}", cake_include)
        return loaded[name]

    return _run(Path(path), f"cake_triton_source.{Path(path).stem}", cake_include)


def _run(file: Path, name: str, cake_include) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(file)
    module.cake_include = cake_include
    # Triton reads a @triton.jit function's source through linecache/inspect: register it.
    code = compile(file.read_text(), str(file), "exec")
    exec(code, module.__dict__)  # the one place Triton sources run (see the module docstring)
    return module


def kernel_of(module: types.ModuleType, name: str):
    """The module's ``@triton.jit`` function ``name``."""
    kernel = getattr(module, name, None)
    if kernel is None or not hasattr(kernel, "arg_names"):
        raise ValueError(f"{module.__file__}: no @triton.jit function {name}")
    return kernel


def declared_arguments(module: types.ModuleType, kernel) -> list[tuple[str, str]]:
    """``(name, kind)`` of the kernel's runtime arguments, from its ``SIGNATURE``."""
    signature = getattr(module, "SIGNATURE", None)
    names = list(kernel.arg_names)
    if not isinstance(signature, dict) or list(signature) != names:
        raise ValueError(f"{module.__file__}: SIGNATURE must list the kernel's arguments "
                         f"{names} in order, got {signature!r}")
    return [(name, argument_kind(signature[name])) for name in names]


# --------------------------------------------------------------------------- compile


def compile_kernel(source: Path, include_dir: Path, arch: str, role: str, flags: Sequence[str],
                   ptxas: str | None) -> tuple[bytes, dict]:
    """Compiles the kernel of ``source`` for ``arch``; returns (cubin, launch metadata)."""
    reason = unavailable_reason(flags)
    if reason is not None:
        raise RuntimeError(reason)
    settings = dict(f.split("=", 1) for f in flags if "=" in f and not f.startswith("triton=="))
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ["TRITON_DEFAULT_FP_FUSION"] = settings.get("fp-fusion", "1")
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ.pop("TRITON_INTERPRET", None)
    if ptxas:
        os.environ["TRITON_PTXAS_PATH"] = ptxas
        os.environ["TRITON_PTXAS_BLACKWELL_PATH"] = ptxas
    with tempfile.TemporaryDirectory(prefix="cake-triton-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        import triton
        from triton.backends.compiler import GPUTarget

        module = load_source(source, include_dir)
        name = _kernel_name(source, role)
        kernel = kernel_of(module, name)
        arguments = declared_arguments(module, kernel)
        hints = dict(getattr(module, "HINTS", {}))
        unknown = sorted(set(hints) - {n for n, _ in arguments})
        if unknown or any(v not in (8, 16) for v in hints.values()):
            raise ValueError(f"{source}: HINTS must map kernel arguments to 8 or 16, got {hints}")
        attrs = {(i,): [["tt.divisibility", hints[n]]] for i, (n, _) in enumerate(arguments)
                 if n in hints}
        ast_source = triton.compiler.ASTSource(fn=kernel, signature=dict(module.SIGNATURE),
                                               constexprs={}, attrs=attrs)
        cap = int(arch[3:-1])
        options = {"num_warps": int(module.NUM_WARPS), "num_stages": int(module.NUM_STAGES),
                   "num_ctas": 1}
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ast_source, target=GPUTarget("cuda", cap, 32),
                                      options=options)
    meta = compiled.metadata
    resources = _ptxas_resources(log.getvalue())
    problems = []
    if meta.global_scratch_size or meta.profile_scratch_size:
        problems.append("it needs a global scratch buffer, which the launcher does not give")
    if meta.tensordesc_meta:
        problems.append("it uses host-built tensor descriptors, which the launcher does not make")
    if meta.num_ctas != 1 or getattr(meta, "launch_cooperative_grid", False) or \
            getattr(meta, "launch_pdl", False):
        problems.append("it needs a cluster, cooperative or PDL launch")
    if meta.shared > MAX_SHARED.get(cap, 0):
        problems.append(f"it needs {meta.shared} bytes of shared memory, more than {arch}'s "
                        f"{MAX_SHARED.get(cap, 0)}")
    if resources.get("spill_stores", 0) or resources.get("spill_loads", 0):
        problems.append(f"it spills ({resources['spill_stores']} bytes stored, "
                        f"{resources['spill_loads']} loaded)")
    if problems:
        raise RuntimeError(f"{name} for {arch}: " + "; ".join(problems))
    metadata = {"name": meta.name, "shared": int(meta.shared), "num_warps": int(meta.num_warps),
                "arguments": arguments, "hints": hints, "registers": resources.get("registers"),
                "spill_stores": resources.get("spill_stores", 0), "ptxas": ptxas or "triton's"}
    return compiled.asm["cubin"], metadata


def _kernel_name(source: Path, role: str) -> str:
    """``<library>_kernel_<name>.py`` with role ``kernel_<name>`` -> ``kernel_<library>_<name>``."""
    stem = source.stem
    if not stem.endswith("_" + role):
        raise ValueError(f"{source}: a Triton kernel source is named <library>_{role}.py")
    library = stem[: -len(role) - 1]
    suffix = role[len("kernel"):]
    return f"kernel_{library}{suffix}"


def _ptxas_resources(log: str) -> dict:
    found = {}
    registers = re.findall(r"Used (\d+) registers", log)
    if registers:
        found["registers"] = int(registers[-1])
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if spills:
        found["spill_stores"] = max(int(s) for s, _ in spills)
        found["spill_loads"] = max(int(l) for _, l in spills)
    return found


def launch_header(role: str, metadata: dict) -> str:
    """The launch metadata as C defines for the program's launcher (cake/triton_launch.h)."""
    macro = role.upper()
    signature = "".join(f"{kind} {name}," for name, kind in metadata["arguments"])
    hints = "".join(f" X({name}, {value})" for name, value in sorted(metadata["hints"].items()))
    return "\n".join([
        f"// Launch metadata of {metadata['name']} (written by triton_aot.py).",
        f'#define CAKE_TRITON_{macro}_NAME "{metadata["name"]}"',
        f"#define CAKE_TRITON_{macro}_SHARED {metadata['shared']}",
        f"#define CAKE_TRITON_{macro}_WARPS {metadata['num_warps']}",
        f'#define CAKE_TRITON_{macro}_SIGNATURE "{signature}"',
        f"#define CAKE_TRITON_{macro}_HINTS(X){hints}",
        ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="triton_aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--include-dir", type=Path, required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--role", required=True)
    parser.add_argument("--cubin", type=Path, required=True)
    parser.add_argument("--header", type=Path, required=True)
    parser.add_argument("--ptxas", help="the CUDA toolkit's ptxas (default: Triton's own)")
    parser.add_argument("--flag", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        cubin, metadata = compile_kernel(args.source, args.include_dir, args.arch, args.role,
                                         args.flag, args.ptxas)
    except (RuntimeError, ValueError, ImportError, OSError) as exc:
        print(f"triton_aot: error: {args.source.name}: {exc}", file=sys.stderr)
        return 1
    args.cubin.write_bytes(cubin)
    args.header.write_text(launch_header(args.role, metadata))
    print(f"triton_aot: {metadata['name']} {args.arch}: {metadata['shared']} B shared, "
          f"{metadata['registers']} registers, {metadata['spill_stores']} B spilled, "
          f"{metadata['num_warps']} warps, ptxas {metadata['ptxas']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
