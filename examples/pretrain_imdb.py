"""Masked-language-model pretraining (BERT) of a transformer encoder on IMDb's unlabelled reviews.

    python examples/pretrain_imdb.py --data path/to/dir --preset cpu           # -> runs/pretrain_imdb/pretrained.pt
    python examples/classify_imdb.py --data path/to/dir --pretrained runs/pretrain_imdb/pretrained.pt --final

The corpus is IMDb's 50,000 unlabelled reviews plus the training reviews (without the validation split), after
removing every review that also occurs in the test set or the validation split, and every repeat: the classifier
fine-tuned afterwards is evaluated on reviews the pretrained encoder has never read. The vocabulary (``--tokenizer
word`` or ``bpe``) is built from the training reviews only, as ``classify_imdb.py`` builds it, and saved with the
model, so the classifier reads text exactly as the encoder did. The split uses ``--seed`` and ``--val-size`` like
``classify_imdb.py``, which refuses a pretrained file of another split.

Each step masks 15 % of the real tokens (80 % ``[MASK]``, 10 % a random token, 10 % kept), and the model learns to
predict the originals (:mod:`torchformer.train.masked_lm`). The masked-token accuracy and loss on the validation
reviews (masked the same way every time) are logged; checkpoints resume exactly. One process (no torchrun).
See docs/imdb.md.
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

from torchformer.data.batching import ClassificationBatches, bucketed_padding
from torchformer.data.packing import PackedBatches
from torchformer.nn.auxiliary import auxiliary_loss
from torchformer.data.imdb_dataset import imdb, train_val_split
from torchformer.data.imdb_unlabelled import deduplicate, imdb_unlabelled, texts_digest
from torchformer.data.encoded import cached_encoding, encoding_key
from torchformer.data.tokenizers import build_tokenizer
from torchformer.config import POSITIONS
from torchformer.models import MLMTransformer
from torchformer.train.checkpoint import (
    checkpoint_path, latest_intact_checkpoint, load_checkpoint, prune_checkpoints, read_checkpoint,
    save_checkpoint,
)
from torchformer.scripts.cli import (
    POSITIVE, POSITIVE_INT, WRITABLE_FOLDER, check_flags, check_model_fits, check_outputs, choose_threads,
    flags_as_saved,
    preset_epilog, preset_flags, remove_interrupted_saves,
)
from torchformer.train.masked_lm import mask_tokens, masked_lm_loss
from torchformer.train.training import (
    CSVLogger, CheckpointClock, TrainingDiverged, autocast, check_finite_losses, count_parameters, plot_curves,
    progress,
    resolve_device, warmup_cosine,
)

PRESETS = {
    # Sized to pretrain in about an hour and a half on one CPU core (docs/imdb.md): twice the classifier preset's
    # width and depth, half its review length (the cost of a step grows with the tokens in it). Rotary positions and
    # pre-norm: with learned positions and post-norm the same run learned to copy and to guess frequent words, and
    # little more (14.3 % masked accuracy against 27 %+; docs/imdb.md).
    "cpu": dict(num_epochs=2, batch_size=32, learn_rate=1e-3, embedding=128, heads=4, depth=2, max_length=256,
                vocab_size=20_000, lr_warmup=50_000, dropout=0.1, tokenizer="word", positions="rotary", prenorm=True),
    "gpu": dict(num_epochs=10, batch_size=64, learn_rate=5e-4, embedding=256, heads=8, depth=4, max_length=512,
                vocab_size=20_000, lr_warmup=200_000, dropout=0.1, tokenizer="word", positions="rotary", prenorm=True),
}
# Must match to resume a checkpoint: they fix the model, the corpus, the vocabulary and the schedule.
RESUME_KEYS = ("embedding", "heads", "depth", "max_length", "dropout", "tokenizer", "vocab_size", "batch_size",
               "num_epochs", "learn_rate", "lr_warmup", "mask_rate", "val_size", "seed", "positions", "prenorm", "pack")
# What a checkpoint written before a flag existed was trained with.
RESUME_DEFAULTS = {"positions": "learned", "prenorm": False, "pack": False}

CHECKS = {
    **dict.fromkeys(("num_epochs", "batch_size", "embedding", "max_length", "heads", "depth", "val_size",
                     "eval_every", "stop_at", "threads"), POSITIVE_INT),
    "vocab_size": (lambda v: v >= 3, "an int >= 3 (<pad>, <unk> and at least one word)"),
    "checkpoint_minutes": POSITIVE,
    "learn_rate": (lambda v: 0 < v < 1e30, "a positive number below 1e30"),
    "lr_warmup": (lambda v: v >= 0, "an int >= 0"),
    "mask_rate": (lambda v: 0 < v < 1, "a number in (0, 1)"),
    "dropout": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "seed": (lambda v: 0 <= v < 2**32, "an int in [0, 2**32)"),
    "data": (lambda v: Path(v).exists(), "an existing folder, or the official archive"),
    "checkpoint": WRITABLE_FOLDER,
    "out": WRITABLE_FOLDER,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=preset_epilog(PRESETS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_flags(p, PRESETS)
    add("-e", "--num-epochs", type=int, help="passes over the pretraining corpus")
    add("-b", "--batch-size", type=int, help="reviews per batch (with --pack: rows of --max-length positions)")
    add("-l", "--learn-rate", type=float, help="peak learning rate (Adam)")
    add("-E", "--embedding", type=int, help="embedding size")
    add("-H", "--heads", type=int, help="attention heads")
    add("-d", "--depth", type=int, help="transformer blocks")
    add("-M", "--max", "--max-length", dest="max_length", type=int, help="tokens kept per review (the rest is cut); "
        "the classifier fine-tuned from it takes the same")
    add("-V", "--vocab-size", type=int, help="vocabulary size of the word or BPE tokenizer, <pad> (and the words' <unk>, or BPE's 256 bytes) "
        "included; [MASK] is one more (ignored by --tokenizer byte)")
    add("--tokenizer", choices=("word", "bpe", "byte"), help="words or byte-level BPE subwords (learned from the "
        "training split, as classify_imdb.py learns them), or UTF-8 bytes")
    add("--positions", choices=POSITIONS, help="how the model knows word order: added to the embeddings (learned, "
        "sinusoidal, none) or inside attention (rotary, alibi, relative); docs/positions.md")
    add("--prenorm", action=argparse.BooleanOptionalAction, help="layer norm before each sublayer (GPT-2), or "
        "(--no-prenorm) after the residual (former's post-norm); docs/blocks.md")
    add("--lr-warmup", type=int, help="warm the learning rate up over this many *reviews*")
    add("--pack", action="store_true", help="fill each batch row with whole reviews (rows of --max-length "
        "positions, attention kept inside each review) instead of padding each review to its batch's longest")
    add("--dropout", type=float, help="dropout rate")
    add("--mask-rate", type=float, default=0.15, help="the fraction of real tokens the model predicts in each step")
    add("-r", "--random-seed", "--seed", dest="seed", type=int, default=1, help="seed for the split (the same as "
        "classify_imdb.py's), the initial weights, the batches and the masks")
    add("--val-size", type=int, default=5000, help="training reviews held out for validation (as classify_imdb.py)")
    add("--preset", choices=tuple(PRESETS), help="defaults for the flags you do not give, listed below (default: gpu "
        "on CUDA, else cpu)")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    add("--threads", type=int, help="torch CPU threads (default: the cores other programs leave idle)")
    add("--data", required=True, help="folder with imdb_{train,test,unsup}.jsonl.gz, an aclImdb/ folder, or the "
        "official archive's folder")
    add("--eval-every", type=int, help="validate (and checkpoint) every N steps (default: 4 times per epoch)")
    add("--checkpoint", help="folder for resumable checkpoints")
    add("--checkpoint-minutes", type=float, default=10, help="with --checkpoint: also save one when this "
        "many minutes have passed since the last save (steps alone may be an hour apart on a CPU)")
    add("--stop-at", type=int, help="stop after this many steps, as if interrupted (resume with --checkpoint)")
    add("--out", default="runs/pretrain_imdb", help="folder for pretrained.pt, the log, the plot and results.json")
    return p


OUTPUTS = ("log.csv", "pretrained.pt", "results.json", "loss.png")  # what a run writes into --out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if os.environ.get("WORLD_SIZE", "1").strip() != "1":  # torchrun sets it (any other value: not one process)
        p.error(f"pretraining runs in one process, but WORLD_SIZE is {os.environ['WORLD_SIZE']!r}: start it with "
                f"python, not torchrun")
    try:
        device = resolve_device(args.device)
    except (ValueError, TypeError) as e:
        p.error(f"--device: {e}")
    for key, value in PRESETS[args.preset or ("gpu" if device.type == "cuda" else "cpu")].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check_flags(p, args, CHECKS)
    if args.embedding % args.heads:
        p.error(f"--embedding must be divisible by --heads, got {args.embedding} and {args.heads}")
    if args.stop_at is not None and args.checkpoint is None:
        p.error("--stop-at needs --checkpoint (it simulates an interruption: the run resumes from the checkpoint)")
    check_outputs(p, args.out, OUTPUTS)
    return args


def corpus(args: argparse.Namespace) -> tuple[list[str], list[str], list[str], dict]:
    """(pretraining texts, training-split texts, validation texts, what de-duplication removed)."""
    try:
        train_all, test = imdb(args.data)
        unlabelled = imdb_unlabelled(args.data)
    except (OSError, ValueError) as e:  # missing, damaged or unreadable files: the message names the file
        sys.exit(f"pretrain_imdb.py: error: {e}")
    if args.val_size >= len(train_all):
        sys.exit(f"pretrain_imdb.py: error: --val-size must be less than the {len(train_all):,} training reviews, "
                 f"got {args.val_size}")
    train_set, val_set = train_val_split(train_all, val_size=args.val_size, seed=args.seed)
    train_texts, val_texts = [t for t, _ in train_set], [t for t, _ in val_set]
    held_out = [t for t, _ in test] + val_texts
    kept = deduplicate(unlabelled + train_texts, exclude=held_out)
    # The digest of the held-out texts: classify_imdb.py --pretrained checks that it evaluates on these very ones.
    removed = {"unlabelled": len(unlabelled), "training_split": len(train_texts),
               "overlapping_test_or_validation": kept.overlapping, "repeats": kept.repeated, "kept": len(kept.texts),
               "held_out_sha256": texts_digest(held_out)}
    if not kept.texts:
        sys.exit(f"pretrain_imdb.py: error: no review is left to pretrain on: all {len(unlabelled):,} unlabelled "
                 f"and {len(train_texts):,} training reviews occur in the test set or the validation split (is "
                 f"{args.data}'s test file a copy of its training file?)")
    return kept.texts, train_texts, val_texts, removed


def encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    # An empty review would be an all-padding row: one token instead (id 1: <unk> for words, a byte otherwise).
    return [tokenizer.encode(text, max_length=max_length) or [1] for text in texts]


def check_resumable(path: Path, args: argparse.Namespace) -> None:
    try:
        checkpoint = read_checkpoint(path)
        saved = checkpoint["extra"]["run"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"cannot resume: {path} is not a checkpoint written by this script ({type(e).__name__}: {e})")
    saved = flags_as_saved(checkpoint, {**RESUME_DEFAULTS, **saved})  # a "rotary" of before 0.5: interleaved
    ignored = ("vocab_size",) if args.tokenizer == "byte" else ()  # bytes have no vocabulary to size
    changed = [f"--{k.replace('_', '-')} {saved.get(k)} (now {getattr(args, k)})" for k in RESUME_KEYS
               if saved.get(k) != getattr(args, k) and k not in ignored]
    if changed:
        sys.exit(f"cannot resume: {path} was trained with {', '.join(changed)}; use the same flags, or a new "
                 f"--checkpoint folder")


@torch.no_grad()
def masked_validation(batches: ClassificationBatches, *, mask_id: int, rate: float, seed: int) -> list:
    """The validation batches masked once, with a fixed seed: every evaluation scores the same masked tokens.

    Stops with an error when no token is chosen (a --mask-rate so small that there would be nothing to score)."""
    g = torch.Generator(device=batches.device or "cpu").manual_seed(seed)
    masked = [(mask_tokens(ids, mask, mask_id=mask_id, num_tokens=mask_id + 1, rate=rate, generator=g), mask)
              for ids, mask, _ in batches]
    if not any(bool(m.chosen.any()) for m, _ in masked):
        reviews = sum(len(mask) for _, mask in masked)
        sys.exit(f"pretrain_imdb.py: error: --mask-rate {rate} chose no token of the {reviews:,} validation reviews, "
                 f"so there is nothing to validate on: raise it (BERT: 0.15)")
    return masked


def validate(model, masked: list) -> tuple[float, float]:
    """Masked-token loss and accuracy on the validation reviews (as :func:`masked_validation` masked them)."""
    model.eval()
    total = correct = count = 0.0
    for m, mask in masked:
        log_probs = model(m.inputs, mask, select=m.chosen).float()  # (n, v): the chosen positions only
        targets = m.targets[m.chosen]
        total += masked_lm_loss(log_probs, targets).item() * len(targets)
        correct += int((log_probs.argmax(-1) == targets).sum())
        count += len(targets)
    return total / max(count, 1), correct / max(count, 1)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        return pretrain(args)
    except OSError as e:  # a full disk, say, while writing a checkpoint (the message names the file)
        kept = " The checkpoints written before are kept." if args.checkpoint else ""
        sys.exit(f"pretrain_imdb.py: error: {e}.{kept}")


def pretrain(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    print(f"device: {device}" + (f", {threads} CPU thread(s) ({why})" if device.type == "cpu" else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resume = None
    remove_interrupted_saves(out, args.checkpoint)  # pretrained.pt too is written atomically (a kill leaves a file)
    if args.checkpoint:
        resume = latest_intact_checkpoint(args.checkpoint, set_aside=True)  # renames the damaged ones it skips
    if resume is not None:
        check_resumable(resume, args)

    print("reading the reviews and removing those the classifier is evaluated on")
    texts, train_texts, val_texts, removed = corpus(args)
    print(f"corpus: {removed['unlabelled']:,} unlabelled + {removed['training_split']:,} training reviews, less "
          f"{removed['overlapping_test_or_validation']:,} that occur in the test set or the validation split and "
          f"{removed['repeats']:,} repeats: {removed['kept']:,} reviews")
    try:  # from the training split only, exactly as classify_imdb.py builds it
        tokenizer = build_tokenizer(args.tokenizer, train_texts, vocab_size=args.vocab_size)
    except (ImportError, ValueError) as e:  # no tokenizers package; -V below 257 for BPE
        sys.exit(f"pretrain_imdb.py: error: --tokenizer {args.tokenizer} -V {args.vocab_size}: {e}")
    mask_id = len(tokenizer)  # [MASK]: one id past the tokenizer's vocabulary
    # The ids are kept in OUT/tokenized, keyed by the texts, the tokenizer and --max-length: a restart reads them.
    encoded = {}
    for name, part in (("pretraining", texts), ("validation", val_texts)):
        key = encoding_key(part, tokenizer.state_dict(), args.max_length)
        encoded[name], read = cached_encoding(out / "tokenized", name, key,
                                              lambda part=part: encode(tokenizer, part, args.max_length))
        print(f"{name}: {len(part):,} reviews, " + ("token ids read from OUT/tokenized (the same texts, tokenizer "
              "and --max-length as at an earlier start)" if read else "tokenized (kept in OUT/tokenized)"))
    g = torch.Generator().manual_seed(args.seed)  # batch order
    if args.pack:  # rows of whole reviews (each cut to --max-length already, so each fits a row)
        train_batches = PackedBatches(encoded["pretraining"], row_length=args.max_length, batch_size=args.batch_size,
                                      generator=g, device=device)
    else:
        train_batches = ClassificationBatches(encoded["pretraining"], [0] * len(texts),
                                              batch_size=args.batch_size, generator=g, device=device)
    bucketed = bucketed_padding([len(d) for d in encoded["pretraining"]], args.batch_size,
                                generator=torch.Generator().manual_seed(args.seed))
    if args.pack:
        print(f"batches: {len(train_batches.rows):,} rows of {args.max_length} positions, {train_batches.padding:.1%} "
              f"of them padding (length-bucketed batches of {args.batch_size} reviews: about {bucketed:.1%})")
    else:
        print(f"batches: about {bucketed:.1%} of their positions padding (each review padded to its length-bucketed "
              f"batch's longest; --pack fills rows of whole reviews instead)")
    val_batches = ClassificationBatches(encoded["validation"], [0] * len(val_texts),
                                        batch_size=2 * args.batch_size, shuffle=False, device=device)
    val_masked = masked_validation(val_batches, mask_id=mask_id, rate=args.mask_rate, seed=args.seed)

    def build() -> MLMTransformer:
        return MLMTransformer(args.embedding, args.heads, args.depth, args.max_length, mask_id + 1, tie_weights=True,
                              dropout=args.dropout, positions=args.positions, prenorm=args.prenorm)

    try:
        check_model_fits(build, device)  # on the meta device first: a typo in -M or -E is no OOM kill
    except MemoryError as e:
        sys.exit(f"pretrain_imdb.py: error: cannot build the model from these flags: {e}")
    model = build().to(device)
    model.check_values = False  # our tokenizer's ids are in range: no wait for the GPU at every step to check them
    opt = torch.optim.Adam(model.parameters(), lr=args.learn_rate)
    per_epoch = len(train_batches)
    total = args.num_epochs * per_epoch
    # --lr-warmup counts reviews: a packed step holds more of them than -b.
    warmup = round(args.lr_warmup * per_epoch / len(texts)) if args.pack else args.lr_warmup // args.batch_size
    sched = warmup_cosine(opt, warmup_steps=min(warmup, total), total_steps=total)
    masks = torch.Generator(device=device).manual_seed(args.seed + 1)  # which tokens each step masks
    step = 0
    if resume is not None:
        try:
            state = load_checkpoint(resume, model=model, optimizer=opt, scheduler=sched,
                                    generators={"batches": g, "masks": masks})
        except ValueError as e:
            sys.exit(f"cannot resume: {e}")
        step = state["step"]
        saved_val = state["extra"].get("val", {})  # the last validation's figures, for a run that had finished
        print(f"resumed from {resume} at step {step}" + (" (finished: writing its outputs again)"
                                                          if step == total else ""))
    print(f"{count_parameters(model):,} parameters, vocabulary {len(tokenizer):,} + [MASK], {total} steps "
          f"({args.num_epochs} epochs of {per_epoch})")

    run = {k: getattr(args, k) for k in RESUME_KEYS}
    extra = {"run": run, "tokenizer": tokenizer.state_dict(), "mask_id": mask_id, "corpus": removed}
    try:
        log = CSVLogger(out / "log.csv", ["step", "epoch", "lr", "train_loss", "val_loss", "val_accuracy", "seconds"],
                        resume_step=step)
    except ValueError as e:  # the log.csv of another script's run in this --out
        sys.exit(f"pretrain_imdb.py: error: {e}")
    eval_every = args.eval_every or max(1, per_epoch // 4)

    def save(step: int, epoch_state: torch.Tensor) -> None:
        batch_state = torch.Generator()  # the start state of the epoch a resumed run replays
        batch_state.set_state(g.get_state() if step % per_epoch == 0 else epoch_state)
        save_checkpoint(checkpoint_path(args.checkpoint, step), model=model, optimizer=opt, scheduler=sched,
                        step=step, generators={"batches": batch_state, "masks": masks}, extra=extra)
        prune_checkpoints(args.checkpoint, keep=2)
        clock.reset()

    clock = CheckpointClock(args.checkpoint_minutes if args.checkpoint else None, device=device)
    bar = progress(total=total, desc="pretrain")
    bar.update(step)
    running, t_log, tokens = [], time.perf_counter(), 0
    val_loss = saved_val.get("loss", float("nan")) if resume is not None else float("nan")
    val_accuracy = saved_val.get("accuracy", float("nan")) if resume is not None else float("nan")
    checked = step  # the losses up to this step are known to be finite

    def stop_if_diverged(losses: list) -> None:
        """Exit naming the first NaN or infinite loss of the steps since the last check: before a save, so that no
        checkpoint and no pretrained.pt is ever written from diverged weights."""
        if not losses:
            return
        try:
            check_finite_losses(torch.stack(losses).tolist(), range(step - len(losses) + 1, step + 1))
        except TrainingDiverged as e:
            bar.close()
            kept = " The checkpoints saved before it are kept." if args.checkpoint else ""
            sys.exit(f"error: {e} (flags -l, --lr-warmup).{kept}")

    for epoch in range(step // per_epoch, args.num_epochs):
        epoch_state = g.get_state()
        skip = step - epoch * per_epoch
        for i, batch in enumerate(train_batches):
            if i < skip:
                continue
            # Packed: (ids, documents, mask); padded: (ids, mask, labels), the labels unused.
            ids, documents, mask = batch if args.pack else (batch[0], None, batch[1])
            model.train()
            m = mask_tokens(ids, mask, mask_id=mask_id, num_tokens=mask_id + 1, rate=args.mask_rate,
                            generator=masks)
            with autocast(device):  # the vocabulary's log-probabilities only where the loss needs them
                log_probs = model(m.inputs, mask, select=m.chosen, documents=documents)  # (n, v)
            loss = masked_lm_loss(log_probs.float(), m.targets[m.chosen])
            loss = loss + auxiliary_loss(model)  # what the model's parts add (a mixture's balance loss); 0 without
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            running.append(loss.detach())
            tokens += mask.sum()
            bar.update(1)
            if step % 50 == 0:
                stop_if_diverged(running[-(step - checked):])
                checked = step
                recent = torch.stack(running[-50:])
                bar.set_postfix({"loss": f"{recent.mean().item():.3f}",
                                 "tok/s": f"{int(tokens) / (time.perf_counter() - t_log):,.0f}"})
                log.log(step=step, epoch=f"{step / per_epoch:.3f}", lr=sched.get_last_lr()[0],
                        train_loss=recent.mean().item(), seconds=round(time.perf_counter() - t_start, 1))
                tokens, t_log = 0, time.perf_counter()
            if step % eval_every == 0 or step == total or step == args.stop_at:
                stop_if_diverged(running[-(step - checked):] if step > checked else [])
                checked = step
                val_loss, val_accuracy = validate(model, val_masked)
                if not math.isfinite(val_loss):  # the weights broke in the last steps, the losses did not show it yet
                    bar.close()
                    sys.exit(f"error: the masked-token validation loss at step {step} is {val_loss}: the weights "
                             f"diverged (flags -l, --lr-warmup); nothing was saved from them")
                extra["val"] = {"loss": val_loss, "accuracy": val_accuracy}
                log.log(step=step, epoch=f"{step / per_epoch:.3f}", val_loss=val_loss, val_accuracy=val_accuracy,
                        seconds=round(time.perf_counter() - t_start, 1))
                bar.write(f"step {step}: train loss {torch.stack(running).mean().item():.4f}, masked-token val loss "
                          f"{val_loss:.4f}, accuracy {val_accuracy:.4f}")
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
    save_checkpoint(out / "pretrained.pt", model=model, step=step, extra=extra)
    if not plot_curves(out / "log.csv", out / "loss.png", x="step", ys=["train_loss", "val_loss"], logy=True,
                       ylabel="masked-token loss (nats)", title="IMDb masked-language-model pretraining"):
        print("matplotlib is not installed: no plot")
    seconds = time.perf_counter() - t_start
    results = {"corpus": removed, "steps": step, "val_masked_loss": val_loss, "val_masked_accuracy": val_accuracy,
               "wall_seconds": round(seconds, 1), "cpu_seconds": round(time.process_time(), 1), "threads": threads,
               "device": str(device), "run": run}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"pretrained model: {out / 'pretrained.pt'}; masked-token val accuracy {val_accuracy:.4f}; "
          f"total time {seconds:.0f}s")
    return results


if __name__ == "__main__":
    main()
