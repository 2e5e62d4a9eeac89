#!/usr/bin/env python3
"""On a GPU: a vendored family's forward and backward are bitwise those of cake-train's own.

Usage (from the repository root, on the H200)::

    PYTHONUNBUFFERED=1 python3 ci/gpu_vendored_check.py [--out DIR] [--family NAME ...]
        [--arch sm_90a] [--jit-only]

Steps, every subprocess with ``flashinfer`` made unimportable (tests/vendor's sitecustomize
meta-path blocker):

1. ``tools/vendor.py`` copies every family (or ``--family``) into a temporary
   ``<host>/flashinfer/experimental/cake/``; ``check_manifests --vendored-gate`` runs inside
   ``ci/build_vendored.sh``, which builds every program of the vendored tree for ``--arch``
   into ``<package>/lib`` (``--jit-only`` skips the build: the vendored run then compiles).
2. A child process imports the vendored package under a neutral parent package
   (``vendored.<family>``, as tests/vendor does: a KCP family imports its base family beside
   it, ``from ..<base>``, which needs a parent) with ``flashinfer`` AND ``cake`` blocked, with
   ``CAKE_JIT=0`` (so every library it uses must come from the vendored build: a KCP family's
   from its own and its base family's), runs the family's own bitwise cases
   (``<family>._selftest.bitwise_cases``: autograd forward and backward on seeded inputs) and
   saves the outputs and gradients and the libraries it loaded.
3. A second child runs the same cases through ``cake.<family>`` from this checkout (its
   loader's normal path: prebuilt, else JIT cache, else a JIT compile into a fresh cache).
4. The parent compares every tensor bitwise (bytes) and prints one line per tensor and a
   summary; ``--out`` also gets ``vendored_check.json``. Exit 0 when every family that has
   a case was compared and everything is equal, 1 otherwise.

Families come from the checkout's manifests; one whose ``_selftest`` has no ``bitwise_cases``
is reported as skipped. Standard library in the parent; torch only in the children.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- cases (children)


def child(side: str, family_name: str, output: Path) -> None:
    """Runs the family's own bitwise cases (``<family>._selftest.bitwise_cases``) in this process
    and saves the outputs and the libraries it loaded."""
    import importlib
    import importlib.machinery
    import types

    import torch

    module_name = f"cake.{family_name}"
    if side == "vendored":
        # The host folder the vendored families sit in (on this child's path) becomes the
        # neutral parent package, so a KCP family's sibling import of its base resolves.
        found = importlib.machinery.PathFinder.find_spec(family_name)
        if found is None or not found.submodule_search_locations:
            raise SystemExit(f"gpu_vendored_check: the vendored {family_name} is not on the path")
        parent = types.ModuleType("vendored")
        parent.__path__ = [str(Path(found.submodule_search_locations[0]).parent)]
        sys.modules["vendored"] = parent
        module_name = f"vendored.{family_name}"
    family = importlib.import_module(module_name)
    cases = importlib.import_module(f"{module_name}._selftest").bitwise_cases
    loader = importlib.import_module(f"{module_name}.core.loader" if side == "vendored"
                                     else "cake.core.loader")
    device = torch.device("cuda", 0)
    start = time.perf_counter()
    outputs = cases(device)
    torch.cuda.synchronize()
    libraries = sorted({(lib.program.library, lib.origin, str(lib.path))
                        for programs in loader.ProgramSet._instances.values()
                        for lib in programs._libraries.values()})
    outside = sorted({m.split(".")[0] for m in sys.modules} & {"cake", "flashinfer"})
    torch.save({"outputs": {k: v.detach().cpu() for k, v in outputs.items()},
                "libraries": libraries, "module": family.__file__, "outside": outside,
                "seconds": time.perf_counter() - start}, output)


# --------------------------------------------------------------------------- parent


def has_cases(family_name: str) -> bool:
    """The family's ``_selftest`` module defines ``bitwise_cases`` (read, not imported)."""
    module = REPO / "cake" / family_name / "_selftest.py"
    return module.is_file() and "\ndef bitwise_cases(" in module.read_text()


class Job:
    """One step in a subprocess with the blocker; output to a log file, printed when done."""

    def __init__(self, label: str, command: list, work: Path, blocked: tuple, path: list,
                 **env):
        from vendor_tree import blocked_env  # the same sitecustomize blocker as the CPU tests'

        self.label = label
        self.log = work / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', label)}.log"
        self.start = time.perf_counter()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(c) for c in command], cwd=work, stdout=log, stderr=subprocess.STDOUT,
                env=dict(blocked_env(work, blocked, path), **env))

    def finish(self) -> bool:
        """Waits; prints the output and the time; True when it succeeded."""
        returncode = self.process.wait(timeout=1800)
        sys.stdout.write(self.log.read_text(errors="replace"))
        print(f"gpu_vendored_check: {self.label} took {time.perf_counter() - self.start:.1f} s"
              + ("" if returncode == 0 else f" and FAILED ({returncode})"), flush=True)
        return returncode == 0


def compare(vendored: dict, installed: dict) -> list[dict]:
    import torch

    rows = []
    for key in sorted(set(vendored) | set(installed)):
        a, b = vendored.get(key), installed.get(key)
        row = {"tensor": key, "equal": False}
        if a is not None and b is not None:
            row.update(shape=list(a.shape), dtype=str(a.dtype).replace("torch.", ""))
            same = a.shape == b.shape and a.dtype == b.dtype
            row["equal"] = same and torch.equal(a.contiguous().view(torch.uint8),
                                                b.contiguous().view(torch.uint8))
            row["finite"] = bool(torch.isfinite(a.float()).all())
            row["nonzero"] = bool(a.float().abs().max() > 0)
            if same and not row["equal"]:
                row["max_abs_diff"] = float((a.double() - b.double()).abs().max())
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"),
                        help="folder for vendored_check.json (default: $OUT if set)")
    parser.add_argument("--family", action="append", default=[],
                        help="family package name (repeatable; default: every family)")
    parser.add_argument("--arch", default="sm_90a", help="arch to build the vendored tree for")
    parser.add_argument("--jit-only", action="store_true",
                        help="skip the vendored AOT build (the vendored run JIT-compiles)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary host tree, build and outputs")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "FAMILY", "OUTPUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return 0

    import torch

    if not torch.cuda.is_available():
        print("gpu_vendored_check: no CUDA GPU here; run it on the GPU machine", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "tests" / "vendor"))
    from vendor_tree import real_families

    families = args.family or real_families()
    work = Path(tempfile.mkdtemp(prefix="cake-vendored-check-"))
    try:
        return check(args, families, work)
    finally:
        if args.keep:
            print(f"gpu_vendored_check: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def check(args: argparse.Namespace, families: list[str], work: Path) -> int:
    import torch
    from vendor_tree import HOST_BLOCKED, PREFIX, RUN_BLOCKED, host_tree, vendor

    from cake.vendor_plan import kcp_base

    into = host_tree(work / "host")
    start = time.perf_counter()
    result = vendor(work, into, *[a for f in families for a in ("--package", f)])
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0:
        return 1
    print(f"gpu_vendored_check: vendored {len(families)} famil"
          f"{'y' if len(families) == 1 else 'ies'} into {into} as {PREFIX}.<name> in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    cased = [name for name in families if has_cases(name)]
    jobs = {}

    def child_job(side: str, name: str) -> Job:
        command = [sys.executable, Path(__file__).resolve(), "--child", side, name,
                   work / f"{name}.{side}.pt"]
        env = {"CAKE_CACHE_DIR": str(work / f"cache-{side}")}
        if side == "installed":  # this checkout's loader: prebuilt, else JIT (cache, compile)
            return Job(f"{name} installed run", command, work, HOST_BLOCKED, [REPO], **env)
        if not args.jit_only:
            env["CAKE_JIT"] = "0"  # every library must come from the vendored build
        return Job(f"{name} vendored run", command, work, RUN_BLOCKED, [into], **env)

    # The installed runs JIT-compile their programs while the vendored tree builds.
    for name in cased:
        jobs[name, "installed"] = child_job("installed", name)
    if not args.jit_only:
        build = Job("the vendored build", ["bash", REPO / "ci" / "build_vendored.sh", into,
                                           args.arch],
                    work, HOST_BLOCKED, [], PYTHON=sys.executable,
                    CAKE_BUILD_DIR=str(work / "build"))
        if not build.finish():
            for job in jobs.values():
                job.process.kill()  # the installed runs this script started
                job.process.wait()
            return 1
    for name in cased:
        jobs[name, "vendored"] = child_job("vendored", name)

    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device":
              torch.cuda.get_device_name(0), "torch": torch.__version__, "arch": args.arch,
              "jit_only": args.jit_only, "families": {}}
    ok = True
    compared = 0
    for name in families:
        if name not in cased:
            print(f"gpu_vendored_check: {name}: SKIPPED (its _selftest has no bitwise_cases)")
            report["families"][name] = {"skipped": "no case"}
            continue
        saved = {}
        failed = []
        for side in ("installed", "vendored"):
            if jobs[name, side].finish():
                saved[side] = torch.load(work / f"{name}.{side}.pt")
            else:
                failed.append(side)
        if failed:
            ok = False
            compared += 1
            print(f"gpu_vendored_check: {name}: FAILED (the {' and '.join(failed)} run failed)")
            report["families"][name] = {"ok": False, "failed_runs": failed}
            continue
        vendored_side, installed_side = saved["vendored"], saved["installed"]
        rows = compare(vendored_side["outputs"], installed_side["outputs"])
        # A KCP family runs its base family's programs too, from the base's vendored folder.
        lib_dirs = tuple(str(into / family / "lib") + os.sep
                         for family in (name, kcp_base(name)) if family)
        from_build = bool(vendored_side["libraries"]) and all(
            origin == "prebuilt" and path.startswith(lib_dirs)
            for _, origin, path in vendored_side["libraries"])
        same_programs = ({lib for lib, _, _ in vendored_side["libraries"]}
                         == {lib for lib, _, _ in installed_side["libraries"]})
        family_ok = (all(r["equal"] and r.get("finite") and r.get("nonzero") for r in rows)
                     and same_programs and not vendored_side["outside"]
                     and (args.jit_only or from_build))
        ok &= family_ok
        compared += 1
        for row in rows:
            print(f"  {name} {row['tensor']:<36} {str(row.get('shape')):<14} "
                  f"{row.get('dtype', '?'):<9} {'equal' if row['equal'] else 'DIFFERENT'}"
                  + ("" if row.get("finite", True) else " NON-FINITE")
                  + ("" if row.get("nonzero", True) else " ALL-ZERO")
                  + (f" max|diff|={row['max_abs_diff']:.3g}" if "max_abs_diff" in row else ""))
        for side, data in saved.items():
            for library, origin, path in data["libraries"]:
                print(f"  {name} {side:<9} {origin:<9} {path}")
        print(f"gpu_vendored_check: {name}: {'OK' if family_ok else 'FAILED'} "
              f"({sum(r['equal'] for r in rows)}/{len(rows)} tensors bitwise equal; vendored "
              f"libraries {'all from its build' if from_build else 'NOT all from its build'}; "
              f"same programs {same_programs}; cake/flashinfer imported by the vendored run: "
              f"{vendored_side['outside'] or 'none'}; run time vendored "
              f"{vendored_side['seconds']:.1f} s, installed {installed_side['seconds']:.1f} s)")
        report["families"][name] = {
            "ok": family_ok, "tensors": rows, "same_programs": same_programs,
            "vendored_from_build": from_build, "vendored_imported": vendored_side["outside"],
            "libraries": {s: d["libraries"] for s, d in saved.items()}}
    ok &= compared > 0
    report["ok"] = ok
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "vendored_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_vendored_check: {'OK' if ok else 'FAILED'}: {compared} famil"
          f"{'y' if compared == 1 else 'ies'} compared on {report['device']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
