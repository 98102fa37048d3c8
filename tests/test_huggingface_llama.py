"""Llama, Mistral and Qwen2 in and out of the Hugging Face layout (torchformer.pretrained.llama): equal outputs.

* without ``transformers``: a hand-written Llama folder loads into the GTransformer whose parameters were set to the
  same tensors by hand, and the rotary frequencies with Llama-3.1's scaling equal the formula written out here;
* with ``transformers`` (skipped without it): tiny random ``LlamaForCausalLM``, ``MistralForCausalLM`` and
  ``Qwen2ForCausalLM`` models (grouped-query attention, a feed-forward size that is no multiple of the width, RMSNorm
  eps ``1e-6``, rope bases and Llama-3.1's scaling, biases, a sliding window) load with log-probabilities equal
  within 1e-4 in float32, greedy decoding with torchformer's KV cache gives ``generate``'s tokens, each choice
  matters (leaving it out moves the outputs by more than the tolerance), and an exported folder loads back into
  ``transformers`` with equal outputs.

Nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import torchformer
from torchformer import GTransformer, from_huggingface, to_huggingface
from torchformer.nn.relative import Rotary

safetensors_torch = pytest.importorskip("safetensors.torch")

E, H, G, DEPTH, POSITIONS, VOCAB, FF = 32, 4, 2, 2, 24, 50, 56  # FF: no multiple of E, as Llama's 11008 of 4096


def hand_config(**changes):
    return {"model_type": "llama", "hidden_size": E, "num_attention_heads": H, "num_key_value_heads": G,
            "num_hidden_layers": DEPTH, "max_position_embeddings": POSITIONS, "vocab_size": VOCAB,
            "intermediate_size": FF, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, **changes}


def hand_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    s = E // H
    tensors = {"model.embed_tokens.weight": r(VOCAB, E), "model.norm.weight": 1 + r(E), "lm_head.weight": r(VOCAB, E)}
    for i in range(DEPTH):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": 1 + r(E), p + "post_attention_layernorm.weight": 1 + r(E),
            p + "self_attn.q_proj.weight": r(H * s, E), p + "self_attn.k_proj.weight": r(G * s, E),
            p + "self_attn.v_proj.weight": r(G * s, E), p + "self_attn.o_proj.weight": r(E, H * s),
            p + "mlp.gate_proj.weight": r(FF, E), p + "mlp.up_proj.weight": r(FF, E), p + "mlp.down_proj.weight": r(E, FF),
        })
    return tensors


def write(folder, config, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# ------------------------------------------------------------------------------- without transformers


def test_a_hand_written_llama_folder_loads_into_the_model_set_by_hand(tmp_path):
    tensors = hand_tensors()
    model = from_huggingface(write(tmp_path / "llama", hand_config(), tensors))
    torch.manual_seed(1)
    expected = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, norm="rms", norm_eps=1e-6,
                            activation="swiglu", ff_hidden=FF, positions="rotary", rotary_base=500000.0, kv_heads=G,
                            out_bias=False, head_bias=False).eval()
    assert model.config == expected.config
    with torch.no_grad():
        expected.embedding.tokens.weight.copy_(tensors["model.embed_tokens.weight"])
        expected.blocks.norm.weight.copy_(tensors["model.norm.weight"])
        expected.head.toprobs.weight.copy_(tensors["lm_head.weight"])
        for i, block in enumerate(expected.blocks.blocks):
            t = {k.removeprefix(f"model.layers.{i}."): v for k, v in tensors.items() if f"layers.{i}." in k}
            block.norm1.weight.copy_(t["input_layernorm.weight"])
            block.norm2.weight.copy_(t["post_attention_layernorm.weight"])
            block.attention.toqueries.weight.copy_(t["self_attn.q_proj.weight"])  # as stored: the same rotary layout
            block.attention.tokeys.weight.copy_(t["self_attn.k_proj.weight"])
            block.attention.tovalues.weight.copy_(t["self_attn.v_proj.weight"])
            block.attention.unifyheads.weight.copy_(t["self_attn.o_proj.weight"])
            block.ff.w1.weight.copy_(t["mlp.gate_proj.weight"])
            block.ff.v.weight.copy_(t["mlp.up_proj.weight"])
            block.ff.w2.weight.copy_(t["mlp.down_proj.weight"])
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected(x), atol=0, rtol=0)


def test_llama3_scaling_slows_the_slow_pairs_keeps_the_fast_ones_and_blends_between():
    """Against the rule written out with Python floats: wavelength w = 2 pi / theta against L / high and L / low."""
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    s, base = 32, 10000.0
    got = Rotary(s, base=base, scaling=scaling).frequencies(torch.device("cpu")).tolist()
    kinds = set()
    for m, value in enumerate(got):
        theta = base ** (-2 * m / s)
        w, length = 2 * math.pi / theta, 64
        if w < length / 4.0:
            want, kind = theta, "kept"
        elif w > length / 1.0:
            want, kind = theta / 8.0, "slowed"
        else:
            blend = (length / w - 1.0) / (4.0 - 1.0)
            want, kind = (1 - blend) * theta / 8.0 + blend * theta, "blended"
        kinds.add(kind)
        assert value == pytest.approx(want, rel=1e-12)
    assert kinds == {"kept", "slowed", "blended"}  # the test sees all three regimes


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling=.* its type is 'yarn'"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=True is not supported"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types=.* is not supported"),
])
def test_a_config_value_torchformer_cannot_express_is_named(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        from_huggingface(write(tmp_path / "x", hand_config(**changes), hand_tensors()))


def test_a_legacy_rope_scaling_of_an_unsupported_type_is_refused_naming_the_field_the_file_has(tmp_path):
    # transformers before 4.45 wrote the kind as "type": read as "rope_type", refused under the file's own name.
    for scaling in ({"type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}):
        with pytest.raises(ValueError, match=r"config.json: rope_scaling=\{.*\} is not supported: its type is "
                                             rf"'{scaling.get('type', scaling.get('rope_type'))}'"):
            from_huggingface(write(tmp_path / "x", hand_config(rope_scaling=scaling), hand_tensors()))
    # An empty rope_parameters beside it is not the field read; a scaling without a type, or not an object, is refused.
    with pytest.raises(ValueError, match="rope_scaling=.* its type is 'linear'"):
        from_huggingface(write(tmp_path / "x", hand_config(rope_parameters={}, rope_scaling={"type": "linear"}),
                               hand_tensors()))
    for scaling, why in (({"factor": 2.0}, "it has no type"), ("linear", "expected a JSON object")):
        with pytest.raises(ValueError, match=f"rope_scaling={scaling!r} is not supported: {why}".replace("{", r"\{")):
            from_huggingface(write(tmp_path / "x", hand_config(rope_scaling=scaling), hand_tensors()))


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("fields", [
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}},  # transformers 5
    {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},  # transformers 4.45 ..
    {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", **LLAMA3}},  # before 4.45
])
def test_every_spelling_of_llama3_scaling_loads_the_same_scaled_model(tmp_path, fields):
    config = {k: v for k, v in hand_config(**fields).items() if k != "rope_theta" or "rope_theta" in fields}
    model = from_huggingface(write(tmp_path / "x", config, hand_tensors()))
    assert (model.config.rotary_base, model.config.rotary_scaling) == (5e5, LLAMA3)


def bare(tensors):
    """The tensors as a bare LlamaModel stores them: no "model." prefix, no output layer."""
    return {k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"}


def test_a_bare_llama_model_folder_loads_its_tied_model_and_an_untied_one_is_refused_by_name(tmp_path):
    tensors = hand_tensors()
    full = from_huggingface(write(tmp_path / "full", hand_config(tie_word_embeddings=True),
                                  {k: v for k, v in tensors.items() if k != "lm_head.weight"}))
    loaded = from_huggingface(write(tmp_path / "bare", hand_config(tie_word_embeddings=True), bare(tensors)))
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), full(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="holds no lm_head.weight, .*a bare LlamaModel's folder.*"
                                         "tie_word_embeddings=false"):
        from_huggingface(write(tmp_path / "untied", hand_config(), bare(tensors)))
    with pytest.raises(ValueError, match="holds no layers.1.mlp.up_proj.weight"):  # named as this folder names them
        from_huggingface(write(tmp_path / "short", hand_config(tie_word_embeddings=True),
                               {k: v for k, v in bare(tensors).items() if k != "layers.1.mlp.up_proj.weight"}))


def test_tensors_that_do_not_fit_the_config_are_named(tmp_path):
    tensors = hand_tensors()
    with pytest.raises(ValueError, match="holds no model.layers.1.mlp.up_proj.weight"):
        from_huggingface(write(tmp_path / "a", hand_config(),
                               {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}))
    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(16, 32\), but config.json makes it \(32, 32\)"):
        from_huggingface(write(tmp_path / "b", hand_config(num_key_value_heads=4), tensors))
    # A bias the config does not name (Qwen2's, in a Llama folder without attention_bias): left over, named.
    biased = {**tensors, "model.layers.0.self_attn.q_proj.bias": torch.zeros(E)}
    with pytest.raises(ValueError, match="tensors this config.json's model does not have .*q_proj.bias"):
        from_huggingface(write(tmp_path / "c", hand_config(), biased))


def test_a_llama_model_exports_and_loads_back_without_transformers(tmp_path):
    torch.manual_seed(0)
    model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, norm="rms", activation="swiglu",
                         positions="rotary", ff_hidden=FF, kv_heads=G, out_bias=False, head_bias=False,
                         tie_weights=True).eval()
    folder = to_huggingface(model, tmp_path / "out")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "llama" and written["intermediate_size"] == FF and written["num_key_value_heads"] == G
    back = from_huggingface(folder)
    assert back.config == model.config
    x = torch.randint(0, VOCAB, (2, POSITIONS))
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=0, rtol=0)
    for changes, message in [(dict(out_bias=True), "out_bias=True .*needs the query, key and value biases"),
                             (dict(kqnorm=True), "kqnorm=True"),
                             (dict(activation="geglu"), "activation='geglu'")]:
        other = GTransformer(config=model.config.replace(**changes))
        with pytest.raises(ValueError, match=f"does not map onto Llama: .*{message}"):
            to_huggingface(other, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


# ---------------------------------------------------------------------------------- with transformers


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


FAMILIES = {
    # Llama-3-like: a large rope base, untied; and Llama-3.1's scaling with a short original context, so that the
    # scaling changes the frequencies this test's positions use.
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters={"rope_type": "default", "rope_theta": 5e5})),
    "llama-3.1": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8})),
    "llama-bias-tied": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=True,
                                                                rms_norm_eps=1e-5)),  # Llama-3's eps, base 10000
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5)),
    "llama-head-dim": ("LlamaConfig", "LlamaForCausalLM", dict(head_dim=16)),  # heads of 16, not 32 / 4
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
}


def random_model(transformers, family, seed=0):
    """A tiny random model of ``family``, its norms' gains and biases random too (they start at 1 and 0)."""
    config_class, model_class, changes = FAMILIES[family]
    config = getattr(transformers, config_class)(
        hidden_size=E, intermediate_size=FF, num_hidden_layers=DEPTH, num_attention_heads=H, num_key_value_heads=G,
        vocab_size=VOCAB, max_position_embeddings=POSITIONS, initializer_range=0.3, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, **{"rms_norm_eps": 1e-6, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_log_probs(hf, x, mask=None):
    with torch.no_grad():
        return torch.log_softmax(hf(x, attention_mask=mask).logits.float(), dim=-1)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_log_probabilities_equal_transformers(tmp_path, transformers, family):
    hf = random_model(transformers, family)
    hf.save_pretrained(tmp_path / family)
    model = from_huggingface(tmp_path / family)
    x = torch.randint(0, VOCAB, (3, POSITIONS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        gap = (model(x) - hf_log_probs(hf, x)).abs().max().item()
    assert gap < 1e-4, gap
    # A right-padded batch: each sequence's real positions as if alone.
    lengths = [POSITIONS, 9, 1]
    mask = torch.tensor([[1] * n + [0] * (POSITIONS - n) for n in lengths])
    theirs = hf_log_probs(hf, x, mask)
    with torch.no_grad():
        for row, n in enumerate(lengths):
            assert (model(x[row : row + 1, :n])[0] - theirs[row, :n]).abs().max().item() < 1e-4


def test_each_llama_choice_matters(tmp_path, transformers):
    """Without each choice the same weights give other log-probabilities, so the test above can see it."""
    hf = random_model(transformers, "llama-3.1")
    hf.save_pretrained(tmp_path / "llama")
    model = from_huggingface(tmp_path / "llama")
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(5))
    reference = hf_log_probs(hf, x)
    config = model.config
    for changes in (dict(positions="rotary_interleaved"), dict(rotary_base=10000.0), dict(rotary_scaling=None),
                    dict(norm_eps=1e-5)):
        other = GTransformer(config=config.replace(**changes)).eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert (other(x) - reference).abs().max() > 5e-4, changes  # five times the tolerance


def test_a_bare_llama_model_of_transformers_gives_its_hidden_states_through_the_tied_embedding(tmp_path,
                                                                                                transformers):
    hf = random_model(transformers, "qwen2")  # tied
    bare_model = transformers.Qwen2Model(hf.config).eval()
    bare_model.load_state_dict(hf.model.state_dict())
    bare_model.save_pretrained(tmp_path / "bare")
    assert not any(k.startswith("model.") for k in safetensors_torch.load_file(tmp_path / "bare" / "model.safetensors"))
    model = from_huggingface(tmp_path / "bare")
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = bare_model(x).last_hidden_state
        expected = torch.log_softmax(hidden @ bare_model.embed_tokens.weight.T, dim=-1)
        assert (model(x) - expected).abs().max().item() < 1e-4


def test_a_legacy_llama3_rope_scaling_loads_as_transformers_reads_it(tmp_path, transformers):
    """A config.json of transformers 4.x (rope_theta, and rope_scaling with "type"): scaled, as transformers 5 reads
    it, and not silently unscaled."""
    hf = random_model(transformers, "llama-3.1")
    hf.save_pretrained(tmp_path / "new")
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    rope = config.pop("rope_parameters")
    kind, theta = rope.pop("rope_type"), rope.pop("rope_theta")
    config.update(rope_theta=theta, rope_scaling={**rope, "type": kind})
    (tmp_path / "new" / "config.json").write_text(json.dumps(config))
    model = from_huggingface(tmp_path / "new")
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (model(x) - hf_log_probs(hf, x)).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_greedy_decoding_equals_transformers_generate(tmp_path, transformers, family):
    hf = random_model(transformers, family, seed=1)
    hf.save_pretrained(tmp_path / family)
    model = from_huggingface(tmp_path / family)
    prompt = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(4))
    ours = torchformer.generate(model, prompt, POSITIONS - 4, temperature=0)  # with torchformer's KV cache
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=POSITIONS - 4,
                             do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("options, architecture", [
    (dict(kv_heads=G, tie_weights=False), "LlamaForCausalLM"),
    (dict(qkv_bias=True, out_bias=True, tie_weights=True, rotary_base=5e5,
          rotary_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8}), "LlamaForCausalLM"),
    (dict(window=5, kv_heads=1), "MistralForCausalLM"),
    (dict(qkv_bias=True, out_bias=False, tie_weights=True), "Qwen2ForCausalLM"),  # as a loaded Qwen2 is
], ids=["llama", "llama-bias-scaled", "mistral", "qwen2"])
def test_an_exported_model_loads_into_transformers_with_equal_outputs(tmp_path, transformers, options, architecture):
    torch.manual_seed(0)
    options = {"out_bias": False, **options}
    model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, norm="rms", norm_eps=1e-6, activation="swiglu",
                         positions="rotary", ff_hidden=FF, head_bias=False, **options).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.3 * torch.randn_like(p)) if "norm" in name or name.endswith("bias") else None
    folder = to_huggingface(model, tmp_path / "export")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == architecture
    x = torch.randint(0, VOCAB, (3, POSITIONS))
    with torch.no_grad():
        gap = (model(x) - hf_log_probs(hf, x)).abs().max().item()
    assert gap < 1e-4, gap


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_a_left_padded_batch_generates_as_transformers_does(tmp_path, transformers, family):
    hf = random_model(transformers, family, seed=2)
    hf.save_pretrained(tmp_path / family)
    model = from_huggingface(tmp_path / family)
    g = torch.Generator().manual_seed(6)
    lengths, t = [6, 2, 4], 6
    mask = torch.stack([torch.arange(t) >= t - n for n in lengths])
    ids = torch.randint(1, VOCAB, (3, t), generator=g).masked_fill(~mask, 0)
    ours = torchformer.generate(model, ids, 10, temperature=0, prompt_mask=mask)
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask.long(), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)
