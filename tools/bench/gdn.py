#!/usr/bin/env python3
"""Benchmark of the Gated DeltaNet families against FLA's chunk_gated_delta_rule (Hopper, Blackwell).

Usage (from the repository root, on a GPU machine)::

    PYTHONPATH=. python tools/bench/gdn.py [--impls cake-det,cake-nondet,fla]
        [--shapes all|H:HV:T,...] [--head-dims K:V] [--ops fwd,bwd,fwd+bwd,ckpt] [--docs 3..6]
        [--iters 30] [--no-l2norm] [--json out.json]
    PYTHONPATH=. python tools/bench/gdn.py --precompile          # JIT both families' programs
    python tools/bench/gdn.py --table a.json b.json              # one table from several runs

Protocol: ``tools/bench/harness.py`` (256 MiB L2 flush before every call, CUDA events,
warm-up, median; the implementations of one shape and op interleaved A B B A in one process).
bf16 q, k, v, fp32 g (log-sigmoid) and beta, K = V = 128 (``--head-dims``: V = 2K, say
``128:256``, times cake's split of V into value heads of K columns against FLA's native
kernels), packed documents (``--docs``, default 4, cut points seeded), no initial or final
state, qk_l2norm in the kernel (``--no-l2norm``: off). Ops, each timed as one call:

* ``fwd``: the forward alone (cake: the helper with the chunk plan; FLA: its function under
  ``torch.no_grad``);
* ``bwd``: the backward alone, ``torch.autograd.grad`` of a forward's output (graph retained);
* ``fwd+bwd``: an autograd forward and its backward;
* ``ckpt``: a checkpointed step, ``torch.utils.checkpoint`` (non-reentrant) of the forward,
  then the backward: two forwards and one backward, as activation checkpointing runs it.

Peak memory: for each implementation, op and shape, the peak of ``torch.cuda.max_memory_allocated``
over one call, less what was allocated before it (inputs and the retained graph excluded).
``--json`` is rewritten after every op, ``complete`` false until the run ends: a run cut short
(FLA's first-call autotuning can take minutes a shape) keeps what it measured.

Peer: FLA (fla-core 0.6.0) ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` with
``cu_seqlens`` and ``use_qk_l2norm_in_kernel``, timed in the same process as the cake families
whenever it imports there (a peer that fails to import or to run is reported and skipped). On
Hopper its gated backward needs Triton >= 3.7.1 (it refuses 3.4 .. 3.7.0, wrong results: its
issue #640); the H200 image has 3.6.0. Prebuilt cake libraries need no Triton, so with an
installed wheel (``pip install .``, built with the pinned Triton) put the carried Triton 3.7.1
first on PYTHONPATH and run every implementation in one process. Only where cake must JIT its
programs (that needs the pinned 3.9.0: the JIT cache is keyed by the installed Triton) run FLA in
a process of its own (``--impls fla``) and the cake families in another, then ``--table`` the two
JSON files; the JSON records the Triton and FLA versions each process saw. Where FLA refuses
HV > H it gets q and k repeated per value head (the same math; noted in the rows). Nothing here
runs without a GPU: importing this module and ``--help`` need neither torch nor a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tools", REPO / "tools" / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402

# (H, HV, T): the shapes of the GPU issue; K = V = 128, bf16.
SHAPES = [(16, 32, 32768), (2, 6, 241817), (8, 16, 16384), (16, 48, 32768)]
HEAD_DIMS = (128, 128)
IMPLS = ("cake-det", "cake-nondet", "fla")
OPS = ("fwd", "bwd", "fwd+bwd", "ckpt")
WARMUP = 3


def parse_shapes(text: str) -> list:
    """``all`` or ``H:HV:T,...`` (HV a positive multiple of H, T >= 1)."""
    if text == "all":
        return list(SHAPES)
    shapes = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r}: expected H:HV:T (integers)")
        heads, value_heads, tokens = (int(p) for p in parts)
        if heads < 1 or tokens < 1 or value_heads < heads or value_heads % heads:
            raise argparse.ArgumentTypeError(f"shape {item!r}: expected H >= 1, HV a multiple "
                                             "of H, T >= 1")
        shapes.append((heads, value_heads, tokens))
    return shapes


def parse_head_dims(text: str) -> tuple:
    """``K:V`` (positive integers; the families refuse what they do not run, reported per
    implementation)."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--head-dims: expected K:V (positive integers), got "
                                         f"{text!r}")
    return int(parts[0]), int(parts[1])


def parse_list(choices: tuple, what: str):
    def parse(text: str) -> list:
        items = [item for item in text.split(",") if item]
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"{what}: expected a comma-separated subset of "
                                             f"{', '.join(choices)}, got {text!r}")
        return items
    return parse


def parse_docs(text: str) -> int:
    if not text.isdigit() or not 3 <= int(text) <= 6:
        raise argparse.ArgumentTypeError(f"--docs: expected 3 .. 6 documents per pack, got "
                                         f"{text!r}")
    return int(text)


# --------------------------------------------------------------------------- inputs and calls


def make_inputs(heads: int, value_heads: int, tokens: int, documents: int,
                head_dims: tuple = HEAD_DIMS, seed: int = 0):
    """bf16 q, k ``[T, H, K]``, v ``[T, HV, V]`` (requiring grad), fp32 g and beta (requiring
    grad), dout, and int32 cu_seqlens of ``documents`` seeded documents, all on the current
    GPU."""
    head_k, head_v = head_dims
    import torch

    from cake.core import selftest

    gen = torch.Generator().manual_seed(seed)
    offsets = selftest.document_offsets(tokens, documents, gen)
    device = torch.device("cuda", torch.cuda.current_device())
    cuda_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=torch.float32,
                           generator=cuda_gen).to(dtype)

    q = randn(tokens, heads, head_k).requires_grad_()
    k = randn(tokens, heads, head_k).requires_grad_()
    v = randn(tokens, value_heads, head_v).requires_grad_()
    g = torch.nn.functional.logsigmoid(randn(tokens, value_heads, dtype=torch.float32) + 3.0)
    beta = torch.sigmoid(randn(tokens, value_heads, dtype=torch.float32))
    g, beta = g.requires_grad_(), beta.requires_grad_()
    dout = randn(tokens, value_heads, head_v)
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    return (q, k, v, g, beta), dout, cu


def cake_forwards(mode: str, inputs: tuple, cu, l2norm: bool) -> tuple:
    """(autograd forward, helper forward without autograd) of one cake family."""
    if mode == "cake-det":
        from cake.cake_gdn_det_train import (CakeGDNDetPlan as Plan, cake_gdn_det as function,
                                             cake_gdn_det_train_forward as helper)
    else:
        from cake.cake_gdn_nondet_train import (CakeGDNNondetPlan as Plan,
                                                cake_gdn_nondet as function,
                                                cake_gdn_nondet_train_forward as helper)
    plan = Plan(cu)  # built once per pack: no host sync in the timed calls

    def autograd_forward(*args):
        return function(*args, plan=plan, qk_l2norm=l2norm)[0]

    def helper_forward():
        return helper(*(x.detach() for x in inputs), plan=plan, qk_l2norm=l2norm)[0]

    return autograd_forward, helper_forward


def fla_forwards(inputs: tuple, cu, l2norm: bool) -> tuple:
    """FLA's (autograd forward, forward under no_grad) and a note (how heads were given)."""
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    heads, value_heads = inputs[0].shape[1], inputs[2].shape[1]
    cu64 = cu.long()
    note = "native"

    def call(q, k, v, g, beta, expand):
        if expand and value_heads != heads:
            q = q.repeat_interleave(value_heads // heads, dim=1)
            k = k.repeat_interleave(value_heads // heads, dim=1)
        o, _ = chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                      cu_seqlens=cu64, use_qk_l2norm_in_kernel=l2norm)
        return o[0]

    expand = False
    try:
        with torch.no_grad():
            call(*inputs, expand=False)
    except Exception as exc:  # noqa: BLE001 (FLA refusing HV > H: retry with repeated heads)
        if value_heads == heads:
            raise
        expand, note = True, f"q, k repeated to HV heads ({type(exc).__name__})"

    def autograd_forward(*args):
        return call(*args, expand=expand)

    def no_grad_forward():
        with torch.no_grad():
            return call(*inputs, expand=expand)

    return autograd_forward, no_grad_forward, note


def op_calls(autograd_forward, plain_forward, inputs: tuple, dout) -> dict:
    """op -> a call timed as one interval (the module docstring says what each holds)."""
    import torch
    import torch.utils.checkpoint

    retained = autograd_forward(*inputs)

    def bwd():
        return torch.autograd.grad(retained, inputs, dout, retain_graph=True)

    def fwd_bwd():
        return torch.autograd.grad(autograd_forward(*inputs), inputs, dout)

    def ckpt():
        out = torch.utils.checkpoint.checkpoint(autograd_forward, *inputs, use_reentrant=False)
        return torch.autograd.grad(out, inputs, dout)

    return {"fwd": plain_forward, "bwd": bwd, "fwd+bwd": fwd_bwd, "ckpt": ckpt}


def peak_bytes(fn) -> int:
    """Bytes one call of ``fn`` allocates at its peak beyond what was allocated before."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def check_agreement(outputs: dict) -> dict:
    """Max |impl - first| / max |first| of each forward output: a sanity check of the setup."""
    names = list(outputs)
    base = outputs[names[0]].float()
    scale = base.abs().max().item()
    return {name: (outputs[name].float() - base).abs().max().item() / scale for name in names[1:]}


def run(shapes, *, impls, ops, docs: int, iters: int, l2norm: bool, bench,
        head_dims: tuple = HEAD_DIMS, record=None) -> list:
    """The rows of every shape, op and implementation; ``record(rows)``, when given, after each
    op's rows (FLA's first-call autotuning can take minutes a shape)."""
    import torch

    rows = []
    head_k, head_v = head_dims
    for heads, value_heads, tokens in shapes:
        inputs, dout, cu = make_inputs(heads, value_heads, tokens, docs, head_dims)
        calls, notes, forwards = {}, {}, {}
        for impl in impls:
            try:
                if impl == "fla":
                    autograd_forward, plain, notes[impl] = fla_forwards(inputs, cu, l2norm)
                else:
                    autograd_forward, plain = cake_forwards(impl, inputs, cu, l2norm)
                    notes[impl] = ""
                forward = plain()
                found = op_calls(autograd_forward, plain, inputs, dout)
                if set(ops) - {"fwd"}:  # a backward that refuses (FLA on Hopper with Triton
                    found["fwd+bwd"]()  # < 3.7.1) is found here, not in the middle of timing
                forwards[impl], calls[impl] = forward, found
            except Exception as exc:  # noqa: BLE001 (a peer that fails is reported and skipped)
                print(f"{impl}: skipped at H={heads} HV={value_heads} T={tokens}: "
                      f"{type(exc).__name__}: {exc}", flush=True)
        if not calls:
            continue
        agreement = check_agreement(forwards) if len(forwards) > 1 else {}
        for op in ops:
            fns = {impl: calls[impl][op] for impl in calls}
            timings = bench.interleaved(fns, iters=iters, warmup=WARMUP)
            for impl, timing in timings.items():
                rows.append({"H": heads, "HV": value_heads, "K": head_k, "V": head_v,
                             "T": tokens, "docs": docs, "op": op,
                             "impl": impl, "ms": timing.median, "spread": timing.spread,
                             "peak MiB": peak_bytes(fns[impl]) / 2**20,
                             "fwd max rel diff": agreement.get(impl, 0.0),
                             "note": notes[impl]})
            print(harness.format_table(rows[-len(timings):]), flush=True)
            if record:
                record(rows)
        del inputs, dout, cu, calls, forwards
        torch.cuda.empty_cache()
    return rows


def peer_versions() -> dict:
    """The Triton and FLA this process imports (None: not importable): FLA's backward is only
    right on Hopper with Triton >= 3.7.1, so every result file says which one ran."""
    return harness.versions(("triton", "fla"))


def precompile() -> None:
    import cake.cake_gdn_det_train as det
    import cake.cake_gdn_nondet_train as nondet

    count = harness.precompile([Path(det.__file__).parent, Path(nondet.__file__).parent])
    print(f"precompiled {count} programs")


def table(paths) -> str:
    """One Markdown table (T, H, HV, K, V, op, ms per implementation, peak MiB, speed-up of
    cake-det over FLA) from the rows of several ``--json`` files."""
    rows = []
    for path in paths:
        rows += json.loads(Path(path).read_text())["rows"]
    merged = {}
    for row in rows:
        dims = {"K": row.get("K", HEAD_DIMS[0]), "V": row.get("V", HEAD_DIMS[1])}
        key = (row["T"], row["H"], row["HV"], dims["K"], dims["V"], row["op"])
        merged.setdefault(key, {"T": row["T"], "H": row["H"], "HV": row["HV"], **dims,
                                "op": row["op"]})
        merged[key][f"{row['impl']} ms"] = row["ms"]
        merged[key][f"{row['impl']} peak MiB"] = row["peak MiB"]
    for entry in merged.values():
        if "fla ms" in entry and "cake-det ms" in entry:
            entry["cake-det x fla"] = entry["fla ms"] / entry["cake-det ms"]
    return harness.format_table(list(merged.values()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", type=parse_list(IMPLS, "--impls"), default=list(IMPLS))
    parser.add_argument("--ops", type=parse_list(OPS, "--ops"), default=list(OPS))
    parser.add_argument("--shapes", type=parse_shapes, default=list(SHAPES),
                        help="'all' or H:HV:T,... (default: the four shapes of the GPU issue)")
    parser.add_argument("--head-dims", type=parse_head_dims, default=HEAD_DIMS,
                        help="K:V (default 128:128)")
    parser.add_argument("--docs", type=parse_docs, default=4, help="documents per pack, 3 .. 6")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--no-l2norm", action="store_true", help="qk_l2norm off for every impl")
    parser.add_argument("--json", type=Path,
                        help="write the numbers here (after every op; complete once the run ends)")
    parser.add_argument("--precompile", action="store_true", help="JIT both families and exit")
    parser.add_argument("--table", nargs="+", type=Path, metavar="JSON",
                        help="print one table from the rows of these --json files and exit")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters: expected at least 1")
    if args.table:
        print(table(args.table))
        return 0
    try:
        import torch
    except ImportError:
        parser.error("torch is not installed")
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU: this benchmark times GPU kernels")
    if args.precompile:
        precompile()
        return 0
    bench = harness.Bench()
    record = harness.recorder(args.json, {"l2norm": not args.no_l2norm, **peer_versions(),
                                          **harness.device_summary()}) if args.json else None
    rows = run(args.shapes, impls=args.impls, ops=args.ops, docs=args.docs, iters=args.iters,
               l2norm=not args.no_l2norm, bench=bench, head_dims=args.head_dims, record=record)
    print()
    print(harness.format_table(rows))
    if record:
        record(rows, complete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
