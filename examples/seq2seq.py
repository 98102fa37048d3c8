"""Train an encoder-decoder transformer to reverse digit strings, then decode greedily and with beam search.

Reversal cannot be solved by the decoder alone: to write output position ``i`` it must look up source position
``n - 1 - i``, which it can only do through cross-attention. The plot of the cross-attention weights should
therefore show an anti-diagonal. The data are generated on the fly; a fixed held-out set is never trained on.

    python examples/seq2seq.py                      # CPU preset, a few minutes on 2 cores
    python examples/seq2seq.py --preset gpu --device cuda
    python examples/seq2seq.py --decode 4740273327 --decode 123    # reverse strings with the trained model

Prints exact-match accuracy on the held-out strings (greedy and beam search) and writes to ``--out`` the trained
model (``model.pt``, which ``--decode`` uses) and ``cross_attention.png`` when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import math
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from torchformer import seq2seq_generate
from torchformer.models import Seq2SeqTransformer
from torchformer.train.checkpoint import read_checkpoint, save_checkpoint
from torchformer.train.loading import load_model
from torchformer.scripts.cli import POSITIVE_INT, WRITABLE_FOLDER, check_flags, choose_threads, preset_flags
from torchformer.train.training import resolve_device

PAD, BOS, EOS, DIGIT0 = 0, 1, 2, 3  # token ids; digit d is DIGIT0 + d
VOCAB = DIGIT0 + 10

PRESETS = {
    "cpu": dict(emb=64, heads=4, depth=2, min_len=3, max_len=10, steps=1500, batch=128, lr=1e-3, test=1000),
    "gpu": dict(emb=128, heads=8, depth=3, min_len=3, max_len=20, steps=6000, batch=256, lr=5e-4, test=2000),
}


def make_examples(n: int, min_len: int, max_len: int, generator: torch.Generator):
    """Random digit strings of random length: ``src`` ``(n, max_len)`` padded, its mask, and the target
    ``(n, max_len + 2)``: BOS, the reversed digits, EOS, padding."""
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
    digits = torch.randint(0, 10, (n, max_len), generator=generator) + DIGIT0
    mask = torch.arange(max_len)[None, :] < lengths[:, None]  # (n, max_len)
    src = digits.masked_fill(~mask, PAD)
    tgt = torch.full((n, max_len + 2), PAD)
    tgt[:, 0] = BOS
    for row, length in enumerate(lengths.tolist()):
        tgt[row, 1 : length + 1] = src[row, :length].flip(0)
        tgt[row, length + 1] = EOS
    return src, mask, tgt


def as_text(ids: torch.Tensor) -> str:
    """Token ids -> digit string, up to the first EOS (special tokens never print as digits)."""
    out = []
    for t in ids.tolist():
        if t == EOS:
            break
        out.append(str(t - DIGIT0) if t >= DIGIT0 else {PAD: "<pad>", BOS: "<bos>"}[t])
    return "".join(out)


def exact_match(predicted, tgt) -> float:
    """``predicted`` ``(n, max_len + 1)`` from ``generate`` (eos-padded) against the target without BOS."""
    expected = tgt[:, 1:].masked_fill(tgt[:, 1:] == PAD, EOS)
    return (predicted == expected).all(dim=1).float().mean().item()


def cross_attention_weights(model, src, mask, out):
    """Cross-attention weights ``(layers, t, u)`` (mean over heads) while the decoder reads ``out`` ``(1, t)``."""
    weights, hooks = [], []

    def grab(module, args, kwargs, output):
        x, context, context_mask = args[:3]
        # Call forward directly (no hooks, no cache) to get the weights the layer just used.
        weights.append(module.forward(x, context, context_mask, return_weights=True)[1][0].mean(0))

    for block in model.decoder.blocks:
        hooks.append(block.cross_attention.register_forward_hook(grab, with_kwargs=True))
    with torch.no_grad():
        model(src, out, mask)
    for hook in hooks:
        hook.remove()
    return torch.stack(weights).cpu()


def plot(weights, src_len: int, out_len: int, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the cross-attention plot")
        return
    layers = weights.size(0)
    fig, axes = plt.subplots(1, layers, figsize=(3.2 * layers, 3.2), squeeze=False)
    for i, ax in enumerate(axes[0]):
        image = ax.imshow(weights[i, :out_len, :src_len].numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(src_len))
        ax.set_yticks(range(out_len))
        ax.set_title(f"decoder layer {i + 1}")
        ax.set_xlabel("source position")
        ax.set_ylabel("output position")
    fig.colorbar(image, ax=axes[0].tolist(), fraction=0.03, pad=0.02, label="attention weight")
    fig.suptitle("cross-attention (mean over heads) while reversing a digit string")
    fig.savefig(path, dpi=120, bbox_inches="tight")  # tight_layout cannot place a colour bar shared by axes
    print(f"wrote {path}")


# The valid values of each flag, checked before training: {dest: (test, what the flag must be)}. None is not given.
CHECKS = {
    "steps": POSITIVE_INT,
    "beam_size": (lambda v: v >= 1, "a positive int (1: greedy)"),
    "threads": POSITIVE_INT,
    "seed": (lambda v: 0 <= v < 2**32, "an int in [0, 2**32)"),
    "out": WRITABLE_FOLDER,
}


# The end of --help: the presets are settings of the script, not flags, so they are listed as such.
PRESET_HELP = "\n".join([
    "presets:",
    *(textwrap.fill(f"--preset {name}: " + ", ".join(f"{key} {value}" for key, value in preset.items()), width=100,
                    initial_indent="  ", subsequent_indent="    ") for name, preset in PRESETS.items()),
    textwrap.fill("emb: embedding size, depth: blocks in the encoder and in the decoder, min_len/max_len: digits per "
                  "string, batch: strings per step, lr: peak learning rate of AdamW, test: held-out strings",
                  width=100, initial_indent="  ", subsequent_indent="  "),
])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, epilog=PRESET_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = preset_flags(parser, PRESETS)  # each flag's help ends with its default, or what each preset sets it to
    add("--preset", choices=sorted(PRESETS), default="cpu",
        help="model size, string lengths, steps and batch size, listed at the end")
    add("--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda', ...")
    add("--seed", type=int, default=0, help="seed for the initialisation and the training strings (the held-out "
        "strings use seed + 1)")
    add("--steps", type=int, default=None, help="training steps (batches of strings), instead of the preset's")
    add("--beam-size", type=int, default=4, help="beam width of the beam-search decoding (1: greedy only)")
    add("--threads", type=int, default=None, help="CPU threads for PyTorch (default: the cores other programs leave "
        "idle, measured at the start; on a busy machine 1 is much faster than torch's own choice)")
    add("--out", type=Path, default=Path("runs/seq2seq"), help="folder for the trained model (model.pt) and "
        "cross_attention.png")
    add("--decode", action="append", metavar="DIGITS", help="no training: reverse this digit string with the model "
        "in --out, greedily and with beam search; repeatable")
    args = parser.parse_args(argv)
    check_flags(parser, args, CHECKS)
    for digits in args.decode or []:
        if not (digits.isascii() and digits.isdigit()):
            parser.error(f"--decode takes a string of digits 0-9, got {digits!r}")
    try:
        args.device = resolve_device(args.device)
    except (ValueError, TypeError) as e:
        parser.error(f"--device: {e}")
    return args


def decode(args: argparse.Namespace) -> list[str]:
    """``--decode``: reverse each given digit string with the trained model in ``--out``; print and return them."""
    path = args.out / "model.pt"
    if not path.is_file():
        raise SystemExit(f"error: no trained model at {path}: train first (the model goes to --out), or pass "
                         f"--out with the folder of a run")
    try:  # the checkpoint holds the model's config: the model is rebuilt from the file alone
        model = load_model(path, model_class=Seq2SeqTransformer, map_location=args.device).eval()
    except ValueError as e:  # not a checkpoint, damaged, or one of another model
        raise SystemExit(f"error: {e}")
    longest = model.config.seq_length - 2  # the target holds BOS, the digits and EOS
    # The shortest strings it saw (the run's settings are in the checkpoint); it never learned to reverse fewer.
    shortest = read_checkpoint(path)["extra"].get("min_len", 1)
    lines = []
    for digits in args.decode:
        if not shortest <= len(digits) <= longest:
            raise SystemExit(f"error: --decode {digits}: the model in {path} was trained on strings of {shortest} "
                             f"to {longest} digits, got {len(digits)}")
        src = torch.tensor([[DIGIT0 + int(d) for d in digits]], device=args.device)  # (1, n)
        greedy = seq2seq_generate(model, src, len(digits) + 1, bos=BOS, eos=EOS)
        line = f"{digits} -> {as_text(greedy[0])} (greedy)"
        if args.beam_size > 1:
            beam = seq2seq_generate(model, src, len(digits) + 1, bos=BOS, eos=EOS, beam_size=args.beam_size)
            line += f", {as_text(beam[0])} (beam {args.beam_size})"
        lines.append(line)
        print(lines[-1])
    return lines


def main(argv=None) -> dict | list[str]:
    args = parse_args(argv)
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    if args.decode:
        return decode(args)
    cfg = dict(PRESETS[args.preset])
    if args.steps is not None:
        cfg["steps"] = args.steps
    device = args.device
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    started = time.time()

    # The held-out strings come from their own generator and are removed from every training batch.
    test_src, test_mask, test_tgt = make_examples(cfg["test"], cfg["min_len"], cfg["max_len"],
                                                  torch.Generator().manual_seed(args.seed + 1))
    held_out = {tuple(row) for row in test_src.tolist()}

    model = Seq2SeqTransformer(cfg["emb"], cfg["heads"], cfg["depth"], cfg["max_len"] + 2, VOCAB, VOCAB,
                               positions="learned", prenorm=True).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg["steps"])))
    )
    print(f"preset {args.preset}: {sum(p.numel() for p in model.parameters()):,} parameters, device {device}"
          + (f", {threads} CPU thread(s) ({why})" if device.type == "cpu" else ""))

    for step in range(cfg["steps"]):
        src, mask, tgt = make_examples(cfg["batch"], cfg["min_len"], cfg["max_len"], gen)
        keep = torch.tensor([tuple(row) not in held_out for row in src.tolist()])
        src, mask, tgt = src[keep].to(device), mask[keep].to(device), tgt[keep].to(device)
        logp = model(src, tgt[:, :-1], mask)  # teacher forcing: predict tgt[1:] from tgt[:-1]
        loss = F.nll_loss(logp.transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if step % 250 == 0 or step == cfg["steps"] - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  ({time.time() - started:.0f} s)")

    model.eval()
    src, mask, tgt = test_src.to(device), test_mask.to(device), test_tgt.to(device)
    steps = cfg["max_len"] + 1  # the digits and the EOS
    greedy = seq2seq_generate(model, src, steps, bos=BOS, eos=EOS, src_mask=mask)
    beam = seq2seq_generate(model, src, steps, bos=BOS, eos=EOS, src_mask=mask, beam_size=args.beam_size)
    print(f"held-out exact match ({cfg['test']} strings of {cfg['min_len']}-{cfg['max_len']} digits): "
          f"greedy {exact_match(greedy, tgt):.1%}, beam search (beam {args.beam_size}) {exact_match(beam, tgt):.1%}")

    # Plot the longest held-out example: the decoder reads BOS + its own greedy output.
    row = int(mask.sum(1).argmax())
    length = int(mask[row].sum())
    print(f"example: {as_text(src[row, :length])} -> {as_text(greedy[row])}")
    decoder_input = torch.cat([greedy.new_full((1, 1), BOS), greedy[row : row + 1, :length]], dim=1)
    weights = cross_attention_weights(model, src[row : row + 1], mask[row : row + 1], decoder_input)
    args.out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(args.out / "model.pt", model=model, step=cfg["steps"], extra={"preset": args.preset, **cfg})
    print(f"model: {args.out / 'model.pt'} (reverse a string with it: --decode 12345 --out {args.out})")
    plot(weights, length, length + 1, args.out / "cross_attention.png")
    print(f"total wall time {time.time() - started:.0f} s")
    return {"greedy": exact_match(greedy, tgt), "beam": exact_match(beam, tgt)}


if __name__ == "__main__":
    main()
