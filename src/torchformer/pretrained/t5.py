"""T5 and flan-T5 in the Hugging Face layout, and torchformer's :class:`~torchformer.models.Seq2SeqTransformer`.

T5 (Raffel et al. 2020) is an encoder-decoder with these choices away from torchformer's defaults, each a config
field:

* **positions**: no vectors added to the embeddings; a learned scalar per head and bucket of ``i - j`` added to
  the scores (``positions="relative"``, ``relative_buckets``, ``relative_max_distance``), **one table per stack**,
  stored in the first block and used by every self-attention layer of that stack (``relative_shared=True``): the
  encoder's buckets tell keys before from keys after the query, the decoder's (causal) see the past only; the
  cross-attention has none.
* **attention**: scores not divided by ``sqrt(s)`` (``attention_scale=1.0``: the factor was folded into the query
  weights when T5 was trained), heads of ``d_kv`` dimensions, which need not be ``d_model / num_heads``
  (``head_dim``: t5-3b and t5-11b), and no biases anywhere (``qkv_bias=False``, ``out_bias=False``).
* **blocks**: pre-norm (``prenorm=True``) with RMSNorm (``norm="rms"``; T5 calls it its LayerNorm) of eps
  ``layer_norm_epsilon`` (``norm_eps``, ``1e-6``), and a final norm per stack. The feed-forward network
  (``d_ff``: ``ff_hidden``) has no biases (``ff_bias=False``): T5 v1.0's ``feed_forward_proj="relu"`` is the plain
  ReLU network; T5 v1.1's and flan-T5's ``"gated-gelu"`` the gated unit with GELU's tanh approximation
  (``activation="geglu_tanh"``: ``wi_0`` the gate, ``wi_1`` the value).
* **embeddings and head**: one token table for source and target (``shared``: ``share_embeddings=True``). T5 v1.0
  ties it to the output layer too, and multiplies the decoder's last vectors by ``d_model ** -0.5`` before it
  (``tie_weights=True``, ``head_scale=True``); flan-T5 has an output layer of its own, without the factor
  (``tie_word_embeddings`` false). Neither has an output bias (``head_bias=False``).

transformers 5 writes ``tie_word_embeddings`` true for flan-T5 too (the factor then in ``scale_decoder_outputs``),
whose own output layer is told apart by the file: :func:`config_from_huggingface` reads the factor as transformers
does, :func:`empty_model` the file.

**The weights** need no cutting and no transposing: :data:`TOP`, :data:`RELATIVE`, :data:`ATTENTION`,
:data:`ENCODER_BLOCK`, :data:`DECODER_BLOCK` and :data:`FEED_FORWARD` are the name map, read in both directions.
A file may also store the shared table under ``encoder.embed_tokens.weight`` and ``decoder.embed_tokens.weight``,
and a tied ``lm_head.weight``: each must equal ``shared.weight``. Older files hold a relative table in the first
decoder block's cross-attention, which T5 never uses (transformers skips it): skipped too (:data:`IGNORED`).

**Generation**: the decoder starts from ``decoder_start_token_id`` (T5's is 0, its padding id): pass it as
``seq2seq_generate(model, src, n, bos=0, eos=1)``.

Shapes: e ``d_model``, v ``vocab_size``, h ``num_heads``, s ``d_kv``, f ``d_ff``, n ``relative_attention_num_buckets``.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from torchformer.config import TransformerConfig
from torchformer.models import Seq2SeqTransformer
import torchformer.pretrained.building as building
from torchformer.pretrained.folders import WeightReader, copy_tensor

MODELS = (Seq2SeqTransformer,)  # the classes this family writes (to_huggingface); describes() says which of them

# The name map, (T5's name, torchformer's name), each tensor as it is.
TOP = (
    ("shared.weight", "src_embedding.tokens.weight"),  # (v, e): the target's table too, and the tied output layer
    ("encoder.final_layer_norm.weight", "encoder.norm.weight"),  # (e,): the final RMSNorm of each pre-norm stack
    ("decoder.final_layer_norm.weight", "decoder.norm.weight"),  # (e,)
)
# Each stack's one table, stored in its first block; every self-attention layer of the stack adds its bias.
RELATIVE = (
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
     "encoder.blocks.0.attention.relative.table.weight"),  # (n, h): bidirectional buckets
    ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
     "decoder.blocks.0.attention.relative.table.weight"),  # (n, h): causal buckets
)
# An attention layer's four projections, after its name (SelfAttention, EncDecAttention) and torchformer's.
ATTENTION = (
    ("q.weight", "toqueries.weight"),  # (h s, e)
    ("k.weight", "tokeys.weight"),  # (h s, e)
    ("v.weight", "tovalues.weight"),  # (h s, e)
    ("o.weight", "unifyheads.weight"),  # (e, h s): mixes the heads
)
# A block's sublayers, numbered in T5's files: layer.0 self-attention, (decoder: layer.1 cross-attention), then the
# feed-forward network; each sublayer's RMSNorm sits before it (pre-norm). Names after "encoder.block.{i}." and
# "encoder.blocks.{i}." (the decoder's likewise); the feed-forward network's after its sublayer, FEED_FORWARD.
ENCODER_BLOCK = (
    *((f"layer.0.SelfAttention.{t5}", f"attention.{ours}") for t5, ours in ATTENTION),
    ("layer.0.layer_norm.weight", "norm1.weight"),  # (e,)
    ("layer.1.layer_norm.weight", "norm2.weight"),  # (e,): before the feed-forward network
)
DECODER_BLOCK = (
    *((f"layer.0.SelfAttention.{t5}", f"attention.{ours}") for t5, ours in ATTENTION),
    ("layer.0.layer_norm.weight", "norm1.weight"),  # (e,)
    *((f"layer.1.EncDecAttention.{t5}", f"cross_attention.{ours}") for t5, ours in ATTENTION),
    ("layer.1.layer_norm.weight", "norm_cross.weight"),  # (e,): before the cross-attention
    ("layer.2.layer_norm.weight", "norm2.weight"),  # (e,): before the feed-forward network
)
FF_SUBLAYER = {"encoder": "layer.1.DenseReluDense.", "decoder": "layer.2.DenseReluDense."}
FEED_FORWARD = {
    "plain": (("wi.weight", "ff.net.0.weight"),  # (f, e): W1, no bias
              ("wo.weight", "ff.net.3.weight")),  # (e, f): W2
    "gated": (("wi_0.weight", "ff.w1.weight"),  # (f, e): the gate's input, act(W1 x)
              ("wi_1.weight", "ff.v.weight"),  # (f, e): the value it gates, V x
              ("wo.weight", "ff.w2.weight")),  # (e, f): W2
}
OUTPUT = ("lm_head.weight", "head.toprobs.weight")  # (v, e): stored when untied (flan-T5)
# Second copies of the shared table, which some files store: each must equal shared.weight.
COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# A relative table in the first decoder block's cross-attention, in older files: T5 never uses it.
IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)

# feed_forward_proj -> torchformer's activation; transformers reads "gated-gelu" as the gated tanh-GELU
# ("gelu_new"), and any other "gated-X" as the gated unit with X.
ACTIVATIONS = {
    "relu": "relu",  # T5 v1.0
    "gelu": "gelu",  # the exact GELU
    "gelu_new": "gelu_tanh",  # GELU's tanh approximation
    "gated-gelu": "geglu_tanh",  # T5 v1.1, flan-T5, mT5
    "gated-gelu_new": "geglu_tanh",
    "gated-silu": "swiglu",
}
EXPORTED_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "geglu_tanh": "gated-gelu",
                        "swiglu": "gated-silu"}
GATED = ("geglu_tanh", "swiglu")

# T5Config's defaults: what a field left out of config.json means. n_positions is older files' (T5 has no
# largest position); torchformer takes it as seq_length, the slots of a decoding cache.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": None,
    "num_heads": 8, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", "is_encoder_decoder": True,
    "tie_word_embeddings": True, "n_positions": 512,
}


def rules(model: Seq2SeqTransformer) -> Iterator[tuple[str, str]]:
    """Every (T5 name, torchformer name) pair of ``model``, block names made absolute.

    Args:
        model: the Seq2SeqTransformer (its depths, activation and tying say which tensors there are).

    Yields:
        The pairs: the top-level tensors, the two relative tables, each encoder block's, each decoder block's,
        then the output layer if untied.
    """
    config = model.config
    ff = FEED_FORWARD["gated" if config.activation in GATED else "plain"]
    yield from TOP
    yield from RELATIVE
    for stack, block in (("encoder", ENCODER_BLOCK), ("decoder", DECODER_BLOCK)):
        for i in range(len(getattr(model, stack).blocks)):
            for t5, ours in (*block, *((FF_SUBLAYER[stack] + t5, ours) for t5, ours in ff)):
                yield f"{stack}.block.{i}.{t5}", f"{stack}.blocks.{i}.{ours}"
    if not config.tie_weights:
        yield OUTPUT


def describes(model: Seq2SeqTransformer) -> bool:
    """Whether ``model`` is written as T5: every Seq2SeqTransformer is, and :func:`config_to_huggingface` checks it.

    Args:
        model: the model to write.

    Returns:
        True.
    """
    return True


def config_from_huggingface(hf: dict[str, Any]) -> TransformerConfig:
    """The :class:`~torchformer.config.TransformerConfig` of a T5 ``config.json``.

    Args:
        hf: the JSON object of ``config.json`` (``model_type`` ``"t5"``); fields left out mean :data:`DEFAULTS`.

    Returns:
        The config of the equal :class:`~torchformer.models.Seq2SeqTransformer` (see the module's docstring).

    Raises:
        ValueError: a field holds a value torchformer cannot express; the message names the field and the value.
    """
    get = {**DEFAULTS, **hf}.get

    def refuse(field: str, why: str) -> ValueError:
        return ValueError(f"config.json: {field}={get(field)!r} is not supported: {why}")

    if get("feed_forward_proj") not in ACTIVATIONS:
        raise refuse("feed_forward_proj", f"torchformer's T5 has {', '.join(map(repr, ACTIVATIONS))}")
    if get("is_encoder_decoder") is not True:
        raise refuse("is_encoder_decoder", "T5ForConditionalGeneration is an encoder-decoder: true")
    tied = get("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise refuse("tie_word_embeddings", "expected true or false")
    scaled = get("scale_decoder_outputs") if "scale_decoder_outputs" in hf else tied  # transformers 5 writes it
    if not isinstance(scaled, bool):
        raise refuse("scale_decoder_outputs", "expected true or false")
    emb, heads, head_size = get("d_model"), get("num_heads"), get("d_kv")
    depth, decoder_depth = get("num_layers"), get("num_decoder_layers")
    try:
        narrow = head_size * heads == emb  # then torchformer's default head size, emb // heads
        return TransformerConfig(
            emb=emb, heads=heads, depth=depth, seq_length=get("n_positions"), num_tokens=get("vocab_size"),
            tgt_tokens=get("vocab_size"), decoder_depth=None if decoder_depth in (None, depth) else decoder_depth,
            head_dim=None if narrow else head_size, attention_scale=1.0, qkv_bias=False, out_bias=False,
            positions="relative", relative_buckets=get("relative_attention_num_buckets"),
            relative_max_distance=get("relative_attention_max_distance"), relative_shared=True,
            prenorm=True, norm="rms", norm_eps=get("layer_norm_epsilon"),
            activation=ACTIVATIONS[get("feed_forward_proj")], ff_hidden=get("d_ff"), ff_bias=False,
            dropout=get("dropout_rate"), share_embeddings=True, tie_weights=tied, head_scale=scaled,
            head_bias=False,
        )
    except (TypeError, ValueError) as e:  # a size that is not a positive int, too few buckets, ...
        raise ValueError(f"config.json: its values (d_model, num_heads, d_kv, d_ff, num_layers, "
                         f"num_decoder_layers, vocab_size, relative_attention_num_buckets, "
                         f"relative_attention_max_distance, layer_norm_epsilon, dropout_rate, n_positions) do not "
                         f"make a model: {e}") from e


def config_to_huggingface(model: Seq2SeqTransformer) -> dict[str, Any]:
    """T5's ``config.json`` for ``model``, or an error naming every field that T5 cannot express.

    Args:
        model: a :class:`~torchformer.models.Seq2SeqTransformer` (not a subclass: a variant computes something
            else).

    Returns:
        The JSON object of ``config.json``, for ``T5ForConditionalGeneration``. ``scale_decoder_outputs`` is written
        beside ``tie_word_embeddings``, as transformers 5 writes it; the special ids are T5's (padding and decoder
        start 0, end 1), which torchformer's model does not know.

    Raises:
        ValueError: the model is a subclass, or its config has fields that do not map; the message names each, with
            its value.
    """
    config = model.config
    if type(model) is not Seq2SeqTransformer:
        raise ValueError(f"to_huggingface: a {type(model).__name__} is a variant of Seq2SeqTransformer, which T5 "
                         f"cannot express; only a Seq2SeqTransformer itself maps onto T5")
    plain = config.activation not in GATED
    wrong = [f"{field}={getattr(config, field)!r} ({why})" for field, ok, why in (
        ("positions", config.positions == "relative", 'T5 adds a learned relative bias: "relative"'),
        ("relative_shared", config.relative_shared, "T5 has one relative table per stack: True"),
        ("attention_scale", config.attention_scale == 1.0, "T5 does not scale its scores: 1.0"),
        ("prenorm", config.prenorm, "T5's blocks are pre-norm: True"),
        ("norm", config.norm == "rms", 'T5 has RMSNorm: "rms"'),
        ("activation", config.activation in EXPORTED_ACTIVATIONS,
         f"T5 has {', '.join(map(repr, EXPORTED_ACTIVATIONS))}"),
        ("ff_bias", not (plain and config.ff_bias), "T5's feed-forward network has no biases: False"),
        ("qkv_bias", not config.qkv_bias, "T5's attention has no biases: False"),
        ("out_bias", not config.out_bias, "T5's attention has no biases: False"),
        ("head_bias", not config.head_bias, "T5's output layer has no bias: False"),
        ("share_embeddings", config.share_embeddings, "T5 has one token table for source and target: True"),
        ("input_dim", config.input_dim is None, "T5 reads token ids: None"),
        ("wide", not config.wide, "T5's heads are narrow (d_kv each): False"),
        ("kv_heads", config.kv_heads in (None, config.heads), "T5 gives every head its keys and values: None"),
        ("window", config.window is None, "T5 attends to the whole sequence: None"),
        ("kqnorm", not config.kqnorm, "T5 does not normalise queries and keys: False"),
        ("embedding_norm", not config.embedding_norm, "T5 does not normalise its embedding: False"),
        ("extra", not config.extra, "T5 knows no variant's hyperparameters: {}"),
    ) if not ok]
    if wrong:
        raise ValueError(f"to_huggingface: this Seq2SeqTransformer does not map onto T5: {'; '.join(wrong)}")
    ff = model.encoder.blocks[0].ff
    hidden = ff.w1.out_features if config.activation in GATED else ff.net[0].out_features
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": config.num_tokens,
        "d_model": config.emb,
        "d_kv": config.head_size,
        "d_ff": hidden,
        "num_layers": config.depth,
        "num_decoder_layers": len(model.decoder.blocks),
        "num_heads": config.heads,
        "relative_attention_num_buckets": config.relative_buckets,
        "relative_attention_max_distance": config.relative_max_distance,
        "dropout_rate": config.dropout,
        "layer_norm_epsilon": config.norm_eps,
        "feed_forward_proj": EXPORTED_ACTIVATIONS[config.activation],
        "is_encoder_decoder": True,
        "tie_word_embeddings": config.tie_weights,
        "scale_decoder_outputs": config.head_scale,
        "n_positions": config.seq_length,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "dtype": str(model.src_embedding.tokens.weight.dtype).removeprefix("torch."),
    }


def empty_model(config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                device: torch.device) -> Seq2SeqTransformer:
    """The Seq2SeqTransformer of ``config`` with memory but no values yet, for :func:`load_weights` to fill.

    Args:
        config: what :func:`config_from_huggingface` made.
        reader: the folder's tensors (for the stored dtype).
        dtype: the parameters' floating dtype, or ``None``: the stored shared table's.
        device: where the parameters go.

    Returns:
        The model, its parameters' values unset; the target's table and a tied output layer are the source's
        table again. A folder whose ``config.json`` says tied but which stores an ``lm_head.weight`` other than the
        shared table (what transformers 5 writes for flan-T5) gets an untied output layer, as transformers gives it.
    """
    stored = set(reader.names())
    if config.tie_weights and OUTPUT[0] in stored and not torch.equal(reader.tensor(OUTPUT[0]),
                                                                        reader.tensor(stored_table(reader))):
        config = config.replace(tie_weights=False)
    # The shared table, the tied output layer and each stack's relative table stay one tensor each.
    return building.empty_model(Seq2SeqTransformer, config, dtype=dtype or reader.dtype(stored_table(reader)),
                                device=device)  # type: ignore[return-value]


def stored_table(reader: WeightReader) -> str:
    """The name the shared token table is stored under: ``shared.weight``, or a copy's name if only that is there.

    Args:
        reader: the folder's tensors.

    Returns:
        ``shared.weight``, ``encoder.embed_tokens.weight`` or ``decoder.embed_tokens.weight``: the first stored;
        ``shared.weight`` when none is (the caller names it missing).
    """
    stored = set(reader.names())  # names() sorts every stored name: once, not once per candidate
    return next((name for name in (TOP[0][0], *COPIES) if name in stored), TOP[0][0])


def load_weights(model: Seq2SeqTransformer, reader: WeightReader) -> None:
    """Copy T5's tensors into ``model``'s parameters, one tensor at a time, every name and shape checked.

    Args:
        model: the Seq2SeqTransformer :func:`config_from_huggingface`'s config built (its parameters' values unset).
        reader: the folder's tensors.

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says; a stored copy of the
            shared table (``encoder.embed_tokens.weight``, ``decoder.embed_tokens.weight``, a tied
            ``lm_head.weight``) differs from it.
    """
    params = dict(model.named_parameters())  # each shared tensor once, under its first name
    left = set(reader.names()) - set(IGNORED)
    table = stored_table(reader)
    for stored, ours in rules(model):
        stored = table if stored == TOP[0][0] else stored
        if stored not in left:
            untied = " (tie_word_embeddings is false)" if (stored, ours) == OUTPUT else ""
            raise ValueError(f"{reader.where} holds no {stored}, which this config.json's T5 has{untied}")
        copy_tensor(reader, stored, params[ours])
        left.discard(stored)
    shared = params[TOP[0][1]].detach()
    copies = COPIES + ((OUTPUT[0],) if model.config.tie_weights else ())  # a tied one equals it (empty_model)
    for copy in (name for name in copies if name in left):
        if not torch.equal(reader.tensor(copy).to(shared), shared):
            raise ValueError(f"{reader.where}: {copy} differs from {table}, but T5 shares one table")
        left.discard(copy)
    if left:
        raise ValueError(f"{reader.where} holds tensors this config.json's T5 does not have (another architecture?): "
                         f"{', '.join(sorted(left)[:8])}{' ...' if len(left) > 8 else ''}")


def export_weights(model: Seq2SeqTransformer) -> dict[str, Tensor]:
    """``model``'s parameters under T5's names, as contiguous CPU tensors.

    Args:
        model: a Seq2SeqTransformer that :func:`config_to_huggingface` accepts.

    Returns:
        ``{name: tensor}``: the shared table once, ``lm_head.weight`` only when the output layer is not tied.
    """
    params = dict(model.named_parameters())
    return {stored: params[ours].detach().contiguous().cpu() for stored, ours in rules(model)}
