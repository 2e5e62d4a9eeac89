"""tools/bench/lm_head.py on a machine without a GPU: it imports without CUDA or its peers
(Liger, cut-cross-entropy are imported only when a run asks for them), holds the issue's shapes,
and refuses to run, saying why, with exit status 2."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "bench" / "lm_head.py"
torch = pytest.importorskip("torch")


def test_the_bench_imports_without_its_peers_and_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the bench would run")
    probe = ("import sys, runpy; module = runpy.run_path(sys.argv[1]); "
             "print(sorted(n for n in sys.modules if n.split('.')[0] in "
             "('liger_kernel', 'cut_cross_entropy', 'cake'))); "
             "print(len(module['SHAPES']), module['PEERS'])")
    imported = subprocess.run([sys.executable, "-c", probe, str(SCRIPT)], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
    assert imported.returncode == 0, imported.stderr[-2000:]
    peers_loaded, shapes = imported.stdout.splitlines()
    assert peers_loaded == "[]"
    assert shapes == "8 ('cake_det', 'cake_nondet', 'liger', 'cce', 'compile', 'eager')"
    refused = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "small"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "lm_head bench: needs a CUDA GPU (none is visible here)"
    assert "Traceback" not in refused.stderr


def test_the_bench_holds_the_issues_shapes():
    bench = runpy.run_path(str(SCRIPT))
    assert sorted(bench["SHAPES"]) == sorted(
        (t, d, v) for t in (8192, 32768)
        for d, v in ((2048, 151936), (4096, 128256), (5120, 151936), (3840, 262144)))


def test_main_records_each_shape_as_it_ends_and_marks_the_finished_run(tmp_path, monkeypatch):
    """The JSON after every shape (a run cut short keeps what it measured), complete at the end,
    with the peers' versions (device work stubbed: this checks the bookkeeping)."""
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    try:
        import harness
        import lm_head
    finally:
        sys.path.remove(str(REPO / "tools" / "bench"))
    path = tmp_path / "run.json"
    seen = []

    def run_shape(shape, peers, **kwargs):
        seen.append(json.loads(path.read_text()))  # the file as this shape starts
        return [{"T": shape[0], "peer": "cake_det", "fwd+bwd ms": 1.0}]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lm_head, "load_peers", lambda names: dict.fromkeys(names))
    monkeypatch.setattr(lm_head, "run_shape", run_shape)
    monkeypatch.setattr(harness, "Bench", lambda: None)
    monkeypatch.setattr(harness, "device_summary", lambda: {"device": "stand-in"})
    assert lm_head.main(["--shapes", "8:16:32,9:16:32", "--peers", "cake_det",
                         "--json", str(path)]) == 0
    assert [(len(f["rows"]), f["complete"]) for f in seen] == [(0, False), (1, False)]
    found = json.loads(path.read_text())
    assert [r["T"] for r in found["rows"]] == [8, 9] and found["complete"] is True
    assert found["device"] == "stand-in" and set(lm_head.PEER_MODULES) <= set(found)
