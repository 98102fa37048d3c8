"""The figures of docs/pretrained.md's Llama, BERT and T5 sections: how far torchformer's loaded models are from
``transformers``'.

For each tiny random model of ``tests/test_huggingface_llama.py`` (its FAMILIES), the largest difference in
log-probabilities between ``transformers``' model and the torchformer model loaded from its ``save_pretrained``
folder; then, on the Llama-3.1 model, how far each choice moves them when left out. The same for the tiny random
BERTs of ``tests/test_huggingface_bert.py``: the masked-LM and the classifier (``BertForSequenceClassification``),
each choice left out, and the losses of fine-tuning a loaded masked-LM as its test does; and T5 and flan-T5
(``tests/test_huggingface_t5.py``'s KINDS, on its padded batch of sources; each choice of its LEFT_OUT), with a
torchformer model exported to each and loaded by ``AutoModelForSeq2SeqLM``. Needs ``transformers``; name the families
to run only those (``python benchmarks/pretrained_equivalence.py t5``)::

    python benchmarks/pretrained_equivalence.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_huggingface_bert as bert_cases  # noqa: E402
import test_huggingface_llama as cases  # noqa: E402  (the test's models, so the figures are the tests')
import torch.nn.functional as F  # noqa: E402
import test_huggingface_t5 as t5_cases  # noqa: E402
import transformers  # noqa: E402

from torchformer import (  # noqa: E402
    CTransformer, GTransformer, MLMTransformer, Seq2SeqTransformer, from_huggingface, to_huggingface,
)


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
    which = sys.argv[1:] or ["llama", "bert", "t5"]
    for name, figures in (("llama", llama), ("bert", bert), ("t5", t5_figures)):
        if name in which:
            figures()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


def llama() -> None:
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


def bert() -> None:
    """The BERT figures, on the tests' tiny models and batch (4 sequences of 16 ids, random token types; the padded
    batch is right-padded to lengths 16, 11, 5, 1)."""
    x, token_types, mask = bert_cases.inputs()
    with tempfile.TemporaryDirectory() as tmp:
        hf = bert_cases.random_bert(transformers)
        hf.save_pretrained(Path(tmp) / "bert")
        model = from_huggingface(Path(tmp) / "bert")
        gaps = bert_cases.gaps(model, hf, x, token_types, mask)
        print(f"bert masked-LM: largest difference {max(gaps):.2g} (no types, types, padded: "
              f"{', '.join(f'{g:.2g}' for g in gaps)})")
        reference = bert_cases.hf_log_probs(hf, x, token_types)
        for changes in (dict(embedding_norm=False), dict(mlm_scale=True), dict(activation="gelu_tanh")):
            other = MLMTransformer(config=model.config.replace(**changes)).eval()
            other.load_state_dict(model.state_dict(), strict=False)
            with torch.no_grad():
                print(f"bert masked-LM with {changes}: moves by "
                      f"{(other(x, token_types=token_types) - reference).abs().max().item():.2g}")
        with torch.no_grad():
            print(f"bert masked-LM given no token types: moves by {(model(x) - reference).abs().max().item():.2g}")

        classifier = bert_cases.random_classifier(transformers)
        classifier.save_pretrained(Path(tmp) / "cls")
        model = from_huggingface(Path(tmp) / "cls")
        gaps = bert_cases.classifier_gaps(model, classifier, x, token_types, mask)
        print(f"bert classifier: largest difference {max(gaps):.2g} (no types, types, padded: "
              f"{', '.join(f'{g:.2g}' for g in gaps)})")
        plain = CTransformer(config=model.config.replace(pooler=False)).eval()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("head.pooler.")})
        print(f"bert classifier without the pooler: moves by "
              f"{max(bert_cases.classifier_gaps(plain, classifier, x, token_types, mask)):.2g}")

        # Fine-tuning, as test_fine_tuning_a_loaded_masked_lm: a loaded masked-LM's encoder, a new pooler and layer.
        hf = bert_cases.random_bert(transformers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        hf.save_pretrained(Path(tmp) / "mlm")
        torch.manual_seed(0)
        tuned = CTransformer.from_encoder(from_huggingface(Path(tmp) / "mlm"), 2, pool="first", pooler=True)
        with torch.no_grad():
            ours = tuned.encoder(tuned.embedding(x, token_types=token_types), mask)
            theirs = hf.bert(x, token_type_ids=token_types, attention_mask=mask.long()).last_hidden_state
        print(f"fine-tuning: step 0's encoder output against BertModel's last hidden state: "
              f"{(ours - theirs)[mask].abs().max().item():.2g}")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, bert_cases.VOCAB, (32, 8), generator=g)
        labels = (ids[:, 1] < bert_cases.VOCAB // 2).long()
        optimizer = torch.optim.Adam(tuned.parameters(), lr=1e-3)
        losses = []
        for _ in range(30):
            loss = F.nll_loss(tuned(ids), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        print(f"fine-tuning: loss {losses[0]:.3f} at step 0, {losses[9]:.3f} after 10 steps, {losses[-1]:.3f} "
              f"after 30")


if __name__ == "__main__":
    main()
