"""GPT-2 in the Hugging Face layout, and torchformer's :class:`~torchformer.models.GTransformer`: the two maps.

GPT-2 (Radford et al. 2019) is a ``GTransformer`` with four choices that are not torchformer's defaults, each a
config field: pre-norm blocks with a final LayerNorm (``prenorm=True``), biases in the query, key and value
projections (``qkv_bias=True``), GELU's tanh approximation (``activation="gelu_tanh"``, the ``gelu_new`` of
``config.json``) and an output layer that is the token embedding alone (``tie_weights=True``, ``head_bias=False``).
Everything else (learned positions, LayerNorm with eps ``1e-5``, a feed-forward network of ``4 e`` with biases,
narrow heads of ``e / h``) is torchformer's default already.

**The config.** :func:`config_from_huggingface` reads ``config.json``'s fields (:data:`DEFAULTS` fills a field left
out, as ``GPT2Config`` does) and refuses, naming the field and its value, any the library cannot express:
``scale_attn_by_inverse_layer_idx``, ``reorder_and_upcast_attn``, cross-attention, an
``activation_function`` torchformer does not have. :func:`config_to_huggingface` is the way back, and refuses a
config with a field GPT-2 cannot express (rotary positions, RMSNorm, ...), naming each.

**The weights.** :data:`TOP` and :data:`BLOCK` are the name map, read in both directions. GPT-2's code stores its
linear layers as ``Conv1D``, whose weight is ``(in, out)``: the transpose of ``nn.Linear``'s ``(out, in)``. And one
``c_attn`` layer computes queries, keys and values together, ``(e, 3 e)``; torchformer has three ``(e, e)`` layers:
a :class:`Rule` says both. The output layer ``lm_head.weight`` is ``wte.weight`` itself (``tie_word_embeddings``,
GPT-2's default); a checkpoint may store it anyway, which must then equal ``wte``.

Shapes: e embedding size (``n_embd``), v vocabulary size (``vocab_size``), p positions (``n_positions``), f the
feed-forward hidden size (``n_inner``, default ``4 e``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from torchformer._checks import is_int
from torchformer.config import TransformerConfig
from torchformer.models import GTransformer
import torchformer.pretrained.building as building
from torchformer.pretrained.folders import WeightReader

# The torchformer models this family writes (to_huggingface picks the family by the model's class).
MODELS = (GTransformer,)


@dataclass(frozen=True)
class Rule:
    """One GPT-2 tensor and the torchformer tensors it becomes.

    ``gpt2`` ``(..., k * n)`` is cut along its output dimension into ``k = len(torchformer)`` pieces, in order; a
    ``Conv1D`` weight (``conv1d=True``) is stored ``(in, out)`` and transposed to ``nn.Linear``'s ``(out, in)``
    first. Names in a block are relative to ``h.{i}.`` and ``blocks.blocks.{i}.``.

    Args:
        gpt2: GPT-2's name of the tensor (``attn.c_attn.weight``).
        torchformer: the names of the torchformer parameters it becomes, in the order of its pieces.
        conv1d: whether it is a ``Conv1D`` weight, stored ``(in, out)``.
    """

    gpt2: str
    torchformer: tuple[str, ...]
    conv1d: bool = False


# The name map. Read it top down: GPT-2's name, shape -> torchformer's name(s), shape.
TOP = (
    Rule("wte.weight", ("embedding.tokens.weight",)),  # (v, e): the token embedding, and the output layer (tied)
    Rule("wpe.weight", ("embedding.positions.embedding.weight",)),  # (p, e): one learned vector per position
    Rule("ln_f.weight", ("blocks.norm.weight",)),  # (e,): the final LayerNorm of a pre-norm stack
    Rule("ln_f.bias", ("blocks.norm.bias",)),  # (e,)
)
BLOCK = (
    Rule("ln_1.weight", ("norm1.weight",)),  # (e,): the LayerNorm before attention
    Rule("ln_1.bias", ("norm1.bias",)),  # (e,)
    Rule("attn.c_attn.weight",  # (e, 3e) -> 3 x (e, e): queries, keys, values, fused, stored (in, out)
         ("attention.toqueries.weight", "attention.tokeys.weight", "attention.tovalues.weight"), conv1d=True),
    Rule("attn.c_attn.bias",  # (3e,) -> 3 x (e,): qkv_bias
         ("attention.toqueries.bias", "attention.tokeys.bias", "attention.tovalues.bias")),
    Rule("attn.c_proj.weight", ("attention.unifyheads.weight",), conv1d=True),  # (e, e): mixes the heads
    Rule("attn.c_proj.bias", ("attention.unifyheads.bias",)),  # (e,)
    Rule("ln_2.weight", ("norm2.weight",)),  # (e,): the LayerNorm before the feed-forward network
    Rule("ln_2.bias", ("norm2.bias",)),  # (e,)
    Rule("mlp.c_fc.weight", ("ff.net.0.weight",), conv1d=True),  # (e, f) -> (f, e): W1
    Rule("mlp.c_fc.bias", ("ff.net.0.bias",)),  # (f,)
    Rule("mlp.c_proj.weight", ("ff.net.3.weight",), conv1d=True),  # (f, e) -> (e, f): W2
    Rule("mlp.c_proj.bias", ("ff.net.3.bias",)),  # (e,)
)
OUTPUT = Rule("lm_head.weight", ("head.toprobs.weight",))  # (v, e): stored only when tie_word_embeddings is false
# GPT2LMHeadModel prefixes the stack's names with "transformer." (lm_head has none); GPT2Model does not.
PREFIX = "transformer."
# Buffers older files store in each block (the causal mask, a constant): nothing to load.
IGNORED = ("attn.bias", "attn.masked_bias")

# GPT2Config's defaults: what a config.json that leaves a field out means.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "add_cross_attention": False, "tie_word_embeddings": True,
}
# config.json's activation_function -> torchformer's activation. gelu_new and gelu_pytorch_tanh are the same
# function (the tanh approximation); "gelu" is the exact one.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
# torchformer's activation -> the name written into config.json.
ACTIVATION_NAMES = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def rules(depth: int, tied: bool) -> Iterator[Rule]:
    """Every rule of a model with ``depth`` blocks, the block names made absolute (``h.0.ln_1.weight``).

    Args:
        depth: the number of blocks (``n_layer``).
        tied: whether the output layer is the token embedding (then ``lm_head.weight`` has no rule).

    Yields:
        The rules, in the order of the files: the top-level tensors, each block's, then the output layer.
    """
    yield from TOP
    for i in range(depth):
        for rule in BLOCK:
            yield Rule(f"h.{i}.{rule.gpt2}", tuple(f"blocks.blocks.{i}.{name}" for name in rule.torchformer),
                       rule.conv1d)
    if not tied:
        yield OUTPUT


def config_from_huggingface(hf: dict[str, Any]) -> TransformerConfig:
    """The :class:`~torchformer.config.TransformerConfig` of a GPT-2 ``config.json``.

    Args:
        hf: the JSON object of ``config.json`` (``model_type`` ``"gpt2"``); fields left out mean :data:`DEFAULTS`.

    Returns:
        The config of the equal :class:`~torchformer.models.GTransformer`: ``prenorm``, ``qkv_bias``,
        ``head_bias=False`` and ``activation="gelu_tanh"`` (for ``gelu_new``). ``dropout`` is the three dropouts'
        common value (they act in training only; torchformer also drops inside the feed-forward network).

    Raises:
        ValueError: a field holds a value torchformer cannot express; the message names the field and the value.
    """
    get = {**DEFAULTS, **hf}.get

    def refuse(field: str, why: str) -> ValueError:
        return ValueError(f"config.json: {field}={get(field)!r} is not supported: {why}")

    if get("activation_function") not in ACTIVATIONS:
        raise refuse("activation_function", f"torchformer has {', '.join(ACTIVATIONS)}")
    for field, supported in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                             ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if get(field) is not supported:
            raise refuse(field, f"torchformer's attention has only {field}={supported}")
    emb, inner = get("n_embd"), get("n_inner")
    dropouts = {get(field) for field in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(dropouts) != 1:
        raise refuse("attn_pdrop", f"torchformer has one dropout, and resid_pdrop={get('resid_pdrop')!r}, "
                                   f"embd_pdrop={get('embd_pdrop')!r} differ")
    tied = get("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise refuse("tie_word_embeddings", "expected true or false")
    try:
        return TransformerConfig(
            emb=emb, heads=get("n_head"), depth=get("n_layer"), seq_length=get("n_positions"),
            num_tokens=get("vocab_size"), norm_eps=get("layer_norm_epsilon"), prenorm=True,
            # n_inner as ff_mult where it is a multiple of n_embd (GPT-2's own 4 e), else as the size itself
            **({"ff_mult": 4} if inner is None else {"ff_mult": inner // emb} if is_int(inner) and is_int(emb)
               and inner % emb == 0 and inner > 0 else {"ff_hidden": inner}),
            activation=ACTIVATIONS[get("activation_function")], dropout=dropouts.pop(), tie_weights=tied,
            qkv_bias=True, head_bias=False,
        )
    except (TypeError, ValueError) as e:  # n_embd not divisible by n_head, a size that is not a positive int, ...
        raise ValueError(f"config.json: its sizes (n_embd, n_head, n_layer, n_positions, vocab_size) do not make a "
                         f"model: {e}") from e


def describes(model: GTransformer) -> bool:
    """Whether ``model`` is of GPT-2's shape: learned positions.

    Args:
        model: the GTransformer to write.

    Returns:
        True for learned positions; :func:`config_to_huggingface` then checks every field.
    """
    return model.config.positions == "learned"


def config_to_huggingface(model: GTransformer) -> dict[str, Any]:
    """GPT-2's ``config.json`` for ``model``, or an error naming every field that GPT-2 cannot express.

    Args:
        model: a :class:`~torchformer.models.GTransformer` (not a subclass: a variant computes something else).

    Returns:
        The JSON object of ``config.json``, for ``GPT2LMHeadModel``.

    Raises:
        ValueError: the model is a subclass of GTransformer, or its config has fields that do not map; the message
            names each, with its value.
    """
    config = model.config
    if type(model) is not GTransformer:
        raise ValueError(f"to_huggingface: a {type(model).__name__} is a variant of GTransformer, which GPT-2 cannot "
                         f"express; only a GTransformer itself maps onto GPT-2")
    wrong = [f"{field}={getattr(config, field)!r} ({why})" for field, ok, why in (
        ("positions", config.positions == "learned", 'GPT-2 adds learned positions: "learned"'),
        ("prenorm", config.prenorm, "GPT-2's blocks are pre-norm: True"),
        ("norm", config.norm == "layer", 'GPT-2 has LayerNorm: "layer"'),
        ("activation", config.activation in ACTIVATION_NAMES, f"GPT-2 has {', '.join(map(repr, ACTIVATION_NAMES))}"),
        ("head_bias", not config.head_bias, "GPT-2's output layer has no bias: False"),
        ("out_bias", config.out_bias, "GPT-2's attention output projection has a bias: True"),
        ("wide", not config.wide, "GPT-2's heads are narrow: False"),
        ("kv_heads", config.kv_heads in (None, config.heads), "GPT-2 gives every head its keys and values: None"),
        ("window", config.window is None, "GPT-2 attends to the whole context: None"),
        ("kqnorm", not config.kqnorm, "GPT-2 does not normalise queries and keys: False"),
        ("extra", not config.extra, "GPT-2 knows no variant's hyperparameters: {}"),
    ) if not ok]
    if wrong:
        raise ValueError(f"to_huggingface: this GTransformer does not map onto GPT-2: {'; '.join(wrong)}")
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.num_tokens,
        "n_positions": config.seq_length,
        "n_embd": config.emb,
        "n_layer": config.depth,
        "n_head": config.heads,
        "n_inner": model.blocks.blocks[0].ff.net[0].out_features,
        "activation_function": ACTIVATION_NAMES[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.norm_eps,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_weights,
        # GPT2Config's defaults are GPT-2's own token 50256, which another vocabulary need not have.
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": str(model.head.toprobs.weight.dtype).removeprefix("torch."),
    }


def empty_model(config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                device: torch.device) -> GTransformer:
    """The GTransformer of ``config`` with memory but no values yet (:mod:`~torchformer.pretrained.building`).

    Args:
        config: what :func:`config_from_huggingface` made.
        reader: the folder's tensors (for the stored dtype).
        dtype: the parameters' floating dtype, or ``None``: the stored token embedding's.
        device: where the parameters go.

    Returns:
        The model, its parameters' values unset (the output layer tied to the embedding again, if tied).
    """
    embedding = PREFIX + TOP[0].gpt2 if PREFIX + TOP[0].gpt2 in reader.names() else TOP[0].gpt2  # wte.weight
    return building.empty_model(GTransformer, config, dtype=dtype or reader.dtype(embedding), device=device)


def load_weights(model: GTransformer, reader: WeightReader) -> None:
    """Copy GPT-2's tensors into ``model``'s parameters, one tensor at a time, every name and shape checked.

    Args:
        model: the GTransformer :func:`config_from_huggingface`'s config built (its parameters' values unset).
        reader: the folder's tensors (:class:`~torchformer.pretrained.folders.WeightReader`).

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says; ``lm_head.weight``
            is stored although tied and differs from ``wte.weight``.
    """
    names = set(reader.names())
    prefix = PREFIX if any(name.startswith(PREFIX) for name in names) else ""
    params = dict(model.named_parameters())  # a tied weight once, under the embedding's name
    left = {name for name in names if name.removeprefix(prefix).split(".", 2)[-1] not in IGNORED}
    tied = model.config.tie_weights
    for rule in rules(model.config.depth, tied):
        stored = rule.gpt2 if rule is OUTPUT else prefix + rule.gpt2
        if stored not in names:
            raise ValueError(f"{reader.where} holds no {stored}, which GPT-2 with n_layer={model.config.depth} "
                             f"{'and tie_word_embeddings=false ' if rule is OUTPUT else ''}has")
        targets = [params[name] for name in rule.torchformer]
        # the shape GPT-2 stores: the targets side by side along the output dimension, transposed for Conv1D
        expected = (sum(t.shape[0] for t in targets), *targets[0].shape[1:])
        expected = tuple(reversed(expected)) if rule.conv1d else expected
        if reader.shape(stored) != expected:
            raise ValueError(f"{reader.where}: {stored} has shape {reader.shape(stored)}, but config.json makes it "
                             f"{expected}")
        with torch.no_grad():
            if len(targets) == 1 and not rule.conv1d:  # as stored: read straight into the parameter if it can be
                reader.copy_into(stored, targets[0])
            else:
                tensor = reader.tensor(stored)
                weight = tensor.T if rule.conv1d else tensor  # Conv1D (in, out) -> Linear (out, in): a view
                for target, piece in zip(targets, weight.split([t.shape[0] for t in targets], dim=0)):
                    target.copy_(piece)  # into the model's dtype and device
                del tensor, weight  # one tensor at a time
        left.discard(stored)
    if tied and "lm_head.weight" in left:  # a file may store the tied weight twice: it must be the same
        if not torch.equal(reader.tensor("lm_head.weight").to(params["embedding.tokens.weight"]),
                           params["embedding.tokens.weight"].detach()):
            raise ValueError(f"{reader.where}: lm_head.weight differs from {prefix}wte.weight, but config.json "
                             f"ties them (tie_word_embeddings=true)")
        left.discard("lm_head.weight")
    if left:
        raise ValueError(f"{reader.where} holds tensors GPT-2 does not have (another architecture?): "
                         f"{', '.join(sorted(left)[:8])}{' ...' if len(left) > 8 else ''}")


def export_weights(model: GTransformer) -> dict[str, Tensor]:
    """``model``'s parameters under GPT-2's names (``GPT2LMHeadModel``'s), as GPT-2 stores them.

    A model without ``qkv_bias`` gets zero biases for ``c_attn``: the same function.

    Args:
        model: a GTransformer that :func:`config_to_huggingface` accepts.

    Returns:
        ``{name: tensor}``, contiguous CPU tensors, ``lm_head.weight`` only when the output layer is not tied.
    """
    params = dict(model.named_parameters())
    tensors = {}
    for rule in rules(model.config.depth, model.config.tie_weights):
        # a bias a model without qkv_bias lacks: zeros of its weight's output size, dtype and device
        pieces = [params[name].detach() if name in params
                  else torch.zeros_like(params[name.removesuffix(".bias") + ".weight"][:, 0])
                  for name in rule.torchformer]
        joined = torch.cat(pieces, dim=0)  # 3 x (e, e) -> (3e, e), or one tensor as it is
        name = rule.gpt2 if rule is OUTPUT else PREFIX + rule.gpt2
        tensors[name] = (joined.T if rule.conv1d else joined).contiguous().cpu()
    return tensors

