"""Qwen3, Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3 and DeepSeek-V2 in and out of the Hugging Face layout: equal to transformers' models.

Tiny random models written by ``transformers`` (skipped without it): log-probabilities equal within 1e-4 in
float32, greedy decoding with torchformer's KV cache gives ``generate``'s tokens, a left-padded batch generates as
each prompt alone (as transformers does), the export loads back into ``transformers`` with equal outputs and into
torchformer exactly, and what torchformer cannot express is refused by name. Nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

import torchformer
from torchformer import from_huggingface, to_huggingface
from torchformer.families import (
    DeepSeekTransformer, MoETransformer, OLMoETransformer, Qwen3MoETransformer, Qwen3Transformer,
)
from torchformer.nn.moe import MoEOptions

pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")

E, H, G, DEPTH, POSITIONS, VOCAB = 32, 4, 2, 2, 24, 50
SIZES = dict(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, num_hidden_layers=DEPTH,
             max_position_embeddings=POSITIONS, vocab_size=VOCAB, initializer_range=0.3, bos_token_id=None,
             eos_token_id=None, pad_token_id=None, rms_norm_eps=1e-6)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", Qwen3Transformer, dict(intermediate_size=56, head_dim=16)),
    "qwen3-biased-tied": ("Qwen3Config", "Qwen3ForCausalLM", Qwen3Transformer,
                          dict(intermediate_size=56, attention_bias=True, tie_word_embeddings=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", MoETransformer,
                dict(intermediate_size=40, num_local_experts=4, num_experts_per_tok=2, sliding_window=7)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", Qwen3MoETransformer,
                  dict(intermediate_size=56, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2,
                       norm_topk_prob=True, head_dim=16)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", OLMoETransformer,
              dict(intermediate_size=24, num_experts=4, num_experts_per_tok=2)),
    # DeepSeek-V3: latent attention with compressed queries, a dense first block, 8 experts in 4 groups (2 chosen),
    # a shared expert; its selection bias made random below, so that it moves the choice.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", DeepSeekTransformer,
                    dict(num_hidden_layers=3, num_key_value_heads=H, intermediate_size=56, moe_intermediate_size=24,
                         n_routed_experts=8,
                         num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
                         q_lora_rank=16, kv_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                         routed_scaling_factor=2.5)),
    "deepseek_v3-direct-queries": ("DeepseekV3Config", "DeepseekV3ForCausalLM", DeepSeekTransformer,
                                   dict(num_key_value_heads=H, intermediate_size=56, moe_intermediate_size=24,
                                        n_routed_experts=4,
                                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                                        n_shared_experts=1, q_lora_rank=None, kv_lora_rank=12, qk_rope_head_dim=4,
                                        qk_nope_head_dim=8, v_head_dim=8, rope_interleave=False)),
    # DeepSeek-V2: softmax routing without renormalisation, two shared experts, the interleaved rotation.
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", DeepSeekTransformer,
                    dict(num_key_value_heads=H, intermediate_size=56, moe_intermediate_size=24, n_routed_experts=6,
                         num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=2, q_lora_rank=16,
                         kv_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
                         routed_scaling_factor=1.5, num_hidden_layers=3)),
}


def random_model(family, seed=0):
    """A tiny random model of ``family``, its norms' gains random too (they start at 1), in float32."""
    config_class, model_class, _, changes = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SIZES, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.1)
    return model


def hf_log_probs(hf, x, mask=None):
    with torch.no_grad():
        return torch.log_softmax(hf(x, attention_mask=mask).logits.float(), dim=-1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family's model, saved: ``{family: (transformers' model, folder)}``."""
    made = {}
    for family in FAMILIES:
        hf = random_model(family)
        folder = tmp_path_factory.mktemp(family)
        hf.save_pretrained(folder)
        made[family] = (hf, folder)
    return made


@pytest.mark.parametrize("family", list(FAMILIES))
def test_log_probabilities_equal_transformers_on_plain_and_right_padded_batches(folders, family):
    hf, folder = folders[family]
    model = from_huggingface(folder)
    assert type(model) is FAMILIES[family][2]
    x = torch.randint(0, VOCAB, (3, POSITIONS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        gap = (model(x) - hf_log_probs(hf, x)).abs().max().item()
    assert gap < 1e-4, gap
    lengths = [POSITIONS, 9, 1]
    mask = torch.tensor([[1] * n + [0] * (POSITIONS - n) for n in lengths])
    theirs = hf_log_probs(hf, x, mask)
    with torch.no_grad():
        for row, n in enumerate(lengths):
            assert (model(x[row:row + 1, :n])[0] - theirs[row, :n]).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_decoding_with_the_cache_and_a_left_padded_batch_equal_transformers_generate(folders, family):
    hf, folder = folders[family]
    model = from_huggingface(folder)
    prompt = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(4))
    ours = torchformer.generate(model, prompt, 12, temperature=0)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                             pad_token_id=0)
    assert torch.equal(ours, theirs)
    lengths, t = [6, 2, 4], 6
    mask = torch.stack([torch.arange(t) >= t - n for n in lengths])
    ids = torch.randint(1, VOCAB, (3, t), generator=torch.Generator().manual_seed(6)).masked_fill(~mask, 0)
    ours = torchformer.generate(model, ids, 8, temperature=0, prompt_mask=mask)
    for row, n in enumerate(lengths):  # each prompt alone
        alone = torchformer.generate(model, ids[row:row + 1, t - n:], 8, temperature=0)
        assert torch.equal(ours[row, t - n:], alone[0])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_round_trip_is_exact_and_transformers_reads_the_export(folders, family, tmp_path):
    hf, folder = folders[family]
    model = from_huggingface(folder)
    exported = to_huggingface(model, tmp_path / "export")
    again = from_huggingface(exported)
    assert again.config == model.config
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    theirs = transformers.AutoModelForCausalLM.from_pretrained(exported).float().eval()
    assert type(theirs).__name__ == FAMILIES[family][1]
    x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (model(x) - hf_log_probs(theirs, x)).abs().max().item() < 1e-4


def test_each_choice_matters(folders):
    """Leaving out a family's choice moves the log-probabilities by more than the tolerance, so the tests see it."""
    for family, changes in (("qwen3_moe", dict(normalize=False)), ("olmoe", dict(normalize=True)),
                            ("mixtral", dict(top_k=1)), ("deepseek_v3", dict(routed_scaling=1.0)),
                            ("deepseek_v3", dict(top_groups=4)), ("deepseek_v2", dict(routed_scaling=1.0)),
                            ("deepseek_v2", dict(normalize=True))):
        hf, folder = folders[family]
        model = from_huggingface(folder)
        options = model.config.options_of(MoEOptions)
        values = {f: getattr(options, f) for f in options.__dataclass_fields__}
        other = type(model)(config=model.config.with_options(MoEOptions(**{**values, **changes}))).eval()
        other.load_state_dict(model.state_dict())
        x = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            assert (other(x) - hf_log_probs(hf, x)).abs().max() > 5e-4, (family, changes)


def test_a_bfloat16_load_keeps_deepseeks_selection_bias_in_float32(folders):
    """The bias moves the choice of experts by steps of 0.001 around values near 0.1: bf16 would round them."""
    hf, folder = folders["deepseek_v3"]
    model = from_huggingface(folder, dtype=torch.bfloat16)
    stored = {n: b for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias")}
    biases = [b for n, b in model.named_buffers() if n.endswith("selection_bias")]
    assert biases and len(biases) == len(stored) and all(b.dtype == torch.float32 for b in biases)
    for bias, expected in zip(biases, stored.values()):
        assert torch.equal(bias, expected.float())


def test_a_file_in_transformers_fused_expert_layout_loads_the_same(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    hf, folder = folders["qwen3_moe"]
    tensors = load_file(folder / "model.safetensors")
    fused = {}
    for i in range(DEPTH):
        where = f"model.layers.{i}.mlp.experts"
        experts = [(tensors.pop(f"{where}.{j}.gate_proj.weight"), tensors.pop(f"{where}.{j}.up_proj.weight"),
                    tensors.pop(f"{where}.{j}.down_proj.weight")) for j in range(6)]
        fused[f"{where}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u, _ in experts])  # (E, 2h, e)
        fused[f"{where}.down_proj"] = torch.stack([d for _, _, d in experts])  # (E, e, h)
    (tmp_path / "fused").mkdir()
    save_file({**tensors, **fused}, str(tmp_path / "fused" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "fused" / "config.json").write_text((folder / "config.json").read_text())
    a, b = from_huggingface(folder), from_huggingface(tmp_path / "fused")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("family, field, value, message", [
    ("mixtral", "router_jitter_noise", 0.1, "router_jitter_noise=0.1 is not supported"),
    ("qwen3_moe", "decoder_sparse_step", 2, "decoder_sparse_step=2 is not supported"),
    ("qwen3_moe", "mlp_only_layers", [1], r"mlp_only_layers=\[1\] is not supported"),
    ("olmoe", "clip_qkv", 8.0, "clip_qkv=8.0 is not supported"),
    ("qwen3", "layer_types", ["full_attention", "sliding_attention"], "layer_types=.* is not supported"),
    ("qwen3", "use_sliding_window", True, "use_sliding_window=True is not supported"),
    ("deepseek_v2", "topk_method", "group_limited_greedy", "topk_method='group_limited_greedy' is not supported"),
    ("deepseek_v2", "norm_topk_prob", True, "norm_topk_prob=True is not supported"),
    ("deepseek_v2", "mlp_bias", True, "mlp_bias=True is not supported"),
])
def test_what_torchformer_cannot_express_is_refused_by_name(folders, tmp_path, family, field, value, message):
    _, folder = folders[family]
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    (tmp_path / "x" / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ValueError, match=message):
        from_huggingface(tmp_path / "x")


def test_an_export_refuses_what_the_family_cannot_express(tmp_path):
    torch.manual_seed(0)
    grouped = MoETransformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, norm="rms", positions="rotary",
                             activation="swiglu", out_bias=False, head_bias=False,
                             options=(MoEOptions(experts=4, groups=2, top_groups=1),))
    with pytest.raises(ValueError, match="does not map onto Mixtral: options=.*renormalised"):
        to_huggingface(grouped, tmp_path / "x")
    windowed = Qwen3Transformer(E, H, DEPTH, POSITIONS, VOCAB, prenorm=True, norm="rms", positions="rotary",
                                activation="swiglu", out_bias=False, head_bias=False, window=4)
    with pytest.raises(ValueError, match="does not map onto Qwen3: window=4"):
        to_huggingface(windowed, tmp_path / "y")
