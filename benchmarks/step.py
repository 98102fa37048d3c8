"""One training step (forward + backward + AdamW update) of a GTransformer, three ways, measured in one run:

* ``fast``:      torchformer's default attention (``scaled_dot_product_attention``)
* ``reference``: torchformer's readable matmul-softmax-matmul attention (``impl="reference"``)
* ``torch``:     ``torch.nn.TransformerEncoder`` of the same size with a causal mask, between the same embedding
                 and output layers

Every configuration runs in its own subprocess so that its peak memory is its own (CUDA: peak allocated;
CPU: peak resident set size of the process, which includes the ~0.3 GB of the Python + torch runtime).

    python benchmarks/step.py                       # CPU defaults: emb 256, 8 heads, depth 4, context 256 and 1024
    python benchmarks/step.py --device cuda --bf16  # on a GPU, with bf16 autocast
    python benchmarks/step.py --kinds fast rotary alibi relative rms swiglu relu2 gqa window   # the parts' cost
    python benchmarks/step.py --contexts 256 --kinds fast modern torch   # the presets' four parts together

For MFU on a GPU (``--compile`` also uses the fused AdamW, as the examples' training loops do): ``--batch-sizes``
measures the given batch sizes in order, each in its own subprocess, and stops at the first that runs out of
memory, or that is not at least 2 % faster than the best so far (more would not help); the best one is marked.
``--kinds fast moe --experts 8 --top-k 2 --expert-hidden H --set ff_hidden=2H`` compares a mixture of experts
with the dense network as wide as the experts a token uses (MFU counts the active parameters, those one token is
multiplied with). ``--set KEY=VALUE`` passes GTransformer options (JSON values), ``--json PATH`` writes every row, and
``--time-limit S`` leaves out the batch sizes that would not finish within S seconds of the start:

    python benchmarks/step.py --device cuda --bf16 --compile --kinds fast --contexts 1024 --emb 768 --heads 12 \
        --depth 12 --batch-sizes 8 16 32 64 --set prenorm=true --json step.json

MFU is ``6N + 12 L H Q T`` FLOPs per token (``torchformer.train.flops``) times tokens/s over the device's dense bf16
peak (``--peak-tflops``, default: read from the GPU's name); CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from torchformer import GTransformer, MoETransformer
from torchformer.nn.moe import MoEOptions
from torchformer.train.flops import (
    active_matmul_parameters, flops_per_token, matmul_parameters, mfu, model_flops_per_token, peak_bf16_tflops,
)


class TorchEncoderLM(nn.Module):
    """The same language model as GTransformer, but with torch.nn.TransformerEncoder as its stack of blocks."""

    def __init__(self, emb: int, heads: int, depth: int, seq_length: int, num_tokens: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(num_tokens, emb)
        self.positions = nn.Embedding(seq_length, emb)
        layer = nn.TransformerEncoderLayer(emb, heads, 4 * emb, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.toprobs = nn.Linear(emb, num_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return F.log_softmax(self.toprobs(h), dim=-1)


# The parts of current models (docs/relative-positions.md, docs/modern-blocks.md), each on the fast path: compare
# with "fast" in the same run to get the cost of the part.
PARTS = {
    "rotary": dict(positions="rotary"),
    "alibi": dict(positions="alibi"),
    "relative": dict(positions="relative"),
    "rms": dict(norm="rms"),
    "relu2": dict(activation="relu2"),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "gqa": dict(kv_heads=2),
    "window": dict(window=128),
    "prenorm": dict(prenorm=True),
    # The presets' architecture (examples/generate_enwik8.py): all four modern parts at once.
    "modern": dict(positions="rotary", norm="rms", activation="swiglu", prenorm=True),
}


def build(kind: str, args, context: int) -> nn.Module:
    if kind == "torch":
        return TorchEncoderLM(args.emb, args.heads, args.depth, context, 256)
    options = dict(args.set)  # --set KEY=VALUE: the same options for every torchformer kind
    if kind == "moe":  # the mixture's own sizes; --set ff_hidden=K*H makes "fast" the dense network of its width
        experts = MoEOptions(experts=args.experts, top_k=args.top_k, expert_hidden=args.expert_hidden)
        return MoETransformer(args.emb, args.heads, args.depth, context, 256,
                              **{"activation": "swiglu", **options, "options": (experts,)})
    if kind in PARTS:
        return GTransformer(args.emb, args.heads, args.depth, context, 256, **{**options, **PARTS[kind]})
    impl = "sdpa" if kind == "fast" else "reference"
    return GTransformer(args.emb, args.heads, args.depth, context, 256, **{**options, "impl": impl})


def step_flops(kind: str, model: nn.Module, args, context: int) -> int:
    """Training FLOPs per token, ``6N + 12 L H Q T``; torch.nn's attention layers are not torchformer's, so that
    model is counted from its sizes."""
    if kind == "torch":
        return flops_per_token(params=matmul_parameters(model), layers=args.depth, attention_width=args.emb,
                               context=context)
    return model_flops_per_token(model, context=context)


def parse_option(text: str) -> tuple[str, object]:
    """``--set KEY=VALUE``: VALUE is read as JSON (``true``, ``2``, ``"rotary"``), else taken as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. positions=rotary), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)"


def run_one(args) -> dict:
    """Time ``args.steps`` training steps of one (kind, context) configuration; runs in its own process."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    context = args.context
    batch = args.batch or args.tokens // args.context
    model = build(args.kind, args, context).to(device)
    # --compile stands for the examples' training loops: a compiled model and, on CUDA, the fused optimizer.
    fused = True if args.compile and device.type == "cuda" else None  # None: torch's default
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    net = torch.compile(model, backend=args.backend) if args.compile else model
    x = torch.randint(0, 256, (batch, context), device=device)
    y = torch.randint(0, 256, (batch, context), device=device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.bf16 else torch.autocast("cpu", enabled=False)

    def step() -> None:
        with amp:
            loss = F.nll_loss(net(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    ms = 1000 * statistics.median(times)
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    tok_s = batch * context / ms * 1000
    flops = step_flops(args.kind, model, args, context)
    peak = args.peak_tflops or (peak_bf16_tflops(device_name(device)) if device.type == "cuda" else None)
    return {"kind": args.kind, "context": context, "batch": batch, "ms": ms, "tok_s": tok_s, "peak_mb": peak_mb,
            "parameters": sum(p.numel() for p in model.parameters()),
            "active_parameters": active_matmul_parameters(model), "flops_per_token": flops,
            "peak_tflops": peak, "mfu": mfu(tok_s, flops, peak_tflops=peak) if peak else None}


def measure(kind: str, context: int, batch: int | None, timeout: float | None) -> dict:
    """Run one configuration in a subprocess of its own; a row with ``"error"`` if it runs out of memory (CUDA),
    fails or passes ``timeout`` seconds."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--kind", kind, "--context", str(context)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    row = {"kind": kind, "context": context, "batch": batch}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"did not finish within the --time-limit ({timeout:.0f} s left)"}
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    if "out of memory" in done.stderr.lower():  # torch.OutOfMemoryError: "CUDA out of memory. Tried to ..."
        return {**row, "error": "out of memory"}
    if batch is None:  # a plain run (no search) fails loudly, as it always did
        raise SystemExit(f"{kind} at context {context} failed:\n{done.stderr[-3000:]}")
    return {**row, "error": f"failed: {done.stderr.strip().splitlines()[-1][-300:] if done.stderr.strip() else ''}"}


def search(kind: str, context: int, batch_sizes: list[int], deadline: float | None) -> list[dict]:
    """The rows of ``batch_sizes`` in order, stopping at the first that fails (e.g. runs out of memory) or is not
    2 % faster than the best so far, or that would not finish before ``deadline`` (a ``time.monotonic()``)."""
    rows: list[dict] = []
    last_s = 0.0
    for batch in batch_sizes:
        left = None if deadline is None else deadline - time.monotonic()
        # The next (larger) batch takes at least as long as the last one did: do not start what cannot finish.
        if left is not None and left < last_s:
            rows.append({"kind": kind, "context": context, "batch": batch, "error": "skipped: not enough time left "
                         f"in --time-limit ({left:.0f} s left, the last size took {last_s:.0f} s)"})
            break
        tic = time.monotonic()
        row = measure(kind, context, batch, left)
        last_s = time.monotonic() - tic
        row["seconds"] = round(last_s, 1)
        best = max((r["tok_s"] for r in rows if "error" not in r), default=None)
        rows.append(row)
        if "error" in row or (best is not None and row["tok_s"] < 1.02 * best):
            break
    done = [r for r in rows if "error" not in r]
    if done:
        max(done, key=lambda r: r["tok_s"])["best"] = True
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch (batch size = tokens // context)")
    p.add_argument("--batch-sizes", type=int, nargs="+", help="instead of --tokens: these batch sizes in order, "
                   "until one runs out of memory or is not 2%% faster than the best so far")
    p.add_argument("--kinds", nargs="+", default=["fast", "reference", "torch"],
                   help=f"fast, reference, torch, moe (a mixture of experts), or a part on the fast path: "
                        f"{', '.join(PARTS)}")
    p.add_argument("--experts", type=int, default=8, help="moe: the routed experts E")
    p.add_argument("--top-k", type=int, default=2, help="moe: the experts each token goes to")
    p.add_argument("--expert-hidden", type=int, help="moe: an expert's hidden size (default: the dense network's)")
    p.add_argument("--set", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
                   help="a GTransformer option for the torchformer kinds, e.g. --set positions=rotary --set "
                        "prenorm=true (repeatable; VALUE is JSON)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (and, on CUDA, fused AdamW)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend for --compile (eager: a quick "
                   "check that the step compiles, no speed-up)")
    p.add_argument("--peak-tflops", type=float, help="peak for MFU (default: the GPU's dense bf16 peak, from its "
                   "name; no MFU on the CPU)")
    p.add_argument("--time-limit", type=float, help="seconds: leave out the configurations that would not finish "
                   "in this time from the start (default: no limit)")
    p.add_argument("--json", type=Path, help="also write the rows, device and torch version to this JSON file")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--kind", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    p.add_argument("--context", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.set = dict(args.set)
    for name in ("batch_sizes", "contexts"):
        if any(v < 1 for v in getattr(args, name) or []):
            p.error(f"--{name.replace('_', '-')} must be positive ints, got {getattr(args, name)}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        p.error(f"--peak-tflops must be a positive number (TFLOP/s), got {args.peak_tflops}")
    if args.backend != "inductor" and not args.compile:
        p.error("--backend is a torch.compile backend: use it with --compile")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kind:
        print(json.dumps(run_one(args)))
        return

    device = torch.device(args.device)
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    options = "".join(f", {k}={v}" for k, v in args.set.items())
    size = f"batch sizes {args.batch_sizes}" if args.batch_sizes else f"{args.tokens} tokens/step"
    print(f"# GTransformer training step: emb {args.emb}, heads {args.heads}, depth {args.depth}{options}, "
          f"{size}, device {args.device}{', bf16 autocast' if args.bf16 else ''}"
          f"{', compiled (' + args.backend + ')' if args.compile else ''}, "
          f"torch {torch.__version__}, median of {args.steps} steps after {args.warmup} warm-up")
    show_mfu = device.type == "cuda" or args.peak_tflops is not None
    print("| context | batch | implementation | ms/step | tokens/s | peak memory (MB) | vs torch.nn | time vs fast |"
          + (" MFU |" if show_mfu else ""))
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if show_mfu else ""))
    every: list[dict] = []
    for context in args.contexts:
        rows = []
        for kind in args.kinds:
            if args.batch_sizes:
                rows += search(kind, context, args.batch_sizes, deadline)
            else:
                left = None if deadline is None else deadline - time.monotonic()
                rows.append(measure(kind, context, None, left))
        every += rows
        for r in rows:
            if "error" in r:
                print(f"| {r['context']} | {r['batch'] or args.tokens // context} | {r['kind']} | {r['error']} |",
                      flush=True)
                continue
            # Ratios compare implementations at the same batch size.
            same = [o for o in rows if o["batch"] == r["batch"] and "error" not in o]
            base = next((o["ms"] for o in same if o["kind"] == "torch"), None)
            fast = next((o["ms"] for o in same if o["kind"] == "fast"), None)
            ratio = f"{base / r['ms']:.2f}x" if base else "-"
            cost = f"{r['ms'] / fast:.2f}x" if fast else "-"  # > 1: the part makes the step slower
            best = " (best)" if r.get("best") else ""
            share = (f" {r['mfu']:.1%} |" if r["mfu"] is not None else " - |") if show_mfu else ""
            print(f"| {r['context']} | {r['batch']}{best} | {r['kind']} | {r['ms']:.1f} | {r['tok_s']:,.0f} | "
                  f"{r['peak_mb']:,.0f} | {ratio} | {cost} |{share}", flush=True)
    if args.json:
        report = {"device": device_name(device), "torch": torch.__version__, "options": args.set,
                  "emb": args.emb, "heads": args.heads, "depth": args.depth, "bf16": args.bf16,
                  "compile": args.compile, "rows": every}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
