"""Every field of TransformerConfig reaches the model: set to a value other than its default, it changes what the
model is (its parameters' names or shapes, their initial values from the same seed) or what it computes (the
outputs on the same weights), or, for the fields whose contract is to change neither (an attention
implementation, activation checkpointing, a variant's own hyperparameters), provably leaves the outputs equal.

A field that a model silently ignored (the fixed sparse pattern built without its ``sparse_summary``, say) fails
here, and a new field fails until it has its row.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from torchformer import CTransformer, GTransformer, MLMTransformer, Seq2SeqTransformer, TransformerConfig
from torchformer.config import PartOptions

E, H, T, V = 16, 4, 12, 20
BASE = dict(emb=E, heads=H, depth=2, seq_length=T, num_tokens=V)
LLAMA = dict(prenorm=True, norm="rms", positions="rotary", activation="swiglu")
RELATIVE = dict(positions="relative", relative_buckets=8)

# field: (model class, the base config's fields, the field's other value)
CHANGES = {
    "emb": (GTransformer, {}, 32),
    "heads": (GTransformer, {}, 2),
    "depth": (GTransformer, {}, 1),
    "seq_length": (GTransformer, {}, 16),
    "num_tokens": (GTransformer, {}, 21),
    "num_classes": (CTransformer, {"num_classes": 2}, 3),
    "tgt_tokens": (Seq2SeqTransformer, {"tgt_tokens": V}, 21),
    "decoder_depth": (Seq2SeqTransformer, {"tgt_tokens": V}, 1),
    "wide": (GTransformer, {}, True),
    "positions": (GTransformer, {}, "sinusoidal"),
    "dropout": (GTransformer, {}, 0.3),
    "prenorm": (GTransformer, {}, True),
    "ff_mult": (GTransformer, {}, 2),
    "activation": (GTransformer, {}, "gelu"),
    "kqnorm": (GTransformer, {}, True),
    "pool": (CTransformer, {"num_classes": 2}, "mean"),
    "tie_weights": (GTransformer, {}, True),
    "norm": (GTransformer, {}, "rms"),
    "kv_heads": (GTransformer, {}, 2),
    "window": (GTransformer, {}, 3),
    "input_dim": (CTransformer, {"num_classes": 2}, 5),  # vectors instead of token ids (build drops num_tokens)
    "qkv_bias": (GTransformer, {}, True),
    "head_bias": (GTransformer, {}, False),
    "norm_eps": (GTransformer, {}, 0.5),
    "ff_hidden": (GTransformer, {}, 40),
    "out_bias": (GTransformer, {}, False),
    "rotary_base": (GTransformer, LLAMA, 50.0),
    "rotary_scaling": (GTransformer, LLAMA, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 4}),
    "num_token_types": (MLMTransformer, {}, 2),
    "embedding_norm": (MLMTransformer, {}, True),
    "mlm_scale": (MLMTransformer, {}, False),
    "pooler": (CTransformer, {"num_classes": 2}, True),
    "attention_scale": (GTransformer, {}, 1.0),
    "head_dim": (GTransformer, {}, 8),
    "ff_bias": (GTransformer, {}, False),
    "head_scale": (GTransformer, {}, True),
    "share_embeddings": (Seq2SeqTransformer, {"tgt_tokens": V}, True),
    "relative_buckets": (GTransformer, RELATIVE, 12),
    "relative_max_distance": (GTransformer, RELATIVE, 5),
    "relative_shared": (GTransformer, RELATIVE, True),
    "zero_init_residual": (GTransformer, {"prenorm": True}, True),
    "logit_cap": (GTransformer, {}, 0.5),
    "sparse": (GTransformer, {"sparse_stride": 3}, "strided"),
    "sparse_stride": (GTransformer, {"sparse": "fixed", "sparse_stride": 4}, 3),
    "sparse_summary": (GTransformer, {"sparse": "fixed", "sparse_stride": 4}, 3),
}
# The fields whose contract is the same outputs: another implementation of attention (equal to 1e-10 in float64),
# recomputation in the backward pass, and a variant's hyperparameters and options, which the built-in modules do not
# read (the mixture of experts' options: tests/test_moe.py).
@dataclasses.dataclass(frozen=True)
class VariantOptions(PartOptions):
    gain: float = 1.0


SAME_OUTPUTS = {
    "impl": (GTransformer, {}, "reference"),
    "checkpoint_blocks": (GTransformer, {}, True),
    "extra": (GTransformer, {}, {"lambda_init": 0.8}),
    "options": (GTransformer, {}, (VariantOptions(gain=2.0),)),  # read by a variant's part, not by the built-ins
}


def build(model_class, fields):
    fields = {**BASE, **fields}
    if "sparse" not in fields:  # the row of sparse: its base is dense
        fields.pop("sparse_stride", None)
    if "input_dim" in fields:
        fields.pop("num_tokens")
    torch.manual_seed(0)
    return model_class(config=TransformerConfig(**fields)).double()


def outputs(model, config):
    g = torch.Generator().manual_seed(1)
    if config.input_dim is not None:
        x = torch.randn(2, T, config.input_dim, generator=g, dtype=torch.float64)
    else:
        x = torch.randint(0, min(config.num_tokens, config.tgt_tokens or V), (2, T), generator=g)
    torch.manual_seed(2)  # the same dropout masks
    with torch.no_grad():
        return model(x, x) if isinstance(model, Seq2SeqTransformer) else model(x)


def shapes(model):
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def test_every_field_has_a_row():
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert fields == set(CHANGES) | set(SAME_OUTPUTS), fields ^ (set(CHANGES) | set(SAME_OUTPUTS))


# The fields whose effect is not in what a model computes from given weights: which parameters are one object
# (fewer distinct parameters, the state dict's names the same), and the initial values alone.
TIED = {"tie_weights", "share_embeddings", "relative_shared"}
INITIALISATION = {"zero_init_residual"}


@pytest.mark.parametrize("field", list(CHANGES))
def test_a_field_at_another_value_changes_the_model(field):
    model_class, base, value = CHANGES[field]
    assert value != TransformerConfig.__dataclass_fields__[field].default or field in {**BASE, **base}
    before, after = build(model_class, base), build(model_class, {**base, field: value})
    assert getattr(after.config, field) == value
    if field in TIED:
        assert len(list(after.parameters())) < len(list(before.parameters())), f"{field}={value!r} tied nothing"
        return
    if field in INITIALISATION:
        assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
        return
    if shapes(before) != shapes(after):
        return  # another architecture: parameters added, removed or resized
    with torch.no_grad():  # no parameter at a value that hides a difference (a zero-initialised relative table)
        for p in before.parameters():
            p.add_(0.1 * torch.randn_like(p))
    after.load_state_dict(before.state_dict())
    for model in (before, after):
        model.train(field == "dropout")
    difference = (outputs(after, after.config) - outputs(before, before.config)).abs().max().item()
    assert difference > 1e-6, f"{field}={value!r} changed nothing"


# How each of them shows that it took effect: the path it names ran (a count of calls), or it was saved.
PROBES = {"impl": "torchformer.nn.attention.attention_reference", "checkpoint_blocks": "torchformer.nn.stacks.checkpoint"}


@pytest.mark.parametrize("field", list(SAME_OUTPUTS))
def test_a_field_whose_contract_is_the_same_outputs_keeps_them_and_takes_effect(field, monkeypatch):
    model_class, base, value = SAME_OUTPUTS[field]
    before, after = build(model_class, base), build(model_class, {**base, field: value})
    assert getattr(after.config, field) == value and shapes(before) == shapes(after)
    after.load_state_dict(before.state_dict())
    for model in (before, after):
        model.train(field == "checkpoint_blocks")  # it applies while training only
    expected = outputs(before, before.config)
    calls = []
    if field in PROBES:
        module, _, name = PROBES[field].rpartition(".")
        original = getattr(importlib.import_module(module), name)
        monkeypatch.setattr(f"{module}.{name}", lambda *a, **k: calls.append(1) or original(*a, **k))
    if field == "checkpoint_blocks":  # it runs only where gradients are recorded (outputs() records none)
        got = after(torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1)))  # outputs()' ids
    else:
        got = outputs(after, after.config)
    torch.testing.assert_close(got.detach(), expected, rtol=0, atol=1e-10)
    if field in PROBES:
        assert calls, f"{field}={value!r}: {PROBES[field]} never ran"
    else:  # a variant's data: read by the variant only, but saved with the config
        assert TransformerConfig.from_dict(after.config.to_dict()) == after.config
