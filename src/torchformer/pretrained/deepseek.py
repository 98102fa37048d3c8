"""DeepSeek-V3 and DeepSeek-V2 in the Hugging Face layout, as a :class:`~torchformer.families.DeepSeekTransformer`.

DeepSeek-V3 (DeepSeek-AI 2024) is a pre-norm RMSNorm generator with two parts of its own:

* **latent attention** (:class:`~torchformer.nn.latent.LatentAttention`, :class:`~torchformer.nn.latent.LatentOptions`
  from ``kv_lora_rank``, ``qk_rope_head_dim``, ``q_lora_rank``, ``qk_nope_head_dim``, ``v_head_dim``): ``q_a_proj``,
  ``q_a_layernorm``, ``q_b_proj`` are the layer's ``q_down``, ``q_norm``, ``q_up`` (``q_proj`` its ``toqueries``
  without ``q_lora_rank``), ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj`` its ``kv_down``, ``kv_norm``,
  ``kv_up``; the rotary part in the interleaved layout (``rope_interleave``: ``positions="rotary_interleaved"``);
* **a mixture of experts** after ``first_k_dense_replace`` dense blocks (:class:`~torchformer.nn.moe.MoEOptions`):
  sigmoid scores, the selection bias ``e_score_correction_bias`` (the router's ``selection_bias``), ``n_group``
  groups of which ``topk_group`` are chosen from, renormalised weights (``norm_topk_prob``) times
  ``routed_scaling_factor``, and ``n_shared_experts`` shared experts (``shared_experts``: the mixture's
  ``shared``).

DeepSeek-V2 has the same names and parts but routes otherwise: softmax scores, no selection bias, the chosen
weights times ``routed_scaling_factor`` without renormalisation (transformers ignores ``norm_topk_prob`` for it), a
rotation always in the interleaved layout, and no group-limited routing in torchformer (DeepSeek-V2 scores a group
by its best expert, DeepSeek-V3 by its two best: ``topk_method="group_limited_greedy"`` is refused by name).

The multi-token-prediction blocks a released checkpoint stores after the last block (``num_nextn_predict_layers``)
are not loaded, as transformers does not load them either.

Shapes: e embedding size, E experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torchformer.config import TransformerConfig
from torchformer.families import DeepSeekTransformer
from torchformer.models import GTransformer
from torchformer.nn.latent import LatentOptions
from torchformer.nn.moe import MoEOptions
import torchformer.pretrained.llama as llama
from torchformer.pretrained.moe import MoEFamily

# Latent attention's names, (Hugging Face, torchformer), relative to a block.
LATENT = (
    ("self_attn.kv_a_proj_with_mqa.weight", "attention.kv_down.weight"),  # (R + r, e)
    ("self_attn.kv_a_layernorm.weight", "attention.kv_norm.weight"),  # (R,)
    ("self_attn.kv_b_proj.weight", "attention.kv_up.weight"),  # (h (n + v), R)
    ("self_attn.o_proj.weight", "attention.unifyheads.weight"),  # (e, h v)
)
LATENT_QUERIES = (
    ("self_attn.q_a_proj.weight", "attention.q_down.weight"),  # (Q, e)
    ("self_attn.q_a_layernorm.weight", "attention.q_norm.weight"),  # (Q,)
    ("self_attn.q_b_proj.weight", "attention.q_up.weight"),  # (h (n + r), Q)
)
DIRECT_QUERIES = (("self_attn.q_proj.weight", "attention.toqueries.weight"),)  # (h (n + r), e)
ROUTER = (("mlp.gate.weight", "ff.router.weight"), ("mlp.gate.e_score_correction_bias", "ff.router.selection_bias"))
SHARED = (("mlp.shared_experts.gate_proj.weight", "ff.shared.w1.weight"),
          ("mlp.shared_experts.up_proj.weight", "ff.shared.v.weight"),
          ("mlp.shared_experts.down_proj.weight", "ff.shared.w2.weight"))


@dataclass(frozen=True)
class DeepSeekFamily(MoEFamily):
    """DeepSeek-V3's names and reading: latent attention, dense first blocks, a router with a bias, shared experts.

    Args:
        model_type: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        architecture: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        model: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        mlp: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        expert_names: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        defaults: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        read: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        write: as :class:`~torchformer.pretrained.moe.MoEFamily`.
        score: the router's scores, which tell the versions apart on export: ``"sigmoid"`` (V3), ``"softmax"`` (V2).
    """

    score: str = "sigmoid"

    def describes(self, model: GTransformer) -> bool:
        """Whether ``model`` is a :class:`~torchformer.families.DeepSeekTransformer` routing by this version's scores.

        Args:
            model: the model to write.

        Returns:
            Whether this family writes it.
        """
        return super().describes(model) and model.config.options_of(MoEOptions).score == self.score

    def block_rules(self, config: TransformerConfig, i: int) -> tuple[tuple[str, str], ...]:
        """Block ``i``'s one-tensor pairs: norms, latent attention, a dense network or the router and shared experts.

        Args:
            config: the model's config.
            i: the block.

        Returns:
            (stored, torchformer) pairs, relative to the block.
        """
        latent, moe = config.options_of(LatentOptions), config.options_of(MoEOptions)
        queries = LATENT_QUERIES if latent.q_rank is not None else DIRECT_QUERIES
        if i < moe.dense_layers:
            return llama.NORMS + queries + LATENT + llama.MLP
        router = ROUTER if moe.selection_bias else ROUTER[:1]  # DeepSeek-V2 has no bias
        return llama.NORMS + queries + LATENT + router + (SHARED if moe.shared_experts else ())

    def expert_blocks(self, model: GTransformer) -> list[tuple[int, Any]]:
        """The blocks after the dense ones, with their indices.

        Args:
            model: the model.

        Returns:
            ``[(i, block), ...]``.
        """
        dense = model.config.options_of(MoEOptions).dense_layers
        return [(i, block) for i, block in enumerate(model.blocks.blocks) if i >= dense]

    def skip(self, model: GTransformer, prefix: str, left: set[str]) -> None:
        """Leave out the multi-token-prediction blocks after the last block (transformers does not load them).

        Args:
            model: the model.
            prefix: the stack's prefix in the files.
            left: the stored names not read yet.
        """
        after = {n for n in left if n.startswith(f"{prefix}layers.")
                 and int(n[len(f"{prefix}layers."):].split(".")[0]) >= model.config.depth}
        left.difference_update(after)


def _read(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError]) -> tuple[dict, Any]:
    if get("attention_bias"):
        raise refuse("attention_bias", "DeepSeek-V3's projections have no biases in torchformer: false")
    if get("topk_method") not in (None, "noaux_tc"):
        raise refuse("topk_method", "torchformer routes as DeepSeek-V3 does: 'noaux_tc'")
    if get("scoring_func") not in (None, "sigmoid"):
        raise refuse("scoring_func", "DeepSeek-V3 scores by 'sigmoid'")
    try:
        moe = MoEOptions(experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"),
                         expert_hidden=get("moe_intermediate_size"), shared_experts=get("n_shared_experts") or 0,
                         score="sigmoid", normalize=bool(get("norm_topk_prob")),
                         routed_scaling=float(get("routed_scaling_factor")), groups=get("n_group") or 1,
                         top_groups=get("topk_group") or 1, dense_layers=get("first_k_dense_replace") or 0,
                         selection_bias=True, balance_loss=0.0)
        latent = LatentOptions(kv_rank=get("kv_lora_rank"), rope_dim=get("qk_rope_head_dim"), q_rank=get("q_lora_rank"),
                               nope_dim=get("qk_nope_head_dim"), value_dim=get("v_head_dim"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json: its fields do not make DeepSeek-V3's parts: {e}") from e
    positions = "rotary_interleaved" if get("rope_interleave") else "rotary"
    return {"positions": positions, "kv_heads": None}, (moe, latent)


def _write(model: GTransformer) -> dict[str, Any]:
    config, moe, latent = model.config, model.config.options_of(MoEOptions), model.config.options_of(LatentOptions)
    llama.refuse_unmapped(model, "DeepSeek-V3", (
        ("qkv_bias", not config.qkv_bias, "DeepSeek-V3's projections have no biases: False"),
        ("out_bias", not config.out_bias, "DeepSeek-V3's projections have no biases: False"),
        ("window", config.window is None, "DeepSeek-V3 has no sliding window: None"),
        ("options", moe.score == "sigmoid" and moe.selection_bias and moe.capacity_factor is None,
         "DeepSeek-V3 routes by sigmoid scores with a selection bias, no capacity"),
    ), positions=("rotary", "rotary_interleaved"))
    return {"kv_lora_rank": latent.kv_rank, "q_lora_rank": latent.q_rank, "qk_rope_head_dim": latent.rope_dim,
            "qk_nope_head_dim": latent.nope_dim or config.head_size, "v_head_dim": latent.value_dim or config.head_size,
            "qk_head_dim": (latent.nope_dim or config.head_size) + latent.rope_dim, "head_dim": latent.rope_dim,
            "rope_interleave": config.positions == "rotary_interleaved", "n_routed_experts": moe.experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": model.blocks.blocks[-1].ff.hidden,
            "n_shared_experts": moe.shared_experts, "norm_topk_prob": moe.normalize,
            "routed_scaling_factor": moe.routed_scaling, "n_group": moe.groups, "topk_group": moe.top_groups,
            "first_k_dense_replace": moe.dense_layers, "num_nextn_predict_layers": 0, "attention_bias": False}


DEEPSEEK_V3 = DeepSeekFamily(
    "deepseek_v3", "DeepseekV3ForCausalLM", DeepSeekTransformer, "mlp", ("gate_proj", "up_proj", "down_proj"),
    {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 4096,
     "rope_interleave": True, "attention_bias": False, "norm_topk_prob": True, "n_shared_experts": 1,
     "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
     "num_experts_per_tok": 8, "n_routed_experts": 256, "moe_intermediate_size": 2048, "kv_lora_rank": 512,
     "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
    _read, _write)


def _read_v2(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError]) -> tuple[dict, Any]:
    for field in ("attention_bias", "mlp_bias"):
        if get(field):
            raise refuse(field, "DeepSeek-V2's projections have no biases in torchformer: false")
    if get("topk_method") not in (None, "greedy"):
        raise refuse("topk_method", "torchformer's group-limited routing scores a group by its two best experts "
                                    "(DeepSeek-V3), DeepSeek-V2's by its best: 'greedy' (no groups)")
    if get("norm_topk_prob"):
        raise refuse("norm_topk_prob", "transformers does not renormalise DeepSeek-V2's weights, nor does "
                                       "torchformer: false")
    try:
        moe = MoEOptions(experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"),
                         expert_hidden=get("moe_intermediate_size"), shared_experts=get("n_shared_experts") or 0,
                         score="softmax", normalize=False, routed_scaling=float(get("routed_scaling_factor")),
                         dense_layers=get("first_k_dense_replace") or 0, balance_loss=0.0)
        latent = LatentOptions(kv_rank=get("kv_lora_rank"), rope_dim=get("qk_rope_head_dim"), q_rank=get("q_lora_rank"),
                               nope_dim=get("qk_nope_head_dim"), value_dim=get("v_head_dim"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json: its fields do not make DeepSeek-V2's parts: {e}") from e
    return {"positions": "rotary_interleaved", "kv_heads": None}, (moe, latent)


def _write_v2(model: GTransformer) -> dict[str, Any]:
    config, moe, latent = model.config, model.config.options_of(MoEOptions), model.config.options_of(LatentOptions)
    llama.refuse_unmapped(model, "DeepSeek-V2", (
        ("qkv_bias", not config.qkv_bias, "DeepSeek-V2's projections have no biases: False"),
        ("out_bias", not config.out_bias, "DeepSeek-V2's projections have no biases: False"),
        ("window", config.window is None, "DeepSeek-V2 has no sliding window: None"),
        ("options", moe.score == "softmax" and not moe.normalize and not moe.selection_bias and moe.groups == 1
         and moe.capacity_factor is None, "DeepSeek-V2 routes by softmax scores, not renormalised, without a "
         "selection bias, groups or capacity"),
    ), positions=("rotary_interleaved",))
    nope, value = latent.nope_dim or config.head_size, latent.value_dim or config.head_size
    return {"kv_lora_rank": latent.kv_rank, "q_lora_rank": latent.q_rank, "qk_rope_head_dim": latent.rope_dim,
            "qk_nope_head_dim": nope, "v_head_dim": value, "head_dim": latent.rope_dim,
            "n_routed_experts": moe.experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": model.blocks.blocks[-1].ff.hidden, "n_shared_experts": moe.shared_experts,
            "norm_topk_prob": False, "routed_scaling_factor": moe.routed_scaling, "topk_method": "greedy",
            "n_group": None, "topk_group": None, "first_k_dense_replace": moe.dense_layers, "attention_bias": False,
            "mlp_bias": False}


DEEPSEEK_V2 = DeepSeekFamily(
    "deepseek_v2", "DeepseekV2ForCausalLM", DeepSeekTransformer, "mlp", ("gate_proj", "up_proj", "down_proj"),
    {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 2048,
     "attention_bias": False, "norm_topk_prob": False, "n_shared_experts": 2, "routed_scaling_factor": 1.0,
     "topk_method": "greedy", "first_k_dense_replace": 0, "n_routed_experts": 64, "moe_intermediate_size": 1407,
     "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
    _read_v2, _write_v2, score="softmax")
