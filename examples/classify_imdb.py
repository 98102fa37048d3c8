"""Sentiment classification of IMDb movie reviews with a transformer encoder (CTransformer) or an LSTM, end to end.

    python examples/classify_imdb.py --data path/to/dir --preset cpu          # train, report validation
    python examples/classify_imdb.py --data path/to/dir --preset cpu --final  # ... and the test set
    python examples/classify_imdb.py --predict "A wonderful, moving film." --out runs/classify_imdb
    python examples/classify_imdb.py --data path/to/dir --pretrained runs/pretrain_imdb/pretrained.pt --final
    torchrun --standalone --nproc_per_node 2 examples/classify_imdb.py --data path/to/dir --preset gpu

Reviews are tokenized (words, byte-level BPE subwords, or UTF-8 bytes), cut to ``--max`` tokens, padded with 0 and
batched by length; the padding mask makes padding invisible to attention and pooling. 5,000 training reviews (chosen
by a seeded split) are held out for validation; the official 25k test set is read only with ``--final``. Flags keep
the meaning they have in Peter Bloem's ``former`` (``--lr-warmup`` counts training *examples*, as there). The
evaluated split's calibration (is the model right as often as it is sure?) goes to results.json and calibration.png.
See docs/imdb.md.

``--pretrained`` starts the encoder from a masked-language model pretrained by ``examples/pretrain_imdb.py`` (on the
unlabelled reviews, without the test and validation reviews): the model's size, positions and norm placement, the
tokenizer and its vocabulary come from that file, and only the classifier head starts from scratch. ``--model lstm``
trains the recurrent baseline instead (a bidirectional LSTM, :class:`~torchformer.baselines.LSTMClassifier`) through
the same pipeline. ``--pack`` trains on rows of ``-M`` positions that each hold several whole reviews, every review
attended to, pooled and classified alone (``docs/masks.md``); evaluation is padded as always.

Under ``torchrun``, ``-b`` is the global batch: each of N processes computes its share of every batch's reviews, the
learning rate is not scaled, and evaluation is shared out too (the same figures as one process). Only the main
process prints and writes files; docs/going-big.md says more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from torchformer.train.checkpoint import (
    checkpoint_path, latest_intact_checkpoint, load_checkpoint, prune_checkpoints, read_checkpoint,
)
from torchformer.data.batching import ClassificationBatches, bucketed_padding, pad_batch
from torchformer.data.packing import IGNORE, PackedBatches, pack
from torchformer.nn.auxiliary import auxiliary_loss
from torchformer.data.imdb_dataset import imdb, train_val_split
from torchformer.data.download import DataNotFoundError
from torchformer.data.imdb_unlabelled import texts_digest
from torchformer.baselines import LSTMClassifier, LSTMConfig
from torchformer.data.tokenizers import build_tokenizer, tokenizer_from_state_dict
from torchformer.train.inspection import attention_weights, plot_attention
from torchformer.train.metrics import Calibration, evaluate_classifier, format_confusion_matrix
from torchformer.models import CTransformer, MLMTransformer
from torchformer.train.loading import load_model
from torchformer.train.optimizers import OPTIMIZERS, make_optimizer
from torchformer.config import POSITIONS
from torchformer.scripts.cli import (
    POSITIVE, POSITIVE_INT, WRITABLE_FOLDER, check_flags, check_model_fits, check_outputs, choose_threads,
    flags_as_saved,
    preset_epilog, preset_flags, remove_interrupted_saves, utf8_text,
)
from torchformer.train.distributed import STRATEGIES, teardown_distributed, wrap_model
from torchformer.train.distributed_checkpoint import load_distributed_checkpoint, save_distributed_checkpoint
from torchformer.scripts.launch import (
    NoLog, average_over_processes, describe_run, seed_each_process, share_batch, start_run,
)
from torchformer.train.training import (
    CSVLogger, CheckpointClock, TrainingDiverged, autocast, check_finite_losses, count_parameters, plot_curves,
    progress,
    resolve_device, warmup_cosine,
)

CLASSES = ("negative", "positive")
# Keys of PRESETS are argparse dests; an explicit flag always wins over the preset.
PRESETS = {
    # Measured on 2 CPU cores (docs/imdb.md, 2026-11-26): 87.48 and 87.33 % on the full 25k test set (seeds 1, 2),
    # 10.7 and 11.0 min; with Adam 86.74 and 86.71 %. The LSTM (--model lstm) has no blocks for Muon: Adam.
    "cpu": dict(num_epochs=3, batch_size=32, learn_rate=3e-3, embedding=64, vocab_size=20_000, max_length=512,
                heads=4, depth=1, max_pool=False, lr_warmup=5_000, dropout=0.1, tokenizer="word", optimizer="muon"),
    # The best validation accuracy of 7 configurations measured on one H100 (docs/imdb.md): in effect the CPU preset,
    # with whole reviews. 86.78 % on the test set in 3.5 min; the others scored 84.1 to 87.0 %, the largest worst.
    "gpu": dict(num_epochs=3, batch_size=32, learn_rate=3e-3, embedding=64, vocab_size=20_000, max_length=2048,
                heads=4, depth=1, max_pool=False, lr_warmup=5_000, dropout=0.1, tokenizer="word"),
}
MODEL_KEYS = ("model", "embedding", "heads", "depth", "max_length", "max_pool", "dropout", "wide", "hidden",
              "positions", "prenorm")
# What a checkpoint written before a model flag existed was trained with.
MODEL_DEFAULTS = {"wide": False, "model": "transformer", "hidden": None, "positions": "learned", "prenorm": False}
# Must match too, to resume a checkpoint exactly: they fix the split, the batches, the vocabulary and the schedule.
RUN_KEYS = ("batch_size", "num_epochs", "learn_rate", "lr_warmup", "tokenizer", "vocab_size", "val_size", "seed",
            "pretrained", "gradient_clipping", "optimizer", "pack")
# What a run recorded before these flags existed trained with (a missing key means that, not "anything").
RUN_DEFAULTS = {"optimizer": "adam", "pack": False}
# What --pretrained decides (the pretrained model's flags): giving one of them as well is an error.
PRETRAINED_KEYS = ("embedding", "heads", "depth", "max_length", "tokenizer", "vocab_size", "positions", "prenorm")


# The valid values of each flag, checked before anything is loaded: {dest: (test, what the flag must be)}. A flag
# that is None (not given, and no preset sets it) is not checked. --val-size is checked against the data later.
CHECKS = {
    **dict.fromkeys(("num_epochs", "batch_size", "embedding", "max_length", "heads", "depth", "val_size",
                     "eval_every", "stop_at", "threads"), POSITIVE_INT),
    "vocab_size": (lambda v: v >= 3, "an int >= 3 (<pad>, <unk> and at least one word)"),
    "checkpoint_minutes": POSITIVE,
    "learn_rate": (lambda v: 0 < v < 1e30, "a positive number below 1e30"),  # larger ones overflow Adam's step
    "lr_warmup": (lambda v: v >= 0, "an int >= 0"),
    "gradient_clipping": (lambda v: 0 <= v < math.inf, "a number >= 0 (0: off)"),
    "dropout": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "seed": (lambda v: 0 <= v < 2**32, "an int in [0, 2**32)"),
    "hidden": POSITIVE_INT,
    "data": (lambda v: Path(v).exists(), "an existing folder or file"),
    "pretrained": (lambda v: Path(v).is_file(), "an existing file (pretrained.pt of examples/pretrain_imdb.py)"),
    "checkpoint": WRITABLE_FOLDER,
    "out": WRITABLE_FOLDER,
}


def build_parser() -> argparse.ArgumentParser:
    # RawDescription: the preset list keeps its lines; the flags' help is wrapped to the terminal.
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=preset_epilog(PRESETS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_flags(p, PRESETS)  # each flag's help ends with its default, or what each preset sets it to
    add("-e", "--num-epochs", type=int, help="passes over the training reviews")
    add("-b", "--batch-size", type=int, help="reviews per batch, in all: under torchrun each of N processes computes "
        "b / N of them (the learning rate is not scaled)")
    add("-l", "--learn-rate", type=float, help="peak learning rate (of Adam, and of Muon if --optimizer muon)")
    add("-E", "--embedding", type=int, help="embedding size")
    add("-V", "--vocab-size", type=int, help="word vocabulary size, <pad> and <unk> included (word tokenizer)")
    add("-M", "--max", "--max-length", dest="max_length", type=int, help="tokens kept per review (the rest is cut)")
    add("-H", "--heads", type=int, help="attention heads (-E must be divisible by -H, unless --wide)")
    add("-d", "--depth", type=int, help="transformer blocks")
    add("--max-pool", action=argparse.BooleanOptionalAction, help="max-pool over positions (else mean-pool)")
    add("--wide", action="store_true", help="wide attention heads: each head sees the whole embedding, so -E need "
        "not be divisible by -H (more parameters; docs/heads.md)")
    add("--positions", choices=POSITIONS, help="how the model knows word order: added to the embeddings (learned, "
        "sinusoidal, none) or inside attention (rotary, alibi, relative); docs/positions.md (default: learned)")
    add("--prenorm", action="store_true", help="layer norm before each sublayer (GPT-2) instead of after the "
        "residual (former's post-norm); docs/blocks.md")
    add("--lr-warmup", type=int, help="warm the learning rate up over this many training *examples* (as former)")
    add("--optimizer", choices=OPTIMIZERS, help="adam, or muon: Muon for the transformer blocks' matrices and Adam "
        "for the rest, one learning rate (torchformer.train.optimizers; default: the preset's, else adam; the LSTM "
        "and --pretrained fine-tuning train with adam unless given)")
    add("--gradient-clipping", type=float, default=1.0, help="clip the gradient norm to this (0: off)")
    add("--dropout", type=float, help="dropout rate")
    add("--tokenizer", choices=("word", "bpe", "byte"), help="words or byte-level BPE subwords (both learned from the "
        "training split; -V sets the vocabulary size, at least 257 for bpe, which needs pip install "
        "\"torchformer[bpe]\"), or UTF-8 bytes")
    add("--model", choices=("transformer", "lstm"), default="transformer", help="the transformer classifier, or the "
        "recurrent baseline: a bidirectional LSTM with -d layers of --hidden units over -E-dimensional embeddings "
        "(-H, --wide, --positions, --prenorm and --checkpoint-blocks do not apply)")
    add("--hidden", type=int, help="LSTM units per direction (--model lstm; default: -E)")
    add("--pack", action="store_true", help="train on rows of -M positions that each hold several whole reviews, "
        "each review attended to, pooled and classified alone (less padding); a batch has as many rows as hold "
        "about -b reviews. Evaluation stays padded (transformer only)")
    add("-r", "--random-seed", "--seed", dest="seed", type=int, default=1, help="seed for the split, init and batches")
    add("-f", "--final", action="store_true", help="evaluate on the official test set at the end")
    add("--preset", choices=tuple(PRESETS), help="defaults for the flags you do not give, listed below (default: gpu "
        "on CUDA, else cpu)")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    add("--compile", action="store_true", help="torch.compile the model")
    add("--strategy", choices=STRATEGIES, default="ddp", help="under torchrun: DDP (a whole model per process) or "
        "FSDP2 (parameters, gradients and optimizer state sharded over the processes); one process: no effect")
    add("--checkpoint-blocks", action="store_true", help="activation checkpointing: keep only each block's input "
        "and recompute the rest in the backward pass (less memory, more compute; not --checkpoint)")
    add("--threads", type=int, help="torch CPU threads (default: the cores other programs leave idle, measured at "
        "the start). It changes the speed, and the rounding of sums: to reproduce a recorded figure "
        "exactly, use its thread count")
    add("--data", help="folder with imdb_{train,test}.jsonl.gz, an aclImdb/ folder or aclImdb_v1.tar.gz")
    add("--download", action="store_true", help="without --data: fetch the official archive if it is missing")
    add("--val-size", type=int, default=5000, help="training reviews held out for validation")
    add("--eval-every", type=int, help="validate (and checkpoint) every N steps (default: once per epoch)")
    add("--checkpoint", help="folder for resumable checkpoints; with --predict also a checkpoint file")
    add("--checkpoint-minutes", type=float, default=10, help="with --checkpoint: also save one when this "
        "many minutes have passed since the last save (steps alone may be an hour apart on a CPU)")
    add("--stop-at", type=int, help="stop after this many steps, as if interrupted (resume with --checkpoint)")
    add("--out", default="runs/classify_imdb", help="folder for the log, plots, results.json and final model")
    add("--pretrained", metavar="FILE", help="start the encoder from this masked-language model (pretrained.pt of "
        "examples/pretrain_imdb.py); -E, -H, -d, -M, --positions, --prenorm, --tokenizer and -V come from it (and "
        "--wide is refused)")
    add("--predict", action="append", metavar="TEXT_OR_FILE",
        help="classify this text (or each line of this file) with a trained model (OUT/model.pt, or --checkpoint); "
             "repeatable")
    return p


# What a training run writes into --out.
OUTPUTS = ("log.csv", "model.pt", "results.json", "loss.png", "accuracy.png", "calibration.png", "attention.png")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.predict:  # only --threads applies of the flags checked below
        check_flags(p, args, {"threads": CHECKS["threads"]})
        return args
    try:
        device = resolve_device(args.device)
    except (ValueError, TypeError) as e:
        p.error(f"--device: {e}")
    if args.pretrained is not None:
        check_flags(p, args, {"pretrained": CHECKS["pretrained"]})
        take_pretrained_flags(p, args)
    preset = PRESETS[args.preset or ("gpu" if device.type == "cuda" else "cpu")]
    # A preset's optimizer is for a transformer trained from scratch: the LSTM has no blocks for Muon, and the
    # fine-tuning of a pretrained encoder was measured with Adam only (docs/imdb.md).
    typed_optimizer = args.optimizer is not None
    if (args.model == "lstm" or args.pretrained is not None) and not typed_optimizer:
        args.optimizer = "adam"
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.optimizer is None:
        args.optimizer = "adam"
    check_flags(p, args, CHECKS)
    # Each narrow head gets embedding // heads dimensions (the LSTM has no heads).
    if args.embedding % args.heads and not args.wide and args.model == "transformer":
        p.error(f"--embedding must be divisible by --heads, got {args.embedding} and {args.heads} (or pass --wide: "
                f"each head then sees the whole embedding)")
    if args.model == "lstm" and (args.pretrained or args.wide or args.checkpoint_blocks or args.prenorm
                                 or args.positions is not None or args.pack):
        p.error("--model lstm does not take --pretrained, --wide, --positions, --prenorm, --checkpoint-blocks or "
                "--pack (they are transformer options; the LSTM skips its padding itself)")
    if args.positions is None:
        args.positions = MODEL_DEFAULTS["positions"]
    if args.hidden is not None and args.model != "lstm":
        p.error("--hidden sets the LSTM's size: it needs --model lstm")
    if args.stop_at is not None and args.checkpoint is None:
        p.error("--stop-at needs --checkpoint (it simulates an interruption: the run resumes from the checkpoint)")
    if args.download and args.data is not None:
        p.error("--download fetches the archive into the cache: give it without --data")
    if args.optimizer == "muon" and args.model == "lstm":
        p.error("--optimizer muon is for a transformer's blocks: --model lstm trains with --optimizer adam")
    check_outputs(p, args.out, OUTPUTS)
    return args


def take_pretrained_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set the model flags from the ``--pretrained`` file; refuse one given too, or another train/validation split."""
    def flag(key: str) -> str:
        return "--" + key.replace("_", "-")

    given = [flag(k) for k in PRETRAINED_KEYS + ("wide",) if getattr(args, k) not in (None, False)]
    if given:
        p.error(f"--pretrained sets the model and the tokenizer: leave out {', '.join(given)}")
    try:
        checkpoint = read_checkpoint(args.pretrained)
        extra = checkpoint["extra"]
        run = extra["run"]
        if "mask_id" not in extra:  # every file of pretrain_imdb.py has it
            raise KeyError("it has no mask_id")
        tokenizer_from_state_dict(extra["tokenizer"])
        # A file from before --positions and --prenorm was pretrained with learned positions and post-norm.
        # A "rotary" of before 0.5 is the model's "rotary_interleaved".
        run = flags_as_saved(checkpoint, {**{k: MODEL_DEFAULTS[k] for k in ("positions", "prenorm")}, **run})
        missing = [key for key in PRETRAINED_KEYS + ("seed", "val_size") if key not in run]
        if missing:
            raise KeyError(f"its run has no {', '.join(missing)}")
    except (OSError, KeyError, TypeError, ValueError, ImportError) as e:
        p.error(f"--pretrained {args.pretrained}: not a model written by examples/pretrain_imdb.py "
                f"({type(e).__name__}: {e})")
    # The encoder has read the training split's reviews, never the validation ones: only the same split keeps the
    # validation figures honest.
    for key in ("seed", "val_size"):
        if run[key] != getattr(args, key):
            p.error(f"--pretrained {args.pretrained} was pretrained without the validation split of {flag(key)} "
                    f"{run[key]}; got {flag(key)} {getattr(args, key)}: use the same, or the validation reviews may "
                    f"be among those it read")
    for key in PRETRAINED_KEYS:
        setattr(args, key, run[key])


def build_model(config: dict, num_tokens: int, checkpoint_blocks: bool = False,
                device: torch.device | None = None, copies: float = 4) -> CTransformer | LSTMClassifier:
    """The classifier the flags describe; with ``device``, first checked to fit there (``copies`` of its weights,
    sized on the meta device)."""
    def build() -> CTransformer | LSTMClassifier:
        if config["model"] == "lstm":
            return LSTMClassifier.from_config(lstm_config(config, num_tokens))
        model = CTransformer(config["embedding"], config["heads"], config["depth"], config["max_length"],
                             num_tokens, len(CLASSES), pool="max" if config["max_pool"] else "mean",
                             dropout=config["dropout"], wide=config["wide"], positions=config["positions"],
                             prenorm=config["prenorm"], checkpoint_blocks=checkpoint_blocks)
        model.check_values = False  # our tokenizer's ids are in range: no wait for the GPU at every step to check
        return model

    try:
        if device is not None:
            check_model_fits(build, device, copies=copies)  # a typo in -M or -E is then an error, not an OOM kill
        return build()
    except (ValueError, MemoryError) as e:  # e.g. -E not divisible by -H, --dropout outside [0, 1), -M 10**9
        sys.exit(f"error: cannot build the model from these flags: {e}")


def lstm_config(config: dict, num_tokens: int) -> LSTMConfig:
    return LSTMConfig(num_tokens, len(CLASSES), emb=config["embedding"], hidden=config["hidden"] or config["embedding"],
                      layers=config["depth"], dropout=config["dropout"], pool="max" if config["max_pool"] else "mean")


def load_classifier(path: Path) -> CTransformer | LSTMClassifier:
    """The trained model in a checkpoint of this script: a transformer rebuilds itself from the config the file holds;
    the LSTM from the flags in its extra."""
    saved = read_checkpoint(path)
    config = {**MODEL_DEFAULTS, **saved["extra"]["config"]}
    if config["model"] != "lstm":
        return load_model(path, model_class=CTransformer)
    model = build_model(config, len(tokenizer_from_state_dict(saved["extra"]["tokenizer"])))
    load_checkpoint(path, model=model, restore_rng=False)
    return model


def saved_tokenizer(path: Path):
    """The tokenizer in the extra of a checkpoint written by this script."""
    try:
        extra = read_checkpoint(path)["extra"]
    except (OSError, ValueError) as e:  # missing, damaged (CheckpointError names it) or not a checkpoint
        sys.exit(f"classify_imdb.py: error: {e}")
    try:
        return tokenizer_from_state_dict(extra["tokenizer"])
    except ImportError as e:  # a BPE model without the tokenizers package
        sys.exit(f"classify_imdb.py: error: {path}: {e}")
    except (KeyError, TypeError, ValueError) as e:
        sys.exit(f"classify_imdb.py: error: {path} holds no tokenizer, so it was not written by this script "
                 f"({type(e).__name__}: {e})")


def check_resumable(ckpt: Path, args: argparse.Namespace) -> None:
    """Refuse to resume ``ckpt`` with other model or run flags (``MODEL_KEYS``, ``RUN_KEYS``), naming them.

    Only the checkpoint's small ``extra`` part is read here (the weights stay on disk): a changed flag gets a
    message naming it, not a config or weight-shape mismatch later, and a changed ``-b`` or ``-e`` cannot silently
    skip the wrong batches or bend the schedule.
    """
    try:
        checkpoint = read_checkpoint(ckpt)
        extra = checkpoint["extra"]
        # Checkpoints of earlier versions have no "run", and no model flags added since (MODEL_DEFAULTS).
        saved = flags_as_saved(checkpoint, {**MODEL_DEFAULTS, **RUN_DEFAULTS, **extra["config"],
                                            **extra.get("run", {})})
    except (OSError, ValueError, KeyError, TypeError) as e:  # a foreign or damaged file: say which, not a traceback
        sys.exit(f"cannot resume: {ckpt} is not a checkpoint written by this script ({type(e).__name__}: {e}); "
                 f"use a new --checkpoint folder")
    ignored = ("vocab_size",) if args.tokenizer == "byte" else ()  # bytes have no vocabulary to size
    changed = [f"--{k.replace('_', '-')} {saved[k]} (now {getattr(args, k)})"
               for k in MODEL_KEYS + RUN_KEYS if k in saved and saved[k] != getattr(args, k) and k not in ignored]
    if changed:
        sys.exit(f"cannot resume: {ckpt} was trained with {', '.join(changed)}; use the same flags, or a new "
                 f"--checkpoint folder")


def encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    # An empty review would be an all-padding row (nothing to attend to): give it one token instead (id 1: <unk> for
    # words, a byte for the byte and BPE tokenizers; IMDb has no empty review, and --predict refuses one).
    return [tokenizer.encode(text, max_length=max_length) or [1] for text in texts]


def looks_like_a_path(text: str) -> bool:
    """One word with a folder separator or a text file's ending: a file name, not a review."""
    word = text.strip()
    return bool(word) and not any(c.isspace() for c in word) and (
        "/" in word or os.sep in word or word.lower().endswith((".txt", ".csv", ".tsv", ".jsonl", ".json", ".gz")))


def predict(args: argparse.Namespace) -> None:
    threads, _ = choose_threads(args.threads)
    torch.set_num_threads(threads)
    source = Path(args.checkpoint) if args.checkpoint else Path(args.out) / "model.pt"
    path = latest_intact_checkpoint(source) if source.is_dir() else source
    if path is None or not path.is_file():
        sys.exit(f"classify_imdb.py: error: no trained model at {source}: train first (the final model goes to "
                 f"--out), or pass --out or --checkpoint to point at one")
    tokenizer = saved_tokenizer(path)  # first: it says whether this script wrote the file
    try:  # the checkpoint holds the model's config, so the model is rebuilt from the file alone
        model = load_classifier(path)
    except (KeyError, ValueError) as e:  # not a checkpoint, or one of another model
        sys.exit(f"classify_imdb.py: error: {path} holds no model of this script ({type(e).__name__}: {e})")
    texts = []
    for item in args.predict:  # each item is a text, or a file holding one review per line
        if not item.strip():  # before the file checks: Path("") is the current folder
            sys.exit("classify_imdb.py: error: --predict needs a non-empty review text "
                     "(or a file with one review per line)")
        if len(item) < 4096 and Path(item).is_dir():
            sys.exit(f"classify_imdb.py: error: --predict {item}: a folder; pass a text file with one review per line")
        if not (len(item) < 4096 and Path(item).is_file()):
            if looks_like_a_path(item):  # a misspelt file name would otherwise be classified as a review
                sys.exit(f"classify_imdb.py: error: --predict {item}: no such file (a review to classify as it is "
                         f"has words separated by spaces)")
            try:
                texts.append(utf8_text(item))
            except argparse.ArgumentTypeError as e:  # a word tokenizer would read the bad bytes as <unk>
                sys.exit(f"classify_imdb.py: error: --predict: {e}")
            continue
        try:
            texts += [t for t in Path(item).read_text(encoding="utf-8").splitlines() if t.strip()]
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"classify_imdb.py: error: --predict {item}: cannot read it as UTF-8 text ({e})")
    if not texts or not all(t.strip() for t in texts):
        sys.exit("classify_imdb.py: error: --predict needs a non-empty review text "
                 "(or a file with one review per line)")
    max_length = {**MODEL_DEFAULTS, **read_checkpoint(path)["extra"]["config"]}["max_length"]
    ids, mask = pad_batch(encode(tokenizer, texts, max_length))
    with torch.no_grad():
        probs = model.eval()(ids, mask).exp()
    for text, p in zip(texts, probs.tolist()):
        scores = "  ".join(f"P({c})={q:.3f}" for c, q in zip(CLASSES, p))
        print(f"{scores}  -> {CLASSES[max(range(len(p)), key=p.__getitem__)]}  | {text[:70]!r}")


def evaluate(model, batches: ClassificationBatches, desc: str):
    """:func:`evaluate_classifier` behind a progress bar: scoring the test set takes many seconds on a CPU. Each
    process scores its share of the batches; every process gets the figures of all of them."""
    with progress(batches, total=len(batches), desc=desc) as bar:
        return evaluate_classifier(model, bar, distributed=True)


def train(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    threads, why = choose_threads(args.threads)  # PyTorch's default takes every core, also the ones in use
    torch.set_num_threads(threads)
    # Only the main process prints from here on; every process is seeded alike (the same split and initial weights).
    run = start_run(resolve_device(args.device), strategy=args.strategy, seed=args.seed)
    device = run.device  # under torchrun on CUDA: this process's GPU
    print(f"device: {device}" + (f", {threads} CPU thread(s) ({why})" if device.type == "cpu" else ""))
    print(describe_run(run, strategy=args.strategy, batch_size=args.batch_size, unit="reviews",
                       learn_rate=args.learn_rate))
    out = Path(args.out)
    config = {k: getattr(args, k) for k in MODEL_KEYS}
    resume = None
    if run.is_main:  # the final model.pt is written atomically too: a killed save leaves its temporary in --out
        remove_interrupted_saves(out, args.checkpoint)
    if args.checkpoint:  # checked before the data are read
        # Warns of each damaged one it skips; the main process renames those (else pruning would keep them).
        resume = latest_intact_checkpoint(args.checkpoint, set_aside=run.is_main)
    if resume is not None:
        check_resumable(resume, args)
    if run.is_main:
        out.mkdir(parents=True, exist_ok=True)
    try:
        train_all, test = imdb(args.data, download=args.download) if args.data is None else imdb(args.data)
    except DataNotFoundError as e:  # nothing in the cache folder: the flags that fix it, not the Python API's
        sys.exit(f"classify_imdb.py: error: {e.problem}; pass --data FOLDER, or --download to fetch the official "
                 f"archive")
    except FileNotFoundError as e:  # --data names a folder without the data: the message says what is missing
        sys.exit(f"classify_imdb.py: error: {e}")
    except ValueError as e:  # a damaged or unofficial file (the message names it); --download replaces a cached one
        hint = "" if args.data is not None else "\n(with the cached archive: --download fetches it again)"
        sys.exit(f"classify_imdb.py: error: {e}{hint}")
    except OSError as e:  # no network for --download, a cache folder that is a file, an unreadable file
        sys.exit(f"classify_imdb.py: error: {e}")
    if args.val_size >= len(train_all):
        sys.exit(f"classify_imdb.py: error: --val-size must be less than the {len(train_all):,} training reviews, "
                 f"got {args.val_size}")
    train_set, val_set = train_val_split(train_all, val_size=args.val_size, seed=args.seed)
    if args.pretrained:  # the pretraining corpus left out exactly the reviews this run evaluates on?
        held_out = read_checkpoint(args.pretrained)["extra"].get("corpus", {}).get("held_out_sha256")
        if held_out is not None and held_out != texts_digest([t for t, _ in test] + [t for t, _ in val_set]):
            sys.exit(f"classify_imdb.py: error: --pretrained {args.pretrained} was pretrained on a corpus that left "
                     f"out other test and validation reviews than this run's (other --data?): it may have read "
                     f"the reviews it would be evaluated on. Pretrain on this data, or use the data it was "
                     f"pretrained with")
    print(f"tokenizing {len(train_set):,} training and {len(val_set):,} validation reviews ({args.tokenizer} "
          f"tokenizer)")  # several seconds on a CPU

    if resume is not None:  # the vocabulary travels with the checkpoint, so a resumed run uses the very same one
        tokenizer = saved_tokenizer(resume)
    elif args.pretrained:  # the vocabulary the encoder was pretrained with (built from the same training reviews)
        tokenizer = saved_tokenizer(Path(args.pretrained))
    else:  # words and BPE learn from the training part only: the vocabulary must not peek at val/test
        try:
            tokenizer = build_tokenizer(args.tokenizer, [text for text, _ in train_set], vocab_size=args.vocab_size)
        except (ImportError, ValueError) as e:  # no tokenizers package; -V below 257 for BPE
            sys.exit(f"classify_imdb.py: error: --tokenizer {args.tokenizer} -V {args.vocab_size}: {e}")
    eval_set = test if args.final else val_set

    def packed_batches(examples, generator) -> PackedBatches:
        """Rows of -M positions, whole reviews each (cut to -M already, so each fits); as many rows per batch as
        hold about -b reviews, so the steps and the schedule stay about those of padded batches."""
        encoded = encode(tokenizer, [t for t, _ in examples], args.max_length)
        lengths = [len(e) for e in encoded]
        rows = len(pack(lengths, args.max_length))
        packed = PackedBatches(encoded, labels=[y for _, y in examples], num_classes=len(CLASSES),
                               row_length=args.max_length, batch_size=max(1, round(args.batch_size * rows /
                               len(encoded))), generator=generator, device=device)
        bucketed = bucketed_padding(lengths, args.batch_size, generator=torch.Generator().manual_seed(args.seed))
        print(f"packed: {rows:,} rows of {args.max_length} positions ({len(encoded) / rows:.2f} reviews per row), "
              f"{packed.batch_size} rows per batch; {packed.padding:.1%} of the positions padding (length-bucketed "
              f"batches of {args.batch_size} reviews: about {bucketed:.1%})")
        return packed

    def batches(examples, shuffle, generator=None):
        return ClassificationBatches(encode(tokenizer, [t for t, _ in examples], args.max_length),
                                     [y for _, y in examples], batch_size=args.batch_size if shuffle else
                                     2 * args.batch_size, shuffle=shuffle, generator=generator, device=device,
                                     num_classes=len(CLASSES))

    g = torch.Generator().manual_seed(args.seed)  # batch order; saved in checkpoints
    train_batches = packed_batches(train_set, g) if args.pack else batches(train_set, True, g)
    val_batches = batches(val_set, False)
    print(f"tokenized {len(train_set):,} train / {len(val_set):,} val reviews, vocabulary {len(tokenizer):,}, "
          f"{time.perf_counter() - t_start:.0f}s")

    # With --pretrained the vocabulary has one more id, the [MASK] of pretraining (never in a review).
    num_tokens = len(tokenizer) + 1 if args.pretrained else len(tokenizer)
    sharded = args.strategy == "fsdp" and run.world_size > 1  # FSDP shards all but the model being built
    model = build_model(config, num_tokens, args.checkpoint_blocks, device=device,
                        copies=1 + 3 / run.world_size if sharded else 4)
    if args.pretrained and resume is None:  # a resumed run has the fine-tuned weights in its checkpoint
        try:
            model.load_encoder(load_model(args.pretrained, model_class=MLMTransformer))
        except ValueError as e:
            sys.exit(f"classify_imdb.py: error: --pretrained {args.pretrained}: {e}")
        print(f"encoder and embedding from {args.pretrained}")
    model = model.to(device)
    seed_each_process(args.seed)  # each process its own dropout masks (the main one keeps its stream)
    # FSDP2 shards a transformer block by block, the LSTM as one piece.
    # `model` stays the module (with FSDP2, sharded in place)
    wrapped = wrap_model(model, strategy=args.strategy, blocks=[] if args.model == "lstm" else None)
    opt = make_optimizer(model, args.optimizer, lr=args.learn_rate)  # after wrapping
    per_epoch, total = len(train_batches), args.num_epochs * len(train_batches)
    # --lr-warmup counts reviews; a packed batch holds -b of them on average only.
    warmup = min(round(args.lr_warmup * per_epoch / len(train_set)) if args.pack else args.lr_warmup // args.batch_size,
                 total)
    sched = warmup_cosine(opt, warmup_steps=warmup, total_steps=total)
    step = 0
    if resume is not None:
        # g comes back in its state at the start of the interrupted epoch; we replay its order and skip ahead.
        try:
            state = load_distributed_checkpoint(resume, model=model, optimizer=opt, scheduler=sched,
                                                generators={"batches": g})
        except ValueError as e:
            sys.exit(f"cannot resume: {e}. Use the same flags, or a new --checkpoint folder")
        step = state["step"]
        t_start -= state["extra"].get("elapsed_s", 0.0)  # the log's seconds and wall_seconds go on from there
        print(f"resumed from {resume} at step {step}")
        if state["world_size"] != run.world_size:  # each process's dropout masks came from another split
            print(f"note: {resume.name} was written by {state['world_size']} process(es), resumed on "
                  f"{run.world_size}: the same batches and schedule, but not bit for bit the run it would have been")
    fast = torch.compile(wrapped) if args.compile else wrapped
    print(f"{count_parameters(model):,} parameters, {total} steps on {device}")

    eval_every = args.eval_every or per_epoch
    extra = {"config": config, "run": {k: getattr(args, k) for k in RUN_KEYS}, "tokenizer": tokenizer.state_dict()}
    # A resumed run logs again the steps after its checkpoint: drop the rows a killed run wrote for them.
    try:
        log = (CSVLogger(out / "log.csv", ["step", "epoch", "lr", "train_loss", "val_loss", "val_accuracy", "seconds"],
                         resume_step=step) if run.is_main else NoLog())  # only the main process writes files
    except ValueError as e:  # the log.csv of another script's run in this --out
        sys.exit(f"classify_imdb.py: error: {e}")

    def diverged(message: str) -> None:
        bar.close()
        kept = (f" The checkpoints in {args.checkpoint} predate it and are kept."
                if args.checkpoint and any(Path(args.checkpoint).glob("*.pt")) else "")
        sys.exit(f"error: {message} (flags -l, --lr-warmup, --gradient-clipping).{kept}")

    def check_diverged(losses: list) -> torch.Tensor:
        """The whole batches' losses of the steps up to `step` (each process holds its part), checked: every
        process checks the same numbers, so all stop together."""
        whole = average_over_processes(torch.stack(losses))
        try:
            check_finite_losses(whole.tolist(), range(step - len(losses) + 1, step + 1))
        except TrainingDiverged as e:
            diverged(str(e))
        return whole

    def validate():
        try:
            return evaluate(fast, val_batches, "validation")
        except ValueError as e:  # NaN or infinite outputs: a divergence the losses read so far did not show yet
            diverged(f"validation at step {step} failed: {e}. The training losses were finite: the last updates "
                     f"probably broke the weights. The usual remedies: a lower learning rate, a longer warmup, "
                     f"gradient clipping")

    def save(step: int, epoch_state: torch.Tensor) -> None:
        state = torch.Generator()  # the start state of the epoch a resumed run replays
        state.set_state(g.get_state() if step % per_epoch == 0 else epoch_state)
        # Every process takes part (the states are gathered onto the main one, which writes the file).
        save_distributed_checkpoint(checkpoint_path(args.checkpoint, step), model=model, optimizer=opt,
                                    scheduler=sched, step=step, generators={"batches": state},
                                    extra={**extra, "elapsed_s": time.perf_counter() - t_start})
        if run.is_main:
            prune_checkpoints(args.checkpoint, keep=2)
        clock.reset()

    clock = CheckpointClock(args.checkpoint_minutes if args.checkpoint else None, device=device)
    bar = progress(total=total, desc="train")
    bar.update(step)
    # Losses and token counts stay on the device and are read every 50 steps: reading them at every step would make
    # the host wait for the GPU twice more per step (the batches are copied from pinned memory, without a wait; the
    # model reads no values: build_model sets check_values = False).
    running, tokens, t_log = [], 0, time.perf_counter()
    for epoch in range(step // per_epoch, args.num_epochs):
        epoch_state = g.get_state()  # the epoch's shuffle is drawn from g when iteration starts
        skip = step - epoch * per_epoch
        for i, batch in enumerate(train_batches):
            if i < skip:
                continue
            # Packed: (ids, documents, mask, labels), labels (b, t) at each row's document numbers; else (b,) labels.
            ids, documents, mask, labels = batch if args.pack else (batch[0], None, *batch[1:])
            fast.train()
            share = share_batch(len(labels))  # this process's rows of the batch (all of them for one process)
            with autocast(device):
                if documents is None:
                    logp = fast(share.take(ids), share.take(mask))  # (b, c)
                else:  # each document pooled and classified alone: (b, t, c), row r's document d at [r, d]
                    logp = fast(share.take(ids), share.take(mask), documents=share.take(documents))
            # Its part of the batch's mean loss: averaged over the processes with the gradients, that mean. A packed
            # batch's mean is over its reviews, not its rows (a device tensor: no wait to count them).
            divisor = share.divisor if documents is None else share.divisor * (labels != IGNORE).sum() / len(labels)
            loss = F.nll_loss(logp.float().flatten(0, -2), share.targets(labels).flatten(), reduction="sum") / divisor
            loss = loss + auxiliary_loss(fast)  # what the model's parts add (a mixture's balance loss); 0 without
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.gradient_clipping > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clipping)
            opt.step()
            sched.step()
            step += 1
            running.append(loss.detach())
            tokens += mask.sum()
            bar.update(1)
            if step % 50 == 0:
                recent = check_diverged(running[-50:]).mean().item()
                bar.set_postfix({"loss": f"{recent:.3f}",  # "tok/s" as generate_enwik8.py's bar says it
                                 "tok/s": f"{int(tokens) / (time.perf_counter() - t_log):,.0f}"})
                log.log(step=step, epoch=f"{step / per_epoch:.3f}", lr=sched.get_last_lr()[0], train_loss=recent,
                        seconds=round(time.perf_counter() - t_start, 1))
                tokens, t_log = 0, time.perf_counter()
            if step % eval_every == 0 or step == total or step == args.stop_at:
                train_loss = check_diverged(running).mean().item()
                val = validate()
                log.log(step=step, epoch=f"{step / per_epoch:.3f}", val_loss=val.loss, val_accuracy=val.accuracy,
                        seconds=round(time.perf_counter() - t_start, 1))
                bar.write(f"step {step}: train loss {train_loss:.4f} (since last validation), "
                          f"val loss {val.loss:.4f}, val accuracy {val.accuracy:.4f}")
                if args.checkpoint:
                    save(step, epoch_state)
                running, tokens, t_log = [], 0, time.perf_counter()
                bar.unpause()  # the bar's rate and time left count training steps only
            elif step % 50 == 0 and clock.due():  # a checkpoint on the clock, between evaluations
                save(step, epoch_state)
                t_log = time.perf_counter()
                bar.unpause()
            if step == args.stop_at:
                bar.close()
                log.close()
                print(f"stopped at step {step} (--stop-at); run again with the same --checkpoint to resume")
                return {}
    bar.close()
    log.close()
    save_distributed_checkpoint(out / "model.pt", model=model, step=step, extra=extra)
    plots = (("loss", ["train_loss", "val_loss"], "loss (nats per review: mean negative log-likelihood)"),
             ("accuracy", ["val_accuracy"], "validation accuracy (fraction of reviews right)"))
    for name, ys, ylabel in plots if run.is_main else ():
        if not plot_curves(out / "log.csv", out / f"{name}.png", x="step", ys=ys, ylabel=ylabel,
                           title=f"IMDb: {name}", logy=name == "loss"):
            print("matplotlib is not installed: no plots")
    if args.final:
        print(f"tokenizing the {len(test):,} test reviews")
    eval_batches = batches(test, False) if args.final else val_batches
    return report(model, tokenizer, eval_set, eval_batches, args, out, t_start, writes=run.is_main)


def report(model, tokenizer, eval_set, eval_batches: ClassificationBatches, args, out: Path, t_start: float, *,
           writes: bool = True) -> dict:
    """Accuracy, confusion matrix and calibration on the evaluation set, and a picture of one review's attention.

    Every process evaluates (an FSDP2 model runs on all of them at once); only the one that ``writes`` writes files,
    after the final model.pt is saved.
    """
    split = "test" if args.final else "validation"
    result = evaluate(model, eval_batches, split)
    print(f"\n{split} accuracy {result.accuracy:.4f} on {result.count:,} reviews (loss {result.loss:.4f})")
    print(format_confusion_matrix(result.confusion, labels=CLASSES))
    calibration = result.calibration
    wrong = calibration.mean_confidence_wrong
    print(f"calibration: expected calibration error {calibration.ece:.4f}; mean confidence "
          f"{calibration.mean_confidence_right:.3f} when right, "
          + ("no wrong answers" if math.isnan(wrong) else f"{wrong:.3f} when wrong"))
    if writes and not plot_reliability(calibration, out / "calibration.png", title=f"IMDb {split}: reliability "
                                       f"diagram (ECE {calibration.ece:.3f})"):
        print("matplotlib is not installed: no calibration.png (pip install matplotlib)")
    if writes and args.model == "transformer":  # one process draws it, with a whole copy of the model (an FSDP2
        # model's blocks are sharded); the LSTM has no attention to draw
        plot_one_review(load_model(out / "model.pt", model_class=CTransformer), tokenizer, eval_set, eval_batches, out)
    seconds = time.perf_counter() - t_start
    results = {"split": split, "accuracy": result.accuracy, "loss": result.loss, "count": result.count,
               "confusion": result.confusion.tolist(), "calibration": calibration.to_dict(),
               "wall_seconds": round(seconds, 1), "cpu_seconds": round(time.process_time(), 1)}
    if writes:
        (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"total time {seconds:.0f}s; outputs in {out}")
    return results


def plot_one_review(model: CTransformer, tokenizer, eval_set, eval_batches: ClassificationBatches, out: Path) -> None:
    """attention.png: the last block's attention (mean over heads) on one short review of the evaluation set."""
    # One short review (at least 20 tokens), cut to 48 tokens so the words stay legible.
    encoded = eval_batches.encoded  # (already tokenized and cut to --max)
    index = min((i for i, e in enumerate(encoded) if len(e) >= 20), key=lambda i: len(encoded[i]), default=0)
    ids, mask = pad_batch([encoded[index][:48]], device=next(model.parameters()).device)
    model.eval()
    weights = attention_weights(model, ids, mask)[0].mean(dim=0)  # (t, t), averaged over heads
    with torch.no_grad():
        p_pos = model(ids, mask).exp()[0, 1].item()
    words = [tokenizer.decode([i]) for i in ids[0].tolist()]
    plot_attention(weights, x_labels=words, y_labels=words, path=out / "attention.png",
                   title=f"last block, mean over heads; true {CLASSES[eval_set[index][1]]}, P(positive)={p_pos:.2f}")


def plot_reliability(calibration: Calibration, path: Path, *, title: str) -> bool:
    """A reliability diagram: per confidence bin, the accuracy (a bar over the bin) and a dot at (mean confidence,
    accuracy), against the diagonal, on which a perfectly calibrated model's dots would lie. Dots below it: the model
    was surer than it was right (overconfident). Returns False without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    edges, counts = calibration.edges.tolist(), calibration.counts.tolist()
    fig = Figure(figsize=(5.5, 5))
    FigureCanvasAgg(fig)  # no pyplot: no global state, no window
    ax = fig.add_subplot()
    ax.plot([edges[0], 1], [edges[0], 1], color="gray", linestyle="--", label="perfectly calibrated")
    for low, high, n, conf, acc in zip(edges, edges[1:], counts, calibration.confidence.tolist(),
                                       calibration.accuracy.tolist()):
        if n:  # an empty bin has no accuracy to draw
            ax.bar(low, acc, width=high - low, align="edge", color="tab:blue", alpha=0.6, edgecolor="white")
            ax.plot([conf], [acc], marker="o", color="tab:red", markersize=4)
            ax.annotate(f"{n:,}", (low + (high - low) / 2, 0.01), ha="center", va="bottom", fontsize=7)
    ax.plot([], [], marker="o", color="tab:red", linestyle="none", label="a bin's (mean confidence, accuracy)")
    ax.set_xlim(edges[0], 1)
    ax.set_ylim(0, 1.2)  # room for the legend above the bars
    ax.set_yticks([i / 5 for i in range(6)])
    ax.set_xlabel("confidence (probability of the predicted class)")
    ax.set_ylabel("accuracy (bars; at their foot: the number of reviews)")
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    return True


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.predict:
        predict(args)
        return {}
    try:
        results = train(args)
    except OSError as e:  # a full disk, say, while writing a checkpoint (the message names the file)
        kept = " The checkpoints written before are kept." if args.checkpoint else ""
        sys.exit(f"classify_imdb.py: error: {e}.{kept}")
    # Only once train() has let go of the wrapped model: a DDP model that outlives its process group can deadlock
    # in its destructor (gloo).
    teardown_distributed()
    return results


if __name__ == "__main__":
    main()
