"""``python -m cake info``, ``python -m cake selftest`` and ``python -m cake precompile``."""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import os
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from . import __version__, families
from .checker import UsageError, check_tree
from .core import jit, loader, toolchain, triton_aot, trust


def family_dirs() -> list[Path]:
    """The family packages next to this file (installed or in a checkout)."""
    root = Path(__file__).resolve().parent
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and p.name.startswith("cake_") and (p / "__init__.py").is_file())


def _devices() -> tuple[list[loader.Device], str]:
    """The visible GPUs and a line about the driver (no GPU is not an error here)."""
    try:
        driver = loader.driver()
        devices = [loader.device(i) for i in range(driver.device_count())]
        return devices, f"CUDA driver {driver.version()}"
    except loader.ProgramUnavailable as exc:
        return [], f"no usable CUDA driver ({exc})"


def _toolchain_line() -> str:
    nvcc, cxx = toolchain.find_nvcc(), toolchain.find_cxx()
    parts = [f"nvcc {jit.compiler_version(nvcc)} ({nvcc})" if nvcc else "nvcc not found",
             f"host c++ {jit.compiler_version(cxx)} ({cxx})" if cxx else "host c++ not found",
             f"triton {triton_aot.installed_version() or 'not installed'} (Triton programs need "
             f"{triton_aot.TRITON_VERSION})"]
    reason = jit.unavailable_reason()
    parts.append("JIT allowed" if reason is None else f"JIT unavailable: {reason}")
    return "; ".join(parts) + f"; cache {jit.cache_root()}"


def _torch_line() -> str:
    if importlib.util.find_spec("torch") is None:
        return "torch: not installed"
    import torch

    return f"torch {torch.__version__} (CUDA runtime {torch.version.cuda})"


def info() -> int:
    devices, driver_line = _devices()
    print(f"cake-train {__version__} at {Path(__file__).resolve().parent}")
    print(driver_line)
    print(_torch_line())
    print(_toolchain_line())
    for d in devices:
        print(f"{d.describe()}: arch {d.arch or 'none (unsupported capability)'}")
    if not devices:
        print("no GPU: program states are shown for each arch a program lists")
    public = families()
    for directory in family_dirs():
        programs = loader.ProgramSet.for_package(directory)
        manifest = programs.manifest
        print(f"\n{manifest.package}: {len(manifest.programs)} program(s); public names: "
              + ", ".join(public.get(f"{__package__}.{directory.name}", [])))
        for program in manifest.programs:
            variant = " ".join(f"{k}={v}" for k, v in sorted(program.variant.items()))
            route = " ".join(f"{k}={v}" for k, v in sorted(program.route.items()))
            arches = [devices[0].arch] if devices else program.arches
            states = " ".join(f"{a}:{_state(programs, program, a)}" for a in arches)
            print(f"  {program.library}  {program.kind}  [{variant}] [{route}]  {states}")
    return 0


def _state(programs: loader.ProgramSet, program, arch) -> str:
    """A program's state for an arch, with the prebuilt library's size."""
    state = programs.state(program, arch)
    path = programs.prebuilt_path(program, arch) if arch else None
    if state == "prebuilt" and path is not None:
        state += f" ({path.stat().st_size / 1024:.0f} KB)"
    return state


def selftest() -> int:
    failures = 0
    devices, driver_line = _devices()
    print(f"cake-train {__version__} selftest of {Path(__file__).resolve().parent}; {driver_line}")
    for directory in family_dirs():
        programs = loader.ProgramSet.for_package(directory)
        findings, count = check_tree(programs.tree)
        for finding in findings:
            print(f"FAIL {finding}")
        failures += len(findings)
        problems = list(_library_problems(programs))
        for problem in problems:
            print(f"FAIL {problem}")
        failures += len(problems)
        built = len(list((directory / "lib").glob("*.so")))
        print(f"{'ok  ' if not findings and not problems else 'FAIL'} {programs.manifest.package}: "
              f"manifest and csrc ({count} programs), {built} prebuilt libraries verified")
        if devices:
            failures += _run_family_selftest(directory.name, devices[0])
    if not devices:
        print("skip GPU self-tests: no GPU on this machine")
    print(f"selftest: {'passed' if not failures else f'{failures} failure(s)'}")
    return 1 if failures else 0


def _library_problems(programs: loader.ProgramSet):
    """Every prebuilt library must be a listed (program, arch), have the sha256 the package's
    build record gives it (checked before it is loaded) and embed that program's digest."""
    by_library = {p.library: p for p in programs.manifest.programs}
    try:
        record = programs.record()
    except loader.LibraryRefused as exc:
        yield str(exc)
        return
    for path in sorted((programs.package_dir / "lib").glob("*.so")):
        library, _, arch = path.stem.rpartition("_sm_")
        program = by_library.get(library)
        if program is None or f"sm_{arch}" not in program.arches:
            yield f"{path}: not a (program, arch) of the manifest"
            continue
        if path.name not in record:
            yield f"{path}: not in the package's build record ({trust.RECORD_NAME})"
            continue
        try:
            digest = loader.embedded_digest(path, library, record[path.name])
        except loader.LibraryRefused as exc:
            yield str(exc)
            continue
        if digest != program.digest:
            yield f"{path}: embeds digest {digest}, the manifest says {program.digest}"
    for name in sorted(set(record) - {p.name for p in (programs.package_dir / "lib").glob("*.so")}):
        yield f"{programs.package_dir / 'lib' / name}: in the build record, but missing"


def _run_family_selftest(name: str, device: loader.Device) -> int:
    if importlib.util.find_spec(f"{__package__}.{name}._selftest") is None:
        print(f"skip {name}: the family has no GPU self-test")
        return 0
    module = importlib.import_module(f"{__package__}.{name}._selftest")
    failures = 0
    for check, problem in module.run(device.index):
        print(f"{'FAIL' if problem else 'ok  '} {name} on {device.describe()}: {check}"
              + (f": {problem}" if problem else ""))
        failures += bool(problem)
    return failures


def precompile(arch: str | None, jobs: int) -> int:
    """JIT-compiles, ``jobs`` at a time, every program of every family for ``arch`` (default: the
    arch of GPU 0) that has no prebuilt or cached library yet, with a line per library done."""
    if arch is None:
        devices, driver_line = _devices()
        if not devices:
            print(f"cake precompile: error: no GPU to take the arch from ({driver_line}); "
                  "pass --arch", file=sys.stderr)
            return 1
        arch = devices[0].arch
    todo = []
    for directory in family_dirs():
        programs = loader.ProgramSet.for_package(directory)
        todo += [(programs, p) for p in programs.manifest.programs
                 if programs.state(p, arch) == "would compile"]
    print(f"cake precompile: {len(todo)} program(s) to compile for {arch}, {jobs} at a time")
    done = 0

    def compile_one(job):
        programs, program = job
        start = time.perf_counter()
        jit.compile_program(programs.tree, programs.manifest, program, arch)
        return program.library, time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for library, seconds in pool.map(compile_one, todo):
            done += 1
            print(f"[{done}/{len(todo)}] {library} ({seconds:.0f} s)", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cake",
        description="cake-train's command line: what is installed and how it would load, the "
                    "self-test of the installed package, and JIT precompiles.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="the device, the toolchain and each program's state")
    commands.add_parser("selftest", help="check the installed manifests, sources and "
                                         "libraries; on a GPU, run each family once")
    compile_parser = commands.add_parser(
        "precompile", help="JIT-compile every program for an arch into the cache")
    compile_parser.add_argument("--arch", help="default: the arch of GPU 0")
    compile_parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        if args.command == "precompile":
            return precompile(args.arch, args.jobs)
        return info() if args.command == "info" else selftest()
    except BrokenPipeError:  # a reader that stopped early (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"cake {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
