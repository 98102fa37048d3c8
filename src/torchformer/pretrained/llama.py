"""Llama, Mistral and Qwen2 in the Hugging Face layout, and torchformer's :class:`~torchformer.models.GTransformer`.

The three families are one architecture (Touvron et al. 2023; Jiang et al. 2023; Qwen team 2024): a ``GTransformer``
with pre-norm blocks (``prenorm=True``) of RMSNorm (``norm="rms"``, eps ``rms_norm_eps``), rotary positions in
the layout of halves (``positions="rotary"``, base ``rope_theta``, Llama-3.1's ``rope_scaling``), grouped-query
attention (``kv_heads``), a SwiGLU feed-forward network of any hidden size (``activation="swiglu"``,
``ff_hidden``), no bias in the attention's output projection (``out_bias=False``) and none in the output layer
(``head_bias=False``). What differs between them is data in ``config.json``:

* **Llama**: ``attention_bias`` puts a bias in all four attention projections (``qkv_bias``, ``out_bias``);
  ``mlp_bias`` (biases in the feed-forward network) is refused.
* **Mistral**: ``sliding_window`` is torchformer's ``window`` (a query sees itself and the ``window - 1`` keys
  before it).
* **Qwen2**: biases in the query, key and value projections, none in the output projection; its sliding window
  applies to some layers only (``use_sliding_window``), which is refused.

**The weights** need no cutting and no transposing: each Hugging Face tensor is one torchformer parameter of the
same shape, :data:`TOP` and :data:`BLOCK` the name map (both directions). The rotary layouts agree (both pair the
halves of a head), so the query and key rows are copied as they are.

Shapes: e embedding size (``hidden_size``), v vocabulary size, f the feed-forward hidden size
(``intermediate_size``), h query heads and g key/value heads of size s (``e / h``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import Tensor

from torchformer._checks import is_int, is_number
from torchformer.config import TransformerConfig
from torchformer.models import GTransformer
from torchformer.nn.feedforward import gated_hidden_size
import torchformer.pretrained.building as building
from torchformer.pretrained.folders import WeightReader, copy_tensor

MODELS = (GTransformer,)  # the classes this family writes (to_huggingface); describes() says which of them

# The name map, (Hugging Face, torchformer), read top down. The stack's names follow PREFIX; names in a block are
# relative to {PREFIX}layers.{i}. and blocks.blocks.{i}.; a bias appears only where the config has one.
TOP = (
    ("embed_tokens.weight", "embedding.tokens.weight"),  # (v, e): the token embedding
    ("norm.weight", "blocks.norm.weight"),  # (e,): the final RMSNorm of the pre-norm stack
)
NORMS = (
    ("input_layernorm.weight", "norm1.weight"),  # (e,): the RMSNorm before attention
    ("post_attention_layernorm.weight", "norm2.weight"),  # (e,): the RMSNorm before the feed-forward network
)
ATTENTION = (
    ("self_attn.q_proj.weight", "attention.toqueries.weight"),  # (h s, e)
    ("self_attn.k_proj.weight", "attention.tokeys.weight"),  # (g s, e)
    ("self_attn.v_proj.weight", "attention.tovalues.weight"),  # (g s, e)
    ("self_attn.o_proj.weight", "attention.unifyheads.weight"),  # (e, h s): mixes the heads
)
MLP = (
    ("mlp.gate_proj.weight", "ff.w1.weight"),  # (f, e): the gate's input, silu(W1 x)
    ("mlp.up_proj.weight", "ff.v.weight"),  # (f, e): the value it gates, V x
    ("mlp.down_proj.weight", "ff.w2.weight"),  # (e, f): W2
)
BLOCK = NORMS + ATTENTION + MLP
QKV_BIASES = tuple((hf.replace("weight", "bias"), tf.replace("weight", "bias")) for hf, tf in ATTENTION[:3])
OUT_BIAS = ("self_attn.o_proj.bias", "attention.unifyheads.bias")
# Qwen3's and Qwen3-MoE's per-head RMSNorm gains, OLMoE's over the whole projections (config.kqnorm).
QK_NORMS = (("self_attn.q_norm.weight", "attention.qnorm.weight"),
            ("self_attn.k_norm.weight", "attention.knorm.weight"))
OUTPUT = ("lm_head.weight", "head.toprobs.weight")  # (v, e): stored only when tie_word_embeddings is false
# LlamaForCausalLM (MistralForCausalLM, ...) prefixes the stack's names with "model." (lm_head has none); a bare
# LlamaModel stores them without, and no lm_head.
PREFIX = "model."
# A buffer older files store in each block (the rotary frequencies, recomputed from the config): nothing to load.
IGNORED = ("self_attn.rotary_emb.inv_freq",)

# Each family's config defaults (LlamaConfig's, MistralConfig's, Qwen2Config's): what a field left out means.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "sliding_window": None, "hidden_act": "silu"},
    "mistral": {"max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                "sliding_window": 4096, "hidden_act": "silu"},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "use_sliding_window": False, "hidden_act": "silu"},
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# Llama-3.1's rope_scaling keys, as config.json names them (torchformer's rotary_scaling uses the same names).
LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def attention_rules(config: TransformerConfig) -> tuple[tuple[str, str], ...]:
    """The pairs of one block's attention and norms: the projections, their biases, and the q/k norms if any.

    Args:
        config: the model's config (its biases and ``kqnorm``).

    Returns:
        (Hugging Face name, torchformer name) pairs, relative to a block.
    """
    return (NORMS + ATTENTION + (QKV_BIASES if config.qkv_bias else ()) + ((OUT_BIAS,) if config.out_bias else ())
            + (QK_NORMS if config.kqnorm else ()))


def rules(config: TransformerConfig, prefix: str = PREFIX, *,
          block: Callable[[int], Iterable[tuple[str, str]]] | None = None) -> Iterator[tuple[str, str]]:
    """Every (Hugging Face name, torchformer name) pair of a model of ``config``, block names made absolute.

    Args:
        config: the model's config (its depth, biases and tying say which tensors there are).
        prefix: what the stack's names start with: :data:`PREFIX` (``LlamaForCausalLM``), or ``""`` (a bare
            ``LlamaModel``).
        block: block ``i``'s pairs, relative to it; ``None``: :func:`attention_rules` and the gated network
            (:data:`MLP`). A family of other parts (a mixture of experts, latent attention) gives its own.

    Yields:
        The pairs, top-level tensors first, then each block's, then the output layer if untied.
    """
    for hf, tf in TOP:
        yield prefix + hf, tf
    for i in range(config.depth):
        for hf, tf in (attention_rules(config) + MLP if block is None else block(i)):
            yield f"{prefix}layers.{i}.{hf}", f"blocks.blocks.{i}.{tf}"
    if not config.tie_weights:
        yield OUTPUT


def stored_prefix(reader: WeightReader) -> str:
    """:data:`PREFIX` when the folder stores the token embedding under it, else ``""`` (a bare ``LlamaModel``).

    Args:
        reader: the folder's tensors.

    Returns:
        The prefix of the stack's names in the files.
    """
    return "" if PREFIX + TOP[0][0] not in reader.names() and TOP[0][0] in reader.names() else PREFIX


def rope(hf: dict[str, Any], refuse: Callable[[str, str], ValueError]) -> tuple[float, Optional[dict]]:
    """``(rotary_base, rotary_scaling)`` from the config's rope fields, in either spelling.

    Args:
        hf: ``config.json``: ``rope_parameters`` (transformers 5), or ``rope_theta`` and ``rope_scaling`` (before),
            whose kind is ``rope_type``, or ``type`` in files of transformers before 4.45.
        refuse: makes the error for a field and a reason.

    Returns:
        The base, and Llama-3.1's scaling or ``None``.
    """
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"  # the one read: its name in errors
    given = hf.get(field)
    if given is not None and not isinstance(given, dict):
        raise refuse(field, "expected a JSON object")
    if field == "rope_scaling" and given and "rope_type" not in given and "type" not in given:
        raise refuse(field, "it has no type (rope_type, or type before transformers 4.45)")
    parameters = given if field == "rope_parameters" else {"rope_theta": hf.get("rope_theta", 10000.0),
                                                           **(given or {})}
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    base = parameters.get("rope_theta", hf.get("rope_theta", 10000.0))
    if kind == "default":
        return base, None
    if kind != "llama3":
        raise refuse(field, f"its type is {kind!r}, and torchformer's rotary positions have 'default' and 'llama3'")
    return base, {key: parameters.get(key) for key in LLAMA3_SCALING}


def refuser(get: Callable[[str], Any]) -> Callable[[str, str], ValueError]:
    """The error for a ``config.json`` field torchformer cannot express: it names the field and its value.

    Args:
        get: reads a field of ``config.json`` (its family's default for one left out).

    Returns:
        ``refuse(field, why)``, which makes the ``ValueError``.
    """
    def refuse(field: str, why: str) -> ValueError:
        return ValueError(f"config.json: {field}={get(field)!r} is not supported: {why}")

    return refuse


def shared_fields(hf: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The config fields of the Llama-shaped part of a family (every one here and in the mixtures of experts).

    Pre-norm RMSNorm blocks, rotary positions of halves, grouped-query attention, a SwiGLU network of
    ``intermediate_size``, no output-layer bias; the fields that say otherwise are refused by name.

    Args:
        hf: ``config.json``.
        defaults: the family's defaults for fields left out.

    Returns:
        ``{field: value}`` for :class:`~torchformer.config.TransformerConfig`: no biases, no window (a family sets
        its own).

    Raises:
        ValueError: a field holds a value torchformer cannot express.
    """
    get = {**defaults, **hf}.get
    refuse = refuser(get)
    if get("hidden_act") != "silu":
        raise refuse("hidden_act", "torchformer's gated network is SwiGLU, 'silu'")
    if get("mlp_bias"):
        raise refuse("mlp_bias", "torchformer's gated network has no biases")
    emb, heads = get("hidden_size"), get("num_attention_heads")
    # A head size other than hidden_size / num_attention_heads (Qwen3, Gemma) is the config's head_dim.
    head_dim = get("head_dim")
    if head_dim is not None and is_int(emb) and is_int(heads) and heads > 0 and head_dim * heads == emb:
        head_dim = None  # the default: torchformer's narrow heads
    if get("use_sliding_window"):
        raise refuse("use_sliding_window", "it windows some layers only; torchformer's window is every layer's")
    if any(layer != "full_attention" for layer in get("layer_types") or ()):
        raise refuse("layer_types", "torchformer's layers all attend alike")
    if not is_number(get("attention_dropout")) and get("attention_dropout") is not None:
        raise refuse("attention_dropout", "expected a number")
    tied = get("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise refuse("tie_word_embeddings", "expected true or false")
    base, scaling = rope(hf, refuse)
    kv_heads = get("num_key_value_heads")
    return dict(emb=emb, heads=heads, head_dim=head_dim, depth=get("num_hidden_layers"),
                seq_length=get("max_position_embeddings"), num_tokens=get("vocab_size"),
                kv_heads=None if kv_heads in (None, heads) else kv_heads, ff_hidden=get("intermediate_size"),
                prenorm=True, norm="rms", norm_eps=get("rms_norm_eps"), activation="swiglu", positions="rotary",
                rotary_base=base, rotary_scaling=scaling, dropout=get("attention_dropout") or 0.0, tie_weights=tied,
                head_bias=False, qkv_bias=False, out_bias=False)


def make_config(**fields: Any) -> TransformerConfig:
    """``TransformerConfig(**fields)``, its errors said as errors of ``config.json``.

    Args:
        **fields: the config's fields.

    Returns:
        The config.

    Raises:
        ValueError: the fields do not make a model (a size that is not a positive int, heads not dividing
            hidden_size, ...).
    """
    try:
        return TransformerConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json: its fields do not make a model: {e}") from e


def config_from_huggingface(hf: dict[str, Any]) -> TransformerConfig:
    """The :class:`~torchformer.config.TransformerConfig` of a Llama, Mistral or Qwen2 ``config.json``.

    Args:
        hf: the JSON object of ``config.json``; fields left out mean the family's :data:`DEFAULTS`.

    Returns:
        The config of the equal :class:`~torchformer.models.GTransformer`.

    Raises:
        ValueError: a field holds a value torchformer cannot express; the message names the field and the value.
    """
    kind = hf["model_type"]
    fields = shared_fields(hf, DEFAULTS[kind])
    get = {**DEFAULTS[kind], **hf}.get
    biased = bool(get("attention_bias")) if kind == "llama" else kind == "qwen2"
    return make_config(**{**fields, "window": get("sliding_window") if kind == "mistral" else None,
                          "qkv_bias": biased, "out_bias": biased and kind == "llama"})


def describes(model: GTransformer) -> bool:
    """Whether ``model`` is of Llama's shape: rotary positions and RMSNorm.

    Args:
        model: the GTransformer to write.

    Returns:
        True for rotary positions with RMSNorm; :func:`config_to_huggingface` then checks every field.
    """
    return model.config.positions == "rotary" and model.config.norm == "rms"


def config_to_huggingface(model: GTransformer) -> dict[str, Any]:
    """A Llama ``config.json`` for ``model`` (Mistral's with a ``window``, Qwen2's with q, k, v biases only).

    Args:
        model: a :class:`~torchformer.models.GTransformer` (not a subclass).

    Returns:
        The JSON object of ``config.json``, for ``LlamaForCausalLM`` or ``MistralForCausalLM``.

    Raises:
        ValueError: the model is a subclass, or config fields do not map; the message names each, with its value.
    """
    config = model.config
    if type(model) is not GTransformer:
        raise ValueError(f"to_huggingface: a {type(model).__name__} is a variant of GTransformer, which Llama cannot "
                         f"express; only a GTransformer itself maps onto Llama")
    refuse_unmapped(model, "Llama", (
        ("out_bias", config.qkv_bias or not config.out_bias, "an output-projection bias needs the query, key and "
                                                             "value biases too (Llama's attention_bias): False"),
        ("kqnorm", not config.kqnorm, "Llama does not normalise queries and keys: False"),
        ("options", not config.options, "Llama's parts have no options: ()"),
    ))
    # Biases on q, k, v but not on the output projection: Qwen2; a window: Mistral; else Llama.
    kind = "qwen2" if config.qkv_bias and not config.out_bias else "llama" if config.window is None else "mistral"
    hf = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], **shared_config_json(model)}
    if kind == "llama":
        hf.update(attention_bias=config.qkv_bias, mlp_bias=False)
    elif kind == "qwen2":
        if config.window is not None:
            raise ValueError(f"to_huggingface: Qwen2 (biases on q, k, v only) windows only some layers, and this "
                             f"model has window={config.window} in every layer: no family expresses both")
        hf.update(use_sliding_window=False, sliding_window=None)
    else:
        if config.qkv_bias:
            raise ValueError("to_huggingface: Mistral has no attention biases; this model has qkv_bias=True and a "
                             f"window={config.window}")
        hf["sliding_window"] = config.window
    return hf


def refuse_unmapped(model: GTransformer, family: str, checks: Iterable[tuple[str, bool, str]], *,
                    positions: tuple[str, ...] = ("rotary",)) -> None:
    """Raise a ``ValueError`` naming every field of ``model``'s config that the Llama-shaped ``family`` cannot express.

    The fields every such family has the same (pre-norm RMSNorm blocks, rotary positions of halves, SwiGLU, no
    output-layer bias, narrow heads, no untyped ``extra``) are checked here, then the family's own ``checks``.

    Args:
        model: the model to write.
        family: its name, for the message (``"Qwen3"``).
        checks: ``(field, whether it maps, what the family has)`` for the family's own fields.
        positions: the rotary layouts the family has (Llama's halves; DeepSeek-V3's either).

    Raises:
        ValueError: the message names each field that does not map, with its value.
    """
    config = model.config
    wrong = [f"{field}={getattr(config, field)!r} ({why})" for field, ok, why in (
        ("positions", config.positions in positions, f"{family}'s rotary positions: {' or '.join(positions)}"),
        ("prenorm", config.prenorm, f"{family}'s blocks are pre-norm: True"),
        ("norm", config.norm == "rms", f'{family} has RMSNorm: "rms"'),
        ("activation", config.activation == "swiglu", f'{family}\'s feed-forward network is "swiglu"'),
        ("head_bias", not config.head_bias, f"{family}'s output layer has no bias: False"),
        ("wide", not config.wide, f"{family}'s heads are narrow: False"),
        ("extra", not config.extra, f"{family} knows no variant's hyperparameters: {{}}"),
        *checks,
    ) if not ok]
    if wrong:
        raise ValueError(f"to_huggingface: this {type(model).__name__} does not map onto {family}: {'; '.join(wrong)}")


def shared_config_json(model: GTransformer) -> dict[str, Any]:
    """The ``config.json`` fields every Llama-shaped family writes alike (sizes, norms, rope, tying, dtype).

    Args:
        model: the model to write, its config already checked.

    Returns:
        The fields, ``intermediate_size`` from the first block's dense network (if any) or ``ff_hidden``.
    """
    config = model.config
    rope_parameters = {"rope_type": "default", "rope_theta": config.rotary_base}
    if config.rotary_scaling is not None:
        rope_parameters = {**rope_parameters, "rope_type": "llama3", **config.rotary_scaling}
    return {
        "vocab_size": config.num_tokens,
        "max_position_embeddings": config.seq_length,
        "hidden_size": config.emb,
        "intermediate_size": config.ff_hidden or gated_hidden_size(config.emb, config.ff_mult),
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads or config.heads,
        "head_dim": config.head_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "rope_parameters": rope_parameters,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_weights,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": str(model.embedding.tokens.weight.dtype).removeprefix("torch."),
    }


def empty_model(config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                device: torch.device) -> GTransformer:
    """The GTransformer of ``config`` with memory but no values yet, for :func:`load_weights` to fill.

    Args:
        config: what :func:`config_from_huggingface` made.
        reader: the folder's tensors (for the stored dtype).
        dtype: the parameters' floating dtype, or ``None``: the stored token embedding's.
        device: where the parameters go.

    Returns:
        The model, its parameters' values unset (the output layer tied to the embedding again, if tied).
    """
    return building.empty_model(GTransformer, config, dtype=dtype or stored_dtype(reader), device=device)


def stored_dtype(reader: WeightReader) -> torch.dtype:
    """The dtype of the stored token embedding: what a model loads in without a ``dtype``.

    Args:
        reader: the folder's tensors.

    Returns:
        The dtype.

    Raises:
        ValueError: the folder stores no token embedding.
    """
    embedding = stored_prefix(reader) + TOP[0][0]
    if embedding not in reader.names():
        raise ValueError(f"{reader.where} holds no {embedding}, which this config.json's model has")
    return reader.dtype(embedding)


def load_weights(model: GTransformer, reader: WeightReader) -> None:
    """Copy the tensors into ``model``'s parameters, one at a time, every name and shape checked.

    Args:
        model: the GTransformer :func:`config_from_huggingface`'s config built (its parameters' values unset).
        reader: the folder's tensors.

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says; ``lm_head.weight``
            is stored although tied and differs from the token embedding.
    """
    copy_weights(model, reader, lambda prefix: rules(model.config, prefix))


def copy_weights(model: GTransformer, reader: WeightReader, pairs: Callable[[str], Iterable[tuple[str, str]]], *,
                 more: Optional[Callable[[str, set[str]], None]] = None, ignored: tuple[str, ...] = ()) -> None:
    """Copy every pair's stored tensor into ``model``, then what ``more`` reads; refuse what is missing or left over.

    Every Llama-shaped family loads through this: the pairs name one parameter (or saved buffer) per stored tensor;
    a family with tensors that are not one parameter each (a mixture's experts, stacked) reads them in ``more``.

    Args:
        model: the model, its values unset.
        reader: the folder's tensors.
        pairs: the (stored, torchformer) pairs for the folder's prefix (:func:`rules`).
        more: called with the prefix and the set of names not read yet, from which it removes what it reads.
        ignored: stored names (their endings) with nothing to load (buffers older files store).

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says; ``lm_head.weight``
            is stored although tied and differs from the token embedding.
    """
    names = set(reader.names())
    prefix = stored_prefix(reader)
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}  # a tied weight once
    left = {name for name in names if not name.endswith(IGNORED + ignored)}
    for stored, name in pairs(prefix):
        if stored not in names:
            bare = (" (a bare LlamaModel's folder, its names without 'model.': it stores no output layer, and "
                    "config.json does not tie it to the embedding, tie_word_embeddings=false; load the folder of the "
                    "LlamaForCausalLM instead, or set tie_word_embeddings to true if the model was trained tied)"
                    if stored == OUTPUT[0] and not prefix else "")
            raise ValueError(f"{reader.where} holds no {stored}, which this config.json's model has{bare}")
        copy_tensor(reader, stored, targets[name])
        left.discard(stored)
    if more is not None:
        more(prefix, left)
    if model.config.tie_weights and OUTPUT[0] in left:  # a file may store the tied weight twice: the same
        embedding = targets["embedding.tokens.weight"].detach()
        if not torch.equal(reader.tensor(OUTPUT[0]).to(embedding), embedding):
            raise ValueError(f"{reader.where}: lm_head.weight differs from {prefix}{TOP[0][0]}, but config.json ties "
                             f"them (tie_word_embeddings=true)")
        left.discard(OUTPUT[0])
    if left:
        raise ValueError(f"{reader.where} holds tensors this config.json's model does not have (biases the config "
                         f"does not name? another architecture?): {', '.join(sorted(left)[:8])}"
                         f"{' ...' if len(left) > 8 else ''}")


def export_weights(model: GTransformer) -> dict[str, Tensor]:
    """``model``'s parameters under the Hugging Face names, as contiguous CPU tensors.

    Args:
        model: a GTransformer that :func:`config_to_huggingface` accepts.

    Returns:
        ``{name: tensor}``, ``lm_head.weight`` only when the output layer is not tied.
    """
    return export_pairs(model, rules(model.config))


def export_pairs(model: GTransformer, pairs: Iterable[tuple[str, str]]) -> dict[str, Tensor]:
    """``{stored name: tensor}`` for each pair, the tensors contiguous and on the CPU.

    Args:
        model: the model.
        pairs: (stored, torchformer) pairs (:func:`rules`).

    Returns:
        The tensors under their stored names.
    """
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {stored: targets[name].detach().contiguous().cpu() for stored, name in pairs}
