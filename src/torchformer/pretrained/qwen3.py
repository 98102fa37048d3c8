"""Qwen3 in the Hugging Face layout, and torchformer's :class:`~torchformer.families.Qwen3Transformer`.

Qwen3 (Qwen team 2025) is Llama's architecture (:mod:`torchformer.pretrained.llama`) with queries and keys
RMS-normalised per head before the rotation (``q_norm``, ``k_norm``, one gain of ``head_dim`` each:
:class:`~torchformer.nn.qknorm.HeadRMSNormAttention`, ``kqnorm=True``), heads of their own size (``head_dim``), and
``attention_bias`` on all four projections. The name map is Llama's, with the two norms.

Shapes: e embedding size, h query heads and g key/value heads of size s (``head_dim``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from torchformer.config import TransformerConfig
from torchformer.families import Qwen3Transformer
import torchformer.pretrained.building as building
import torchformer.pretrained.llama as llama
from torchformer.pretrained.folders import WeightReader

MODELS = (Qwen3Transformer,)  # the classes this family writes (to_huggingface)
# Qwen3Config's defaults: what a field left out means.
DEFAULTS: dict[str, Any] = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                            "attention_bias": False, "use_sliding_window": False, "hidden_act": "silu"}


def config_from_huggingface(hf: dict[str, Any]) -> TransformerConfig:
    """The config of a Qwen3 ``config.json``.

    Args:
        hf: the JSON object of ``config.json``.

    Returns:
        The config of the equal :class:`~torchformer.families.Qwen3Transformer`.

    Raises:
        ValueError: a field holds a value torchformer cannot express (the message names it).
    """
    fields = llama.shared_fields(hf, DEFAULTS)
    biased = bool({**DEFAULTS, **hf}.get("attention_bias"))
    return llama.make_config(**{**fields, "kqnorm": True, "qkv_bias": biased, "out_bias": biased})


def describes(model: Qwen3Transformer) -> bool:
    """Always: a Qwen3Transformer is Qwen3-shaped (:func:`config_to_huggingface` checks every field).

    Args:
        model: the model to write.

    Returns:
        True.
    """
    return True


def config_to_huggingface(model: Qwen3Transformer) -> dict[str, Any]:
    """A Qwen3 ``config.json`` for ``model``.

    Args:
        model: a :class:`~torchformer.families.Qwen3Transformer`.

    Returns:
        The JSON object of ``config.json``.

    Raises:
        ValueError: config fields do not map (each named, with its value).
    """
    config = model.config
    llama.refuse_unmapped(model, "Qwen3", (
        ("out_bias", config.qkv_bias == config.out_bias, "Qwen3's attention_bias is on all four projections or none"),
        ("window", config.window is None, "Qwen3's sliding window is some layers' only: None"),
        ("options", not config.options, "Qwen3's parts have no options: ()"),
    ))
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **llama.shared_config_json(model),
            "attention_bias": config.qkv_bias, "use_sliding_window": False, "sliding_window": None}


def empty_model(config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                device: torch.device) -> Qwen3Transformer:
    """The model of ``config`` with memory but no values yet (see :func:`torchformer.pretrained.llama.empty_model`).

    Args:
        config: what :func:`config_from_huggingface` made.
        reader: the folder's tensors.
        dtype: the parameters' dtype, or ``None``: the stored embedding's.
        device: where the parameters go.

    Returns:
        The model.
    """
    return building.empty_model(Qwen3Transformer, config, dtype=dtype or llama.stored_dtype(reader), device=device)


def load_weights(model: Qwen3Transformer, reader: WeightReader) -> None:
    """Copy the tensors into ``model``: Llama's names and the two norms of each block.

    Args:
        model: the model, its values unset.
        reader: the folder's tensors.

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says.
    """
    llama.load_weights(model, reader)


def export_weights(model: Qwen3Transformer) -> dict[str, Tensor]:
    """``model``'s parameters under Qwen3's names.

    Args:
        model: a model :func:`config_to_huggingface` accepts.

    Returns:
        ``{name: tensor}``, contiguous CPU tensors.
    """
    return llama.export_weights(model)
