"""Speculative decoding's speed-up: a trained model decoding alone, and with a small trained draft.

Train the two on enwik8 (the same bytes, so the same vocabulary), then time them on prompts from the
validation split:

    python examples/generate_enwik8.py -D enwik8 -d 6 --minutes 13 --threads 1 --out runs/target
    python examples/generate_enwik8.py -D enwik8 -d 1 --minutes 5 --threads 1 --out runs/draft
    python benchmarks/speculative.py --target runs/target/model.pt --draft runs/draft/model.pt -D enwik8 --threads 1

For each lookahead ``k`` the plain and the speculative call alternate within one process, on the same prompts:
the ratio is the median of each round's pair (plain time / speculative time), so a machine that changes speed
between rounds moves both. It also reports the target's calls per new token after the prompt's (plain decoding
makes one for every new token but the first) and, greedily, whether the tokens are plain greedy decoding's (they
must be, up to float32 near-ties). ``--temperature 1``
samples instead (the ratio then compares two samplers of one distribution, not the same tokens).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from torchformer.data.enwik8_dataset import enwik8
from torchformer.decoding.generation import generate
from torchformer.models import GTransformer
from torchformer.train.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the model (a GTransformer checkpoint, model.pt)")
    parser.add_argument("--draft", required=True, help="the draft (likewise, of the same vocabulary)")
    parser.add_argument("-D", "--data", required=True, help="enwik8 (or the byte file both were trained on)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts, decoded one after another per round")
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lookahead", default="2,3,4,6", help="comma-separated lookaheads to time")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds per lookahead")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = load_model(args.target, model_class=GTransformer).eval()
    draft = load_model(args.draft, model_class=GTransformer).eval()
    _, val, _ = enwik8(args.data, progress=False)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, val.numel() - args.prompt_length, (args.prompts, args.batch), generator=g)
    prompts = [torch.stack([val[s:s + args.prompt_length].long() for s in row.tolist()]) for row in starts]

    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    sampling = dict(temperature=args.temperature, generator=torch.Generator().manual_seed(1))

    def run(**options) -> tuple[float, list[torch.Tensor], int]:
        calls[0], out = 0, []
        begin = time.perf_counter()
        for prompt in prompts:
            out.append(generate(model, prompt, args.new_tokens, **sampling, **options))
        return time.perf_counter() - begin, out, calls[0]

    n_params = sum(p.numel() for p in model.parameters())
    d_params = sum(p.numel() for p in draft.parameters())
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"{os.cpu_count()} cores; target {model.config.depth} blocks ({n_params:,} parameters), draft "
          f"{draft.config.depth} ({d_params:,}); {args.prompts} prompts x batch {args.batch}, "
          f"{args.prompt_length} + {args.new_tokens} tokens, temperature {args.temperature:g}, median of "
          f"{args.repeats} alternating rounds")
    run()
    run(draft=draft)  # warm-up
    print(f"{'lookahead':>9} {'plain tok/s':>12} {'speculative tok/s':>18} {'ratio':>6} {'target calls/token':>19} "
          f"{'same tokens':>12}")
    for lookahead in [int(k) for k in args.lookahead.split(",")]:
        plain, fast, ratios, same, per_token = [], [], [], True, 0.0
        for _ in range(args.repeats):
            t_plain, out_plain, _ = run()
            t_fast, out_fast, n_calls = run(draft=draft, lookahead=lookahead)
            plain.append(t_plain)
            fast.append(t_fast)
            ratios.append(t_plain / t_fast)
            same = same and all(torch.equal(a, b) for a, b in zip(out_plain, out_fast))
            # Minus one prefill call per prompt: the rest verify proposals.
            per_token = (n_calls - len(prompts)) / (len(prompts) * args.new_tokens)
        tokens = len(prompts) * args.batch * args.new_tokens
        print(f"{lookahead:>9} {tokens / statistics.median(plain):>12,.1f} {tokens / statistics.median(fast):>18,.1f} "
              f"{statistics.median(ratios):>5.2f}x {per_token:>19.2f} "
              f"{('yes' if same else 'NO') if args.temperature == 0 else '(sampled)':>12}")


if __name__ == "__main__":
    main()
