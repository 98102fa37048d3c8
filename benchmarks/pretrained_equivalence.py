"""The figures of docs/pretrained.md's Llama and T5 sections: how far torchformer's loaded models are from
``transformers``'.

For each tiny random model of ``tests/test_huggingface_llama.py`` (its FAMILIES), the largest difference in
log-probabilities between ``transformers``' model and the torchformer model loaded from its ``save_pretrained``
folder; then, on the Llama-3.1 model, how far each choice moves them when left out. The same for T5 and flan-T5
(``tests/test_huggingface_t5.py``'s KINDS, on its padded batch of sources; each choice of its LEFT_OUT), and for a
torchformer model exported to each and loaded by ``AutoModelForSeq2SeqLM``. Needs ``transformers``::

    python benchmarks/pretrained_equivalence.py          # both
    python benchmarks/pretrained_equivalence.py t5       # T5 only (or llama)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_huggingface_llama as cases  # noqa: E402  (the test's models, so the figures are the tests')
import test_huggingface_t5 as t5_cases  # noqa: E402
import transformers  # noqa: E402

from torchformer import GTransformer, Seq2SeqTransformer, from_huggingface, to_huggingface  # noqa: E402


def t5_figures() -> None:
    """T5's and flan-T5's largest differences, each choice left out, and the exported models'."""
    c = t5_cases
    with tempfile.TemporaryDirectory() as tmp:
        for kind in c.KINDS:
            hf = c.random_model(transformers, kind)
            hf.save_pretrained(Path(tmp) / kind)
            model = from_huggingface(Path(tmp) / kind)
            print(f"{kind}: largest difference {c.gap(model, hf):.2g}")
            for field in c.LEFT_OUT:
                print(f"{kind} without {field}: moves by {c.gap(c.without(model, kind, field), hf):.2g}")
        for options in ({"activation": "relu", "tie_weights": True, "head_scale": True},
                        {"activation": "geglu_tanh", "tie_weights": False, "head_scale": False}):
            torch.manual_seed(0)
            model = Seq2SeqTransformer(
                c.E, c.H, c.DEPTH, c.SOURCE, c.VOCAB, c.VOCAB, decoder_depth=c.DECODER_DEPTH, head_dim=c.S,
                ff_hidden=c.FF, positions="relative", relative_shared=True, relative_buckets=c.BUCKETS,
                relative_max_distance=c.MAX_DISTANCE, attention_scale=1.0, prenorm=True, norm="rms", norm_eps=1e-6,
                ff_bias=False, out_bias=False, head_bias=False, share_embeddings=True, **options).eval()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.3 * torch.randn_like(p))
            hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(to_huggingface(model, Path(tmp) / "export"))
            print(f"exported {options['activation']}: largest difference {c.gap(model, hf.eval()):.2g}")


def main() -> None:
    transformers.logging.set_verbosity_error()
    which = sys.argv[1:] or ["llama", "t5"]
    if "t5" in which:
        t5_figures()
    if "llama" not in which:
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        return
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
