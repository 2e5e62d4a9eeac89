#!/usr/bin/env python3
"""What checking a library before loading it adds to its first load (cake/core/trust.py), no GPU.

Usage (repository root, nvcc on PATH: the programs are JIT-compiled once into a cache)::

    python tools/bench/first_load.py [--processes 30] [--json out.json]

Before ``dlopen`` runs a library's code, the loader reads the file, hashes it (sha256) against
its record, checks its ELF header and loads exactly those bytes from an in-memory file
(``trust.load``); after it, it asks the library for its digest and ABI version
(``loader.Library``). For the first program of each family, JIT-compiled for sm_90a (the fake
driver, tests/fake_cuda.py, stands in for libcuda.so.1 and reports an H200), each figure is the
median over ``--processes`` fresh processes of one first load, the three ways interleaved:

* ``plain dlopen``: ``ctypes.CDLL(path)``, a first load with no check;
* ``checked``: ``trust.load``, the check, the in-memory copy and the dlopen;
* ``loader``: ``loader.Library``, checked plus the digest and ABI calls;

and the check alone (read, sha256, ELF header) in one process, the median of 1,000. "checked -
plain" is what the check adds to a first load (target: under 1 ms). CPU figures of the
development machine; compare runs of this script with each other (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

FAMILIES = ("cake_causal_conv1d_det_train", "cake_rmsnorm_det_train")
WAYS = ("plain dlopen", "checked", "loader")

# One first load in a fresh process; everything but the load itself is done before the clock.
CHILD = textwrap.dedent("""
    import ctypes, json, sys, time
    sys.path[:0] = [{repo!r}]
    from pathlib import Path
    from cake.core import loader, trust
    from cake.core import manifest as mf
    path, sha256, way = Path({path!r}), {sha256!r}, {way!r}
    program = next(p for p in mf.read(Path({manifest!r})).programs if p.library == {library!r})
    start = time.perf_counter()
    if way == "plain dlopen":
        ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    elif way == "checked":
        trust.load(path, sha256, "remedy")
    else:
        loader.Library(program, path, "cached", sha256, "remedy")
    print(json.dumps(time.perf_counter() - start))
""")


def first_loads(library: dict, processes: int) -> dict:
    """Seconds of one first load in each of ``processes`` fresh processes, per way."""
    times = {way: [] for way in WAYS}
    for _ in range(processes):
        for way in WAYS:  # interleaved, so that drift hits the three alike
            script = CHILD.format(repo=str(REPO), way=way, **library)
            result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                    text=True, check=True)
            times[way].append(json.loads(result.stdout))
    return times


def check_alone(path: Path, sha256: str, repeat: int = 1000) -> float:
    """Seconds of the check before loading (read, sha256, ELF header): the median of ``repeat``."""
    from cake.core import trust

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256 or trust.elf_problem(data):
            raise SystemExit(f"{path}: not the recorded library")
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def libraries() -> list[dict]:
    """The first program of each family, compiled into the cache once (through the loader, the
    fake driver giving the device): its file, sha256, manifest and name."""
    import fake_cuda

    fake_cuda.load()
    from cake.core import loader

    found = []
    for name in FAMILIES:
        programs = loader.ProgramSet.for_package(REPO / "cake" / name)
        program = programs.manifest.programs[0]
        path = programs.library(program, 0).path
        found.append({"path": str(path), "library": program.library,
                      "manifest": str(programs.tree.manifest_path),
                      "sha256": path.with_name(path.name + ".sha256").read_text().strip()})
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("CAKE_CACHE_DIR", str(Path(tempfile.gettempdir()) / "cake-bench-jit"))
    results = {}
    for library in libraries():
        path = Path(library["path"])
        medians = {way: statistics.median(t) * 1e3
                   for way, t in first_loads(library, args.processes).items()}
        medians["check alone"] = check_alone(path, library["sha256"]) * 1e3
        results[path.name] = dict(medians, kb=path.stat().st_size / 1e3)
        print(f"{path.name} ({path.stat().st_size / 1e3:.1f} KB), first loads: median of "
              f"{args.processes} fresh processes")
        print(f"  check alone (read, sha256, ELF header) {medians['check alone']:7.3f} ms "
              f"(one process, median of 1000)")
        for way in WAYS:
            extra = ""
            if way == "checked":
                extra = (f"  (+{medians['checked'] - medians['plain dlopen']:.3f} ms over the "
                         f"plain dlopen; target: under 1 ms)")
            print(f"  {way:<38} {medians[way]:7.3f} ms{extra}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                         "processes": args.processes, "ms": results},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
