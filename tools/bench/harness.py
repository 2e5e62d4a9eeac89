"""Generic GPU benchmark harness for cake-train families (CUDA events, L2 flush, interleaved peers).

Protocol (docs/benchmarks.md): every measured call is preceded by a write of a 256 MiB
buffer (flushing the H200's 60 MB L2), timed alone between two CUDA events, after warm-up; the
reported figure is the median of many such calls. Peers of one shape run interleaved in one
process, in A B B A order per round, so that clock or thermal drift hits them alike. The
roofline is the device-to-device copy bandwidth measured in the same run (bytes read plus bytes
written over time, same protocol), so "% of roofline" compares like with like.

Use::

    from tools.bench import harness            # or: import harness (run from tools/bench)
    bench = harness.Bench()
    bw = bench.copy_bandwidth()                # bytes/s
    times = bench.interleaved({"cake": f, "peer": g}, iters=50)   # name -> Timing
    kernels = bench.interleaved({"cake": f, "peer": g}, hide_host=True)
    split = bench.device_breakdown({"cake": f, "peer": g})        # device and idle us per call
    print(harness.format_table(rows))

``host_inclusive=True`` synchronizes after the flush, so the interval also holds the host work
of the call (Python, validation, launches): the figure an eager training step sees when the
GPU waits for the host. ``hide_host=True`` does the opposite: the flush is repeated until the
device is still busy with it when the call has enqueued all its work (checked on every sample),
so the interval holds the call's device work and the gaps between its operations, and none of
its host path: the time of the call's kernels, for every peer alike. Samples are taken with
Python's cyclic garbage collector paused, as ``timeit`` does.

``tune_libraries`` renders and JIT-compiles a family's templates with other knob values (tuning
sweeps). Torch is imported lazily; nothing here knows any family.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import importlib
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

FLUSH_BYTES = 256 << 20
# ~30 ms of flushes on the H200: the longest host paths timed (FLA's backward) take 1-4 ms, so a
# call not hidden behind this many synchronizes with the device (or waits for something else).
MAX_COVER_FLUSHES = 512


class HostNotHidden(RuntimeError):
    """A call's host path outlasted ``MAX_COVER_FLUSHES`` flushes (or the call synchronized)."""


@dataclasses.dataclass
class Timing:
    """Milliseconds of each measured call; ``flushes``: the most flushes before one of them
    (more than one where ``hide_host`` needed them to cover the host paths)."""

    samples: list
    flushes: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the figure is."""
        ordered = sorted(self.samples)
        n = len(ordered)
        return (ordered[int(0.9 * (n - 1))] - ordered[int(0.1 * (n - 1))]) / self.median


class Bench:
    """Holds the flush buffer and the events; one per device."""

    def __init__(self, device=None):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None \
            else torch.device(device)
        self._flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._stop = torch.cuda.Event(enable_timing=True)
        self._cover = 1  # flushes before each hide_host sample: one count for all calls timed

    def flush(self) -> None:
        self._flush.fill_(0x5A5A5A5A)

    def once(self, fn: Callable[[], object], *, host_inclusive: bool = False,
             hide_host: bool = False) -> float:
        """One flushed, event-timed call of ``fn``; milliseconds (module docstring: the modes)."""
        if hide_host:
            return self._once_hidden(fn)
        return self._timed(fn, flushes=1, host_inclusive=host_inclusive)[0]

    def _timed(self, fn, *, flushes: int, host_inclusive: bool = False,
               check_start: bool = False) -> tuple:
        """(ms, with ``check_start``: whether the device had passed the start event when ``fn``
        returned, i.e. waited for some of its host path)."""
        for _ in range(flushes):
            self.flush()
        if host_inclusive:
            self.torch.cuda.synchronize(self.device)
        self._start.record()
        fn()
        started = check_start and self._start.query()
        self._stop.record()
        self._stop.synchronize()
        return self._start.elapsed_time(self._stop), started

    def _once_hidden(self, fn) -> float:
        """A sample whose start event the device had not reached when ``fn`` returned: all of
        its work was queued behind the flushes, so none of its host time is in the interval.
        Doubles the flushes until that holds, for this sample and the later ones of every call
        timed together (so that peers are not timed behind different amounts of work)."""
        while self._cover <= MAX_COVER_FLUSHES:
            ms, started = self._timed(fn, flushes=self._cover, check_start=True)
            if not started:
                return ms
            self._cover *= 2
        raise HostNotHidden(f"the device reached the call before its host path ended, even "
                            f"behind {MAX_COVER_FLUSHES} flushes (does it synchronize?)")

    def time(self, fn: Callable[[], object], *, warmup: int = 5, iters: int = 50,
             host_inclusive: bool = False, hide_host: bool = False) -> Timing:
        return self.interleaved({"fn": fn}, warmup=warmup, iters=iters,
                                host_inclusive=host_inclusive, hide_host=hide_host)["fn"]

    def interleaved(self, fns: Mapping[str, Callable[[], object]], *, warmup: int = 5,
                    iters: int = 50, host_inclusive: bool = False, hide_host: bool = False) -> dict:
        """Times several peers of one shape in A B B A order per round; name -> Timing."""
        names = list(fns)
        for name in names:
            for _ in range(warmup):
                fns[name]()
        self.torch.cuda.synchronize(self.device)
        samples = {name: [] for name in names}
        self._cover = 1
        with _gc_paused():
            for round_index in range(iters):
                order = names if round_index % 2 == 0 else list(reversed(names))
                for name in order:
                    gc.collect(0)
                    try:
                        samples[name].append(self.once(fns[name], host_inclusive=host_inclusive,
                                                       hide_host=hide_host))
                    except HostNotHidden as exc:
                        raise HostNotHidden(f"{name}: {exc}") from None
        return {name: Timing(s, self._cover) for name, s in samples.items()}

    def copy_bandwidth(self, nbytes: int = 2 << 30, iters: int = 20) -> float:
        """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
        torch = self.torch
        src = torch.empty(nbytes // 2, dtype=torch.int16, device=self.device).random_()
        dst = torch.empty_like(src)
        timing = self.time(lambda: dst.copy_(src), warmup=3, iters=iters)
        return 2 * nbytes / (timing.median * 1e-3)

    def device_breakdown(self, fns: Mapping[str, Callable[[], object]], *,
                         rounds: int = 6) -> dict:
        """Where each call's event-timed interval goes, from a torch.profiler trace of
        ``rounds`` flushed calls of every fn (A B B A order): name -> {"device_us": its kernels',
        copies' and memsets' summed durations, "idle_us": the time from the end of the device
        work before it (the flush) to its first kernel, "kernels": device operations per call}
        (medians), and per operation of a call its duration ("ops_us") and the gap to the next
        ("gaps_us"). An event time well above ``device_us`` with a large ``idle_us`` is host time
        the flush did not hide; one whose ``device_us`` itself is larger is slower device work."""
        from torch.profiler import ProfilerActivity, profile, record_function

        names = list(fns)
        for name in names:
            fns[name]()
        self.torch.cuda.synchronize(self.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for round_index in range(rounds):
                for name in (names if round_index % 2 == 0 else list(reversed(names))):
                    def labelled(name=name):
                        with record_function(f"{_CALL_TAG}{name}"):
                            fns[name]()
                    self.once(labelled)
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
        return _breakdown(events, names)


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic collector off while samples are taken (as ``timeit`` does): a collection
    inside one call would charge that call with the garbage of all the others. The loops collect
    the youngest generation (where everything made since holds) between samples instead, so that
    garbage in cycles (and the device memory it holds) does not pile up."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_CALL_TAG = "bench call: "
_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _breakdown(events: list, names: Sequence[str]) -> dict:
    """``Bench.device_breakdown``'s figures from a Chrome trace: each device operation belongs
    to the annotated call whose CPU range holds the runtime call that launched it (matched by
    correlation id), on any thread (autograd's backward launches from its engine's thread;
    the calls run one at a time); the first operation of a call's is compared with the end of
    the device operation before it."""
    calls = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e.get("name", "").startswith(_CALL_TAG)), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    device = sorted((e for e in events if e.get("cat") in _DEVICE_CATEGORIES), key=lambda e: e["ts"])

    def owner(op):
        launch = launches.get(op.get("args", {}).get("correlation"))
        if launch is None:
            return None
        for index, call in enumerate(calls):
            if call["ts"] <= launch["ts"] <= call["ts"] + call["dur"]:
                return index
        return None

    per_call = {}
    for position, op in enumerate(device):
        index = owner(op)
        if index is None:
            continue
        entry = per_call.setdefault(index, {"device_us": 0.0, "kernels": 0, "idle_us": None, "ops": []})
        entry["device_us"] += op["dur"]
        entry["kernels"] += 1
        before = device[position - 1] if position else None
        gap = op["ts"] - (before["ts"] + before["dur"]) if before else 0.0
        if entry["idle_us"] is None:
            entry["idle_us"] = gap
        else:
            entry["ops"][-1]["gap_after"] = gap
        entry["ops"].append({"dur": op["dur"]})
    result = {}
    for name in names:
        mine = [per_call[i] for i, call in enumerate(calls)
                if call["name"] == f"{_CALL_TAG}{name}" and i in per_call]
        result[name] = {key: statistics.median(e[key] for e in mine) if mine else float("nan")
                        for key in ("device_us", "idle_us", "kernels")}
        result[name].update(_op_medians(mine))
    return result


def _op_medians(calls: list) -> dict:
    """Per position in a call, its device operation's median duration ("ops_us") and the median
    gap from it to the next ("gaps_us"), when every call ran the same number of operations."""
    if not calls or len({len(e["ops"]) for e in calls}) != 1:
        return {"ops_us": [], "gaps_us": []}
    count = len(calls[0]["ops"])
    return {"ops_us": [statistics.median(e["ops"][k]["dur"] for e in calls) for k in range(count)],
            "gaps_us": [statistics.median(e["ops"][k]["gap_after"] for e in calls) for k in range(count - 1)]}


def precompile(package_dirs: Sequence[Path], only: Callable | None = None,
               workers: int = 16) -> int:
    """JIT-compiles, ``workers`` at a time, the programs of the family packages in
    ``package_dirs`` built for GPU 0's arch (those ``only(program)`` accepts, when given) that
    have no library yet; returns how many it compiled."""
    from cake.core import jit, loader

    arch = loader.device(0).arch
    jobs = []
    for package_dir in package_dirs:
        programs = loader.ProgramSet.for_package(Path(package_dir))
        jobs += [(programs, p) for p in programs.manifest.programs
                 if arch in p.arches and (only is None or only(p))
                 and programs.state(p, arch) == "would compile"]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda job: jit.compile_program(job[0].tree, job[0].manifest, job[1], arch),
                      jobs))
    return len(jobs)


def tune_libraries(family, params: Mapping[str, Mapping[str, object]], *, repo: Path,
                   workers: int = 16) -> dict:
    """Renders one program of ``family`` (a ``tools.render.Family``: its name and templates) per
    entry of ``params`` (name -> every knob's value) into a temporary tree, JIT-compiles them
    for GPU 0's arch, ``workers`` at a time, and loads them: name -> ``cake.core.loader.Library``.
    The programs keep the family's name, so their digests differ from the shipped ones only
    through the knobs."""
    from cake.core import jit, loader
    from cake.core import manifest as mf
    from tools import render

    specs = tuple(render.Spec(variant={"tune": name}, route={}, params=dict(knobs))
                  for name, knobs in params.items())
    # The family's entries (the programs' declared C entries) and kind come with it.
    tuned = dataclasses.replace(family, specs=specs)
    manifest, files = render.render_family(tuned, repo)
    root = Path(tempfile.mkdtemp(prefix="cake-tune-"))
    (root / "manifests").mkdir()
    (root / "manifests" / f"{tuned.name}.json").write_text(mf.to_json(manifest))
    (root / "csrc" / tuned.name).mkdir(parents=True)
    for file_name, data in files.items():
        (root / "csrc" / tuned.name / file_name).write_bytes(data)
    shutil.copytree(repo / "csrc" / "include", root / "csrc" / "include")
    (root / "cake" / tuned.name).mkdir(parents=True)
    programs = loader.ProgramSet.for_package(root / "cake" / tuned.name)
    arch = loader.device(0).arch
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda p: jit.compile_program(programs.tree, manifest, p, arch),
                      manifest.programs))
    return {p.variant["tune"]: programs.library(p, 0) for p in manifest.programs}


def percent_of_roofline(nbytes: float, ms: float, bandwidth: float) -> float:
    """Achieved fraction (in %) of ``bandwidth`` (bytes/s) moving ``nbytes`` in ``ms``."""
    return 100.0 * nbytes / (ms * 1e-3) / bandwidth


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (dicts), floats with 3 significant decimals."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())

    def cell(value):
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def device_summary() -> dict:
    """Device name, capability, SM count, torch/CUDA versions: goes into every result file."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def write_json(path, payload: Mapping[str, object]) -> None:
    """``payload`` to ``path``, replaced whole: a process killed mid-write leaves the previous
    file."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(partial, path)


def recorder(path, extra: Mapping[str, object]) -> Callable[..., None]:
    """A writer of a run's rows to ``path`` each time it is called, with ``extra`` (versions,
    device) and ``complete`` (False until the run's last call). It writes an empty, incomplete
    file at once: a run cut short by a time limit keeps what it measured, even nothing, and its
    file says it was cut short."""
    def record(rows: Sequence[Mapping[str, object]], complete: bool = False) -> None:
        write_json(path, {**extra, "rows": list(rows), "complete": complete})
    record([])
    return record


def versions(modules: Sequence[str]) -> dict:
    """Each module's version in this process: its ``__version__``, else its distribution's (None:
    not importable). Every result file says which peers ran."""
    from importlib import metadata

    distributions = metadata.packages_distributions()
    found = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            found[name] = None
            continue
        found[name] = getattr(module, "__version__", None) or next(
            (metadata.version(d) for d in distributions.get(name, ())), "unknown")
    return found
