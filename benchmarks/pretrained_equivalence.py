"""The figures of docs/pretrained.md's Llama section: how far torchformer's loaded models are from ``transformers``'.

For each tiny random model of ``tests/test_huggingface_llama.py`` (its FAMILIES), the largest difference in
log-probabilities between ``transformers``' model and the torchformer model loaded from its ``save_pretrained``
folder; then, on the Llama-3.1 model, how far each choice moves them when left out. Needs ``transformers``::

    python benchmarks/pretrained_equivalence.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_huggingface_llama as cases  # noqa: E402  (the test's models, so the figures are the tests')
import transformers  # noqa: E402

from torchformer import GTransformer, from_huggingface  # noqa: E402


def main() -> None:
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        for family in cases.FAMILIES:
            hf = cases.random_model(transformers, family)
            hf.save_pretrained(Path(tmp) / family)
            model = from_huggingface(Path(tmp) / family)
            x = torch.randint(0, cases.VOCAB, (3, cases.POSITIONS), generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                print(f"{family}: largest difference {(model(x) - cases.hf_log_probs(hf, x)).abs().max().item():.2g}")
        model = from_huggingface(Path(tmp) / "llama-3.1")
        hf = cases.random_model(transformers, "llama-3.1")
        x = torch.randint(0, cases.VOCAB, (2, cases.POSITIONS), generator=torch.Generator().manual_seed(5))
        reference = cases.hf_log_probs(hf, x)
        for changes in (dict(positions="rotary_interleaved"), dict(rotary_base=10000.0), dict(rotary_scaling=None),
                        dict(norm_eps=1e-5)):
            other = GTransformer(config=model.config.replace(**changes)).eval()
            other.load_state_dict(model.state_dict())
            with torch.no_grad():
                print(f"llama-3.1 with {changes}: moves by {(other(x) - reference).abs().max().item():.2g}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
