"""Open a pretrained model in the Hugging Face layout: generate, score each token, and draw one layer's attention.

    python examples/pretrained.py path/to/gpt2 --prompt "The meaning of life is"
    python examples/pretrained.py path/to/gpt2 --prompt "Hello" -n 30 --temperature 0.8 --layer 0 --out runs/gpt2

FOLDER is what ``huggingface-cli download gpt2 --local-dir gpt2`` fetches (or ``save_pretrained`` writes): a
``config.json``, the weights, and ``tokenizer.json`` (read with the ``tokenizers`` package, the ``bpe`` extra;
without one, give token ids: ``--ids 464 3616 286``). Any family ``torchformer.from_huggingface`` reads as a
generator works: GPT-2, Llama, Mistral, Qwen2 (docs/pretrained.md).

It prints the prompt's tokens with the log-probability the model gave each one (given the tokens before it), the
continuation with the log-probability of each generated token, and writes ``attention.png`` (block ``--layer``'s
self-attention over prompt and continuation, averaged over the heads) to ``--out`` when matplotlib is installed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch

from torchformer import GTransformer, from_huggingface, generate
from torchformer.pretrained import HuggingFaceTokenizer
from torchformer.scripts.cli import POSITIVE_INT, WRITABLE_FOLDER, check_flags, choose_threads
from torchformer.train.inspection import attention_weights, plot_attention

CHECKS = {"new_tokens": POSITIVE_INT, "out": WRITABLE_FOLDER}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a model folder in the Hugging Face layout (config.json, weights)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the text to continue (needs the folder's tokenizer.json)")
    prompt.add_argument("--ids", type=int, nargs="+", help="the prompt as token ids, without a tokenizer")
    p.add_argument("-n", "--new-tokens", type=int, default=20, help="tokens to generate (default 20)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy; above 0 samples")
    p.add_argument("--seed", type=int, default=0, help="the seed of the sampling (default 0)")
    p.add_argument("--layer", type=int, default=-1, help="the block whose attention is drawn (default -1, the last)")
    p.add_argument("--out", type=Path, default=Path("runs/pretrained"), help="where attention.png goes")
    p.add_argument("--threads", type=int, help="CPU threads (default: the free cores)")
    args = p.parse_args(argv)
    check_flags(p, args, CHECKS)
    if args.temperature < 0:
        p.error(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    return args


def labels(tokenizer: Optional[HuggingFaceTokenizer], ids: list[int]) -> list[str]:
    """One readable label per token: its text (GPT-2 marks a leading space with Ġ), or its id; an id the tokenizer
    does not have (a model's vocabulary is often padded beyond it) says so."""
    if tokenizer is None:
        return [str(i) for i in ids]
    return [repr(tokenizer.decode([i], skip_special_tokens=False)) if tokenizer.token(i) is not None
            else f"<id {i}: no token>" for i in ids]


def unknown_ids(tokenizer: Optional[HuggingFaceTokenizer], ids: list[int]) -> str:
    """A note on the ids beyond the tokenizer's vocabulary (they decode to nothing), or ``""`` if there are none."""
    beyond = sorted({i for i in ids if tokenizer is not None and tokenizer.token(i) is None})
    if not beyond:
        return ""
    listed = ", ".join(map(str, beyond[:8])) + (" ..." if len(beyond) > 8 else "")
    return (f"note: {len(beyond)} generated id(s) ({listed}) are not in the tokenizer's {len(tokenizer)} tokens (the "
            f"model's vocabulary is padded beyond them): they have no text and are left out of it")


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    model = from_huggingface(args.folder)
    if not isinstance(model, GTransformer):
        raise SystemExit(f"pretrained.py: {args.folder} holds a {type(model).__name__}, not a generator; this "
                         f"script generates text (GPT-2, Llama, Mistral, Qwen2)")
    tokenizer = None if args.ids else HuggingFaceTokenizer.from_folder(args.folder)
    ids = args.ids or tokenizer.encode(args.prompt)
    if not ids:
        raise SystemExit("pretrained.py: the prompt encodes to no tokens")
    if max(ids) >= model.config.num_tokens or min(ids) < 0:
        raise SystemExit(f"pretrained.py: --ids must be in [0, {model.config.num_tokens}), got {ids}")
    prompt = torch.tensor([ids])
    print(f"model: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{model.config.depth} blocks; {threads} thread(s) ({why})")

    # The prompt's own tokens, each scored by the model given the tokens before it (the first has no context).
    with torch.no_grad():
        logp = model(prompt)[0]  # (t, v)
    print("\nprompt (log-probability of each token given the ones before it):")
    for i, (token, label) in enumerate(zip(ids, labels(tokenizer, ids))):
        print(f"  {label:>16}  {'' if i == 0 else f'{logp[i - 1, token].item():8.3f}'}")

    generator = torch.Generator().manual_seed(args.seed)
    tokens, new_logp = generate(model, prompt, args.new_tokens, temperature=args.temperature, generator=generator,
                                return_logprobs=True)
    new = tokens[0, len(ids):].tolist()
    print(f"\ncontinuation ({'greedy' if args.temperature == 0 else f'temperature {args.temperature}'}; "
          f"log-probability of each generated token):")
    for step, (token, label) in enumerate(zip(new, labels(tokenizer, new))):
        print(f"  {label:>16}  {new_logp[0, step, token].item():8.3f}")
    if tokenizer is not None:
        print(f"\ntext: {tokenizer.decode([i for i in tokens[0].tolist() if tokenizer.token(i) is not None])!r}")
        note = unknown_ids(tokenizer, new)
        if note:
            print(note)

    # The attention of one block over the whole sequence, the mean over its heads.
    sequence = tokens[:, -model.config.seq_length:]  # the model sees at most seq_length tokens
    with torch.no_grad():
        weights = attention_weights(model, sequence, layer=args.layer)  # (1, h, t, t)
    names = labels(tokenizer, sequence[0].tolist())
    path = args.out / "attention.png"
    block = args.layer % model.config.depth  # -1: the last block, shown by its index
    if plot_attention(weights[0].mean(0), x_labels=names, y_labels=names, path=path,
                      title=f"block {block} of {model.config.depth}, mean over {weights.size(1)} heads"):
        print(f"attention of block {block} (of 0 .. {model.config.depth - 1}): {path}")
    else:
        print("(matplotlib is not installed: no attention.png; pip install matplotlib)")


if __name__ == "__main__":
    main()
