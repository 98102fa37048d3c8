"""BERT in and out of the Hugging Face layout (torchformer.pretrained): equal outputs, named errors.

Two kinds of test:

* without ``transformers``: a folder written by hand (``config.json`` and a safetensors or ``.bin`` file, the tensors
  under BERT's names, old and new) loads into an MLMTransformer whose log-probabilities equal BERT's forward pass
  written out here in plain torch (:func:`bert_reference`), not read from the module's map; and every refusal names
  its field or tensor;
* with ``transformers`` (skipped where it is not installed; the ``test`` extra installs it): tiny random
  ``BertForMaskedLM``\\ s written with ``save_pretrained`` (one file, shards) or as ``pytorch_model.bin`` load with
  log-probabilities equal within 1e-4 in float32, with and without token types and with a padding mask, and an
  exported folder loads back into ``transformers`` with equal outputs.

The classifier, ``BertForSequenceClassification`` <-> ``CTransformer`` (``pool="first"``, ``pooler=True``), is
tested the same two ways (the reference's classifier head, and tiny random classifiers), and so is fine-tuning: a
loaded ``BertForMaskedLM`` becomes a classifier with ``CTransformer.from_encoder`` and learns a separable task.

Nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from torchformer import CTransformer, MLMTransformer, from_huggingface, to_huggingface

safetensors_torch = pytest.importorskip("safetensors.torch")

E, H, DEPTH, POSITIONS, VOCAB, TYPES, INNER = 32, 4, 2, 16, 50, 2, 64
TOLERANCE = 1e-4  # float32 log-probabilities, as for GPT-2


def hf_config(**changes):
    """A tiny BERT config.json, BertConfig's other fields left out (they mean BERT's defaults: eps 1e-12, ...)."""
    return {"model_type": "bert", "hidden_size": E, "num_attention_heads": H, "num_hidden_layers": DEPTH,
            "max_position_embeddings": POSITIONS, "vocab_size": VOCAB, "intermediate_size": INNER, **changes}


def bert_tensors(seed=0, prefix="bert.", old_names=False, pretraining=False):
    """Random tensors under BERT's names (BertForMaskedLM's, with ``prefix``), nn.Linear's (out, in) layout.

    ``old_names``: LayerNorms as ``gamma`` and ``beta``; ``pretraining``: also BertForPreTraining's pooler and
    next-sentence head, and the position ids buffer, as ``bert-base-uncased`` stores them.
    """
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    gain, bias = ("gamma", "beta") if old_names else ("weight", "bias")

    def layer_norm(name):
        return {f"{name}.{gain}": 1 + r(E), f"{name}.{bias}": r(E)}

    tensors = {"embeddings.word_embeddings.weight": r(VOCAB, E),
               "embeddings.position_embeddings.weight": r(POSITIONS, E),
               "embeddings.token_type_embeddings.weight": r(TYPES, E), **layer_norm("embeddings.LayerNorm")}
    for i in range(DEPTH):
        block = f"encoder.layer.{i}."
        for name, (out, inp) in (("attention.self.query", (E, E)), ("attention.self.key", (E, E)),
                                 ("attention.self.value", (E, E)), ("attention.output.dense", (E, E)),
                                 ("intermediate.dense", (INNER, E)), ("output.dense", (E, INNER))):
            tensors[f"{block}{name}.weight"], tensors[f"{block}{name}.bias"] = r(out, inp), r(out)
        tensors.update(layer_norm(f"{block}attention.output.LayerNorm"))
        tensors.update(layer_norm(f"{block}output.LayerNorm"))
    if pretraining:
        tensors.update({"pooler.dense.weight": r(E, E), "pooler.dense.bias": r(E),
                        "embeddings.position_ids": torch.arange(POSITIONS)[None]})
    tensors = {prefix + name: t for name, t in tensors.items()}
    tensors.update({"cls.predictions.transform.dense.weight": r(E, E), "cls.predictions.transform.dense.bias": r(E),
                    **layer_norm("cls.predictions.transform.LayerNorm"), "cls.predictions.bias": r(VOCAB)})
    if pretraining:
        tensors.update({"cls.seq_relationship.weight": r(2, E), "cls.seq_relationship.bias": r(2)})
    return tensors


def bert_reference(tensors, x, token_types=None, mask=None, eps=1e-12, head="masked-lm"):
    """BERT's forward pass, written out from its definition: (b, t) ids -> (b, t, v) log-probabilities (the
    masked-LM), or (b, c) (``head="classifier"``, BertForSequenceClassification).

    Embedding: word + position + token type, LayerNorm. Each block (post-norm): LayerNorm(x + attention(x)), then
    LayerNorm(x + W2 gelu(W1 x)); attention with biases, softmax(q k^T / sqrt(s)) per head, padded keys masked.
    Masked-LM head: LayerNorm(gelu(W x + b)), dot products with the word embedding, plus the output bias. Classifier:
    the pooler tanh(W x_0 + b) on the first position, then the linear layer. No dropout.
    """
    t = {name.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
         .replace("LayerNorm.beta", "LayerNorm.bias"): v.double() for name, v in tensors.items()}

    def ln(h, name):
        return F.layer_norm(h, (E,), t[f"{name}.weight"], t[f"{name}.bias"], eps)

    def linear(h, name):
        return h @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    b, n = x.shape
    types = torch.zeros_like(x) if token_types is None else token_types
    h = t["embeddings.word_embeddings.weight"][x] + t["embeddings.position_embeddings.weight"][:n] \
        + t["embeddings.token_type_embeddings.weight"][types]
    h = ln(h, "embeddings.LayerNorm")
    s = E // H
    for i in range(DEPTH):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(h, p + f"attention.self.{m}").view(b, n, H, s).transpose(1, 2) for m in ("query", "key",
                                                                                                      "value"))
        scores = q @ k.transpose(-2, -1) / math.sqrt(s)  # (b, h, t, t)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, E)
        h = ln(h + linear(heads, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        ff = linear(F.gelu(linear(h, p + "intermediate.dense")), p + "output.dense")
        h = ln(h + ff, p + "output.LayerNorm")
    if head == "classifier":
        return torch.log_softmax(linear(torch.tanh(linear(h[:, 0], "pooler.dense")), "classifier"), dim=-1)
    h = ln(F.gelu(linear(h, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
    logits = h @ t["embeddings.word_embeddings.weight"].T + t["cls.predictions.bias"]
    return torch.log_softmax(logits, dim=-1)


def write(folder, config, tensors, layout="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if layout == "safetensors":
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return folder


def inputs(seed=2):
    """A batch of ids, random token types, and a padding mask (right padding, one row unpadded)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (4, POSITIONS), generator=g)
    token_types = torch.randint(0, TYPES, (4, POSITIONS), generator=g)
    mask = torch.arange(POSITIONS)[None, :] < torch.tensor([16, 11, 5, 1])[:, None]  # (4, 16)
    return x, token_types, mask


# ------------------------------------------------------------------------------- without transformers


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
@pytest.mark.parametrize("prefix, old_names, pretraining", [("bert.", False, False), ("", False, False),
                                                            ("bert.", True, True)],
                         ids=["masked-lm", "no-prefix", "bert-base-uncased-like"])
def test_a_hand_written_folder_loads_and_computes_berts_formula(tmp_path, layout, prefix, old_names, pretraining):
    tensors = bert_tensors(prefix=prefix, old_names=old_names, pretraining=pretraining)
    folder = write(tmp_path / "bert", hf_config(), tensors, layout)
    rng = torch.get_rng_state()
    model = from_huggingface(folder)
    assert torch.equal(torch.get_rng_state(), rng)  # built on the meta device: no random initialisation
    assert type(model) is MLMTransformer and not model.training
    assert model.head.weight is model.embedding.tokens.weight  # tied, as BERT's output matrix
    c = model.config
    assert (c.num_token_types, c.embedding_norm, c.mlm_scale, c.qkv_bias, c.prenorm, c.activation, c.norm_eps) == \
        (2, True, False, True, False, "gelu", 1e-12)
    x, token_types, mask = inputs()
    with torch.no_grad():
        for types in (None, token_types):
            expected = bert_reference(tensors, x, types)
            gap = (model(x, token_types=types).double() - expected).abs().max().item()
            assert gap < 1e-5, gap
        padded = model(x, mask, token_types=token_types).double()
    expected = bert_reference(tensors, x, token_types, mask)
    assert (padded - expected)[mask].abs().max().item() < 1e-5  # the real positions; padding reads no padding


def test_dtype_and_device(tmp_path):
    folder = write(tmp_path / "half", hf_config(), {k: v.to(torch.bfloat16) for k, v in bert_tensors().items()})
    assert {p.dtype for p in from_huggingface(folder).parameters()} == {torch.bfloat16}  # the file's dtype
    model = from_huggingface(folder, dtype=torch.float64, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@pytest.mark.parametrize("field, value, message", [
    ("hidden_act", "gelu_new", "hidden_act='gelu_new' is not supported: torchformer's BERT has the exact GELU"),
    ("position_embedding_type", "relative_key", "position_embedding_type='relative_key' is not supported"),
    ("is_decoder", True, "is_decoder=True is not supported: torchformer's BERT is an encoder"),
    ("add_cross_attention", True, "add_cross_attention=True is not supported"),
    ("intermediate_size", 0, "config.json: its values .* do not make a model: ff_hidden must be a positive int"),
    ("attention_probs_dropout_prob", 0.2, "attention_probs_dropout_prob=0.2 is not supported: torchformer has one "
                                          "dropout"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings='yes' is not supported"),
    ("num_attention_heads", 5, "config.json: its values .* do not make a model: .*emb"),
    ("type_vocab_size", 0, "config.json: its values .* do not make a model: num_token_types must be a positive int"),
    ("layer_norm_eps", 0.0, "config.json: its values .* do not make a model: norm_eps must be a positive float"),
])
def test_a_config_value_torchformer_cannot_express_is_named(tmp_path, field, value, message):
    folder = write(tmp_path / "bert", hf_config(**{field: value}), bert_tensors())
    with pytest.raises(ValueError, match=message):
        from_huggingface(folder)


def test_older_config_fields_that_change_nothing_are_read(tmp_path):
    """position_embedding_type "absolute" (written until transformers 5), the layer-norm eps of another model."""
    tensors = bert_tensors()
    folder = write(tmp_path / "bert", hf_config(position_embedding_type="absolute", layer_norm_eps=1e-5), tensors)
    model = from_huggingface(folder)
    assert model.config.norm_eps == 1e-5
    assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-5}  # every LayerNorm
    x, token_types, _ = inputs()
    with torch.no_grad():
        gap = (model(x, token_types=token_types).double() - bert_reference(tensors, x, token_types, eps=1e-5))
    assert gap.abs().max().item() < 1e-5


def test_tensors_that_do_not_fit_the_config_are_named(tmp_path):
    tensors = bert_tensors()
    missing = {k: v for k, v in tensors.items() if k != "bert.encoder.layer.1.intermediate.dense.bias"}
    with pytest.raises(ValueError, match="holds no bert.encoder.layer.1.intermediate.dense.bias"):
        from_huggingface(write(tmp_path / "a", hf_config(), missing))
    with pytest.raises(ValueError, match=r"bert.encoder.layer.0.attention.self.key.weight has shape \(32, 16\), but "
                                         r"config.json makes it \(32, 32\)"):
        from_huggingface(write(tmp_path / "b", hf_config(),
                               {**tensors, "bert.encoder.layer.0.attention.self.key.weight": torch.ones(E, 16)}))
    with pytest.raises(ValueError, match="tensors BERT's masked-LM does not have.*bert.encoder.layer.2.output"):
        from_huggingface(write(tmp_path / "c", hf_config(),
                               {**tensors, "bert.encoder.layer.2.output.dense.bias": torch.ones(E)}))
    with pytest.raises(ValueError, match="cls.predictions.decoder.weight differs from "
                                         "bert.embeddings.word_embeddings.weight, but config.json ties them"):
        from_huggingface(write(tmp_path / "d", hf_config(),
                               {**tensors, "cls.predictions.decoder.weight": torch.zeros(VOCAB, E)}))
    with pytest.raises(ValueError, match="cls.predictions.decoder.bias differs from cls.predictions.bias, but "
                                         "config.json ties them"):
        from_huggingface(write(tmp_path / "e", hf_config(),
                               {**tensors, "cls.predictions.decoder.bias": torch.zeros(VOCAB)}))
    same = {**tensors, "cls.predictions.decoder.weight": tensors["bert.embeddings.word_embeddings.weight"].clone(),
            "cls.predictions.decoder.bias": tensors["cls.predictions.bias"].clone()}  # stored twice, as .bin files may
    from_huggingface(write(tmp_path / "f", hf_config(), same, "bin"))
    encoder_only = {k: v for k, v in tensors.items() if not k.startswith("cls.")}  # what BertModel writes
    with pytest.raises(ValueError, match=r"holds no cls.predictions.transform.dense.weight.*a BertModel file has no "
                                         r"masked-LM head; a BertForSequenceClassification file loads as a "
                                         r"CTransformer when its config.json's architectures say so"):
        from_huggingface(write(tmp_path / "g", hf_config(), encoder_only))
    with pytest.raises(ValueError, match="holds no cls.predictions.decoder.weight, which .* and "
                                         "tie_word_embeddings=false has"):
        from_huggingface(write(tmp_path / "h", hf_config(tie_word_embeddings=False), tensors))


def bert_like(**changes):
    """A random MLMTransformer with BERT's choices, its biases and norm parameters random too."""
    options = dict(activation="gelu", qkv_bias=True, tie_weights=True, norm_eps=1e-12, num_token_types=TYPES,
                   embedding_norm=True, mlm_scale=False, ff_mult=INNER // E)
    torch.manual_seed(0)
    model = MLMTransformer(E, H, DEPTH, POSITIONS, VOCAB, **{**options, **changes}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or name.endswith("transform.2.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_export_and_load_round_trip_without_transformers(tmp_path):
    # No qkv_bias and no token types: exported as zero biases and one zero token-type vector, the same function.
    model = bert_like(qkv_bias=False, num_token_types=None, tie_weights=False, dropout=0.1)
    folder = to_huggingface(model, tmp_path / "out")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "bert" and written["architectures"] == ["BertForMaskedLM"]
    assert written["type_vocab_size"] == 1 and written["tie_word_embeddings"] is False
    assert written["intermediate_size"] == INNER and written["layer_norm_eps"] == 1e-12
    back = from_huggingface(folder)
    assert back.config == model.config.replace(qkv_bias=True, num_token_types=1, dropout=0.1)
    x, _, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(back(x, mask), model(x, mask), atol=1e-6, rtol=0)


def test_a_model_that_does_not_map_onto_bert_is_named(tmp_path):
    cases = [
        (dict(positions="rotary"), "positions='rotary'"),
        (dict(prenorm=True), "prenorm=True"),
        (dict(activation="relu", norm="rms"), "norm='rms' .*; activation='relu'"),
        (dict(embedding_norm=False), "embedding_norm=False"),
        (dict(mlm_scale=True), "mlm_scale=True"),
        (dict(kv_heads=2, window=4), "kv_heads=2 .*; window=4"),
    ]
    for changes, message in cases:
        with pytest.raises(ValueError, match=f"does not map onto BERT: {message}"):
            to_huggingface(bert_like(**changes), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written

    class Variant(MLMTransformer):
        pass

    with pytest.raises(ValueError, match="a Variant is a variant of MLMTransformer"):
        to_huggingface(Variant(config=bert_like().config), tmp_path / "x")
    with pytest.raises(ValueError, match="a CTransformer does not map onto a Hugging Face family unless BERT's "
                                         "classifier .* expresses it, and this one has: "):
        to_huggingface(CTransformer(E, H, DEPTH, POSITIONS, VOCAB, 2), tmp_path / "x")


# ---------------------------------------------------------------------------------- with transformers


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def random_bert(transformers, seed=0, **changes):
    """A tiny random BertForMaskedLM, its biases and LayerNorm gains random too (they start at 0 and 1).

    Weights of standard deviation 0.3, not BERT's 0.02: far from uniform log-probabilities, so that a missing
    part (the embedding's LayerNorm, the token types) moves them by more than the tolerance.
    """
    config = transformers.BertConfig(hidden_size=E, num_hidden_layers=DEPTH, num_attention_heads=H,
                                     intermediate_size=INNER, max_position_embeddings=POSITIONS, vocab_size=VOCAB,
                                     type_vocab_size=TYPES, initializer_range=0.3, **changes)
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_log_probs(hf, x, token_types=None, mask=None):
    with torch.no_grad():
        out = hf(x, token_type_ids=token_types, attention_mask=None if mask is None else mask.long())
        return torch.log_softmax(out.logits.float(), dim=-1)


def gaps(model, hf, x, token_types, mask):
    """The largest log-probability difference: without token types, with them, and at the real positions of a
    padded batch."""
    with torch.no_grad():
        return (
            (model(x) - hf_log_probs(hf, x)).abs().max().item(),
            (model(x, token_types=token_types) - hf_log_probs(hf, x, token_types)).abs().max().item(),
            (model(x, mask, token_types=token_types) - hf_log_probs(hf, x, token_types, mask))[mask].abs().max().item(),
        )


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin"])
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": False, "layer_norm_eps": 1e-5,
                                          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}],
                         ids=["bert", "untied-eps1e-5"])
def test_log_probabilities_equal_transformers(tmp_path, transformers, layout, changes):
    hf = random_bert(transformers, **changes)
    folder = tmp_path / "bert"
    if layout == "bin":  # what save_pretrained(safe_serialization=False) wrote before transformers 5
        folder.mkdir()
        hf.config.to_json_file(folder / "config.json")
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    else:
        hf.save_pretrained(folder, max_shard_size="20KB" if layout == "sharded" else "5GB")
        assert (folder / "model.safetensors.index.json").exists() == (layout == "sharded")
    model = from_huggingface(folder)
    assert model.config.tie_weights == hf.config.tie_word_embeddings
    x, token_types, mask = inputs()
    assert max(gaps(model, hf, x, token_types, mask)) < TOLERANCE


def test_each_bert_choice_matters(tmp_path, transformers):
    """Without the fields BERT needs, the same weights give other log-probabilities: the test above can see them."""
    hf = random_bert(transformers)
    hf.save_pretrained(tmp_path / "bert")
    model = from_huggingface(tmp_path / "bert")
    x, token_types, _ = inputs()
    reference = hf_log_probs(hf, x, token_types)
    for change in (dict(embedding_norm=False), dict(mlm_scale=True), dict(activation="gelu_tanh")):
        other = MLMTransformer(config=model.config.replace(**change)).eval()
        assert not other.load_state_dict(model.state_dict(), strict=False).missing_keys
        with torch.no_grad():
            assert (other(x, token_types=token_types) - reference).abs().max() > 10 * TOLERANCE, change
    with torch.no_grad():
        assert (model(x, token_types=token_types) - reference).abs().max() < TOLERANCE
        assert (model(x) - reference).abs().max() > 10 * TOLERANCE  # the token types count


def test_a_classifier_starts_from_the_loaded_encoder_and_reads_berts_last_hidden_state(tmp_path, transformers):
    """Fine-tuning a loaded BERT: a CTransformer of its config (the head's fields changed) takes its encoder, whose
    output equals BertModel's last hidden state at the real positions, with token types and padding."""
    hf = random_bert(transformers)
    hf.save_pretrained(tmp_path / "bert")
    bert = from_huggingface(tmp_path / "bert")
    classifier = CTransformer(config=bert.config.replace(tie_weights=False, mlm_scale=True, num_classes=3,
                                                         pool="first")).eval()
    classifier.load_encoder(bert)
    x, token_types, mask = inputs()
    with torch.no_grad():
        ours = classifier.encoder(classifier.embedding(x, token_types=token_types), mask)
        theirs = hf.bert(x, token_type_ids=token_types, attention_mask=mask.long()).last_hidden_state
        assert (ours - theirs)[mask].abs().max().item() < TOLERANCE
        assert classifier(x, mask, token_types=token_types).shape == (4, 3)


@pytest.mark.parametrize("changes", [{}, dict(qkv_bias=False, num_token_types=None, tie_weights=False, dropout=0.1,
                                              norm_eps=1e-5), dict(ff_hidden=48, out_bias=False)],
                         ids=["bert", "no-qkv-bias-no-types-untied", "ff-hidden-no-out-bias"])
def test_an_exported_model_loads_into_transformers_with_equal_outputs(tmp_path, transformers, changes):
    model = bert_like(**changes)
    folder = to_huggingface(model, tmp_path / "export")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    assert math.isclose(hf.config.attention_probs_dropout_prob, model.config.dropout)
    x, token_types, mask = inputs()
    if model.config.num_token_types is None:
        token_types = None  # the exported model's one type, 0, is transformers' default too
    assert max(gaps(model, hf, x, token_types, mask)) < TOLERANCE


# ------------------------------------------------------- the classifier, BertForSequenceClassification

CLASSES = 3


def classifier_config(**changes):
    """A tiny BertForSequenceClassification's config.json, as save_pretrained writes it (id2label, no problem_type)."""
    return hf_config(**{"architectures": ["BertForSequenceClassification"],
                        "id2label": {str(i): f"LABEL_{i}" for i in range(CLASSES)}, **changes})


def classifier_tensors(seed=0):
    """Random tensors under BertForSequenceClassification's names: the encoder and the pooler after ``bert.`` (and
    the position ids, as older files store them), the linear layer ``classifier``."""
    tensors = {k: v for k, v in bert_tensors(seed, pretraining=True).items() if k.startswith("bert.")}
    g = torch.Generator().manual_seed(seed + 1)
    return {**tensors, "classifier.weight": 0.3 * torch.randn(CLASSES, E, generator=g),
            "classifier.bias": 0.3 * torch.randn(CLASSES, generator=g)}


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
def test_a_hand_written_classifier_folder_loads_and_computes_berts_formula(tmp_path, layout):
    tensors = classifier_tensors()
    model = from_huggingface(write(tmp_path / "cls", classifier_config(), tensors, layout))
    assert type(model) is CTransformer and not model.training
    c = model.config
    assert (c.num_classes, c.pool, c.pooler, c.num_token_types, c.embedding_norm, c.qkv_bias, c.norm_eps,
            c.tie_weights) == (CLASSES, "first", True, 2, True, True, 1e-12, False)
    x, token_types, mask = inputs()
    with torch.no_grad():
        for types, padding in ((None, None), (token_types, None), (token_types, mask)):
            expected = bert_reference(tensors, x, types, padding, head="classifier")
            gap = (model(x, padding, token_types=types).double() - expected).abs().max().item()
            assert gap < 1e-5, gap


@pytest.mark.parametrize("changes, message", [
    (dict(problem_type="regression"), "problem_type='regression' is not supported: a CTransformer gives a softmax"),
    (dict(problem_type="multi_label_classification"), "problem_type='multi_label_classification' is not supported"),
    (dict(id2label={"0": "score"}), "num_labels=1 is not supported: transformers reads one label as a regression"),
    (dict(id2label={"0": "yes"}, problem_type="single_label_classification"), "num_labels=1 is not supported"),
    (dict(num_labels=2), "num_labels=2 is not supported: id2label names 3 classes"),
    (dict(id2label=["a", "b"]), r"id2label=\['a', 'b'\] is not supported"),
    (dict(classifier_dropout=0.3), "classifier_dropout=0.3 is not supported: torchformer has one dropout"),
])
def test_a_classifier_config_torchformer_cannot_express_is_named(tmp_path, changes, message):
    folder = write(tmp_path / "cls", classifier_config(**changes), classifier_tensors())
    with pytest.raises(ValueError, match=message):
        from_huggingface(folder)


def test_a_classifier_config_that_maps_loads(tmp_path):
    """problem_type single-label classification is what a CTransformer computes; classifier_dropout equal to the
    dropout is the one dropout; num_labels without id2label is read too."""
    tensors = classifier_tensors()
    folder = write(tmp_path / "a", classifier_config(problem_type="single_label_classification"), tensors)
    assert from_huggingface(folder).config.num_classes == CLASSES
    config = classifier_config(classifier_dropout=0.1, num_labels=CLASSES)
    del config["id2label"]
    assert from_huggingface(write(tmp_path / "b", config, tensors)).config.num_classes == CLASSES


def test_classifier_tensors_that_do_not_fit_are_named(tmp_path):
    tensors = classifier_tensors()
    no_pooler = {k: v for k, v in tensors.items() if not k.startswith("bert.pooler.")}
    with pytest.raises(ValueError, match=r"holds no bert.pooler.dense.weight, which BERT's classifier "
                                         r"\(BertForSequenceClassification\) with num_hidden_layers=2 has"):
        from_huggingface(write(tmp_path / "a", classifier_config(), no_pooler))
    with pytest.raises(ValueError, match=r"classifier.weight has shape \(3, 32\), but config.json makes it \(2, 32\)"):
        from_huggingface(write(tmp_path / "b", classifier_config(id2label={"0": "a", "1": "b"}), tensors))
    with pytest.raises(ValueError, match="tensors BertForSequenceClassification does not have .*cls.predictions.bias"):
        from_huggingface(write(tmp_path / "c", classifier_config(), {**tensors, **bert_tensors()}))


def bert_classifier_like(**changes):
    """A random CTransformer of BertForSequenceClassification's shape, its biases and norm parameters random too."""
    options = dict(emb=E, heads=H, depth=DEPTH, seq_length=POSITIONS, num_tokens=VOCAB, num_classes=CLASSES,
                   activation="gelu", qkv_bias=True, norm_eps=1e-12, num_token_types=TYPES, embedding_norm=True,
                   ff_mult=INNER // E, pool="first", pooler=True)
    torch.manual_seed(0)
    model = CTransformer(**{**options, **changes}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_an_exported_classifier_reads_back_without_transformers(tmp_path):
    model = bert_classifier_like(qkv_bias=False, num_token_types=None, dropout=0.1)
    folder = to_huggingface(model, tmp_path / "out")
    written = json.loads((folder / "config.json").read_text())
    assert written["architectures"] == ["BertForSequenceClassification"]
    assert written["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    assert written["problem_type"] == "single_label_classification" and written["type_vocab_size"] == 1
    back = from_huggingface(folder)
    assert back.config == model.config.replace(qkv_bias=True, num_token_types=1)
    x, _, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(back(x, mask), model(x, mask), atol=1e-6, rtol=0)


def test_a_classifier_that_does_not_map_onto_bert_is_named(tmp_path):
    for changes, message in [
        (dict(pool="max"), "pool='max' .*BERT classifies from the \\[CLS\\] token"),
        (dict(pooler=False), "pooler=False .*BERT's classifier reads the pooler's output: True"),
        (dict(pool="mean", pooler=False, prenorm=True), "prenorm=True .*; pool='mean' .*; pooler=False"),
        (dict(num_tokens=None, num_token_types=None, input_dim=5), "input_dim=5 .*BERT reads token ids"),
        (dict(num_classes=1), "num_classes=1 .*transformers reads one label as a regression"),
    ]:
        with pytest.raises(ValueError, match="a CTransformer does not map onto a Hugging Face family unless BERT's "
                                             "classifier \\(BertForSequenceClassification\\) expresses it, and this "
                                             f"one has: .*{message}"):
            to_huggingface(bert_classifier_like(**changes), tmp_path / "x")
    assert not (tmp_path / "x").exists()

    class Variant(CTransformer):
        pass

    with pytest.raises(ValueError, match="a Variant is a variant of CTransformer, which BERT cannot express"):
        to_huggingface(Variant(config=bert_classifier_like().config), tmp_path / "x")


def random_classifier(transformers, seed=0, **changes):
    """A tiny random BertForSequenceClassification, biases and LayerNorm gains random too, as random_bert."""
    config = transformers.BertConfig(**{
        "hidden_size": E, "num_hidden_layers": DEPTH, "num_attention_heads": H, "intermediate_size": INNER,
        "max_position_embeddings": POSITIONS, "vocab_size": VOCAB, "type_vocab_size": TYPES, "initializer_range": 0.3,
        "num_labels": CLASSES, **changes})
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def classifier_gaps(model, hf, x, token_types, mask):
    """The largest difference between the model's log-probabilities and log_softmax of transformers' logits: without
    token types, with them, and on a right-padded batch."""
    def theirs(types=None, padding=None):
        out = hf(x, token_type_ids=types, attention_mask=None if padding is None else padding.long())
        return torch.log_softmax(out.logits.float(), dim=-1)

    with torch.no_grad():
        return ((model(x) - theirs()).abs().max().item(),
                (model(x, token_types=token_types) - theirs(token_types)).abs().max().item(),
                (model(x, mask, token_types=token_types) - theirs(token_types, mask)).abs().max().item())


@pytest.mark.parametrize("changes", [{}, dict(intermediate_size=48, layer_norm_eps=1e-5, classifier_dropout=0.1)],
                         ids=["bert", "ff-hidden-eps1e-5"])
def test_classifier_log_probabilities_equal_transformers(tmp_path, transformers, changes):
    hf = random_classifier(transformers, **changes)
    hf.save_pretrained(tmp_path / "cls")
    model = from_huggingface(tmp_path / "cls")
    assert type(model) is CTransformer and model.config.num_classes == CLASSES
    x, token_types, mask = inputs()
    assert max(classifier_gaps(model, hf, x, token_types, mask)) < TOLERANCE


def test_the_pooler_matters(tmp_path, transformers):
    """Without the pooler (the linear layer on the [CLS] vector itself) the same weights give other
    log-probabilities, by far more than the tolerance: the test above can see it."""
    hf = random_classifier(transformers)
    hf.save_pretrained(tmp_path / "cls")
    model = from_huggingface(tmp_path / "cls")
    plain = CTransformer(config=model.config.replace(pooler=False)).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.pooler.")}
    plain.load_state_dict(state)
    x, token_types, mask = inputs()
    assert max(classifier_gaps(plain, hf, x, token_types, mask)) > 10 * TOLERANCE


@pytest.mark.parametrize("changes", [{}, dict(qkv_bias=False, num_token_types=None, dropout=0.1, ff_hidden=48,
                                              num_classes=2)], ids=["bert", "no-qkv-bias-no-types-ff-hidden"])
def test_an_exported_classifier_loads_into_transformers_with_equal_outputs(tmp_path, transformers, changes):
    model = bert_classifier_like(**changes)
    folder = to_huggingface(model, tmp_path / "export")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.num_labels == model.config.num_classes
    assert hf.config.problem_type == "single_label_classification"  # cross-entropy, as nll_loss of ours
    x, token_types, mask = inputs()
    if model.config.num_token_types is None:
        token_types = None
    assert max(classifier_gaps(model, hf, x, token_types, mask)) < TOLERANCE


def test_fine_tuning_a_loaded_masked_lm(tmp_path, transformers):
    """A BertForMaskedLM folder -> from_huggingface -> CTransformer.from_encoder: at step 0 its encoder computes
    BertModel's last hidden state; a few optimizer steps on a separable task (the class is the token at position 1)
    lower the loss."""
    hf = random_bert(transformers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf.save_pretrained(tmp_path / "bert")
    bert = from_huggingface(tmp_path / "bert")
    torch.manual_seed(0)
    classifier = CTransformer.from_encoder(bert, 2, pool="first", pooler=True)
    x, token_types, mask = inputs()
    with torch.no_grad():
        ours = classifier.encoder(classifier.embedding(x, token_types=token_types), mask)
        theirs = hf.bert(x, token_type_ids=token_types, attention_mask=mask.long()).last_hidden_state
    assert (ours - theirs)[mask].abs().max().item() < TOLERANCE
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (32, 8), generator=g)
    labels = (x[:, 1] < VOCAB // 2).long()  # separable: one token decides
    optimizer = torch.optim.Adam(classifier.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = F.nll_loss(classifier(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses  # measured: 0.75 -> 0.089 after 30 steps
