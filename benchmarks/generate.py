"""Tokens per second of ``torchformer.generate`` (a ``GTransformer``) with and without the KV cache.

For each context length ``C`` a randomly initialised model (``seq_length=C``) is given a prompt of ``C - new``
tokens and generates ``new`` tokens greedily, so the last token is generated with a full context. Without the
cache every token costs a forward pass over up to ``C`` positions; with it, one position. The time includes
processing the prompt (one forward pass in both cases), as a user calling ``generate`` would see it.

    python benchmarks/generate.py                     # CPU, contexts 256 and 1024
    python benchmarks/generate.py --device cuda

Two more columns use :class:`~torchformer.decoding.compiled.StaticCacheGenerator`: the same cache, kept between
calls instead of allocated per call ("static"), and with ``--compile`` its one-token step compiled by
``torch.compile`` ("compiled"; ``--mode reduce-overhead`` adds CUDA graphs on a GPU). Compilation happens in the
warm-up and is not timed.

    python benchmarks/generate.py --compile
    python benchmarks/generate.py --device cuda --compile --mode reduce-overhead

``--kv-heads K`` (grouped-query attention), ``--positions``, and ``--latent-rank R --rope-dim D`` (latent attention,
DeepSeek's MLA, whose cache holds ``R + D`` numbers per token and layer; ``--absorb`` for its absorbed path) choose
the attention, e.g. MLA against GQA of the same cache size:

    python benchmarks/generate.py --latent-rank 48 --rope-dim 16 --absorb
    python benchmarks/generate.py --kv-heads 1 --positions rotary

``--against transformers`` times the same random checkpoints in both libraries instead: a GPT-2-shaped and a
Llama-shaped model (grouped-query attention, 8 query and 2 key/value heads) written by ``transformers`` and read
by ``torchformer.from_huggingface``, greedy, in alternating rounds, at batch 1 and 16 after a 16-token prompt and
at batch 1 after a 1,000-token one; it reports both libraries' tokens/s, their ratio and whether the tokens agree:

    python benchmarks/generate.py --against transformers --threads 1
    python benchmarks/generate.py --against transformers --threads 1 --compile   # and the compiled step

``--json PATH`` also writes the rows (tokens/s of each variant, the speed-ups, any token mismatches), the device
and the torch version to a JSON file; ``--backend eager`` checks that the step compiles without the time inductor
takes (no speed-up).

All variants alternate within one process, so their ratios are meaningful even on a busy machine. Every variant
should produce the tokens of the uncached run; the benchmark says so if one does not (in float32 a near-tie
between two tokens of the random model can flip a greedy choice).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from torchformer.decoding.compiled import StaticCacheGenerator
from torchformer.decoding.generation import generate
from torchformer.families import LatentTransformer
from torchformer.models import GTransformer
from torchformer.nn.latent import LatentOptions


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def build(args: argparse.Namespace, context: int) -> GTransformer:
    """The model the flags describe: a GTransformer, or a LatentTransformer with --latent-rank."""
    if args.latent_rank is None:
        return GTransformer(args.emb, args.heads, args.depth, context, args.vocab, kv_heads=args.kv_heads,
                            positions=args.positions)
    model = LatentTransformer(args.emb, args.heads, args.depth, context, args.vocab, positions="rotary",
                              options=(LatentOptions(kv_rank=args.latent_rank, rope_dim=args.rope_dim),))
    for attention in model.self_attention_layers():
        attention.absorb = args.absorb
    return model


def cache_values(args: argparse.Namespace) -> int:
    """Numbers the cache holds per token and layer: the latent and the rotary key, or each key/value head's two."""
    if args.latent_rank is not None:
        return args.latent_rank + args.rope_dim
    return 2 * (args.kv_heads or args.heads) * (args.emb // args.heads)


SHAPES = {  # (transformers' config class, its arguments): 6 layers of width 512, a vocabulary of 8,000
    "gpt2": ("GPT2Config", dict(n_embd=512, n_layer=6, n_head=8, n_positions=2048, vocab_size=8000, bos_token_id=0,
                                eos_token_id=0)),
    "llama": ("LlamaConfig", dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                                  intermediate_size=1536, max_position_embeddings=2048, vocab_size=8000)),
}
SETTINGS = [(1, 16), (16, 16), (1, 1000)]  # (batch, prompt length)
# --toy: the same code at sizes a test runs in seconds (1 layer of width 32, a vocabulary of 64; short prompts).
TOY = {"gpt2": dict(n_embd=32, n_layer=1, n_head=2), "llama": dict(hidden_size=32, num_hidden_layers=1,
       num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)}
TOY_SETTINGS = [(1, 4), (2, 4)]


def against_transformers(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """torchformer's ``generate`` against transformers' on the same checkpoints, in alternating rounds."""
    import tempfile

    import transformers

    from torchformer import from_huggingface

    print(f"transformers {transformers.__version__}; greedy, {args.new_tokens} new tokens, median of "
          f"{args.repeats} alternating rounds (a ratio: the median of each round's)"
          + ("; compiled: torchformer's StaticCacheGenerator(compile=True), compiled in the warm-up" if args.compile
             else "") + "\n")
    compiled = ["compiled (tok/s)", "compiled ratio"] if args.compile else []
    print("| shape | batch | prompt | transformers (tok/s) | torchformer (tok/s) | ratio | "
          + "".join(f"{c} | " for c in compiled) + "same tokens |")
    print("|---|--:|--:|--:|--:|--:|" + "--:|" * len(compiled) + "--:|")
    rows = []
    for shape in args.shapes:
        config_class, options = SHAPES[shape]
        if args.toy:
            options = {**options, **TOY[shape], "vocab_size": 64}
        config = getattr(transformers, config_class)(**options)
        torch.manual_seed(0)
        theirs = transformers.AutoModelForCausalLM.from_config(config).to(device).eval()
        with tempfile.TemporaryDirectory() as folder:
            theirs.save_pretrained(folder)
            ours = from_huggingface(folder).to(device).eval()
        static = (StaticCacheGenerator(ours, compile=True, mode=args.mode, backend=args.backend) if args.compile
                  else None)
        for batch, length in TOY_SETTINGS if args.toy else SETTINGS:
            prompt = torch.randint(0, config.vocab_size, (batch, length), device=device)
            new = args.new_tokens

            def run_theirs() -> torch.Tensor:
                with torch.no_grad():
                    return theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                           min_new_tokens=new, do_sample=False, pad_token_id=0)

            runs = {"theirs": run_theirs, "ours": lambda: generate(ours, prompt, new, temperature=0)}
            if static is not None:
                runs["compiled"] = lambda: static.generate(prompt, new, temperature=0)
            reference = run_theirs()
            # The warm-up (and compilation), and the share of torchformer's tokens equal to transformers'.
            same = min((run() == reference)[:, length:].float().mean().item() for run in list(runs.values())[1:])
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    times[name].append(timed(run, device))
            rate = {k: batch * new / statistics.median(v) for k, v in times.items()}
            # The ratio of each round's pair, then their median: a machine that speeds up or slows down between
            # rounds moves both runs of a pair alike.
            ratio = {k: statistics.median(a / b for a, b in zip(times["theirs"], times[k])) for k in runs}
            extra = f"{rate['compiled']:.1f} | {ratio['compiled']:.2f}x | " if static is not None else ""
            print(f"| {shape} | {batch} | {length} | {rate['theirs']:.1f} | {rate['ours']:.1f} | "
                  f"{ratio['ours']:.2f}x | {extra}{100 * same:.0f} % |", flush=True)
            rows.append({"shape": shape, "batch": batch, "prompt": length, "tok_s": rate, "ratio": ratio["ours"],
                         **({"compiled_ratio": ratio["compiled"]} if static is not None else {}),
                         "same_tokens": same})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'cuda:1', ...")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting; the median is reported")
    parser.add_argument("--emb", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--kv-heads", type=int, help="grouped-query attention with this many key/value heads")
    parser.add_argument("--positions", default="learned", help="learned, rotary, ... (GTransformer's positions)")
    parser.add_argument("--latent-rank", type=int, help="latent attention (DeepSeek's MLA) with a latent of this "
                        "size; rotary positions")
    parser.add_argument("--rope-dim", type=int, default=16, help="with --latent-rank: the rotary key's size")
    parser.add_argument("--absorb", action="store_true", help="with --latent-rank: attention on the latents (the "
                        "absorbed decoding path)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: its choice)")
    parser.add_argument("--compile", action="store_true", help="also time the compiled static-cache step")
    parser.add_argument("--mode", default=None, help="torch.compile mode for --compile (e.g. reduce-overhead)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend for --compile")
    parser.add_argument("--json", type=Path, help="also write the rows, device and torch version to this JSON file")
    parser.add_argument("--against", choices=["transformers"], help="time the same checkpoints in transformers "
                        "(a test dependency) instead of the cache variants")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES),
                        help="with --against: the checkpoints' shapes (default both)")
    parser.add_argument("--toy", action="store_true", help="with --against: tiny checkpoints and prompts (a test of "
                        "the benchmark itself, not a measurement)")
    args = parser.parse_args()
    if args.mode is not None and not args.compile:
        parser.error("--mode is a torch.compile mode: use it with --compile")
    if args.backend != "inductor" and not args.compile:
        parser.error("--backend is a torch.compile backend: use it with --compile")
    if args.latent_rank is None and args.absorb:
        parser.error("--absorb is latent attention's decoding path: use it with --latent-rank")
    if args.latent_rank is not None and args.kv_heads is not None:
        parser.error("--kv-heads and --latent-rank are two kinds of attention: give one")
    if args.toy and not args.against:
        parser.error("--toy sizes the --against checkpoints: use it with --against transformers")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.against:
        print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, device {device}, "
              f"threads {torch.get_num_threads()}")
        rows = against_transformers(args, device)
        if args.json:
            args.json.write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                             "threads": torch.get_num_threads(), "rows": rows}, indent=2) + "\n")
        return

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, device {device}, "
          f"threads {torch.get_num_threads()}")
    attention = (f"latent {args.latent_rank} + rotary key {args.rope_dim}{' absorbed' if args.absorb else ''}"
                 if args.latent_rank else f"{args.kv_heads or args.heads} key/value heads, {args.positions}")
    print(f"model: emb {args.emb}, heads {args.heads}, depth {args.depth}, vocab {args.vocab}, {attention}; "
          f"cache {cache_values(args)} values per token and layer; batch {args.batch}, "
          f"{args.new_tokens} new tokens, greedy, median of {args.repeats}"
          + (f"; compile mode {args.mode}" if args.compile else "") + "\n")
    names = ["no cache", "cache", "static"] + (["compiled"] if args.compile else [])
    print("| context | prompt | " + " | ".join(f"{n} (tok/s)" for n in names) + " | cache / no cache | "
          + " | ".join(f"{n} / no cache" for n in names[2:]) + " |")
    print("|--:|--:|" + "--:|" * (2 * len(names) - 1))
    rows = []
    for context in args.contexts:
        if args.new_tokens >= context:
            raise ValueError(f"--new-tokens must be smaller than every context, got {args.new_tokens} >= {context}")
        model = build(args, context).to(device).eval()
        prompt = torch.randint(0, args.vocab, (args.batch, context - args.new_tokens), device=device)
        static = StaticCacheGenerator(model)
        runs = {
            "no cache": lambda n: generate(model, prompt, n, temperature=0, use_cache=False),
            "cache": lambda n: generate(model, prompt, n, temperature=0),
            "static": lambda n: static.generate(prompt, n, temperature=0),
        }
        if args.compile:
            compiled = StaticCacheGenerator(model, compile=True, mode=args.mode, backend=args.backend)
            runs["compiled"] = lambda n: compiled.generate(prompt, n, temperature=0)
        reference = runs["no cache"](args.new_tokens)
        agreement = {}
        for name, run in runs.items():  # warm-up (allocator, kernels, compilation) and a check of the tokens
            same = (run(args.new_tokens) == reference)[:, -args.new_tokens :].float().mean().item()
            agreement[name] = same
            if same < 1:
                print(f"note: {name} generated {100 * same:.1f} % of the uncached run's tokens (near-ties)")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                times[name].append(timed(lambda: run(args.new_tokens), device))
        rate = {name: args.batch * args.new_tokens / statistics.median(t) for name, t in times.items()}
        print(f"| {context} | {prompt.size(1)} | " + " | ".join(f"{rate[n]:.1f}" for n in names) + " | "
              + " | ".join(f"{rate[n] / rate['no cache']:.1f}x" for n in names[1:]) + " |", flush=True)
        rows.append({"context": context, "prompt": prompt.size(1), "batch": args.batch, "tok_s": rate,
                     "speedup": {n: rate[n] / rate["no cache"] for n in names[1:]},
                     "same_tokens_as_no_cache": agreement})
    if args.json:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
            f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)")
        report = {"device": name, "torch": torch.__version__, "emb": args.emb, "heads": args.heads,
                  "attention": attention, "cache_values": cache_values(args),
                  "depth": args.depth, "new_tokens": args.new_tokens, "compile": args.compile, "mode": args.mode,
                  "backend": args.backend if args.compile else None, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
