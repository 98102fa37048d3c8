"""GPT-2 in and out of the Hugging Face layout (torchformer.pretrained): equal outputs, named errors.

Two kinds of test:

* without ``transformers``: a folder written by hand (``config.json`` and a safetensors or ``.bin`` file, the tensors
  under GPT-2's names) loads into the GTransformer whose weights were set to the same tensors by hand, with the
  transposes and cuts written out here, not read from the module's map; and every refusal names its field;
* with ``transformers`` (skipped where it is not installed; the ``test`` extra installs it): tiny random
  ``GPT2LMHeadModel``\\ s written with ``save_pretrained`` (one file, shards) or as ``pytorch_model.bin`` load with
  log-probabilities equal within 1e-4 in float32, greedy decoding with torchformer's KV cache gives
  ``generate``'s tokens, and an exported folder loads back into ``transformers`` with equal outputs.

Nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import torchformer
from torchformer import CTransformer, GTransformer, from_huggingface, to_huggingface

safetensors_torch = pytest.importorskip("safetensors.torch")

E, H, DEPTH, POSITIONS, VOCAB = 32, 4, 2, 16, 50


def hf_config(**changes):
    """A tiny GPT-2 config.json, GPT2Config's other fields left out (they mean GPT-2's defaults)."""
    return {"model_type": "gpt2", "n_embd": E, "n_head": H, "n_layer": DEPTH, "n_positions": POSITIONS,
            "vocab_size": VOCAB, **changes}


def gpt2_tensors(seed=0, inner=4 * E, prefix=""):
    """Random tensors under GPT-2's names and in its layout: Conv1D weights (in, out), c_attn q|k|v fused."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    tensors = {"wte.weight": r(VOCAB, E), "wpe.weight": r(POSITIONS, E), "ln_f.weight": 1 + r(E), "ln_f.bias": r(E)}
    for i in range(DEPTH):
        tensors.update({
            f"h.{i}.ln_1.weight": 1 + r(E), f"h.{i}.ln_1.bias": r(E),
            f"h.{i}.attn.c_attn.weight": r(E, 3 * E), f"h.{i}.attn.c_attn.bias": r(3 * E),
            f"h.{i}.attn.c_proj.weight": r(E, E), f"h.{i}.attn.c_proj.bias": r(E),
            f"h.{i}.ln_2.weight": 1 + r(E), f"h.{i}.ln_2.bias": r(E),
            f"h.{i}.mlp.c_fc.weight": r(E, inner), f"h.{i}.mlp.c_fc.bias": r(inner),
            f"h.{i}.mlp.c_proj.weight": r(inner, E), f"h.{i}.mlp.c_proj.bias": r(E),
            # The causal mask that older files store as a buffer: a constant, nothing to load.
            f"h.{i}.attn.bias": torch.ones(1, 1, POSITIONS, POSITIONS).tril(),
        })
    return {prefix + name: tensor for name, tensor in tensors.items()}


def write(folder, config, tensors, layout="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if layout == "safetensors":
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return folder


def by_hand(tensors):
    """The GTransformer with GPT-2's tensors copied in by hand: each Conv1D weight transposed, c_attn cut in 3."""
    torch.manual_seed(1)
    model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, activation="gelu_tanh", tie_weights=True,
                         qkv_bias=True, head_bias=False, dropout=0.1).eval()
    with torch.no_grad():
        model.embedding.tokens.weight.copy_(tensors["wte.weight"])
        model.embedding.positions.embedding.weight.copy_(tensors["wpe.weight"])
        model.blocks.norm.weight.copy_(tensors["ln_f.weight"])
        model.blocks.norm.bias.copy_(tensors["ln_f.bias"])
        for i, block in enumerate(model.blocks.blocks):
            t = {name.removeprefix(f"h.{i}."): v for name, v in tensors.items() if name.startswith(f"h.{i}.")}
            a = block.attention
            w, b = t["attn.c_attn.weight"], t["attn.c_attn.bias"]  # (e, 3e), (3e,)
            a.toqueries.weight.copy_(w[:, :E].T), a.toqueries.bias.copy_(b[:E])
            a.tokeys.weight.copy_(w[:, E:2 * E].T), a.tokeys.bias.copy_(b[E:2 * E])
            a.tovalues.weight.copy_(w[:, 2 * E:].T), a.tovalues.bias.copy_(b[2 * E:])
            a.unifyheads.weight.copy_(t["attn.c_proj.weight"].T), a.unifyheads.bias.copy_(t["attn.c_proj.bias"])
            block.norm1.weight.copy_(t["ln_1.weight"]), block.norm1.bias.copy_(t["ln_1.bias"])
            block.norm2.weight.copy_(t["ln_2.weight"]), block.norm2.bias.copy_(t["ln_2.bias"])
            block.ff.net[0].weight.copy_(t["mlp.c_fc.weight"].T), block.ff.net[0].bias.copy_(t["mlp.c_fc.bias"])
            block.ff.net[3].weight.copy_(t["mlp.c_proj.weight"].T), block.ff.net[3].bias.copy_(t["mlp.c_proj.bias"])
    return model


# ------------------------------------------------------------------------------- without transformers


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_a_hand_written_folder_loads_into_the_model_set_by_hand(tmp_path, layout, prefix):
    tensors = gpt2_tensors(prefix=prefix)
    folder = write(tmp_path / "gpt2", hf_config(), tensors, layout)
    rng = torch.get_rng_state()
    model = from_huggingface(folder)
    assert torch.equal(torch.get_rng_state(), rng)  # built on the meta device: no random initialisation
    assert type(model) is GTransformer and not model.training
    expected = by_hand({name.removeprefix(prefix): t for name, t in tensors.items()})
    assert model.config == expected.config
    assert model.head.toprobs.weight is model.embedding.tokens.weight  # tied, as GPT-2's output layer
    x = torch.randint(0, VOCAB, (3, POSITIONS), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected(x), atol=0, rtol=0)
    assert model.embedding.tokens.weight.dtype == torch.float32


def test_greedy_decoding_with_the_cache_equals_the_full_pass(tmp_path):
    model = from_huggingface(write(tmp_path / "gpt2", hf_config(), gpt2_tensors()))
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    cached = torchformer.generate(model, prompt, 8, temperature=0)
    uncached = torchformer.generate(model, prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_dtype_and_device(tmp_path):
    tensors = gpt2_tensors()
    folder = write(tmp_path / "half", hf_config(), {k: v.to(torch.bfloat16) for k, v in tensors.items()})
    assert {p.dtype for p in from_huggingface(folder).parameters()} == {torch.bfloat16}  # the file's dtype
    model = from_huggingface(folder, dtype=torch.float64, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype.*got torch.int64"):
        from_huggingface(folder, dtype=torch.int64)


def test_the_safetensors_reader_reads_each_dtype_exactly_and_names_a_damaged_file(tmp_path):
    """The reader parses the file itself (header, then each tensor's bytes read into place): against safetensors'."""
    from torchformer.pretrained.folders import WeightReader

    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.randn(2, 2).half(),
               "d": torch.randn(4, 1).double(), "e": torch.zeros(0, 3)}
    folder = write(tmp_path / "all", hf_config(), tensors)
    with WeightReader(folder) as reader:
        assert reader.names() == sorted(tensors)
        for name, expected in tensors.items():
            assert reader.dtype(name) == expected.dtype and reader.shape(name) == tuple(expected.shape)
            assert torch.equal(reader.tensor(name), expected)
            into = torch.empty_like(expected)  # same dtype: read straight into it
            reader.copy_into(name, into)
            assert torch.equal(into, expected)
            converted = torch.empty(expected.shape, dtype=torch.float32)  # another dtype: read, then converted
            reader.copy_into(name, converted)
            assert torch.equal(converted, expected.float())
    file = folder / "model.safetensors"
    data = file.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    last = max(tensors, key=lambda name: header[name]["data_offsets"][1])  # the tensor stored last
    file.write_bytes(data[:-8])  # its bytes cut short
    with WeightReader(folder) as reader, pytest.raises(ValueError, match=f"ends inside {last}"):
        reader.tensor(last)
    file.write_bytes(b"\xff" * 8 + data[8:])  # a header length beyond the file
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        WeightReader(folder)


def test_a_sharded_folder_loads(tmp_path):
    tensors = gpt2_tensors(prefix="transformer.")
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config()))
    names = sorted(tensors)
    shards = {f"model-0000{k + 1}-of-00002.safetensors": names[k::2] for k in range(2)}
    for file, part in shards.items():
        safetensors_torch.save_file({n: tensors[n] for n in part}, str(folder / file), metadata={"format": "pt"})
    weight_map = {n: file for file, part in shards.items() for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    expected = by_hand({name.removeprefix("transformer."): t for name, t in tensors.items()})
    x = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(from_huggingface(folder)(x), expected(x), atol=0, rtol=0)


@pytest.mark.parametrize("field, value, message", [
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True is not supported"),
    ("reorder_and_upcast_attn", True, "reorder_and_upcast_attn=True is not supported"),
    ("activation_function", "swish", "activation_function='swish' is not supported: torchformer has gelu_new"),
    ("add_cross_attention", True, "add_cross_attention=True is not supported"),
    ("scale_attn_weights", False, "scale_attn_weights=False is not supported"),
    ("attn_pdrop", 0.2, "attn_pdrop=0.2 is not supported: torchformer has one dropout"),
    ("n_head", 5, "config.json: its sizes .* do not make a model: .*emb"),
])
def test_a_config_value_torchformer_cannot_express_is_named(tmp_path, field, value, message):
    folder = write(tmp_path / "gpt2", hf_config(**{field: value}), gpt2_tensors())
    with pytest.raises(ValueError, match=message):
        from_huggingface(folder)


def test_other_model_types_and_missing_files_are_named(tmp_path):
    folder = write(tmp_path / "gpt_neox", {**hf_config(), "model_type": "gpt_neox"}, gpt2_tensors())
    with pytest.raises(ValueError, match="model_type='gpt_neox' is not supported; torchformer loads 'gpt2', 'llama'"):
        from_huggingface(folder)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_huggingface(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        from_huggingface(empty)
    (empty / "config.json").write_text(json.dumps(hf_config()))
    with pytest.raises(FileNotFoundError, match="holds no weights: none of model.safetensors"):
        from_huggingface(empty)
    (empty / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="model_type"):
        from_huggingface(empty)


def test_tensors_that_do_not_fit_the_config_are_named(tmp_path):
    tensors = gpt2_tensors()
    missing = {k: v for k, v in tensors.items() if k != "h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match="holds no h.1.mlp.c_fc.bias"):
        from_huggingface(write(tmp_path / "a", hf_config(), missing))
    with pytest.raises(ValueError, match=r"h.0.attn.c_attn.weight has shape \(32, 64\), but config.json makes it "
                                         r"\(32, 96\)"):
        from_huggingface(write(tmp_path / "b", hf_config(), {**tensors, "h.0.attn.c_attn.weight": torch.ones(E, 64)}))
    with pytest.raises(ValueError, match="tensors GPT-2 does not have.*h.2.ln_1.weight"):
        from_huggingface(write(tmp_path / "c", hf_config(), {**tensors, "h.2.ln_1.weight": torch.ones(E)}))
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        from_huggingface(write(tmp_path / "d", hf_config(), {**tensors, "lm_head.weight": torch.zeros(VOCAB, E)}))
    same = {**tensors, "lm_head.weight": tensors["wte.weight"].clone()}  # stored twice, as a .bin file may
    from_huggingface(write(tmp_path / "e", hf_config(), same, "bin"))
    index = tmp_path / "f"
    write(index, hf_config(), tensors)
    (index / "model.safetensors").rename(index / "shard.safetensors")
    (index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte.weight": "../x"}}))
    with pytest.raises(ValueError, match="names the file '../x' for wte.weight"):
        from_huggingface(index)


def test_export_and_load_round_trip_without_transformers(tmp_path):
    torch.manual_seed(0)
    # No qkv_bias: the exported c_attn biases are zeros, the same function; the model loaded back has them.
    model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, activation="gelu", tie_weights=False,
                         head_bias=False, ff_mult=2).eval()
    folder = to_huggingface(model, tmp_path / "out")
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "gpt2" and written["activation_function"] == "gelu"
    assert written["n_inner"] == 2 * E and written["tie_word_embeddings"] is False
    back = from_huggingface(folder)
    assert back.config == model.config.replace(qkv_bias=True)
    x = torch.randint(0, VOCAB, (2, POSITIONS))
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), atol=1e-6, rtol=0)


def test_a_model_that_does_not_map_onto_gpt2_is_named(tmp_path):
    gpt2_like = dict(prenorm=True, tie_weights=True, head_bias=False)
    cases = [
        (dict(norm="rms"), "norm='rms'"),
        (dict(out_bias=False), "out_bias=False"),
        (dict(activation="swiglu"), "activation='swiglu'"),
        (dict(kv_heads=2, window=4), "kv_heads=2 .*; window=4"),
        (dict(head_bias=True), "head_bias=True"),
        (dict(prenorm=False), "prenorm=False"),
    ]
    for changes, message in cases:
        model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, **{**gpt2_like, **changes})
        with pytest.raises(ValueError, match=f"does not map onto GPT-2: {message}"):
            to_huggingface(model, tmp_path / "x")
    # Rotary positions with LayerNorm: neither GPT-2 (learned positions) nor Llama (rotary with RMSNorm).
    with pytest.raises(ValueError, match="maps onto no Hugging Face family: .* positions='rotary', norm='layer'"):
        to_huggingface(GTransformer(E, H, DEPTH, POSITIONS, VOCAB, **gpt2_like, positions="rotary"), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written
    with pytest.raises(ValueError, match="a CTransformer does not map onto a Hugging Face family"):
        to_huggingface(CTransformer(E, H, 1, POSITIONS, VOCAB, 2), tmp_path / "x")
    with pytest.raises(TypeError, match="model must be a torchformer model"):
        to_huggingface(torch.nn.Linear(2, 2), tmp_path / "x")

    class Variant(GTransformer):
        pass

    with pytest.raises(ValueError, match="a Variant is a variant of GTransformer"):
        to_huggingface(Variant(E, H, DEPTH, POSITIONS, VOCAB, **gpt2_like), tmp_path / "x")


# ---------------------------------------------------------------------------------- with transformers


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def random_gpt2(transformers, seed=0, **changes):
    """A tiny random GPT2LMHeadModel, its biases and LayerNorm gains random too (they start at 0 and 1).

    Weights of standard deviation 0.3, not GPT-2's 0.02: far from uniform log-probabilities, so that a missing
    part (the query bias, the tanh GELU) moves them by more than the tolerance (test_each_gpt2_choice_matters).
    """
    config = transformers.GPT2Config(n_embd=E, n_layer=DEPTH, n_head=H, n_positions=POSITIONS, vocab_size=VOCAB,
                                     bos_token_id=None, eos_token_id=None, initializer_range=0.3, **changes)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_log_probs(hf, x, mask=None):
    with torch.no_grad():
        return torch.log_softmax(hf(x, attention_mask=mask).logits.float(), dim=-1)


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin"])
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": False, "n_inner": 64, "activation_function": "gelu"},
                                     {"n_inner": 100, "layer_norm_epsilon": 1e-2}],
                         ids=["gpt2", "untied-gelu", "inner-100-eps"])
def test_log_probabilities_equal_transformers(tmp_path, transformers, layout, changes):
    hf = random_gpt2(transformers, **changes)
    folder = tmp_path / "gpt2"
    if layout == "bin":  # what save_pretrained(safe_serialization=False) wrote before transformers 5
        folder.mkdir()
        hf.config.to_json_file(folder / "config.json")
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    else:
        hf.save_pretrained(folder, max_shard_size="20KB" if layout == "sharded" else "5GB")
        assert (folder / "model.safetensors.index.json").exists() == (layout == "sharded")
    model = from_huggingface(folder)
    x = torch.randint(0, VOCAB, (4, POSITIONS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(x)
    gap = (ours - hf_log_probs(hf, x)).abs().max().item()
    assert gap < 1e-4, gap
    # A padded batch (right padding): the real positions are those of each sequence alone.
    lengths = [16, 11, 5, 1]
    mask = torch.tensor([[1] * n + [0] * (POSITIONS - n) for n in lengths])
    padded = x.masked_fill(mask == 0, 0)
    theirs = hf_log_probs(hf, padded, mask)
    with torch.no_grad():
        for row, n in enumerate(lengths):
            alone = model(padded[row : row + 1, :n])[0]
            assert (alone - theirs[row, :n]).abs().max().item() < 1e-4
            assert (model(padded)[row, :n] - theirs[row, :n]).abs().max().item() < 1e-4  # causal: padding after


def test_each_gpt2_choice_matters(tmp_path, transformers):
    """Without the fields GPT-2 needs, the same weights give other log-probabilities: the test above can see them."""
    hf = random_gpt2(transformers)
    hf.save_pretrained(tmp_path / "gpt2")
    model = from_huggingface(tmp_path / "gpt2")
    x = torch.randint(0, VOCAB, (2, POSITIONS))
    exact_gelu = GTransformer(config=model.config.replace(activation="gelu")).eval()
    exact_gelu.load_state_dict(model.state_dict())
    no_query_bias = from_huggingface(tmp_path / "gpt2")
    with torch.no_grad():
        for block in no_query_bias.blocks.blocks:
            block.attention.toqueries.bias.zero_()
        reference = hf_log_probs(hf, x)
        assert (model(x) - reference).abs().max() < 1e-4
        assert (exact_gelu(x) - reference).abs().max() > 1e-3  # ten times the tolerance
        assert (no_query_bias(x) - reference).abs().max() > 1e-3


def test_greedy_decoding_equals_transformers_generate(tmp_path, transformers):
    hf = random_gpt2(transformers, seed=1)
    hf.save_pretrained(tmp_path / "gpt2")
    model = from_huggingface(tmp_path / "gpt2")
    prompt = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(4))
    ours = torchformer.generate(model, prompt, POSITIONS - 4, temperature=0)  # with torchformer's KV cache
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=POSITIONS - 4,
                             do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("options", [
    dict(activation="gelu_tanh", qkv_bias=True, tie_weights=True),
    dict(activation="relu", qkv_bias=False, tie_weights=False, ff_mult=3, dropout=0.1),
], ids=["gpt2", "relu-no-qkv-bias-untied"])
def test_an_exported_model_loads_into_transformers_with_equal_outputs(tmp_path, transformers, options):
    torch.manual_seed(0)
    model = GTransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, head_bias=False, **options).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    folder = to_huggingface(model, tmp_path / "export")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    x = torch.randint(0, VOCAB, (3, POSITIONS))
    with torch.no_grad():
        gap = (model(x) - hf_log_probs(hf, x)).abs().max().item()
    assert gap < 1e-4, gap
    assert math.isclose(hf.config.attn_pdrop, model.config.dropout)


def test_a_left_padded_batch_generates_as_transformers_does(tmp_path, transformers):
    """Prompts of different lengths, padded on the left as Hugging Face pads for generation: the same tokens."""
    hf = random_gpt2(transformers, seed=2)
    hf.save_pretrained(tmp_path / "gpt2")
    model = from_huggingface(tmp_path / "gpt2")
    g = torch.Generator().manual_seed(6)
    lengths, t = [6, 2, 4], 6
    ids = torch.randint(1, VOCAB, (3, t), generator=g)
    mask = torch.stack([torch.arange(t) >= t - n for n in lengths])
    ids = ids.masked_fill(~mask, 0)
    ours = torchformer.generate(model, ids, POSITIONS - t, temperature=0, prompt_mask=mask)
    with torch.no_grad():
        theirs = hf.generate(ids, attention_mask=mask.long(), max_new_tokens=POSITIONS - t, do_sample=False,
                             pad_token_id=0)
    assert torch.equal(ours, theirs)
