"""T5 and flan-T5 in and out of the Hugging Face layout (torchformer.pretrained.t5): equal outputs.

* without ``transformers``: a hand-written T5 folder (and a flan-T5 one) loads into a Seq2SeqTransformer whose
  log-probabilities equal T5's forward pass written out here with plain tensor operations (RMSNorm, unscaled
  scores, T5's buckets of ``key - query``, one table per stack, the feed-forward networks, the scaled tied output);
  an exported model loads back into the same model; the refusals name the field or tensor;
* with ``transformers`` (skipped without it): tiny random ``T5ForConditionalGeneration`` models in T5 v1.0's shape
  (ReLU, output tied to the shared table and scaled by ``d_model ** -0.5``) and flan-T5's (gated tanh-GELU, an
  output layer of its own), with heads of ``d_kv`` other than ``d_model / num_heads`` and a decoder deeper than the
  encoder, load with log-probabilities equal within 1e-4 in float32 for a padded source batch; greedy decoding with
  torchformer's KV cache gives ``generate``'s tokens; each T5 choice matters (leaving it out moves the outputs by
  more than five times the tolerance); an exported folder loads into ``AutoModelForSeq2SeqLM`` with equal outputs.

Nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from torchformer import CTransformer, Seq2SeqTransformer, from_huggingface, seq2seq_generate, to_huggingface
from torchformer.nn.feedforward import GATES, NONLINEARITIES
from torchformer.pretrained import t5

safetensors_torch = pytest.importorskip("safetensors.torch")

# Heads of S = 6 dimensions at width 32 with 4 heads (not 32 / 4: t5-3b's d_kv); 8 buckets up to distance 12, so
# that sources of 20 and targets of 16 tokens reach the logarithmic buckets and the shared last one.
E, H, S, DEPTH, DECODER_DEPTH, VOCAB, FF, BUCKETS, MAX_DISTANCE = 32, 4, 6, 2, 3, 50, 40, 8, 12
SOURCE, TARGET = 20, 16


def hand_config(**changes):
    return {"model_type": "t5", "d_model": E, "num_heads": H, "d_kv": S, "num_layers": DEPTH,
            "num_decoder_layers": DECODER_DEPTH, "vocab_size": VOCAB, "d_ff": FF,
            "relative_attention_num_buckets": BUCKETS, "relative_attention_max_distance": MAX_DISTANCE,
            "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", **changes}


def hand_tensors(config, seed=0):
    """Every tensor of a T5 of ``config`` under T5's names, random (norms around 1, relative tables of size 1)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    gated = config["feed_forward_proj"].startswith("gated")
    tensors = {"shared.weight": r(VOCAB, E, scale=1.0), "encoder.final_layer_norm.weight": 1 + r(E),
               "decoder.final_layer_norm.weight": 1 + r(E)}
    if not config.get("tie_word_embeddings", True):
        tensors["lm_head.weight"] = r(VOCAB, E)
    for stack, depth, ff in (("encoder", DEPTH, "layer.1"), ("decoder", DECODER_DEPTH, "layer.2")):
        tensors[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = r(BUCKETS, H, scale=1.0)
        for i in range(depth):
            p = f"{stack}.block.{i}."
            attentions = ["layer.0.SelfAttention."] + (["layer.1.EncDecAttention."] if stack == "decoder" else [])
            for a in attentions:
                tensors.update({p + a + "q.weight": r(H * S, E), p + a + "k.weight": r(H * S, E),
                                p + a + "v.weight": r(H * S, E), p + a + "o.weight": r(E, H * S)})
            norms = ["layer.0", "layer.1"] + (["layer.2"] if stack == "decoder" else [])
            tensors.update({f"{p}{n}.layer_norm.weight": 1 + r(E) for n in norms})
            inputs = ["wi_0", "wi_1"] if gated else ["wi"]
            tensors.update({f"{p}{ff}.DenseReluDense.{w}.weight": r(FF, E) for w in inputs})
            tensors[f"{p}{ff}.DenseReluDense.wo.weight"] = r(E, FF)
    return tensors


def write(folder, config, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def t5_bucket(relative, *, bidirectional, num_buckets, max_distance):
    """T5's bucket of ``relative = key position - query position`` (Mesh TensorFlow's rule, in its own terms)."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets  # keys after the query: the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # keys after the query never count: bucket 0
    exact = num_buckets // 2
    far = exact + (torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
                   * (num_buckets - exact)).long()
    return bucket + torch.where(distance < exact, distance, far.clamp(max=num_buckets - 1))


def reference_log_probs(t, config, src, tgt, src_mask):
    """T5's log-probabilities written out from its tensors ``t`` and ``config.json``, nothing of torchformer's."""
    eps, b = config["layer_norm_epsilon"], src.size(0)
    gated = config["feed_forward_proj"].startswith("gated")

    def rms(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def heads(x):  # (b, t, h s) -> (b, h, t, s)
        return x.view(b, x.size(1), H, S).transpose(1, 2)

    def attention(x, y, p, bias, allowed):  # no 1/sqrt(s): T5 trained its weights without it
        q, k, v = heads(x @ t[p + "q.weight"].T), heads(y @ t[p + "k.weight"].T), heads(y @ t[p + "v.weight"].T)
        scores = (q @ k.transpose(-1, -2) + bias).masked_fill(~allowed, float("-inf"))
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, x.size(1), H * S) @ t[p + "o.weight"].T

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    def feed_forward(x, p):
        if gated:
            return (gelu_tanh(x @ t[p + "wi_0.weight"].T) * (x @ t[p + "wi_1.weight"].T)) @ t[p + "wo.weight"].T
        return F.relu(x @ t[p + "wi.weight"].T) @ t[p + "wo.weight"].T

    def position_bias(stack, length, bidirectional):  # (h, t, t), from the stack's one table
        relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
        bucket = t5_bucket(relative, bidirectional=bidirectional, num_buckets=BUCKETS, max_distance=MAX_DISTANCE)
        return t[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"][bucket].permute(2, 0, 1)

    x, bias, sees = t["shared.weight"][src], position_bias("encoder", src.size(1), True), src_mask[:, None, None, :]
    for i in range(DEPTH):
        p = f"encoder.block.{i}."
        x = x + attention(rms(x, t[p + "layer.0.layer_norm.weight"]), rms(x, t[p + "layer.0.layer_norm.weight"]),
                          p + "layer.0.SelfAttention.", bias, sees)
        x = x + feed_forward(rms(x, t[p + "layer.1.layer_norm.weight"]), p + "layer.1.DenseReluDense.")
    memory = rms(x, t["encoder.final_layer_norm.weight"])
    y, bias = t["shared.weight"][tgt], position_bias("decoder", tgt.size(1), False)
    causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril()
    for i in range(DECODER_DEPTH):
        p = f"decoder.block.{i}."
        n = rms(y, t[p + "layer.0.layer_norm.weight"])
        y = y + attention(n, n, p + "layer.0.SelfAttention.", bias, causal)
        y = y + attention(rms(y, t[p + "layer.1.layer_norm.weight"]), memory, p + "layer.1.EncDecAttention.", 0.0,
                          sees)
        y = y + feed_forward(rms(y, t[p + "layer.2.layer_norm.weight"]), p + "layer.2.DenseReluDense.")
    y = rms(y, t["decoder.final_layer_norm.weight"])
    if config.get("tie_word_embeddings", True):  # T5 v1.0: the shared table, after the factor d_model ** -0.5
        return F.log_softmax((y * E**-0.5) @ t["shared.weight"].T, dim=-1)
    return F.log_softmax(y @ t["lm_head.weight"].T, dim=-1)  # flan-T5: an output layer of its own, no factor


def batch(seed=2):
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(0, VOCAB, (3, SOURCE), generator=g), torch.randint(0, VOCAB, (3, TARGET), generator=g)
    src_mask = torch.arange(SOURCE)[None, :] < torch.tensor([SOURCE, 12, 3])[:, None]  # (3, u): right-padded
    return src, tgt, src_mask


# ------------------------------------------------------------------------------- without transformers


@pytest.mark.parametrize("changes", [{}, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}],
                         ids=["t5", "flan-t5"])
def test_a_hand_written_t5_folder_equals_t5_written_out(tmp_path, changes):
    config = hand_config(**changes)
    tensors = hand_tensors(config)
    # Second copies of the shared table, and the cross-attention table older files hold: read, checked, skipped.
    stored = {**tensors, "encoder.embed_tokens.weight": tensors["shared.weight"].clone(),
              "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": torch.ones(BUCKETS, H)}
    # In float64, so that the two orders of the same arithmetic agree to far below any missing part's effect (in
    # float32 these large random weights leave them up to 7e-5 apart).
    model = from_huggingface(write(tmp_path / "t5", config, stored), dtype=torch.float64)
    assert isinstance(model, Seq2SeqTransformer) and model.config.head_size == S
    src, tgt, src_mask = batch()
    with torch.no_grad():
        got = model(src, tgt, src_mask)
    want = reference_log_probs({k: v.double() for k, v in tensors.items()}, config, src, tgt, src_mask)
    assert (got - want).abs().max().item() < 1e-10


def test_t5s_tables_are_shared_once_per_stack(tmp_path):
    model = from_huggingface(write(tmp_path / "t5", hand_config(), hand_tensors(hand_config())))
    encoder = {id(block.attention.relative) for block in model.encoder.blocks}
    decoder = {id(block.attention.relative) for block in model.decoder.blocks}
    assert len(encoder) == len(decoder) == 1 and encoder != decoder
    assert model.tgt_embedding.tokens.weight is model.src_embedding.tokens.weight is model.head.toprobs.weight
    names = [name for name, _ in model.named_parameters()]
    assert sum("relative" in name for name in names) == 2 and not any(name.endswith("bias") for name in names)


def test_a_t5_model_exports_and_loads_back_without_transformers(tmp_path):
    for changes in ({}, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}):
        config = hand_config(**changes)
        model = from_huggingface(write(tmp_path / "in", config, hand_tensors(config)))
        folder = to_huggingface(model, tmp_path / "out")
        written = json.loads((folder / "config.json").read_text())
        assert written["d_kv"] == S and written["num_decoder_layers"] == DECODER_DEPTH
        assert written["feed_forward_proj"] == config["feed_forward_proj"]
        back = from_huggingface(folder)
        assert back.config == model.config
        src, tgt, src_mask = batch()
        with torch.no_grad():
            torch.testing.assert_close(back(src, tgt, src_mask), model(src, tgt, src_mask), atol=0, rtol=0)


@pytest.mark.parametrize("changes, message", [
    ({"feed_forward_proj": "gated-relu"}, "feed_forward_proj='gated-relu' is not supported"),
    ({"is_encoder_decoder": False}, "is_encoder_decoder=False is not supported"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes' is not supported"),
    ({"relative_attention_max_distance": 2}, "relative_max_distance must be an int >= 5"),
    ({"d_kv": 0}, "do not make a model"),
])
def test_a_config_value_torchformer_cannot_express_is_named(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        from_huggingface(write(tmp_path / "x", hand_config(**changes), hand_tensors(hand_config())))


def test_tensors_that_do_not_fit_the_config_are_named(tmp_path):
    tensors = hand_tensors(hand_config())
    missing = {k: v for k, v in tensors.items() if k != "decoder.block.2.layer.1.EncDecAttention.v.weight"}
    with pytest.raises(ValueError, match="holds no decoder.block.2.layer.1.EncDecAttention.v.weight"):
        from_huggingface(write(tmp_path / "a", hand_config(), missing))
    with pytest.raises(ValueError, match=r"SelfAttention.q.weight has shape \(24, 32\), but config.json makes it "
                                         r"\(32, 32\)"):
        from_huggingface(write(tmp_path / "b", hand_config(d_kv=8), tensors))
    other = {**tensors, "decoder.embed_tokens.weight": torch.zeros(VOCAB, E)}
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight differs from shared.weight"):
        from_huggingface(write(tmp_path / "c", hand_config(), other))
    with pytest.raises(ValueError, match=r"holds no lm_head.weight, .* \(tie_word_embeddings is false\)"):
        from_huggingface(write(tmp_path / "d", hand_config(tie_word_embeddings=False), tensors))
    with pytest.raises(ValueError, match="does not have .*DenseReluDense.wi_0.weight"):
        from_huggingface(write(tmp_path / "e", hand_config(), {**tensors, **hand_tensors(
            hand_config(feed_forward_proj="gated-gelu"))}))


def test_a_model_t5_cannot_express_is_refused_by_name(tmp_path):
    plain = Seq2SeqTransformer(E, H, DEPTH, SOURCE, VOCAB, VOCAB)  # torchformer's defaults: nothing of T5's
    with pytest.raises(ValueError, match="does not map onto T5: positions='learned' .*relative_shared=False .*"
                                         "attention_scale=None .*prenorm=False .*norm='layer' .*ff_bias=True .*"
                                         "out_bias=True .*head_bias=True .*share_embeddings=False"):
        to_huggingface(plain, tmp_path / "x")
    t5_like = dict(positions="relative", relative_shared=True, attention_scale=1.0, prenorm=True, norm="rms",
                   ff_bias=False, out_bias=False, head_bias=False, share_embeddings=True)
    with pytest.raises(ValueError, match="does not map onto T5: activation='geglu'"):
        to_huggingface(Seq2SeqTransformer(E, H, DEPTH, SOURCE, VOCAB, VOCAB, **t5_like, activation="geglu"),
                       tmp_path / "x")
    with pytest.raises(ValueError, match="does not map onto T5: kv_heads=2"):
        to_huggingface(Seq2SeqTransformer(E, H, DEPTH, SOURCE, VOCAB, VOCAB, **t5_like, kv_heads=2), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written
    with pytest.raises(ValueError, match="a CTransformer does not map onto a Hugging Face family unless BERT's "
                                         "classifier"):
        to_huggingface(CTransformer(E, H, 1, SOURCE, VOCAB, 2), tmp_path / "x")


# ---------------------------------------------------------------------------------- with transformers


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


KINDS = {
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),  # T5 v1.0: tied and scaled
    "flan-t5": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),  # v1.1, flan: untied, unscaled
}


def random_model(transformers, kind, seed=0, decoder_depth=DECODER_DEPTH):
    """A tiny random T5 of ``kind``; the norms' gains and the relative tables random too (they start at 1 and
    small), and flan-T5's output layer a matrix of its own. The shared table has entries of standard deviation 0.02
    (GPT-2's and BERT's initialisation; T5's is 1): the norms then see vectors of mean square 4e-4, where eps 1e-5
    instead of 1e-6 shows."""
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=E, d_kv=S, d_ff=FF, num_layers=DEPTH, num_decoder_layers=decoder_depth,
        num_heads=H, relative_attention_num_buckets=BUCKETS, relative_attention_max_distance=MAX_DISTANCE,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **KINDS[kind])
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif "relative_attention_bias" in name:
                p.normal_()
        model.shared.weight.mul_(0.02)
        if not KINDS[kind]["tie_word_embeddings"]:  # transformers 5 ties every T5 on building it: untie here
            model.lm_head.weight = torch.nn.Parameter(0.3 * torch.randn(VOCAB, E))
    return model


def hf_log_probs(hf, src, tgt, src_mask):
    with torch.no_grad():
        logits = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
    return torch.log_softmax(logits.float(), dim=-1)


def gap(model, hf, seed=2):
    src, tgt, src_mask = batch(seed)
    with torch.no_grad():
        return (model(src, tgt, src_mask) - hf_log_probs(hf, src, tgt, src_mask)).abs().max().item()


@pytest.mark.parametrize("kind", list(KINDS))
def test_log_probabilities_equal_transformers(tmp_path, transformers, kind):
    hf = random_model(transformers, kind)
    hf.save_pretrained(tmp_path / kind)
    model = from_huggingface(tmp_path / kind)
    assert model.config.tie_weights == model.config.head_scale == KINDS[kind]["tie_word_embeddings"]
    assert gap(model, hf) < 1e-4


# Each choice T5 needs, left out: the loaded model's config changed, the same weights. relative_shared=False is a
# loader that gives the table to the first layer only (where T5 stores it), the other layers a table of zeros.
LEFT_OUT = {
    "attention_scale": dict(attention_scale=None),
    "relative_shared": dict(relative_shared=False),
    "relative_max_distance": dict(relative_max_distance=24),
    "norm_eps": dict(norm_eps=1e-5),
    "head_scale": {"t5": dict(head_scale=False), "flan-t5": dict(head_scale=True)},
    "activation": {"t5": dict(activation="gelu"), "flan-t5": dict(activation="geglu")},
}


def without(model, kind, field):
    """``model`` with ``field``'s T5 value left out (:data:`LEFT_OUT`), its weights kept."""
    changes = LEFT_OUT[field].get(kind, LEFT_OUT[field]) if field in ("head_scale", "activation") else LEFT_OUT[field]
    other = Seq2SeqTransformer(config=model.config.replace(**changes)).eval()
    other.load_state_dict(model.state_dict())
    if field == "relative_shared":
        with torch.no_grad():
            for block in [*other.encoder.blocks[1:], *other.decoder.blocks[1:]]:
                block.attention.relative.table.weight.zero_()
    return other


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_t5_choice_matters(tmp_path, transformers, kind):
    """Without each choice the same weights give other log-probabilities, so the test above can see it."""
    hf = random_model(transformers, kind)
    hf.save_pretrained(tmp_path / kind)
    model = from_huggingface(tmp_path / kind)
    for field in LEFT_OUT:
        assert gap(without(model, kind, field), hf) > 5e-4, field  # five times the tolerance


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_decoding_equals_transformers_generate(tmp_path, transformers, kind):
    # Encoder and decoder of one depth: transformers 5.24's generate builds its cache for num_layers blocks and
    # fails on a deeper decoder (the log-probabilities above cover that shape).
    hf = random_model(transformers, kind, seed=1, decoder_depth=DEPTH)
    hf.save_pretrained(tmp_path / kind)
    model = from_huggingface(tmp_path / kind)
    src, _, src_mask = batch(4)
    ours = seq2seq_generate(model, src, TARGET, bos=0, eos=1, src_mask=src_mask)  # torchformer's KV cache
    with torch.no_grad():
        theirs = hf.generate(src, attention_mask=src_mask.long(), max_new_tokens=TARGET, do_sample=False,
                             num_beams=1, pad_token_id=1)  # after eos, eos again, as seq2seq_generate pads
    assert torch.equal(theirs[:, 0], torch.zeros(3, dtype=torch.long))  # decoder_start_token_id
    assert torch.equal(ours, theirs[:, 1:])


@pytest.mark.parametrize("options", [
    dict(activation="relu", tie_weights=True, head_scale=True),  # T5 v1.0
    dict(activation="geglu_tanh", tie_weights=False, head_scale=False),  # flan-T5
    dict(activation="swiglu", tie_weights=True, head_scale=False),  # what a T5 config can say besides
], ids=["t5", "flan-t5", "swiglu-tied-unscaled"])
def test_an_exported_model_loads_into_transformers_with_equal_outputs(tmp_path, transformers, options):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(E, H, DEPTH, SOURCE, VOCAB, VOCAB, decoder_depth=DECODER_DEPTH, head_dim=S,
                               ff_hidden=FF, positions="relative", relative_shared=True, relative_buckets=BUCKETS,
                               relative_max_distance=MAX_DISTANCE, attention_scale=1.0, prenorm=True, norm="rms",
                               norm_eps=1e-6, ff_bias=False, out_bias=False, head_bias=False, share_embeddings=True,
                               **options).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1, tables away from 0, every weight moved
            p.add_(0.3 * torch.randn_like(p))
    folder = to_huggingface(model, tmp_path / "export")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert (hf.lm_head.weight is hf.shared.weight) == options["tie_weights"]
    assert gap(model, hf) < 1e-4


def test_the_feed_forward_choices_are_transformers_activations(transformers):
    """Each feed_forward_proj torchformer reads computes the activation transformers builds for it."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 1001)
    for proj, activation in t5.ACTIVATIONS.items():
        config = transformers.T5Config(feed_forward_proj=proj)
        assert config.is_gated_act == (activation in t5.GATED), proj
        ours = GATES[activation]() if activation in GATES else NONLINEARITIES[activation]()
        torch.testing.assert_close(ours(x), ACT2FN[config.dense_act_fn](x), atol=1e-6, rtol=0, msg=proj)
    assert set(t5.EXPORTED_ACTIVATIONS.values()) <= set(t5.ACTIVATIONS)
    assert all(t5.ACTIVATIONS[proj] == activation for activation, proj in t5.EXPORTED_ACTIVATIONS.items())
