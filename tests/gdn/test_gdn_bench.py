"""tools/bench/gdn.py without a GPU: it imports without torch's CUDA, checks its arguments
before touching a device, and merges results files into one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "gdn.py"


def run(*arguments):
    return subprocess.run([sys.executable, str(BENCH), *arguments], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_the_module_imports_and_lists_the_issue_shapes():
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    try:
        import gdn
    finally:
        sys.path.remove(str(REPO / "tools" / "bench"))
    assert gdn.SHAPES == [(16, 32, 32768), (2, 6, 241817), (8, 16, 16384), (16, 48, 32768)]
    assert gdn.parse_shapes("2:6:100") == [(2, 6, 100)]
    assert gdn.parse_head_dims("128:256") == (128, 256)
    versions = gdn.peer_versions()  # what every result file records
    assert set(versions) == {"triton", "fla"}
    assert all(value is None or isinstance(value, str) for value in versions.values())


@pytest.mark.parametrize("arguments,message", [
    (("--shapes", "2:5:100"), "HV a multiple of H"),
    (("--shapes", "2x6"), "expected H:HV:T"),
    (("--head-dims", "128"), "expected K:V"),
    (("--impls", "cake,fla"), "subset of cake-det, cake-nondet, fla"),
    (("--ops", "forward"), "subset of fwd, bwd, fwd+bwd, ckpt"),
    (("--docs", "2"), "3 .. 6 documents"),
    (("--iters", "0"), "at least 1"),
])
def test_bad_arguments_are_refused_before_any_device_work(arguments, message):
    result = run(*arguments)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_without_a_gpu_it_says_so():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run("--shapes", "1:1:64")
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr


def test_table_merges_the_runs_of_two_processes(tmp_path):
    rows = {"cake": [{"H": 2, "HV": 6, "T": 100, "op": "fwd", "impl": "cake-det", "ms": 1.0,
                      "peak MiB": 10.0}],
            "fla": [{"H": 2, "HV": 6, "T": 100, "op": "fwd", "impl": "fla", "ms": 3.0,
                     "peak MiB": 30.0}]}
    paths = []
    for name, found in rows.items():
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"rows": found}))
    result = run("--table", *map(str, paths))
    assert result.returncode == 0, result.stderr
    assert "cake-det x fla" in result.stdout and "3.00" in result.stdout
    assert "| 128 | 128 |" in result.stdout.replace("  ", " ")  # K, V of rows without them


def test_run_records_the_rows_after_every_op(monkeypatch):
    """A run cut short keeps what it measured: ``record`` gets the rows so far after each op
    (device work stubbed: this checks the bookkeeping, not the timings)."""
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    try:
        import gdn
    finally:
        sys.path.remove(str(REPO / "tools" / "bench"))

    class Timing:
        median, spread = 1.5, 0.01

    class Bench:
        def interleaved(self, fns, iters, warmup):
            return {impl: Timing() for impl in fns}

    monkeypatch.setattr(gdn, "make_inputs", lambda *args: ((), None, None))
    monkeypatch.setattr(gdn, "cake_forwards", lambda *args: (None, lambda: None))
    monkeypatch.setattr(gdn, "op_calls", lambda *args: dict.fromkeys(gdn.OPS, lambda: None))
    monkeypatch.setattr(gdn, "peak_bytes", lambda fn: 0)
    seen = []
    rows = gdn.run([(1, 1, 64), (2, 2, 64)], impls=["cake-det"], ops=["fwd", "bwd"], docs=3,
                   iters=1, l2norm=True, bench=Bench(),
                   record=lambda found: seen.append([(r["H"], r["op"]) for r in found]))
    assert seen == [[(1, "fwd")], [(1, "fwd"), (1, "bwd")],
                    [(1, "fwd"), (1, "bwd"), (2, "fwd")],
                    [(1, "fwd"), (1, "bwd"), (2, "fwd"), (2, "bwd")]]
    assert len(rows) == 4
