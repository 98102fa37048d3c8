"""Train a character-level GTransformer on enwik8: evaluate in bits per byte, checkpoint, resume, sample.

    python examples/generate_enwik8.py                       # bundled 300 KB sample; cpu/gpu preset by device
    python examples/generate_enwik8.py -D enwik8.zip --preset gpu --compile --checkpoint runs/ckpt --final
    python examples/generate_enwik8.py --generate "The history of " --length 500 --temperature 0.8
    torchrun --standalone --nproc_per_node 8 examples/generate_enwik8.py -D enwik8.zip --preset gpu --strategy fsdp

Training always leaves the final model in ``--out`` (``model.pt``); ``--generate`` continues a prompt with it (or
with the latest checkpoint in ``--checkpoint``) in seconds.

The flags of Peter Bloem's ``former`` (experiments/generate.py) keep their meaning. ``--preset`` fills in every flag
you do not give; an explicit flag always wins. See docs/enwik8.md and the "generate_enwik8.py" section of
examples/README.md for measured results.

Under ``torchrun`` every process trains on its share of each batch: ``-b`` is the global batch (each of N processes
computes ``b / N`` of its sequences) and the learning rate is not scaled, so the same flags take the same steps on
any number of processes. Only the main process prints and writes files; docs/going-big.md says more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from torchformer import DeepSeekTransformer, GTransformer, LatentTransformer, MoETransformer, generate, load_model
from torchformer.decoding.generation import MemoryStep
from torchformer.config import POSITIONS, ROTARY
from torchformer.nn.auxiliary import auxiliary_loss, auxiliary_statistics
from torchformer.nn.latent import LatentOptions
from torchformer.nn.moe import MoEOptions
from torchformer.data import default_root, enwik8, enwik8_sample, random_batches
from torchformer.train.evaluation import bits_per_byte
from torchformer.train.flops import mfu, model_flops_per_token
from torchformer.scripts.cli import (
    POSITIVE, POSITIVE_INT, WRITABLE_FOLDER, check_flags, check_model_fits, check_outputs, choose_threads,
    flags_as_saved, preset_epilog, preset_flags, remove_interrupted_saves, utf8_text,
)
from torchformer.train.distributed import STRATEGIES, all_reduce_mean, teardown_distributed, wrap_model
from torchformer.train.distributed_checkpoint import load_distributed_checkpoint, save_distributed_checkpoint
from torchformer.scripts.launch import (
    NoLog, average_over_processes, describe_run, seed_each_process, share_batch, start_run,
)
from torchformer.train.training import (
    CSVLogger, CheckpointClock, TrainingDiverged, autocast, check_finite_losses, checkpoint_path, count_parameters,
    latest_intact_checkpoint, plot_curves, progress, prune_checkpoints, resolve_device, resume_schedule,
    warmup_cosine, warmup_stable_decay,
)
from torchformer.train.checkpoint import read_checkpoint
from torchformer.train.optimizers import OPTIMIZERS, make_optimizer

PRESETS = {
    # Measured on 2 CPU cores (docs/enwik8.md, 2026-11-27): 2.1510 and 2.1708 validation bits per byte on
    # enwik8_prefix (seeds 1, 2; 2.1469 and 2.1365 with the gated width 341 of before that day); at width 341 with
    # a cosine schedule 2.1500 and 2.1527 (9.2 min of training); with Adam and no kqnorm 2.2211; with learned
    # positions, LayerNorm and ReLU 2.34.
    "cpu": dict(num_batches=2000, batch_size=32, learn_rate=5e-3, lr_warmup=50, embedding=128, heads=4, depth=4,
                context=128, dropout=0.0, kqnorm=True, optimizer="muon", schedule="wsd", positions="rotary",
                norm="rms", activation="swiglu",
                test_every=500, test_subset=20_000),
    # For one H100/H200 (bf16), trained for a fixed time. Measured on one H100 with --minutes 5: 1.262 test bits
    # per byte on the Wikipedia stand-in corpus, 1.0M tokens/s, 30.5% MFU (docs/enwik8.md). Without kqnorm, learning
    # rate 1.5e-3 gave loss spikes from step 6,900 on; 6e-4 learned more slowly.
    # The architecture is the CPU measurement's winner (rotary, RMSNorm, SwiGLU), NOT yet run on a GPU: the figures
    # above are of learned positions, LayerNorm and ReLU.
    "gpu": dict(minutes=10.0, batch_size=32, learn_rate=1e-3, lr_warmup=1000, embedding=512, heads=8, depth=12,
                context=1024, dropout=0.0, kqnorm=True, optimizer="adam", positions="rotary", norm="rms",
                activation="swiglu",
                test_every=2000, test_subset=100_000),
}

# The bundled sample (270 KB of training text) is learned by heart long before the CPU preset's 2,000 steps: on it,
# validation went 2.48 -> 2.58 -> 3.11 -> 3.70 bits/byte at steps 500, 1000, 1500, 2000 while the training loss kept
# falling (issue 31, AMD EPYC, 1 core). Without -N or --minutes a run on the sample stops at the best of those.
SAMPLE_STEPS = 500
# Validation rising at this many evaluations in a row (while training goes on) is reported as overfitting.
RISES = 2

# Must match to resume a checkpoint (a checkpoint of a run before these flags existed has the defaults).
ARCHITECTURE = ("embedding", "heads", "depth", "context", "kqnorm", "positions", "norm", "activation", "kv_heads",
                "window", "wide", "logit_cap", "sparse", "sparse_stride", "experts", "active_experts", "expert_hidden",
                "latent_rank", "rope_dim")
# Must match too, to resume exactly: they fix the batches, the dropout masks and the updates. (-N may change: it
# extends the run; --minutes is turned into -N.)
RUN_KEYS = ("batch_size", "accumulate", "lr_warmup", "gradient_clipping", "dropout", "seed", "optimizer",
            "schedule", "zero_init", "memory")
# What a run recorded before these flags existed trained with (a missing key means that, not "anything").
RUN_DEFAULTS = {"schedule": "cosine", "zero_init": False, "memory": None}
ARCHITECTURE_DEFAULTS = {"kqnorm": False, "positions": "learned", "norm": "layer", "activation": "relu",
                         "kv_heads": None, "window": None, "wide": False, "logit_cap": None,
                         "sparse": None, "sparse_stride": None, "experts": None, "active_experts": 2, "expert_hidden": None,
                         "latent_rank": None, "rope_dim": 16}
# loss: the training loss in nats per byte (what the optimizer sees); train_bpb: the same in bits per byte, the unit
# of val_bpb, so that the two curves can be compared.
COLUMNS = ["step", "loss", "train_bpb", "lr", "tokens_per_s", "val_bpb", "elapsed_s"]
MIN_TEMPERATURE = 1e-3  # below it sampling is greedy in all but name (and tiny ones overflow): 0 means greedy


# The valid values of each flag, checked before anything runs: {dest: (test, what the flag must be)}. A flag
# that is None (not given, and no preset sets it) is not checked.
CHECKS = {
    **dict.fromkeys(("num_batches", "batch_size", "embedding", "heads", "depth", "context", "kv_heads", "window",
                     "sparse_stride", "memory", "experts", "active_experts", "expert_hidden", "latent_rank", "rope_dim",
                     "test_every", "test_subset", "test_batch_size", "accumulate", "threads", "log_every",
                     "stop_after"), POSITIVE_INT),
    **dict.fromkeys(("minutes", "peak_tflops", "checkpoint_minutes", "logit_cap"), POSITIVE),
    "learn_rate": (lambda v: 0 < v < 1e30, "a positive number below 1e30"),  # larger ones overflow Adam's step
    "lr_warmup": (lambda v: v >= 0, "an int >= 0"),
    "dropout": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "gradient_clipping": (lambda v: 0 <= v < math.inf, "a number >= 0 (0: off)"),
    "sample_length": (lambda v: v >= 0, "an int >= 0 (0: no samples)"),
    "top_k": POSITIVE_INT,
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "temperature": (lambda v: v == 0 or MIN_TEMPERATURE <= v < math.inf,
                    f"0 (greedy) or a number >= {MIN_TEMPERATURE:g}"),
    "seed": (lambda v: 0 <= v < 2**32, "an int in [0, 2**32)"),
    "data": (lambda v: v.is_file() and os.access(v, os.R_OK), "a readable file"),
    "checkpoint": WRITABLE_FOLDER,
    "out": WRITABLE_FOLDER,
}


OUTPUTS = ("log.csv", "model.pt", "best.pt", "results.json", "loss.png")  # what a training run writes into --out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=preset_epilog(PRESETS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_flags(p, PRESETS)  # each flag's help ends with its default, or what each preset sets it to
    add("-N", "--num-batches", type=int, help="optimizer steps to train for")
    add("--minutes", type=float, help="instead of -N: train for about this many minutes (-N is set from the "
                                      "measured speed of a few steps; evaluation time does not count)")
    add("-b", "--batch-size", type=int, help="sequences per micro-batch, in all: under torchrun each of N processes "
        "computes b / N of them (the learning rate is not scaled)")
    add("-l", "--learn-rate", type=float, help="peak learning rate")
    add("--lr-warmup", type=int, help="linear warmup steps (then the --schedule: cosine decay to 10%%, or wsd)")
    add("--schedule", choices=("cosine", "wsd"), help="learning rate after the warmup: cosine decay to 10%%, or wsd "
        "(constant, then a linear decay to 0 over the last 20%% of the steps; default: the preset's, else cosine)")
    add("--zero-init", action=argparse.BooleanOptionalAction, default=False, help="start each block's attention "
        "and feed-forward output projections at zero, so each (pre-norm) block starts as the identity")
    add("--logit-cap", type=float, help="soft-cap the output logits at this size: cap * tanh(logits / cap) "
        "(default: none)")
    add("--optimizer", choices=OPTIMIZERS, help="adam, or muon: Muon for the blocks' matrices and Adam for the "
        "rest, one learning rate (torchformer.train.optimizers; default: the preset's, else adam)")
    add("-E", "--embedding", type=int, help="embedding size")
    add("-H", "--heads", type=int, help="attention heads")
    add("-d", "--depth", type=int, help="transformer blocks")
    add("-C", "--context", type=int, help="context length in bytes")
    add("--dropout", type=float, help="dropout rate")
    add("--positions", choices=POSITIONS,
        help="position scheme (docs/positions.md, docs/relative-positions.md)")
    add("--norm", choices=("layer", "rms"), help="LayerNorm or RMSNorm in the blocks (docs/modern-blocks.md)")
    add("--activation", choices=("relu", "gelu", "relu2", "swiglu", "geglu"), help="feed-forward nonlinearity")
    add("--kv-heads", type=int, help="key/value heads (grouped-query attention; default: --heads)")
    add("--window", type=int, help="sliding-window attention: each byte sees the last N bytes (default: all)")
    add("--memory", type=int, help="Transformer-XL's segment memory of N positions: train on -b contiguous streams "
        "of the data, a segment of -C bytes per step, every layer also attending over the N positions before the "
        "segment (kept without gradients; docs/long-context.md); evaluation and samples read the same way. Needs "
        "positions inside attention (rotary, alibi, relative, none); not with --compile")
    add("--sparse", choices=("strided", "fixed"), help="a sparse transformer's attention pattern in every layer "
        "(docs/long-context.md; needs --sparse-stride): on the CPU a mask, so it changes what is learned, not the "
        "time per step")
    add("--sparse-stride", type=int, help="the pattern's stride (strided) or block length (fixed), about the square "
        "root of -C; the fixed pattern keeps the last position of each block")
    add("--experts", type=int, help="a mixture of N experts in every block's feed-forward network "
        "(docs/experts-and-latents.md; needs a gated --activation), --active-experts per byte; its balance loss joins "
        "the training loss, and the experts' load is printed at each evaluation (default: a dense network)")
    add("--active-experts", type=int, default=2, help="with --experts: the experts each byte goes to (k)")
    add("--expert-hidden", type=int, help="with --experts: each expert's hidden size (default: the dense network's)")
    add("--latent-rank", type=int, help="latent attention: keys and values from a cached latent of N numbers per "
        "position (docs/experts-and-latents.md; needs rotary --positions) (default: plain heads)")
    add("--rope-dim", type=int, default=16, help="with --latent-rank: the rotary part of each query and key")
    add("--kqnorm", action=argparse.BooleanOptionalAction, help="layer-normalise keys and queries (fixes the "
        "scale of the attention logits, which can stabilise training at high learning rates)")
    add("--wide", action="store_true", help="wide heads: each head sees the whole embedding (then -E need not be "
        "divisible by -H; docs/heads.md)")
    add("--gradient-clipping", type=float, default=1.0, help="max gradient norm (0: off)")
    add("--test-every", type=int, help="evaluate, sample and checkpoint every N steps")
    add("--test-subset", type=int, help="bytes of the validation split scored while training: windows spread "
        "over the whole split, the same at every evaluation (an estimate of the whole split's figure)")
    add("--test-batch-size", type=int, default=64, help="windows per batch when evaluating")
    add("--final", action="store_true", help="at the end, report bits per byte on the TEST split (else validation)")
    add("-D", "--data", type=Path, help="enwik8 (raw, .gz or .zip) or any byte file; default: cache, else sample")
    add("--preset", choices=sorted(PRESETS), help="defaults for the flags you do not give, listed at the end "
        "(default: gpu on CUDA, else cpu)")
    add("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    add("--compile", action="store_true", help="torch.compile the model for training")
    add("--strategy", choices=STRATEGIES, default="ddp", help="under torchrun: DDP (a whole model per process) or "
        "FSDP2 (parameters, gradients and optimizer state sharded over the processes); one process: no effect")
    add("--checkpoint-blocks", action="store_true", help="activation checkpointing: keep only each block's input "
        "and recompute the rest in the backward pass (less memory, about a third more compute; not --checkpoint)")
    add("--accumulate", type=int, default=1, help="micro-batches per optimizer step (gradient accumulation)")
    add("--checkpoint", type=Path, help="folder for checkpoints; resume from the latest intact one in it (with "
        "--generate: sample from that one, or from this checkpoint file)")
    add("--checkpoint-minutes", type=float, default=10, help="with --checkpoint: also save one when this "
        "many minutes have passed since the last save (steps alone may be an hour apart on a CPU)")
    add("--seed", type=int, default=1, help="seed for the initialisation, batches and samples")
    add("--out", type=Path, default=Path("runs/generate_enwik8"),
        help="folder for the CSV log, the plot, results.json and the final model (model.pt)")
    add("--generate", metavar="PROMPT", type=utf8_text,
        help="no training: continue PROMPT with the trained model (OUT/model.pt, or "
        "--checkpoint) and print it")
    add("--sample-length", "--length", type=int, default=600,
        help="bytes to sample at each evaluation (0: none), or to generate with --generate")
    add("--temperature", type=float, default=0.5, help="sampling temperature (0: greedy)")
    add("--top-k", type=int, help="sample only from the k likeliest bytes (default: all)")
    add("--top-p", type=float, help="sample only from the likeliest bytes that together hold this much "
        "probability (nucleus sampling; default: all)")
    add("--peak-tflops", type=float, default=989.0, help="accelerator peak for MFU (989: H100 bf16 dense)")
    add("--threads", type=int, help="torch CPU threads (default: the cores other programs leave idle, measured at "
        "the start). It changes the speed, and the rounding of sums: to reproduce a recorded figure "
        "exactly, use its thread count")
    add("--log-every", type=int, default=10, help="read the losses and log them every N steps")
    add("--stop-after", type=int, help=argparse.SUPPRESS)  # tests: checkpoint at step N, then exit as if killed
    args = p.parse_args(argv)

    if args.generate is not None:  # only the sampling flags apply
        check_flags(p, args, {k: CHECKS[k] for k in ("sample_length", "temperature", "top_k", "top_p", "seed",
                                                     "threads", "memory")})
        if not args.generate:
            p.error("--generate needs a non-empty prompt (the model continues it)")
        if args.sample_length == 0:
            p.error("--length must be a positive int with --generate, got 0")
    try:
        args.device = resolve_device(args.device)
    except (ValueError, TypeError) as e:
        p.error(f"--device: {e}")
    if args.generate is not None:
        return args
    if args.memory is not None and args.compile:
        p.error("--memory does not run under --compile yet: leave one out")
    if (args.sparse is None) != (args.sparse_stride is None):
        p.error("--sparse and --sparse-stride go together: the pattern, and its stride (block length), e.g. "
                "--sparse fixed --sparse-stride 16")
    if args.minutes is not None and args.num_batches is not None:
        p.error("give -N/--num-batches or --minutes, not both")
    args.typed_num_batches = args.num_batches  # a resume must know whether -N came from the command or a preset
    args.warmup_steps = None  # the warmup a resumed run started with (check_resumable); None: min(--lr-warmup, -N)
    # A resumed run's feed-forward width as its config records it (check_resumable): a gated network saved before
    # 2026-11-27 (config_version 2) rounded 2/3 of 4 * embedding to the nearest integer, today to a multiple of 16.
    args.ff_hidden = None
    given_length = args.minutes is not None or args.num_batches is not None
    preset = PRESETS[args.preset or ("gpu" if args.device.type == "cuda" else "cpu")]
    for key, value in preset.items():  # a preset's training length (-N or --minutes) applies only if neither is given
        if getattr(args, key) is None and not (key in ("num_batches", "minutes") and given_length):
            setattr(args, key, value)
    args.optimizer = args.optimizer or "adam"
    args.schedule = args.schedule or "cosine"
    check_flags(p, args, CHECKS)
    if args.embedding % args.heads and not args.wide:  # each narrow head gets embedding // heads dimensions
        p.error(f"--embedding must be divisible by --heads, got {args.embedding} and {args.heads} (or pass --wide: "
                f"each head then sees the whole embedding)")
    if args.kv_heads is not None and args.heads % args.kv_heads:  # each key/value head serves a group of heads
        p.error(f"--kv-heads must divide --heads, got {args.kv_heads} and {args.heads}")
    if args.latent_rank is not None and args.positions not in ROTARY:
        p.error(f"--latent-rank needs rotary positions (its keys carry them in --rope-dim coordinates): --positions "
                f"rotary or rotary_interleaved, got {args.positions}")
    if args.stop_after is not None and args.checkpoint is None:
        p.error("--stop-after needs --checkpoint (it simulates a kill after a checkpoint)")
    check_outputs(p, args.out, OUTPUTS)
    return args


def rising(values: list[float], times: int = RISES) -> bool:
    """Whether each of the last ``times`` values is above the one before it (validation getting worse)."""
    return len(values) > times and all(b > a for a, b in zip(values[-times - 1:], values[-times:]))


def load_data(path: Path | None, *, notes: bool = True):
    """The three splits and where they came from; ``notes``: print the loader's notes (the main process only)."""
    try:
        if path is not None:
            with warnings.catch_warnings(record=True) as caught:  # e.g. "not the official enwik8": say it plainly
                warnings.simplefilter("always")
                splits = enwik8(path)
            for warning in caught if notes else ():
                print(f"note: {warning.message}", file=sys.stderr)
            return splits, str(path)
        return enwik8(), str(default_root() / "enwik8")
    except ValueError as e:  # a damaged file, or a cached copy that is not the official one: the message names it
        sys.exit(f"error: {e}")
    except FileNotFoundError as e:
        if path is not None:
            sys.exit(f"error: {e}")
        banner = "!" * 100
        if notes:
            print(f"{banner}\n!! No --data and no enwik8 in {default_root()}: training on the 300 KB SAMPLE bundled "
                  f"with torchformer.\n!! Fine for a demo; the figures are NOT enwik8 results. Pass -D "
                  f"path/to/enwik8.zip.\n{banner}", file=sys.stderr)
        return enwik8_sample(), "bundled sample (enwik8_sample)"
    except OSError as e:  # the cache folder (TORCHFORMER_HOME) is a file, -D is a folder, a file is unreadable
        sys.exit(f"error: {e}")


def data_name(source: str) -> str:
    """What the plot calls the data: the file's name ("enwik8.zip", "enwik8_prefix.gz", ...) or the bundled sample,
    so that a picture of a run on other data is never mistaken for an enwik8 result."""
    return source if source.startswith("bundled") else Path(source).name


def decode(ids: torch.Tensor) -> str:
    """Bytes as text; a byte-level model can emit invalid UTF-8 (e.g. half a character), shown as \ufffd."""
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


def sample(model, data, args, generator) -> str:
    """Continue a random ``context``-byte seed from ``data`` by ``--sample-length`` bytes."""
    start = int(torch.randint(len(data) - args.context, (1,), generator=generator, device=generator.device))
    seed = data[start:start + args.context].long()[None].to(args.device)
    step = MemoryStep(model, args.memory) if args.memory else None
    with autocast(args.device):
        out = generate(model, seed, args.sample_length, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, generator=generator, step=step)
    return f"[{decode(seed[0])}]{decode(out[0, args.context:])}"


def generate_mode(args) -> str:
    """``--generate``: continue the prompt with the trained model and print it; no data is read, nothing trained."""
    source = args.checkpoint or args.out / "model.pt"
    path = latest_intact_checkpoint(source) if source.is_dir() else source
    if path is None or not path.is_file():
        if args.checkpoint is not None:
            sys.exit(f"error: no checkpoint at {source} (--checkpoint): pass the folder of a run started with "
                     f"--checkpoint, or a checkpoint file, or leave it out to use the final model in --out")
        sys.exit(f"error: no trained model at {source}: train first (the final model goes to --out, now "
                 f"{args.out}), or pass --out or --checkpoint to point at one")
    try:  # the file holds the model's config: the model is rebuilt from it alone
        model = load_model(path, model_class=GTransformer, map_location=args.device)
    except ValueError as e:  # not a checkpoint, damaged, or one of another model
        sys.exit(f"error: {e}")
    prompt = torch.tensor(list(args.generate.encode("utf-8")), device=args.device)[None]  # (1, t) byte ids
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    try:
        step = MemoryStep(model, args.memory) if args.memory else None  # a model trained with memory reads so
    except ValueError as e:
        sys.exit(f"error: --memory: {e}")
    with autocast(args.device):
        out = generate(model, prompt, args.sample_length, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, generator=generator, step=step)
    text = decode(out[0])
    print(text)
    return text


def seconds_per_step(net, model, train, args, steps: int = 20) -> float:
    """Time whole training steps (after 3 warm-up steps, which also compile the model with --compile).

    The steps are real ones, with one difference: the optimizer is a throwaway Adam with learning rate 0, which
    does all the work of an update but leaves the weights exactly as they were. The batches come from a generator
    of their own, so training afterwards is not affected (except that dropout draws from the global generator).
    """
    generator = torch.Generator(device=args.device).manual_seed(args.seed + 2)
    probe = make_optimizer(model, args.optimizer, lr=0.0, fused=args.device.type == "cuda")
    streams = Streams(train, args) if args.memory else None
    memory = model.new_memory(args.memory) if args.memory else None  # a throwaway memory of its own
    count = iter(range(10**9))

    def step() -> None:
        for _ in range(args.accumulate):
            if streams is None:
                sum(micro_loss(net, *micro_batch(train, args, generator), args)).backward()
            else:
                x, y, positions, _ = streams.batch(next(count))
                sum(micro_loss(net, x, y, args, caches=memory, positions=positions)).backward()
        if args.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clipping)
        probe.step()
        probe.zero_grad(set_to_none=True)

    net.train()
    for _ in range(3):
        step()
    synchronize(args.device)
    tic = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(args.device)
    return all_reduce_mean((time.perf_counter() - tic) / steps)  # every process must choose the same -N


def micro_batch(train: torch.Tensor, args, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's rows of the next global micro-batch: ``(k, context)`` inputs and targets. Every process draws
    the whole batch's windows (their starts: a few numbers) from its copy of the shared generator and keeps its
    share, so the batches are the same on any number of processes (targets of repeated rows: ignored)."""
    x, y = random_batches(train, context=args.context, batch_size=args.batch_size, generator=generator)
    share = share_batch(args.batch_size)
    return share.take(x), share.targets(y)


class Streams:
    """With ``--memory``: the training split as ``-b`` contiguous streams, read one segment of ``-C`` bytes at a
    time. Micro-batch ``g`` (counted over the whole run, so a resumed run continues exactly) is segment
    ``g mod S`` of every stream, ``S`` the segments a stream holds; at segment 0 the streams start again and the
    memory is emptied. Under torchrun each process trains (and remembers) its share of the streams."""

    def __init__(self, train: torch.Tensor, args) -> None:
        rows, self.context = args.batch_size, args.context
        length = len(train) // rows
        self.rows = train[: rows * length].view(rows, length)  # (b, length): stream r is one stretch of the text
        self.segments = (length - 1) // self.context
        if self.segments < 1:
            sys.exit(f"--memory: the training split ({len(train):,} bytes) holds fewer than one -C {self.context} "
                     f"segment per stream for -b {rows} streams")

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """This process's ``(k, C)`` inputs and targets of micro-batch ``index``, their positions in the streams
        ``(C,)``, and whether the streams start again there."""
        segment = index % self.segments
        start = segment * self.context
        x, y = self.rows[:, start:start + self.context], self.rows[:, start + 1:start + self.context + 1]
        share = share_batch(x.size(0))
        positions = torch.arange(start, start + self.context, device=x.device)
        return share.take(x), share.targets(y), positions, segment == 0


def micro_loss(net, x: torch.Tensor, y: torch.Tensor, args, **memory) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's part of the global micro-batch's mean loss, divided by ``--accumulate``: averaged over the
    processes (as DDP and FSDP2 average gradients), the mean over the whole batch (one process: that mean). And the
    parts' own losses (a mixture's balance loss; 0 without), each process's over its rows, likewise averaged.
    ``memory``: ``caches`` and ``positions`` with ``--memory``."""
    with autocast(args.device):
        logp = net(x, **memory)  # (k, t, 256) log-probabilities of the next byte
    tokens = share_batch(args.batch_size).divisor * args.context
    loss = F.nll_loss(logp.float().flatten(0, 1), y.flatten(), reduction="sum") / tokens / args.accumulate
    return loss, torch.as_tensor(auxiliary_loss(net), device=loss.device) / args.accumulate


def expert_load(model) -> str:
    """The experts' load of the last training step, each block's busiest and idlest expert against the mean."""
    loads = auxiliary_statistics(model).get("expert_load", [])
    spread = [f"{(load.max() / load.mean()).item():.2f}/{(load.min() / load.mean()).item():.2f}" for load in loads]
    return f"expert load, max/min over the mean, by block: {' '.join(spread)} (1.00/1.00: even)"


def check_resumable(ckpt: Path, args) -> None:
    """Refuse to resume ``ckpt`` with other architecture flags or another ``-l``, or past its end (a ``-N`` below
    its step), and continue the schedule it was trained with (its ``-N``, unless ``-N`` is given on the command
    line).

    Only the checkpoint's small ``extra`` part is read here (``read_checkpoint``: the weights stay on disk), so that
    a changed flag gets a message naming it rather than a config or weight-shape mismatch later.
    """
    try:
        saved = read_checkpoint(ckpt)
        step, extra = saved["step"], saved["extra"]
        config = flags_as_saved(saved, extra["config"])  # a "rotary" of before 0.5 is "rotary_interleaved"
        args.ff_hidden = saved["config"].ff_hidden  # set for a gated network of config_version 2 (its width)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # a foreign or damaged file: say which
        sys.exit(f"cannot resume: {ckpt} is not a checkpoint written by this script ({type(e).__name__}: {e}); "
                 f"use a new --checkpoint folder")
    changed = [f"--{k.replace('_', '-')} {config.get(k, ARCHITECTURE_DEFAULTS.get(k))} (now {getattr(args, k)})"
               for k in ARCHITECTURE if config.get(k, ARCHITECTURE_DEFAULTS.get(k)) != getattr(args, k)]
    # The optimizer and schedule come back with the checkpoint's learning rate: another -l would be ignored.
    if extra.get("learn_rate", args.learn_rate) != args.learn_rate:  # (older checkpoints do not record it)
        changed.append(f"--learn-rate {extra['learn_rate']} (now {args.learn_rate})")
    run = extra.get("run", {})  # older checkpoints do not record these
    saved_run = {k: run[k] if k in run else RUN_DEFAULTS[k] for k in RUN_KEYS if k in run or k in RUN_DEFAULTS}
    changed += [f"--{k.replace('_', '-')} {value} (now {getattr(args, k)})" for k, value in saved_run.items()
                if value != getattr(args, k)]
    if changed:
        sys.exit(f"cannot resume: {ckpt} was trained with {', '.join(changed)}; use a new --checkpoint folder")
    planned = extra.get("num_batches")  # older checkpoints do not record it
    # The warmup the run started with: extending it (a larger -N) stretches the decay, never warms up again.
    args.warmup_steps = extra.get("warmup_steps", min(args.lr_warmup, planned or args.num_batches))
    if args.typed_num_batches is None and planned is not None:  # an explicit -N wins, e.g. to train longer
        args.num_batches = planned  # the learning-rate schedule continues exactly where it stopped
    elif args.typed_num_batches is None and args.minutes:
        sys.exit(f"cannot resume {ckpt} with --minutes: it does not record its -N; pass -N instead")
    if step > args.num_batches:  # it would report a model of `step` steps as one of -N steps
        sys.exit(f"cannot resume: {ckpt} is at step {step}, past -N {args.num_batches}; pass -N {step} or more to "
                 f"continue it, or use a new --checkpoint folder")
    if args.typed_num_batches is None and args.minutes:
        print(f"resuming with -N {planned}, as in the run that wrote {ckpt.name} (--minutes is not measured again)")
    elif planned is not None and args.num_batches != planned:
        print(f"note: {ckpt.name} was trained with -N {planned}; with -N {args.num_batches} the learning-rate "
              f"schedule changes from here on")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(model, data, args, windows=None, progress=None) -> float:
    """Bits per byte, each process scoring its share of the windows: every process gets the whole figure. With
    ``--memory``, the whole split as ``--test-batch-size`` streams through the memory (every process all of it)."""
    with autocast(args.device):
        if args.memory:
            return bits_per_byte(model, data, context=args.context, batch_size=args.test_batch_size,
                                 memory=args.memory, progress=progress)
        return bits_per_byte(model, data, context=args.context, batch_size=args.test_batch_size, windows=windows,
                             progress=progress, distributed=True)


def main(argv=None) -> dict | str:
    args = parse_args(argv)
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    if args.generate is not None:
        return generate_mode(args)
    try:
        result = train(args, threads, why)
    except OSError as e:  # a full disk, say, while writing a checkpoint (the message names the file)
        kept = " The checkpoints written before are kept." if args.checkpoint else ""
        sys.exit(f"error: {e}.{kept}")
    # Only once train() has let go of the wrapped model: a DDP model that outlives its process group can deadlock
    # in its destructor (gloo).
    teardown_distributed()
    return result


def train(args, threads: int, why: str) -> dict:
    # Only the main process prints from here on; every process is seeded alike (the same initial weights).
    run = start_run(args.device, strategy=args.strategy, seed=args.seed)
    args.device = run.device  # under torchrun on CUDA: this process's GPU
    print(f"device: {args.device}" + (f", {threads} CPU thread(s) ({why})" if args.device.type == "cpu" else ""))
    print(describe_run(run, strategy=args.strategy, batch_size=args.batch_size, unit="sequences",
                       learn_rate=args.learn_rate))
    (train, val, test), source = load_data(args.data, notes=run.is_main)
    print(f"data: {source}; {len(train):,} train, {len(val):,} val, {len(test):,} test bytes")
    if (source.startswith("bundled") and args.typed_num_batches is None and args.minutes is None
            and args.num_batches is not None and args.num_batches > SAMPLE_STEPS):
        print(f"note: -N {SAMPLE_STEPS} instead of the preset's {args.num_batches}: a longer run learns the small "
              f"sample by heart (validation rises); give -N to choose, or -D for real data")
        args.num_batches = SAMPLE_STEPS
    # The periodic validation scores --test-subset bytes in windows spread over the whole split (bits_per_byte
    # scores `stride` = context // 2 new bytes per window): the first bytes alone are not a fair sample of it.
    val_windows = max(1, math.ceil(args.test_subset / max(1, args.context // 2)))
    if args.context >= min(len(train), len(val)):
        sys.exit(f"--context {args.context} is too long for this data ({len(val):,} validation bytes)")
    train = train.to(args.device)  # 90 MB at most; sampling windows then never leaves the device
    ckpt = None  # before the model is built: a resumed model is built as its checkpoint's config says
    if run.is_main:  # the final model.pt is written atomically too: a killed save leaves its temporary in --out
        remove_interrupted_saves(args.out, args.checkpoint)
    if args.checkpoint:
        # Warns of each damaged one it skips; the main process renames those (else pruning would keep them).
        ckpt = latest_intact_checkpoint(args.checkpoint, set_aside=run.is_main)
    if ckpt is not None:
        check_resumable(ckpt, args)

    def build() -> GTransformer:
        options = ((MoEOptions(experts=args.experts, top_k=args.active_experts, expert_hidden=args.expert_hidden),)
                   if args.experts else ()) + ((LatentOptions(kv_rank=args.latent_rank, rope_dim=args.rope_dim),)
                                               if args.latent_rank else ())
        model_class = {(False, False): GTransformer, (True, False): MoETransformer, (False, True): LatentTransformer,
                       (True, True): DeepSeekTransformer}[bool(args.experts), bool(args.latent_rank)]
        return model_class(args.embedding, args.heads, args.depth, args.context, 256, dropout=args.dropout,
                           prenorm=True, kqnorm=args.kqnorm, positions=args.positions, norm=args.norm,
                           activation=args.activation, kv_heads=args.kv_heads, window=args.window,
                           wide=args.wide, checkpoint_blocks=args.checkpoint_blocks,
                           zero_init_residual=args.zero_init, logit_cap=args.logit_cap, sparse=args.sparse,
                           sparse_stride=args.sparse_stride, ff_hidden=args.ff_hidden, options=options)

    try:
        # Sized on the meta device first: a typo in -C or -E is no OOM kill. FSDP shards all but the built model.
        sharded = args.strategy == "fsdp" and run.world_size > 1
        check_model_fits(build, args.device, copies=1 + 3 / run.world_size if sharded else 4)
        model = build().to(args.device)
    except (ValueError, MemoryError) as e:  # e.g. -E not divisible by -H, --dropout outside [0, 1), -C 10**9
        sys.exit(f"error: cannot build the model from these flags: {e}")
    # The batches are bytes (ids 0..255) and positions the model's own: skip the value checks, which on a GPU would
    # make the host wait for the device at every step (tests/test_host_syncs.py).
    model.check_values = False
    streams, memory = None, None
    if args.memory:  # before wrapping: the memory's caches belong to the model's own blocks
        try:
            memory = model.new_memory(args.memory)
        except ValueError as e:
            sys.exit(f"error: --memory: {e}")
        streams = Streams(train, args)
    seed_each_process(args.seed)  # each process its own dropout masks (the main one keeps its stream)
    flops = model_flops_per_token(model, context=args.context)
    parameters = count_parameters(model)
    print(f"model: {parameters:,} parameters, {flops / 1e6:.1f} MFLOPs per training token")
    # `model` stays the module itself (with FSDP2, sharded in place): evaluation, sampling and checkpoints use it.
    wrapped = wrap_model(model, strategy=args.strategy)
    net = torch.compile(wrapped) if args.compile else wrapped
    if ckpt is None and args.minutes:
        seconds = seconds_per_step(net, model, train, args)
        args.num_batches = max(1, int(args.minutes * 60 / seconds))
        print(f"--minutes {args.minutes:g}: {1000 * seconds:.1f} ms per step measured, so -N {args.num_batches}")
    opt = make_optimizer(model, args.optimizer, lr=args.learn_rate, fused=args.device.type == "cuda")  # after wrapping
    # Warmup, then cosine decay (or WSD's constant rate and linear decay) to step -N. A resumed run keeps the warmup it started with (check_resumable).
    warmup = min(args.lr_warmup, args.num_batches) if args.warmup_steps is None else args.warmup_steps
    schedule = warmup_stable_decay if args.schedule == "wsd" else warmup_cosine
    sched = schedule(opt, warmup_steps=warmup, total_steps=args.num_batches)
    # Our own generators (not the global one) pick batches and samples, and the checkpoint restores them. They are
    # seeded alike on every process: each draws the same global batch and keeps its share (see micro_batch).
    # The batch generator lives on the device: drawing window starts on the CPU would mean a copy to the GPU,
    # and with it a wait for the GPU, at every step.
    batches = torch.Generator(device=args.device).manual_seed(args.seed)
    sampler = torch.Generator(device=args.device).manual_seed(args.seed + 1)
    generators = {"batches": batches, "sampling": sampler}

    start, elapsed = 0, 0.0
    best = {"val_bpb": math.inf, "step": 0}  # the best validation estimate so far, whose model is OUT/best.pt
    if ckpt is not None:
        try:
            state = load_distributed_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched,
                                                generators=generators)
        except ValueError as e:
            sys.exit(f"cannot resume: {e}. Use the same flags, or a new --checkpoint folder")
        start, elapsed = state["step"], state["extra"]["elapsed_s"]
        best = state["extra"].get("best", best)  # a checkpoint from before best.pt existed: from here on
        if memory is not None and state["process_state"] is not None:  # this process's memory, as it was saved
            for cache, saved in zip(memory, state["process_state"]["memory"]):
                cache.self_attention.load_state_dict(saved, device=args.device)
        elif memory is not None:  # another number of processes: other rows; the streams go on without memory
            print(f"note: {ckpt.name} holds the memory of {state['world_size']} process(es): this run's memory starts "
                  f"empty")
        resume_schedule(sched)  # the rates of this run's rule at `start`, not the saved rule's (a larger -N)
        print(f"resumed from {ckpt} at step {start}")
        if state["world_size"] != run.world_size:  # each process's dropout masks came from another split
            print(f"note: {ckpt.name} was written by {state['world_size']} process(es), resumed on "
                  f"{run.world_size}: the same batches and schedule, but not bit for bit the run it would have been")
    log, tb = NoLog(), None  # only the main process writes files
    if run.is_main:
        args.out.mkdir(parents=True, exist_ok=True)
        try:  # rows a killed run logged after its last checkpoint are dropped: this run logs those steps again
            log = CSVLogger(args.out / "log.csv", COLUMNS + (["aux_loss"] if args.experts else []), resume_step=start)
        except ValueError as e:  # a log.csv of an older version of this script, with other columns
            sys.exit(f"error: {e}")
        tb = tensorboard(args.out)

    def save(step: int) -> None:
        if args.checkpoint:
            config = {k: getattr(args, k) for k in ARCHITECTURE}
            extra = {"config": config, "elapsed_s": elapsed, "num_batches": args.num_batches, "warmup_steps": warmup,
                     "learn_rate": args.learn_rate, "run": {k: getattr(args, k) for k in RUN_KEYS}, "best": best}
            # Every process takes part (the states are gathered onto the main one, which writes the file).
            own = None if memory is None else {"memory": [  # each process's memory of its rows, on the CPU
                cache.self_attention.state_dict(device="cpu") for cache in memory]}
            save_distributed_checkpoint(checkpoint_path(args.checkpoint, step), model=net, optimizer=opt,
                                        scheduler=sched, step=step, extra=extra, generators=generators,
                                        process_state=own)
            if run.is_main:
                prune_checkpoints(args.checkpoint, keep=2)
            clock.reset()

    def diverged(message: str) -> None:
        bar.close()
        kept = (f" The checkpoints in {args.checkpoint} predate it and are kept."
                if args.checkpoint and any(args.checkpoint.glob("*.pt")) else "")
        sys.exit(f"error: {message} (flags -l, --lr-warmup, --gradient-clipping, --kqnorm).{kept}")

    @contextlib.contextmanager
    def divergence_checked(step: int):
        """An evaluation that fails on NaN or infinite outputs shows a divergence that the losses read so far did
        not (the last updates broke the weights): exit as for a NaN loss, before anything is saved."""
        try:
            yield
        except ValueError as e:
            diverged(f"the evaluation at step {step} failed: {e}. The training losses were finite: the last updates "
                     f"probably broke the weights. The usual remedies: a lower learning rate, a longer warmup, "
                     f"gradient clipping, normalised keys and queries")

    tokens_per_step = args.batch_size * args.accumulate * args.context
    clock = CheckpointClock(args.checkpoint_minutes if args.checkpoint else None, device=args.device)
    bar = progress(total=args.num_batches, desc="train")
    bar.update(start)
    say = getattr(bar, "write", print)  # tqdm.write keeps the bar intact; the plain fallback has no write
    # Reading a loss (.item()) makes the CPU wait for the GPU, which then idles while the next step is launched.
    # So losses stay on the device and are read every --log-every steps; speed is measured over those intervals.
    pending: list[tuple[int, torch.Tensor, float]] = []  # (step, loss, lr) not yet logged
    pending_aux: list[torch.Tensor] = []  # their steps' auxiliary losses (a mixture's balance loss)
    history, warned = [], False  # validation figures so far (this process's run), and whether it warned of them
    speeds: list[float] = []
    tic = time.perf_counter()
    for step in range(start + 1, args.num_batches + 1):
        net.train()
        loss_sum = torch.zeros((), device=args.device)
        aux_sum = torch.zeros((), device=args.device)
        for micro in range(args.accumulate):
            if streams is None:
                loss, aux = micro_loss(net, *micro_batch(train, args, batches), args)
            else:  # the next segment of every stream, through the memory of the one before
                x, y, positions, restart = streams.batch((step - 1) * args.accumulate + micro)
                if restart:
                    for cache in memory:
                        cache.reset()
                loss, aux = micro_loss(net, x, y, args, caches=memory, positions=positions)
            (loss + aux).backward()
            loss_sum += loss.detach()
            aux_sum += aux.detach()
        if args.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clipping)
        pending.append((step, loss_sum, opt.param_groups[0]["lr"]))
        pending_aux.append(aux_sum)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        bar.update(1)

        evaluate_now = step % args.test_every == 0 or step == args.num_batches
        checkpoint_now = evaluate_now or step == args.stop_after
        if not (checkpoint_now or step % args.log_every == 0):
            continue
        checkpoint_now = checkpoint_now or clock.due()  # at logging steps only: the same steps on every process
        # The whole batch's losses (waits for the GPU to finish): every process checks the same numbers.
        losses = average_over_processes(torch.stack([loss for _, loss, _ in pending])).tolist()
        try:  # before anything is evaluated or saved: the checkpoints on disk predate the divergence
            check_finite_losses(losses, [s for s, _, _ in pending])
        except TrainingDiverged as e:
            diverged(str(e))
        seconds = time.perf_counter() - tic
        elapsed += seconds
        speed = tokens_per_step * len(pending) / seconds
        speeds.append(speed)
        stats = {"loss": f"{losses[-1]:.3f}", "tok/s": f"{speed:,.0f}"}
        if args.device.type == "cuda":
            stats["mfu"] = f"{mfu(speed / run.world_size, flops, peak_tflops=args.peak_tflops):.1%}"  # per GPU
        bar.set_postfix(stats)
        rows = [dict(step=s, loss=value, train_bpb=value / math.log(2), lr=lr, tokens_per_s=round(speed),
                     elapsed_s=round(elapsed, 1))
                for (s, _, lr), value in zip(pending, losses)]
        if args.experts:  # the balance loss the optimizer saw besides the prediction's
            for row, value in zip(rows, average_over_processes(torch.stack(pending_aux)).tolist()):
                row["aux_loss"] = value
        pending.clear()
        pending_aux.clear()

        if evaluate_now:
            with divergence_checked(step):  # the uncompiled module: evaluation shapes vary
                rows[-1]["val_bpb"] = evaluate(model, val, args, windows=val_windows)
                how = ("the whole split, as streams through the memory" if args.memory
                       else f"estimate: {val_windows} windows spread over the split")
                say(f"step {step}: loss {losses[-1]:.3f} (= {losses[-1] / math.log(2):.3f} bits/byte on train), "
                    f"validation ~{rows[-1]['val_bpb']:.3f} bits/byte ({how})")
                if args.experts:
                    say(f"  {expert_load(model)}")
                history.append(rows[-1]["val_bpb"])
                improved = rows[-1]["val_bpb"] < best["val_bpb"]  # the same figure on every process
                if improved:
                    best = {"val_bpb": rows[-1]["val_bpb"], "step": step}
                if rising(history) and not warned:
                    warned = True
                    say(f"warning: validation rose at the last {RISES} evaluations ("
                        f"{' -> '.join(f'{v:.3f}' for v in history[-RISES - 1:])} bits/byte) while the training loss "
                        f"fell: the model is learning the training text by heart. Train on more data (-D) or for "
                        f"fewer steps (-N); {args.out / 'best.pt'} keeps the model of the best validation so far "
                        f"({best['val_bpb']:.3f} at step {best['step']})")
                if args.sample_length > 0:  # on every process: an FSDP2 model runs on all of them at once
                    say(f"sample (seed in brackets, temperature {args.temperature}):\n"
                        f"{sample(model, val, args, sampler)}\n")
        for row in rows:
            log.log(**row)
            if tb:
                tb.add_scalar("loss", row["loss"], row["step"])
                if "val_bpb" in row:
                    tb.add_scalar("val_bpb", row["val_bpb"], row["step"])
        if checkpoint_now:
            save(step)
        if evaluate_now and improved:  # after the checkpoint (which records `best`); every process takes part
            save_distributed_checkpoint(args.out / "best.pt", model=model, step=step, extra={
                "config": {k: getattr(args, k) for k in ARCHITECTURE}, "val_bpb": best["val_bpb"]})
        if step == args.stop_after:
            print(f"--stop-after {step}: checkpoint saved, stopping")
            if tb:
                tb.close()
            bar.close()
            log.close()
            return {"step": step}
        tic = time.perf_counter()  # evaluation, sampling and saving do not count as training time
        bar.unpause()  # nor in the bar's rate and time left
    bar.close()
    # The first interval includes warm-up (and compilation with --compile); leave it out of the typical speed.
    typical = statistics.median(speeds[1:] or speeds) if speeds else None
    if typical is None:
        print(f"training: nothing left to train, the checkpoint is at step {args.num_batches}")
    else:
        note = f"median {typical:,.0f} tokens/s"
        if args.device.type == "cuda":
            per_gpu = mfu(typical / run.world_size, flops, peak_tflops=args.peak_tflops)
            note += f", MFU {per_gpu:.1%} of {args.peak_tflops:g} TFLOP/s per GPU"
        print(f"training: {elapsed / 60:.1f} min, {note}")

    split, data = ("test", test) if args.final else ("validation", val)
    with divergence_checked(args.num_batches):
        bpb = evaluate(model, data, args, progress=f"{split} bits/byte")
    share = (mfu(typical / run.world_size, flops, peak_tflops=args.peak_tflops)
             if typical and args.device.type == "cuda" else None)
    result = {"step": args.num_batches, "split": split, "bpb": bpb, "elapsed_s": elapsed, "tokens_per_s": typical,
              "mfu": share, "peak_tflops": args.peak_tflops if share is not None else None,
              "flops_per_token": flops, "parameters": parameters, "processes": run.world_size, "data": source}
    print(f"{split} bits per byte: {result['bpb']:.4f} on all {len(data):,} bytes "
          f"(after {args.num_batches} steps, {elapsed / 60:.1f} min of training)")
    log.close()
    # The final model, always (with or without --checkpoint): --generate samples from it, load_model rebuilds it.
    extra = {"config": {k: getattr(args, k) for k in ARCHITECTURE}, "result": result}
    save_distributed_checkpoint(args.out / "model.pt", model=model, step=args.num_batches, extra=extra)
    if not run.is_main:  # the rest is the main process's alone
        return result
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"model: {args.out / 'model.pt'} (sample from it: --generate \"PROMPT\" --out {args.out})")
    if best["step"] and best["step"] != args.num_batches and (args.out / "best.pt").is_file():
        print(f"best validation estimate: {best['val_bpb']:.3f} at step {best['step']}, better than the end's: its "
              f"model is {args.out / 'best.pt'} (load_model, or --generate with --checkpoint {args.out / 'best.pt'})")
    if tb:
        tb.close()
    marks = {f"{split}, whole split: {bpb:.3f}": (args.num_batches, bpb)}
    if plot_curves(args.out / "log.csv", args.out / "loss.png", x="step", ys=["train_bpb", "val_bpb"], logy=True,
                   ylabel="bits per byte", marks=marks,
                   title=f"{data_name(source)}: training batches and validation estimate, in bits per byte"):
        print(f"curves: {args.out / 'loss.png'}")
    else:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
    return result


def tensorboard(out: Path):
    """A TensorBoard writer when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(out / "tensorboard")


if __name__ == "__main__":
    main()
