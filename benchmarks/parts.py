"""Forward + backward of each modern part on its own, against the plain part it replaces, at the shapes of one layer
of the presets' CPU model (emb 256, 8 heads of 32, batch 16, context 256), in one process:

* norms: ``torch.nn.LayerNorm`` (one fused kernel each way); RMSNorm as :func:`~torchformer.nn.norms.rms_norm` writes
  it (autograd differentiates each operation); ``torch.nn.functional.rms_norm``; :class:`~torchformer.RMSNorm` (its
  gradient by LayerNorm's fused kernel);
* rotary: :func:`~torchformer.nn.relative.rotate_halves` under autograd; :class:`~torchformer.nn.relative.RotateHalves`
  (the library's path), each on the queries as attention makes them (a transposed view, the heads side by side,
  and so their gradient), and ``RotateHalves`` on contiguous queries (its path on halves); and the angles alone;
* feed-forward: the plain ``W2 relu(W1 x)`` of hidden size 1024; the gated SwiGLU of the library's hidden size 688
  (2/3 of 1024 to the nearest multiple of 16), as the library computes it (two input projections), with the two
  projections concatenated into one product, and of hidden size 683 (the nearest integer, the rule of config_version 2).
* matrix: one input projection of the gated network alone, ``e x 688`` and ``e x 683``.

    python benchmarks/parts.py --threads 1

Each row is the median of ``--repeats`` calls, after 3 warm-up calls, in milliseconds. The inputs of a call are
fresh tensors, so a call reads them from memory as a training step does, not from the cache a repeated call warms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from torchformer import RMSNorm
from torchformer.nn.feedforward import FeedForward, GatedFeedForward
from torchformer.nn.norms import rms_norm
from torchformer.nn.relative import RotateHalves, Rotary, rotate_halves

B, T, E, H = 16, 256, 256, 8  # batch, context, embedding, heads
S = E // H  # head size


def timed(make_inputs, fn, repeats: int) -> float:
    """Median milliseconds of ``fn(*inputs).backward(grad)`` over fresh inputs."""
    times = []
    for k in range(repeats + 3):
        inputs, grad = make_inputs()
        start = time.perf_counter()
        fn(*inputs).backward(grad)
        if k >= 3:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def activations():  # (b, t, e) and its gradient
        return (torch.randn(B, T, E, requires_grad=True),), torch.randn(B, T, E)

    def projected(linear: nn.Linear):  # (b, t, e), and the gradient of its projection (b, t, h)
        return lambda: ((torch.randn(B, T, E, requires_grad=True),), torch.randn(B, T, linear.out_features))

    def queries():  # (b, h, t, s) as a transposed view of the projection's (b, t, h, s), and the gradient, as
        # scaled_dot_product_attention's backward pass returns it, in the same layout
        return (torch.randn(B, T, H, S, requires_grad=True).transpose(1, 2),), torch.randn(B, T, H, S).transpose(1, 2)

    def contiguous_queries():  # (b, h, t, s) contiguous, the gradient too
        return (torch.randn(B, H, T, S, requires_grad=True),), torch.randn(B, H, T, S)

    layer_norm, rms = nn.LayerNorm(E), RMSNorm(E)
    cos, sin = Rotary(S).angles(torch.arange(T), torch.float32)
    plain, gated, exact = FeedForward(E), GatedFeedForward(E), GatedFeedForward(E, hidden=round(2 * 4 * E / 3))

    def gated_one_product(x):  # W1 and V as one (2h, e) matrix: one product, then its two halves
        gate, value = F.linear(x, torch.cat([gated.w1.weight, gated.v.weight])).chunk(2, dim=-1)
        return gated.w2(gated.act(gate) * value)

    rows = [
        ("norm", "LayerNorm (torch.nn)", activations, layer_norm),
        ("norm", "RMSNorm written out (autograd)", activations, lambda x: rms_norm(x, rms.weight, rms.eps)),
        ("norm", "torch.nn.functional.rms_norm (autograd)", activations,
         lambda x: F.rms_norm(x, (E,), rms.weight, rms.eps)),
        ("norm", "RMSNorm (the library's: LayerNorm's gradient kernel)", activations, rms),
        ("rotary", "rotate_halves (autograd)", queries, lambda q: rotate_halves(q, cos, sin)),
        ("rotary", "RotateHalves (the library's; on whole rows)", queries, lambda q: RotateHalves.apply(q, cos, sin)),
        ("rotary", "RotateHalves on contiguous queries (on halves)", contiguous_queries,
         lambda q: RotateHalves.apply(q, cos, sin)),
        ("feed-forward", "ReLU, hidden 1024", activations, plain),
        ("feed-forward", f"SwiGLU, hidden {gated.w1.out_features} (the library's)", activations, gated),
        ("feed-forward", "SwiGLU, W1 and V as one product", activations, gated_one_product),
        ("feed-forward", f"SwiGLU, hidden {exact.w1.out_features} (config_version 2)", activations, exact),
        # One input projection of each width alone: where the widths differ, without the element-wise work.
        ("matrix", f"e x {gated.w1.out_features} (the library's gated width)", projected(gated.w1), gated.w1),
        ("matrix", f"e x {exact.w1.out_features} (config_version 2)", projected(exact.w1), exact.w1),
    ]
    print(f"# forward + backward, (b, t, e) = ({B}, {T}, {E}), {H} heads, torch {torch.__version__}, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print("| part | implementation | ms |")
    print("| --- | --- | ---: |")
    for part, name, make_inputs, fn in rows:
        print(f"| {part} | {name} | {timed(make_inputs, fn, args.repeats):.2f} |", flush=True)
    # The angles alone (Rotary.angles, forward only: no gradient flows into them), per call of a layer.
    rotary, positions = Rotary(S), torch.arange(T)
    times = []
    for k in range(203):
        start = time.perf_counter()
        rotary.angles(positions, torch.float32)
        if k >= 3:
            times.append(time.perf_counter() - start)
    ms = 1000 * statistics.median(times)
    print(f"| rotary | the angles alone (Rotary.angles, t = {T}; forward only) | {ms:.3f} |")


if __name__ == "__main__":
    main()
