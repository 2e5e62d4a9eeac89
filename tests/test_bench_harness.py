"""The benchmark harness's trace breakdown (``Bench.device_breakdown``), on a synthetic Chrome
trace with the categories torch.profiler writes; its host-hidden timing (``hide_host``) on a
model of one stream; and the README's peer table against the run it quotes: no GPU needed."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import harness  # noqa: E402

TAG = harness._CALL_TAG


def _call(name, ts, dur, tid=1):
    return {"cat": "user_annotation", "name": TAG + name, "ts": ts, "dur": dur, "tid": tid}


def _launch(correlation, ts, tid=1, cat="cuda_runtime"):
    return {"cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": correlation}}


def _op(correlation, ts, dur, cat="kernel"):
    return {"cat": cat, "name": f"op{correlation}", "ts": ts, "dur": dur,
            "args": {"correlation": correlation}}


def _trace():
    """Two rounds of calls "a" (two kernels) and "b" (one memset, launched by the driver API),
    each after a flush kernel launched outside any call; b's ops start 30 us after the flush."""
    events = []
    correlation = 0
    for start, order in ((0, ("a", "b")), (1000, ("b", "a"))):
        for slot, name in enumerate(order):
            base = start + slot * 400
            correlation += 1
            events += [_launch(correlation, base), _op(correlation, base + 10, 60)]  # the flush
            events.append(_call(name, base + 20, 50))
            if name == "a":
                events += [_launch(correlation + 1, base + 25), _op(correlation + 1, base + 75, 100),
                           _launch(correlation + 2, base + 30), _op(correlation + 2, base + 180, 20)]
            else:
                events += [_launch(correlation + 1, base + 25, cat="cuda_driver"),
                           _op(correlation + 1, base + 100, 40, cat="gpu_memset")]
            correlation += 2
    events.append({"cat": "gpu_user_annotation", "name": TAG + "a", "ts": 0, "dur": 5000})
    return events


def test_breakdown_sums_each_calls_device_work_and_idle_time_after_the_flush():
    result = harness._breakdown(_trace(), ["a", "b"])
    assert result["a"] == {"device_us": 120.0, "idle_us": 5.0, "kernels": 2,
                           "ops_us": [100.0, 20.0], "gaps_us": [5.0]}
    assert result["b"] == {"device_us": 40.0, "idle_us": 30.0, "kernels": 1, "ops_us": [40.0], "gaps_us": []}


def test_breakdown_leaves_per_operation_figures_out_when_calls_differ_in_operations():
    events = _trace()
    extra = max(e["args"]["correlation"] for e in events if "args" in e) + 1
    first_a = min(e["ts"] for e in events if e.get("name") == TAG + "a")
    events += [_launch(extra, first_a + 35), _op(extra, first_a + 205, 10)]  # a third kernel, once
    result = harness._breakdown(events, ["a"])
    assert result["a"]["ops_us"] == [] and result["a"]["gaps_us"] == []


def test_breakdown_counts_launches_from_other_threads_and_skips_launches_outside_calls():
    events = _trace()
    for event in events:
        if event.get("cat") == "cuda_driver":
            event["tid"] = 2  # b's memsets now come from another thread (autograd's engine)
    result = harness._breakdown(events, ["a", "b", "c"])
    assert result["b"]["device_us"] == 40.0 and result["b"]["idle_us"] == 30.0
    # The flushes (launched outside every call) belong to no call; "c" never ran.
    assert result["a"]["kernels"] == 2
    assert all(math.isnan(result["c"][key]) for key in ("device_us", "idle_us", "kernels"))


def test_readme_peer_table_is_the_committed_run():
    """The README's RMSNorm peer table is what ``tools/bench/rmsnorm.py --table`` prints from
    the committed run it cites first, so its figures cannot drift from the data."""
    import json

    import rmsnorm  # tools/bench/rmsnorm.py

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    source = re.search(r"`(tools/bench/results/[\w.-]+-peers\.json)`", readme)
    assert source, "the README names the peer run it quotes"
    result = json.loads((repo / source.group(1)).read_text())
    table = rmsnorm.peer_table(result["rows"], result["copy_bandwidth"])
    assert table.splitlines()[0] in readme
    start = readme.index(table.splitlines()[0])
    assert readme[start:start + len(table)] == table


class _Stream:
    """One CUDA stream as the harness sees it, in microseconds: a flush is FLUSH_US of device
    work enqueued at no host cost; a call spends ``host_us`` on the host, then enqueues
    DEVICE_US of device work. Events are stamped when the device reaches them."""

    FLUSH_US, DEVICE_US = 60.0, 100.0

    def __init__(self, host_us):
        self.host_us, self.host, self.device_free = host_us, 0.0, 0.0
        self.flushes = []  # flushes before each timed interval

    def enqueue(self, us):
        self.device_free = max(self.device_free, self.host) + us

    def call(self):
        self.host += self.host_us
        self.enqueue(self.DEVICE_US)


class _Event:
    def __init__(self, stream):
        self.stream, self.stamp = stream, None

    def record(self):
        self.stamp = max(self.stream.device_free, self.stream.host)

    def query(self):
        return self.stream.host >= self.stamp

    def synchronize(self):
        self.stream.host = max(self.stream.host, self.stamp)

    def elapsed_time(self, end):
        return (end.stamp - self.stamp) / 1e3


def _modelled_bench(host_us):
    stream = _Stream(host_us)
    bench = object.__new__(harness.Bench)
    bench._start, bench._stop, bench._cover = _Event(stream), _Event(stream), 1
    bench.flush = lambda: stream.enqueue(stream.FLUSH_US)
    return bench, stream


def test_hide_host_doubles_the_flushes_until_the_call_is_queued_before_the_device_reaches_it():
    bench, stream = _modelled_bench(host_us=150.0)
    # As a user calls it: 60 us of flush hide 60 of the 150 us host path; 90 show.
    assert bench.once(stream.call) * 1e3 == stream.DEVICE_US + 90.0
    # Hidden: 1 and 2 flushes (60, 120 us) fall short; 4 (240 us) cover the host path.
    assert bench.once(stream.call, hide_host=True) * 1e3 == stream.DEVICE_US
    assert bench._cover == 4
    before = stream.device_free
    assert bench.once(stream.call, hide_host=True) * 1e3 == stream.DEVICE_US
    assert stream.device_free - before == 4 * stream.FLUSH_US + stream.DEVICE_US  # starts at 4


def test_hide_host_reports_the_flushes_it_needed_and_refuses_a_call_it_cannot_hide():
    bench, stream = _modelled_bench(host_us=30.0)
    bench.torch = type("torch", (), {"cuda": type("cuda", (), {"synchronize": staticmethod(lambda d: None)})})
    bench.device = None
    timing = bench.interleaved({"call": stream.call}, warmup=0, iters=3, hide_host=True)["call"]
    assert timing.samples == [stream.DEVICE_US / 1e3] * 3 and timing.flushes == 1
    bench, stream = _modelled_bench(host_us=(harness.MAX_COVER_FLUSHES + 1) * _Stream.FLUSH_US)
    with pytest.raises(harness.HostNotHidden, match=r"^the device reached the call before its "
                                                    rf"host path ended, even behind "
                                                    rf"{harness.MAX_COVER_FLUSHES} flushes"):
        bench.once(stream.call, hide_host=True)


@pytest.mark.nvcc
def test_tune_libraries_keep_the_family_entries_and_the_bench_calls_them_by_name(
        tmp_path_factory, monkeypatch):
    """``harness.tune_libraries`` renders tuned programs with the family's declared entries (its
    table's ``entries``), so a tune at the table's own knobs is the shipped program, digest and
    entries; causal_conv1d.py's direct entry calls pass every declared argument by name: on the
    fake CUDA driver (tests/fake_cuda.c) the forward, backward and reduction launch on the
    bench's stream with the bench's buffers in their parameters. Compiles one program with nvcc
    (into the JIT cache the family tests of the session share)."""
    import ctypes
    import struct
    import types

    torch = pytest.importorskip("torch")
    import fake_cuda

    from cake.core import jit
    from cake.core import manifest as mf

    reason = jit.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if fake_cuda.real_driver_present():
        pytest.skip("a real CUDA driver is installed here: the fake must not be mixed with it")
    driver = fake_cuda.load()
    cache = tmp_path_factory.getbasetemp() / "cake-family-jit-cache"  # the family tests' cache
    cache.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("CAKE_CACHE_DIR", str(cache))
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda *args: types.SimpleNamespace(cuda_stream=0x5))

    import causal_conv1d  # tools/bench/causal_conv1d.py
    from tools.families import cake_causal_conv1d_det_train as table

    repo = Path(__file__).resolve().parents[1]
    manifest = mf.read(repo / "manifests" / "cake_causal_conv1d_det_train.json")
    shipped = next(p for p in manifest.programs if p.route["tile"] == "short" and p.variant
                   == {"dtype": "bfloat16", "bias": False, "activation": "silu"})
    library = causal_conv1d.tune_libraries({"short": dict(table.TILES["short"][1])})["short"]
    assert library.program.library == shipped.library
    assert library.program.entries == shipped.entries

    x, dy = torch.zeros(1000, 512, dtype=torch.bfloat16), torch.zeros(1000, 512, dtype=torch.bfloat16)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    w, dw = torch.zeros(512, 4, dtype=torch.bfloat16), torch.empty(512, 4)
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32)
    driver.reset()
    forward, backward, workspace = causal_conv1d._entry_calls(library, x, w, cu, y, dy, dx, dw)
    forward()
    backward()
    launches = driver.launches()
    prefix = f"kernel_{shipped.library}_"
    assert [launch.kernel for launch in launches] == [
        prefix + "forward_av", prefix + "backward_av", prefix + "reduce_f"]
    assert {launch.stream for launch in launches} == {0x5}
    # The kernels' parameters (csrc/include/cake/causal_conv1d/config.h, Params).
    fields = ("x", "weight", "bias", "cu_seqlens", "num_docs", "doc_len", "tokens", "channels")
    for launch in launches:
        values = dict(zip(fields, struct.unpack_from("<4Q4q", launch.params)))
        assert values == {"x": x.data_ptr(), "weight": w.data_ptr(), "bias": 0,
                          "cu_seqlens": cu.data_ptr(), "num_docs": 2, "doc_len": 0, "tokens": 1000,
                          "channels": 512}
    y_ptr, dy_ptr, dx_ptr, partials, dweight, _ = struct.unpack_from("<6Q", launches[1].params, 88)
    assert (y_ptr, dy_ptr, dx_ptr, partials, dweight) == (
        0, dy.data_ptr(), dx.data_ptr(), workspace.data_ptr(), dw.data_ptr())
    size = ctypes.c_int64(-1)
    library.entry("workspace_bytes")(0, tokens=1000, channels=512, out=ctypes.addressof(size))
    assert workspace.numel() == size.value > 0


def test_recorder_rewrites_the_rows_so_far_and_marks_the_finished_run(tmp_path):
    path = tmp_path / "run.json"
    record = harness.recorder(path, {"device": "stand-in", "rows": "not the rows"})
    # written at once: a run killed before its first row still leaves a file saying so
    assert json.loads(path.read_text()) == {"rows": [], "complete": False, "device": "stand-in"}
    record([{"ms": 1.0}])
    assert json.loads(path.read_text()) == {"rows": [{"ms": 1.0}], "complete": False,
                                            "device": "stand-in"}
    record([{"ms": 1.0}, {"ms": 2.0}], complete=True)
    found = json.loads(path.read_text())
    assert found["rows"] == [{"ms": 1.0}, {"ms": 2.0}] and found["complete"] is True
    assert [f.name for f in tmp_path.iterdir()] == ["run.json"]  # no partial file left


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "run.json"
    harness.write_json(path, {"rows": [1]})
    with pytest.raises(TypeError):
        harness.write_json(path, {"rows": [object()]})  # json.dump fails after writing a prefix
    assert json.loads(path.read_text()) == {"rows": [1]}


def test_versions_names_each_module_or_none():
    found = harness.versions(("textwrap", "pytest", "no_such_module_here"))
    assert found["pytest"] == pytest.__version__ and found["no_such_module_here"] is None
    assert found["textwrap"] == "unknown"  # neither a __version__ nor a distribution
