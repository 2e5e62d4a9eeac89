"""tools/bench/lm_head.py on a machine without a GPU: it imports without CUDA or its peers
(Liger, cut-cross-entropy are imported only when a run asks for them), holds the issue's shapes,
and refuses to run, saying why, with exit status 2."""

from __future__ import annotations

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
