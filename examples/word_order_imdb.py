"""Does a trained IMDb classifier use word order? Its test accuracy on the reviews as written and with the words of
each review shuffled.

    python examples/classify_imdb.py --data path/to/dir --preset cpu --final     # train; the model goes to --out
    python examples/word_order_imdb.py --data path/to/dir                        # then ask it

Each test review is tokenized and cut to the model's length exactly as ``classify_imdb.py`` does, then its tokens
are permuted (a seeded random order per review). The shuffled review holds the same tokens, the same number of
times: a model that only counts words (a bag of words) gives it the same answer, and the accuracy cannot move. How
far it moves, and how many predictions change, measures how much the model reads the order. Prints both and writes
them to ``OUT/word_order.json``. The test set is only read here, never used to choose anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from torchformer.data.batching import pad_batch
from torchformer.data.imdb_dataset import imdb
from torchformer.data.tokenizers import tokenizer_from_state_dict
from torchformer.models import CTransformer
from torchformer.train.checkpoint import read_checkpoint
from torchformer.train.loading import load_model
from torchformer.scripts.cli import POSITIVE_INT, check_flags, choose_threads
from torchformer.train.training import progress

CHECKS = {"batch_size": POSITIVE_INT, "threads": POSITIVE_INT,
          "seed": (lambda v: 0 <= v < 2**63, "an int >= 0")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="the IMDb data, as for classify_imdb.py: a folder with imdb_{train,test}.jsonl.gz, "
                   "an aclImdb/ folder or aclImdb_v1.tar.gz (default: the cache folder)")
    p.add_argument("--out", type=Path, default=Path("runs/classify_imdb"), help="the --out of the classify_imdb.py "
                   "run: model.pt is read from it, word_order.json written to it (default: runs/classify_imdb)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffles (default: 0)")
    p.add_argument("-b", "--batch-size", type=int, default=64, help="reviews per batch (default: 64)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: the cores other programs leave idle)")
    args = p.parse_args(argv)
    check_flags(p, args, CHECKS)
    return args


def shuffle_each(encoded: list[list[int]], generator: torch.Generator) -> list[list[int]]:
    """Each review's token ids in a random order of its own: the same multiset of ids, no order left."""
    return [[ids[i] for i in torch.randperm(len(ids), generator=generator).tolist()] for ids in encoded]


@torch.no_grad()
def predict(model: CTransformer, encoded: list[list[int]], batch_size: int, desc: str) -> torch.Tensor:
    """``(n,)`` predicted classes, in the order of ``encoded``; reviews of similar length are batched together."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    predicted = torch.empty(len(encoded), dtype=torch.long)
    for start in progress(range(0, len(order), batch_size), desc=desc):
        chunk = order[start:start + batch_size]
        ids, mask = pad_batch([encoded[i] for i in chunk])  # (b, t) each
        predicted[chunk] = model(ids, mask).argmax(dim=-1)
    return predicted


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    print(f"device: cpu, {threads} CPU thread(s) ({why})")
    path = args.out / "model.pt"
    if not path.is_file():
        sys.exit(f"error: no trained model at {path}: train one with classify_imdb.py first, or pass the --out of "
                 f"its run")
    try:  # the checkpoint holds the model's config and the tokenizer: both are rebuilt from the file alone
        extra = read_checkpoint(path)["extra"]
        if extra.get("config", {}).get("model") == "lstm":
            sys.exit(f"error: {path} is classify_imdb.py's LSTM (--model lstm); this script measures a transformer "
                     f"(an LSTM reads its words in order by construction)")
        model = load_model(path, model_class=CTransformer).eval()
        tokenizer = tokenizer_from_state_dict(extra["tokenizer"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        sys.exit(f"error: {path} is not a model written by classify_imdb.py ({type(e).__name__}: {e})")
    except ImportError as e:  # a BPE model without the tokenizers package
        sys.exit(f"error: {path}: {e}")
    try:
        _, test = imdb(args.data)
    except (OSError, ValueError) as e:  # missing or damaged data: the message names the file
        sys.exit(f"error: {e}")
    # As classify_imdb.py: cut to the model's length; an empty review becomes one unknown token.
    encoded = [tokenizer.encode(text, max_length=model.config.seq_length) or [1] for text, _ in test]
    labels = torch.tensor([label for _, label in test])
    shuffled = shuffle_each(encoded, torch.Generator().manual_seed(args.seed))
    written = predict(model, encoded, args.batch_size, "as written")
    mixed = predict(model, shuffled, args.batch_size, "words shuffled")
    result = {
        "reviews": len(test),
        "accuracy_as_written": (written == labels).double().mean().item(),
        "accuracy_words_shuffled": (mixed == labels).double().mean().item(),
        "predictions_changed": (written != mixed).double().mean().item(),
        "seed": args.seed,
        "model": str(path),
    }
    print(f"test accuracy on {len(test):,} reviews: {result['accuracy_as_written']:.4f} as written, "
          f"{result['accuracy_words_shuffled']:.4f} with each review's words shuffled; the shuffle changed "
          f"{result['predictions_changed']:.2%} of the predictions")
    (args.out / "word_order.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
