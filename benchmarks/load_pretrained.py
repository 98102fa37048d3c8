"""Loading a GPT-2-small-shaped checkpoint: how long it takes, and how much memory it holds at its peak.

``torchformer.from_huggingface`` builds the model on the meta device and copies the memory-mapped tensors in one at
a time, so it should never hold two full copies of the weights. This benchmark writes a random GPT-2 of the small
size (124M parameters, 12 layers, emb 768, 1024 positions, vocabulary 50257; about 500 MB in float32) as a Hugging
Face folder with ``torchformer.to_huggingface`` (no ``transformers`` needed), then loads it in fresh processes, each
measuring:

* the seconds ``from_huggingface`` takes;
* the peak resident memory of the process (``VmHWM`` of ``/proc/self/status``, Linux) above what it held before
  loading (torch imported, the
  folder not yet read), as a ratio of the weights' size on disk (the target is at most 1.3x). Pages of the mapped
  file count while they are resident, as the operating system counts them.

    python benchmarks/load_pretrained.py                 # 3 loads of a safetensors folder
    python benchmarks/load_pretrained.py --bin --runs 5   # pytorch_model.bin instead
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

MEASURE = r"""
import json, sys, time
import torch
import torchformer
from torchformer import from_huggingface

def memory_mb(field):
    # VmHWM, this process's peak since it started (exec), not ru_maxrss: that keeps the peak of the parent it was
    # forked from, which held a whole model when it wrote the folder.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024

before = memory_mb("VmRSS")
start = time.perf_counter()
model = from_huggingface(sys.argv[1])
seconds = time.perf_counter() - start
peak = memory_mb("VmHWM")
print(json.dumps({"seconds": seconds, "before_mb": before, "peak_mb": peak, "after_mb": memory_mb("VmRSS"),
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


def write_gpt2_small(folder: Path, *, bin_format: bool) -> int:
    """A random GPT-2-small-shaped model written as a Hugging Face folder; returns the weights' size in bytes."""
    from torchformer import GTransformer, to_huggingface

    torch.manual_seed(0)
    model = GTransformer(768, 12, 12, 1024, 50257, prenorm=True, qkv_bias=True, activation="gelu_tanh",
                         tie_weights=True, head_bias=False)
    to_huggingface(model, folder)
    del model
    if bin_format:  # the same tensors as a pytorch_model.bin, as older save_pretrained wrote them
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
        return (folder / "pytorch_model.bin").stat().st_size
    return (folder / "model.safetensors").stat().st_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="loads, each in a fresh process (default 3)")
    parser.add_argument("--bin", action="store_true", help="write pytorch_model.bin instead of model.safetensors")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2-small"
        size = write_gpt2_small(folder, bin_format=args.bin)
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", MEASURE, str(folder)], capture_output=True, text=True,
                                 check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    weights_mb = size / 2**20
    print(f"# from_huggingface on a GPT-2-small-shaped folder ({'pytorch_model.bin' if args.bin else 'safetensors'}, "
          f"{runs[0]['parameters']:,} parameters, weights {weights_mb:.0f} MiB), torch {torch.__version__}")
    print("| run | seconds | RSS before (MiB) | peak RSS (MiB) | peak - before | (peak - before) / weights |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, r in enumerate(runs, 1):
        extra = r["peak_mb"] - r["before_mb"]
        print(f"| {i} | {r['seconds']:.2f} | {r['before_mb']:.0f} | {r['peak_mb']:.0f} | {extra:.0f} | "
              f"{extra / weights_mb:.2f}x |")
    ratios = [(r["peak_mb"] - r["before_mb"]) / weights_mb for r in runs]
    print(f"median: {statistics.median(r['seconds'] for r in runs):.2f} s, {statistics.median(ratios):.2f}x the "
          f"weights")


if __name__ == "__main__":
    main()
