"""Vendoring the KCP family alone (tools/vendor.py --package ..._kcp): its base family comes with
it, the vendored gate passes, refuses the copy once the base is gone (CM710), and the copy runs a
step (the CPU path, a one-process gloo group) with ``cake`` and ``flashinfer`` unimportable,
importing the base beside it under the host's parent package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
KCP, BASE = "cake_causal_conv1d_det_train_kcp", "cake_causal_conv1d_det_train"
PREFIX = "hostlib.cake"  # a host package, as flashinfer.experimental.cake is


def _run(*command, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, command)], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    """A host tree with the KCP family vendored alone (its base comes with it)."""
    root = tmp_path_factory.mktemp("host")
    into = root / "hostlib" / "cake"
    into.mkdir(parents=True)
    for folder in (root / "hostlib", into):
        (folder / "__init__.py").write_text("")
    result = _run(REPO / "tools" / "vendor.py", "--into", into, "--package-prefix", PREFIX,
                  "--package", KCP, cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in into.iterdir() if p.is_dir()) == [BASE, KCP]
    return root


def _gate(root: Path) -> subprocess.CompletedProcess:
    return _run(REPO / "tools" / "check_manifests.py", "--vendored-gate", "--root", root,
                "--package", f"{PREFIX}.{KCP}", "--package", f"{PREFIX}.{BASE}", cwd=root)


def test_the_copy_with_its_base_passes_the_gate(host):
    result = _gate(host)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_copy_runs_a_step_without_cake(host):
    """A zigzag step on the CPU of the vendored copy: y and dx bitwise the single-rank run of
    its compute (the vendored base family's reference), nothing imported from cake."""
    script = textwrap.dedent(f"""
        import sys
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("cake", "flashinfer"):
                    raise ImportError(f"{{name}} is blocked")
        sys.meta_path.insert(0, Blocker())
        import torch, torch.distributed as dist
        from hostlib.cake import {KCP} as kcp
        from hostlib.cake.{KCP} import _compute
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        S, C = 23, 5
        cu = torch.tensor([0, 9, 12, S], dtype=torch.int32)  # [9, 12) crosses 11
        g = torch.Generator().manual_seed(0)
        x, dy = (torch.randn(S, C, generator=g, dtype=torch.float64) for _ in range(2))
        w = torch.randn(C, 4, generator=g, dtype=torch.float64)
        plan = kcp.CakeCausalConv1dDetKcpPlan.build(cu, S, C, torch.float64, layout="zigzag")
        assert plan.forward_windows.rows > 0  # the second piece's first tokens take windows
        xl = kcp.cake_causal_conv1d_det_train_kcp_shard(x, plan).requires_grad_()
        y = kcp.cake_causal_conv1d_det_kcp(xl, w, None, plan, cu_seqlens=cu)
        y.backward(kcp.cake_causal_conv1d_det_train_kcp_shard(dy, plan))
        want_y, want_dx = torch.empty_like(x), torch.empty_like(x)
        _compute.ReferenceCompute.forward(x, w, None, cu, "silu", want_y)
        _compute.ReferenceCompute.backward(dy, x, w, None, cu, "silu", want_dx)
        unshard = kcp.cake_causal_conv1d_det_train_kcp_unshard
        assert torch.equal(unshard(y.detach(), plan), want_y)
        assert torch.equal(unshard(xl.grad, plan), want_dx)
        dist.destroy_process_group()
        assert _compute.reference.__name__ == "hostlib.cake.{BASE}.reference"
        print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"cake", "flashinfer"}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=host, capture_output=True,
                            text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(host)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_gate_refuses_the_copy_without_its_base(host, tmp_path):
    root = tmp_path / "host"
    shutil.copytree(host, root)
    shutil.rmtree(root / "hostlib" / "cake" / BASE)
    result = _run(REPO / "tools" / "check_manifests.py", "--vendored-gate", "--root", root,
                  "--package", f"{PREFIX}.{KCP}", cwd=root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{root / 'hostlib' / 'cake' / BASE}:$: CM710 " in result.stdout
