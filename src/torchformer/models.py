"""Complete models assembled from the modules: a classifier, a generator and an encoder-decoder.

Every model is built from one :class:`~torchformer.config.TransformerConfig` and keeps it as ``model.config``.
The first positional arguments follow Peter Bloem's ``former``, so ``former`` experiments port by changing the
import; every other field of the config is a keyword argument (``GTransformer(256, 8, 4, 128, 256, prenorm=True)``),
or pass a whole config (``GTransformer(config=config)``, :meth:`TransformerModel.from_config`).

* :class:`CTransformer`: token ids ``(b, t)`` -> class log-probabilities ``(b, c)``.
* :class:`GTransformer`: token ids ``(b, t)`` -> log-probabilities of the next token ``(b, t, v)``, causally.
* :class:`Seq2SeqTransformer`: source ids ``(b, u)`` and target ids ``(b, t)`` -> ``(b, t, v_tgt)``.
* :class:`MLMTransformer`: token ids ``(b, t)`` -> log-probabilities of the original token at every position
  ``(b, t, v)``: a masked-language model (BERT), pretrained to start a classifier from
  (:meth:`CTransformer.load_encoder`).

With ``input_dim=d`` in the config, the classifier's input and the encoder-decoder's source are feature vectors
``(b, t, d)`` (audio frames, say) instead of token ids, projected by a linear layer
(:class:`~torchformer.nn.embedding.VectorEmbedding`). A generator feeds its own output tokens back in, so its input
is always token ids.

The models are the boundary: their ``forward`` checks its inputs (shapes, dtypes, and the values of ids and
positions on every device, unless ``check_values`` is off) before the modules inside check the shapes they get. A
variant of a model swaps the class of its blocks (``block_class``; see ``docs/extending.md``).

Shapes: b batch size, t (target) sequence length, u source length, d input features, e embedding size, c classes,
v vocabulary size.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

from torch import Tensor, nn

from torchformer._checks import (
    check_bool, check_cached_positions, check_document_values, check_documents, check_embeddings, check_features,
    check_mask, check_positions, check_positive_int, check_shift, check_tokens, is_int, values_checkable,
)
from torchformer.config import TransformerConfig
from torchformer.decoding import generation
from torchformer.nn.attention import MultiHeadAttention
from torchformer.nn.blocks import DecoderBlock, TransformerBlock
from torchformer.nn.cache import BlockCache, check_caches
from torchformer.nn.embedding import TokenEmbedding, input_embedding
from torchformer.nn.heads import ClassifierHead, GeneratorHead, MaskedLMHead
from torchformer.nn.masks import document_positions
from torchformer.nn.stacks import Decoder, Encoder


def clear_horizons(caches: Optional[list[BlockCache]]) -> None:
    """Let ``caches`` read every slot again after a call that set a horizon (a later direct call sets none).

    Args:
        caches: the caches of the call, or ``None``.
    """
    for cache in caches or ():
        cache.set_horizon(None)


def build_config(model: str, config: Optional[TransformerConfig], given: dict, options: dict) -> TransformerConfig:
    """The config of a model: ``config`` itself, or one made from former's positional arguments and keywords.

    Args:
        model: the model's name, for the messages (``"GTransformer"``).
        config: the whole config, if the caller passed one; ``None``: build it from ``given`` and ``options``.
        given: the model's positional arguments by field name (``{"emb": 128, ...}``); ``None`` for one not given.
        options: the other keyword arguments, each a field of :class:`~torchformer.config.TransformerConfig`.

    Returns:
        The config, checked.

    Raises:
        TypeError: a field is given twice (positionally and as a keyword), a keyword is not a field, ``config`` is
            not a :class:`~torchformer.config.TransformerConfig`, or ``config`` comes with other arguments.
        ValueError: a value is not valid (raised by :class:`~torchformer.config.TransformerConfig`).
    """
    named = {name: value for name, value in given.items() if value is not None}
    twice = sorted(set(named) & set(options))
    if twice:
        raise TypeError(f"{model} got {', '.join(twice)} twice, as a positional argument and as a keyword"
                        + (" (src_tokens is the config's num_tokens)" if "num_tokens" in twice else ""))
    if config is None:
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(TransformerConfig)})
        if unknown:
            raise TypeError(f"{model} got unexpected keyword argument(s) {', '.join(unknown)}; its options are the "
                            f"fields of TransformerConfig: "
                            f"{', '.join(f.name for f in dataclasses.fields(TransformerConfig))}")
        return TransformerConfig(**named, **options)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    if named or options:
        raise TypeError(f"{model}: pass either config= or the model's arguments ({', '.join([*named, *options])}), "
                        f"not both; use config.replace(...) to change a field")
    return config


def require_input(model: str, config: TransformerConfig) -> None:
    """A ``ValueError`` unless token ids have a vocabulary, ``num_tokens``, and feature vectors (``input_dim``) none.

    Args:
        model: the model's name, for the messages.
        config: the model's configuration.
    """
    if config.input_dim is None:
        config.require(model, "num_tokens")
    else:
        config.unused(model, "num_tokens")


def check_input(x: object, name: str, config: TransformerConfig, mask: Optional[Tensor], mask_name: str, *,
                like: Tensor, values: bool) -> Tensor:
    """Check a model's input and its optional padding mask ``(b, t)``; return the input for the embedding.

    Padding vectors are zeroed: they may hold anything, NaN included, and although attention never reads them,
    ``0 * NaN`` in the gradient of the input projection would still poison its weights.

    Args:
        x: the input: token ids ``(b, t)``, or feature vectors ``(b, t, d)`` with ``config.input_dim = d``.
        name: the input's name, for the messages (``"x"``, ``"src"``).
        config: the model's configuration: ``input_dim``, and ``num_tokens`` that bounds the ids.
        mask: ``(b, t)``, True for real positions, False for padding; ``None``: every position is real.
        mask_name: the mask's name, for the messages.
        like: a parameter of the model, whose dtype feature vectors must have (unless autocast is on).
        values: also check that token ids are in range (one read of the device; the model's ``check_values``).

    Returns:
        ``x`` as the embedding takes it: the ids, or the vectors with their padding zeroed.

    Raises:
        TypeError: ``x`` or ``mask`` is not a tensor of the right kind (ids, floating vectors of ``like``'s dtype, a
            bool mask).
        ValueError: a shape is wrong, or (with ``values``) an id is outside ``[0, num_tokens)``.
    """
    if config.input_dim is None:
        x = check_tokens(x, name, config.num_tokens, values=values)  # type: ignore[arg-type]
    else:
        x = check_features(x, name, config.input_dim, like=like)
    if mask is not None:
        check_mask(mask, mask_name, tuple(x.shape[:2]), device=x.device)
        if config.input_dim is not None:
            x = x.masked_fill(~mask[:, :, None], 0.0)
    return x


def check_token_types(token_types: object, x: Tensor, config: TransformerConfig, *, values: bool) -> Optional[Tensor]:
    """Check a model's optional token types ``(b, t)`` (BERT's segments) against its token ids ``x`` ``(b, t)``.

    Args:
        token_types: the type of each token, ids in ``[0, num_token_types)``; ``None``: every token of type 0.
        x: the token ids, whose shape and device ``token_types`` must have.
        config: the model's configuration: ``num_token_types`` bounds the types.
        values: also check that the types are in range (one read of the device; the model's ``check_values``).

    Returns:
        ``token_types`` as ``torch.long``, or ``None``.

    Raises:
        TypeError: ``token_types`` is not an integer tensor.
        ValueError: the model has no token types, or a shape, device or (with ``values``) a type is wrong.
    """
    if token_types is None:
        return None
    if config.num_token_types is None:
        raise ValueError("token_types must be None: this model has no token types (num_token_types=None in its "
                         "configuration)")
    token_types = check_tokens(token_types, "token_types", config.num_token_types, values=values)
    if tuple(token_types.shape) != tuple(x.shape):
        raise ValueError(f"token_types must have the shape of x, (b, t) = {tuple(x.shape)}, got "
                         f"{tuple(token_types.shape)}")
    if token_types.device != x.device:
        raise ValueError(f"token_types must be on x's device, {x.device}, got {token_types.device}")
    return token_types


def check_memory(memory: object, src_mask: Optional[Tensor], emb: int, *, like: Tensor) -> int:
    """Check the encoder's output a decoder reads, ``(b, u, emb)`` with ``u >= 1``, and its padding mask ``(b, u)``.

    Args:
        memory: the encoder's output (:meth:`Seq2SeqTransformer.encode`).
        src_mask: ``(b, u)``, True for real source positions; ``None``: all are real.
        emb: the model's embedding size ``e``.
        like: a parameter of the model, whose dtype ``memory`` must have (unless autocast is on).

    Returns:
        The batch size ``b``.

    Raises:
        TypeError: ``memory`` or ``src_mask`` is not a tensor of the right kind or dtype.
        ValueError: a shape is wrong, or ``memory`` holds no position.
    """
    b, u, _ = check_embeddings(memory, "memory", emb, like=like)
    if u == 0:
        raise ValueError(f"memory must hold at least one position (the encoder's output of a source), got shape "
                         f"{tuple(memory.shape)}")  # type: ignore[union-attr]
    if src_mask is not None:
        check_mask(src_mask, "src_mask", (b, u), "(b, u)", device=memory.device)  # type: ignore[union-attr]
    return b


class TransformerModel(nn.Module):
    """What every torchformer model shares: it is built from, and keeps, a :class:`TransformerConfig`.

    ``model.config`` is plain data; checkpoints and exported folders store it (:mod:`torchformer.saving`), so
    :func:`~torchformer.train.loading.load_model` rebuilds the model from its file alone, and loading the weights of
    another architecture is an error naming the differing fields.

    ``model.check_values`` (default ``True``) says whether ``forward`` also reads its inputs' *values* to check
    them: token ids in range, positions in range and consecutive, ``pool="first"``'s mask at position 0. On a GPU
    each check makes the host wait once, so a training loop that makes its own batches may set it ``False`` (on the
    model itself, not on a DDP or compile wrapper); shapes and dtypes are always checked (docs/models.md, "Error
    messages").

    Args:
        config: the architecture; kept as ``model.config``.

    Shapes:
        Each model says what its ``forward`` takes and returns: :class:`CTransformer`, :class:`GTransformer`,
        :class:`Seq2SeqTransformer`.
    """

    _check_values = True  # a subclass may change the default

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config

    @property
    def check_values(self) -> bool:
        """Whether ``forward`` reads its inputs' values to check them (see the class docstring)."""
        return self._check_values

    @check_values.setter
    def check_values(self, value: bool) -> None:
        self._check_values = check_bool(value, "check_values")  # "no" would be truthy

    def packed_positions(self, documents: Tensor, x: Tensor, name: str = "documents", dims: str = "(b, t)") -> Tensor:
        """The door check of packed rows' ``documents``; each token's position within its document.

        Args:
            documents: ``(b, t)`` integer, the document of each token of ``x`` (non-decreasing along a row, read
                when the model checks values).
            x: the token ids ``(b, t)``.
            name: what the messages call ``documents`` (a sequence-to-sequence model's ``src_documents``).
            dims: what they call its shape (the source's ``(b, u)``).

        Returns:
            ``(b, t)`` long, from 0 at each document's first token: what the position embedding reads.

        Raises:
            TypeError: ``documents`` is not an integer tensor.
            ValueError: its shape or device is not ``x``'s, or (values checked) it decreases along a row.
        """
        documents = check_documents(documents, x.size(0), x.size(1), x.device, name, dims)
        if self.check_values and values_checkable(documents):
            check_document_values(documents, name)
        return document_positions(documents)

    def check_cache_positions(self, positions: Optional[Tensor], x: Tensor, caches: Optional[list[BlockCache]],
                              capacity: Optional[int], horizon: Optional[int]) -> Tensor:
        """The door check of a decoder's ``positions`` and ``horizon``; gives the caches their horizon.

        Args:
            positions: the new tokens' positions ``(t,)``, or ``None`` (``0 .. t-1``, refused with caches).
            x: the new tokens ``(b, t)``.
            caches: the caches in use (already checked), or ``None``.
            capacity: their first position they cannot hold (``None``: ring caches, or no caches).
            horizon: the slots the call reads (see :meth:`GTransformer.forward`), or ``None``.

        Returns:
            The positions ``(t,)``, long.

        Raises:
            ValueError: a position out of range or not consecutive, a horizon without caches, out of range or not
                past the last position.
        """
        if caches is None:
            if horizon is not None:
                raise ValueError(f"horizon ({horizon!r}) says which cache slots a call reads: give it with caches")
            return check_positions(positions, x.size(1), x.device, limit=self.config.position_limit, cached=False,
                                   values=self.check_values)
        positions, horizon, span = check_cached_positions(positions, x.size(1), x.device,
                                                          limit=self.config.position_limit, capacity=capacity,
                                                          horizon=horizon, values=self.check_values)
        for cache in caches:  # for this call (the forward clears them after it): every block reads the same slots
            cache.set_horizon(horizon, span=span)
        return positions

    @classmethod
    def from_config(cls, config: TransformerConfig) -> TransformerModel:
        """A freshly initialised model of this class with the architecture ``config``.

        Args:
            config: the architecture; kept as ``model.config``.

        Returns:
            The model, with random initial weights.

        Raises:
            TypeError: ``config`` is not a :class:`~torchformer.config.TransformerConfig`.
            ValueError: ``config`` leaves out a field this model needs, or sets one it does not use.
        """
        return cls(config=config)

    @classmethod
    def import_path(cls) -> str:
        """Where the class can be imported from, ``"module:qualname"`` (``"__main__:MyGPT"`` for a script's class).

        Checkpoints and exported folders record it next to the class name, so that a variant's model is rebuilt
        from its file without naming its class (``load_model(path)`` finds it in the imported module).

        Returns:
            ``f"{cls.__module__}:{cls.__qualname__}"``, with ``pkg.mod`` for ``__main__`` when run as
            ``python -m pkg.mod`` (the name other programs import it by).
        """
        module = cls.__module__
        if module == "__main__":  # python -m pkg.mod: the script is importable as pkg.mod elsewhere
            spec = sys.modules["__main__"].__spec__  # None for a plain script or python -c
            module = spec.name if spec is not None else module
        return f"{module}:{cls.__qualname__}"

    def transformer_blocks(self) -> list[nn.Module]:
        """Every transformer block of the model, in the order they run.

        They are the units that FSDP shards one at a time (:func:`torchformer.train.distributed.wrap_model`). Each
        model class lists its own.

        Returns:
            The blocks, as a new list.

        Raises:
            NotImplementedError: the model class does not list its blocks.
        """
        raise NotImplementedError(f"{type(self).__name__} must list its blocks in transformer_blocks()")


class CTransformer(TransformerModel):
    """Sequence classifier: embedding -> :class:`~torchformer.nn.stacks.Encoder` -> pooled :class:`ClassifierHead`.

    With a padding ``mask`` (True = real token), padding never changes the result. ``pool`` (a config field) is
    ``"max"`` (default, as former's ``max_pool=True``), ``"mean"`` or ``"first"``; ``pooler=True`` adds BERT's pooler
    (dense, tanh, dropout) before the classes' linear layer. :meth:`from_encoder` starts one from a pretrained
    encoder (a loaded BERT).

    Args:
        emb: embedding size ``e``.
        heads: number of attention heads ``h``.
        depth: number of blocks.
        seq_length: the longest sequence the model takes (learned positions know no more).
        num_tokens: vocabulary size ``v`` (left out with ``input_dim``).
        num_classes: number of classes ``c``.
        config: a :class:`~torchformer.config.TransformerConfig` instead of the numbers.
        **options: any other field of :class:`~torchformer.config.TransformerConfig` (``prenorm=True``,
            ``pool="mean"``, ``input_dim=d``, ...).

    Shapes:
        ``x`` ``(b, t)`` ids or ``(b, t, d)`` vectors, ``mask`` ``(b, t)``, ``token_types`` ``(b, t)`` (with
        ``num_token_types``) -> ``(b, c)`` log-probabilities.
    """

    block_class: type[TransformerBlock] = TransformerBlock

    def __init__(self, emb: Optional[int] = None, heads: Optional[int] = None, depth: Optional[int] = None,
                 seq_length: Optional[int] = None, num_tokens: Optional[int] = None, num_classes: Optional[int] = None,
                 *, config: Optional[TransformerConfig] = None, **options: Any) -> None:
        given = dict(emb=emb, heads=heads, depth=depth, seq_length=seq_length, num_tokens=num_tokens,
                     num_classes=num_classes)
        config = build_config("CTransformer", config, given, options)
        config.require("CTransformer", "seq_length", "num_classes")
        config.unused("CTransformer", *OTHER_HEADS_FIELDS)
        require_input("CTransformer", config)
        if config.input_dim is not None:  # token types belong to token ids
            config.unused("CTransformer", "num_token_types")
        super().__init__(config)
        self.embedding = input_embedding(config)  # token ids, or feature vectors with input_dim
        self.encoder = Encoder(config, block_class=self.block_class)
        # BERT's pooler (config.pooler) drops its output with the model's dropout; without it the head has none.
        self.head = ClassifierHead(config.emb, config.num_classes, config.pool,  # type: ignore[arg-type]
                                   pooler=config.pooler, dropout=config.dropout if config.pooler else 0.0)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, *, token_types: Optional[Tensor] = None,
                documents: Optional[Tensor] = None) -> Tensor:
        """``(b, t) -> (b, c)``; ``token_types`` ``(b, t)``: each token's type (segment), with ``num_token_types``
        (default: all 0). ``documents`` ``(b, t)``: packed rows, as in :meth:`GTransformer.forward`; each document
        is then classified alone, ``(b, t) -> (b, t, c)``, row ``r``'s document ``d`` at ``[r, d]``
        (:class:`~torchformer.nn.heads.ClassifierHead`)."""
        x = check_input(x, "x", self.config, mask, "mask", like=self.head.toprobs.weight, values=self.check_values)
        token_types = check_token_types(token_types, x, self.config, values=self.check_values)
        if (self.config.pool == "first" and mask is not None and self.check_values and values_checkable(mask)
                and not bool(mask[:, 0].all())):
            rows = (~mask[:, 0]).nonzero().flatten().tolist()
            raise ValueError(f"pool='first' classifies from position 0, but mask marks it as padding in rows "
                             f"{rows[:10]}{' ...' if len(rows) > 10 else ''}: pad on the right, or pool 'max'/'mean'")
        positions = check_positions(None, x.size(1), x.device, limit=self.config.position_limit)
        embedded = positions if documents is None else self.packed_positions(documents, x)  # (t,) or (b, t)
        if token_types is None:  # a VectorEmbedding (input_dim) takes no token types
            h = self.embedding(x, embedded)  # (b, t) or (b, t, d) -> (b, t, e)
        else:
            h = self.embedding(x, embedded, token_types=token_types)  # (b, t) -> (b, t, e)
        h = self.encoder(h, mask, positions=positions, documents=documents)
        return self.head(h, mask, documents)  # (b, t, e) -> (b, c), or (b, t, c) per document

    def self_attention_layers(self) -> list[MultiHeadAttention]:
        """The self-attention module of every block, first to last (for :mod:`torchformer.train.inspection`).

        Returns:
            Each block's ``attention``, a :class:`~torchformer.nn.attention.MultiHeadAttention`, as a new list.
        """
        return [block.attention for block in self.transformer_blocks()]

    def transformer_blocks(self) -> list[nn.Module]:
        """The encoder's blocks, in the order they run.

        Returns:
            The blocks, as a new list.
        """
        return list(self.encoder.blocks)

    @classmethod
    def from_encoder(cls, pretrained: TransformerModel, num_classes: int, **options: Any) -> CTransformer:
        """A classifier that starts from ``pretrained``'s embedding and encoder: fine-tuning's first step in one call.

        The classifier's config is ``pretrained``'s with the fields only another model's head reads
        (:data:`OTHER_HEADS_FIELDS`: ``tie_weights``, ``mlm_scale``, ...) back at their defaults, ``num_classes`` and
        ``options`` set; then :meth:`load_encoder` copies the encoder. The head is freshly initialised (from the
        global random generator), and the model is on ``pretrained``'s device and dtype, in training mode. For a
        BERT loaded with :func:`~torchformer.from_huggingface`, ``CTransformer.from_encoder(bert, 2, pool="first",
        pooler=True)`` is ``BertForSequenceClassification`` with a new pooler and classifier.

        Args:
            pretrained: the model whose embedding and encoder it starts from (an :class:`MLMTransformer`, say).
            num_classes: the number of classes ``c``.
            **options: other config fields of the classifier (``pool="first"``, ``pooler=True``, ``dropout=0.1``).

        Returns:
            The classifier.

        Raises:
            TypeError: ``pretrained`` is not a torchformer model.
            ValueError: ``options`` change a field of the encoder, or ``pretrained`` has no encoder
                (:meth:`load_encoder` names what differs).
        """
        if not isinstance(pretrained, TransformerModel):
            raise TypeError(f"pretrained must be a torchformer model (e.g. an MLMTransformer), got "
                            f"{type(pretrained).__name__}")
        defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig) if f.name in OTHER_HEADS_FIELDS}
        model = cls(config=pretrained.config.replace(**{**defaults, "num_classes": num_classes, **options}))
        weight = next(pretrained.parameters())  # the embedding's, floating: where and in which dtype the encoder is
        model.to(device=weight.device, dtype=weight.dtype)
        model.load_encoder(pretrained)
        return model

    def load_encoder(self, pretrained: TransformerModel) -> None:
        """Start from a pretrained encoder: copy the embedding and the encoder of ``pretrained`` into this model.

        The classifier head keeps its fresh initialisation: it is what fine-tuning learns first. The configuration of
        ``pretrained`` must equal this model's in every field that shapes the encoder or changes what it computes, and
        its blocks must be of the same classes; the fields of the head and of training (:data:`FINE_TUNING_FIELDS`:
        ``num_classes``, ``pool``, ``dropout``, ...) may differ, and ``seq_length`` too unless the positions are
        learned (:meth:`from_encoder` builds such a classifier and calls this).

        Args:
            pretrained: the model whose ``embedding`` and ``encoder`` are copied (onto this model's device and dtype).

        Raises:
            TypeError: ``pretrained`` is not a torchformer model.
            ValueError: the configurations differ in an encoder field (each one is named), or ``pretrained`` has no
                encoder of this layout (a generator's blocks are causal and are called ``blocks``).
        """
        if not isinstance(pretrained, TransformerModel):
            hint = " (pass the module itself, model._orig_mod, not the compiled wrapper)" if hasattr(
                pretrained, "_orig_mod") else ""
            raise TypeError(f"pretrained must be a torchformer model (e.g. an MLMTransformer), got "
                            f"{type(pretrained).__name__}{hint}")
        differ = [d for d in pretrained.config.differences(self.config) if d.split(":")[0] not in FINE_TUNING_FIELDS]
        # seq_length sizes the learned position table only; other schemes take any length.
        if pretrained.config.position_limit != self.config.position_limit:
            differ.append(f"learned positions: {pretrained.config.position_limit} vs {self.config.position_limit}")
        if differ:
            raise ValueError(f"the pretrained {type(pretrained).__name__}'s encoder differs from this classifier's "
                             f"(pretrained vs classifier): {'; '.join(differ)}")
        # Equal configs and weights can still compute differently: a variant's block class (docs/extending.md).
        kinds = [type(block).__name__ for block in pretrained.transformer_blocks()]
        own = [type(block).__name__ for block in self.transformer_blocks()]
        if kinds != own:
            raise ValueError(f"the pretrained {type(pretrained).__name__}'s blocks are {kinds}, this classifier's "
                             f"{own}: give the classifier the same block_class")
        parts = ("embedding.", "encoder.")
        state = {k: v for k, v in pretrained.state_dict().items() if k.startswith(parts)}
        wanted = {k for k in self.state_dict() if k.startswith(parts)}
        if set(state) != wanted:
            missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
            raise ValueError(f"the pretrained {type(pretrained).__name__} has no encoder of this classifier's layout: "
                             f"missing {missing[:5]}, unexpected {extra[:5]}")
        self.load_state_dict(state, strict=False)  # strict=False: the head is not in state, on purpose


# The fields a classifier does not use because another model's head reads them: CTransformer refuses them, and
# from_encoder sets them back to their defaults.
OTHER_HEADS_FIELDS = ("tgt_tokens", "decoder_depth", "tie_weights", "head_bias", "mlm_scale", "head_scale",
                      "share_embeddings", "logit_cap")
# The config fields a fine-tuned classifier may change from its pretrained encoder's: the heads' (mlm_scale is the
# masked-LM head's, which a classifier leaves at its default), training's, the encoder-decoder's decoder (no part of
# an encoder), and seq_length (compared as the learned positions' limit).
FINE_TUNING_FIELDS = frozenset({"num_classes", "pool", "pooler", "tie_weights", "mlm_scale", "head_scale",
                                "share_embeddings", "tgt_tokens", "decoder_depth", "dropout", "impl",
                                "checkpoint_blocks", "seq_length"})


class MLMTransformer(TransformerModel):
    """Masked language model (BERT): a bidirectional encoder that predicts the hidden tokens of its input.

    Some ids of ``x`` are replaced by a ``[MASK]`` id (:func:`torchformer.train.masked_lm.mask_tokens`); the output is
    the log-probabilities of the original token at every position. Unlike a :class:`GTransformer`, every position
    sees the whole sequence (no causal mask). Train with :func:`~torchformer.train.masked_lm.masked_lm_loss`, which
    counts the masked positions only; then start a classifier of the same configuration from it with
    :meth:`CTransformer.load_encoder`. The embedding and the encoder are named as in :class:`CTransformer`; the head
    is a :class:`~torchformer.nn.heads.MaskedLMHead`, tied to the embedding with ``tie_weights=True`` (as BERT).

    Args:
        emb: embedding size ``e``.
        heads: number of attention heads ``h``.
        depth: number of blocks.
        seq_length: the longest sequence the model takes (learned positions know no more).
        num_tokens: vocabulary size ``v``, ``[MASK]`` included.
        config: a :class:`~torchformer.config.TransformerConfig` instead of the numbers.
        **options: any other field of :class:`~torchformer.config.TransformerConfig` (``tie_weights=True``,
            ``prenorm=True``, ...).

    Shapes:
        ``x`` ``(b, t)`` ids, ``mask`` ``(b, t)``, ``token_types`` ``(b, t)`` -> ``(b, t, v)`` log-probabilities;
        with ``select`` ``(b, t)``, ``(n, v)`` for its ``n`` True positions.
    """

    block_class: type[TransformerBlock] = TransformerBlock

    def __init__(self, emb: Optional[int] = None, heads: Optional[int] = None, depth: Optional[int] = None,
                 seq_length: Optional[int] = None, num_tokens: Optional[int] = None, *,
                 config: Optional[TransformerConfig] = None, **options: Any) -> None:
        given = dict(emb=emb, heads=heads, depth=depth, seq_length=seq_length, num_tokens=num_tokens)
        config = build_config("MLMTransformer", config, given, options)
        config.require("MLMTransformer", "seq_length", "num_tokens")
        # Masked tokens are ids, so the input is too (no input_dim); no classes and no pooling: a token per position.
        config.unused("MLMTransformer", "num_classes", "tgt_tokens", "decoder_depth", "pool", "input_dim", "head_bias",
                      "pooler", "head_scale", "share_embeddings", "logit_cap")
        super().__init__(config)
        self.embedding = TokenEmbedding.from_config(config)
        self.encoder = Encoder(config, block_class=self.block_class)
        tie = self.embedding.tokens if config.tie_weights else None
        self.head = MaskedLMHead(config.emb, config.num_tokens, tie_to=tie,  # type: ignore[arg-type]
                                 eps=config.norm_eps, scale=config.mlm_scale)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, *, select: Optional[Tensor] = None,
                token_types: Optional[Tensor] = None, documents: Optional[Tensor] = None) -> Tensor:
        """``(b, t) -> (b, t, v)``; with ``select`` (bool ``(b, t)``, e.g. :attr:`MaskedTokens.chosen
        <torchformer.train.masked_lm.MaskedTokens.chosen>`) only the ``n`` selected positions' ``(n, v)``, in
        row-major order. Training needs no more: the loss counts the masked positions only, and the projection onto
        the vocabulary (``e * v`` per position) is most of the cost of a small model. ``token_types`` ``(b, t)``:
        each token's type (BERT's segment: 0 for sentence A, 1 for B), with ``num_token_types`` (default: all 0).
        ``documents`` ``(b, t)``: packed rows, as in :meth:`GTransformer.forward` (each document sees only itself,
        its positions counted from 0)."""
        x = check_input(x, "x", self.config, mask, "mask", like=self.embedding.tokens.weight,
                        values=self.check_values)
        token_types = check_token_types(token_types, x, self.config, values=self.check_values)
        if select is not None:
            check_mask(select, "select", tuple(x.shape), true_means="a position to predict")  # indexes: any device
        positions = check_positions(None, x.size(1), x.device, limit=self.config.position_limit)
        embedded = positions if documents is None else self.packed_positions(documents, x)  # (t,) or (b, t)
        h = self.embedding(x, embedded, token_types=token_types)  # (b, t) -> (b, t, e)
        h = self.encoder(h, mask, positions=positions, documents=documents)
        return self.head(h if select is None else h[select])  # (b, t, e) -> (b, t, v), or (n, e) -> (n, v)

    # The encoder is a classifier's, under the same name: its layers are listed the same way.
    self_attention_layers = CTransformer.self_attention_layers
    transformer_blocks = CTransformer.transformer_blocks


class GTransformer(TransformerModel):
    """Autoregressive generator (a GPT-style language model): causal blocks, next-token log-probabilities.

    The output at position ``i`` depends only on tokens ``0..i`` and predicts token ``i + 1``. ``mask`` marks real
    tokens (padding is never attended to); ``shift`` is each row's left padding, so that its first real token has
    position 0 (a batch of prompts of different lengths, see ``torchformer.generate``'s ``prompt_mask``).
    ``tie_weights=True`` shares the embedding with the output layer. To sample or beam-search, call
    ``model.generate(prompt, n)`` or ``model.beam_search(prompt, n, beam_size=k)`` (the functions of
    :mod:`torchformer.decoding.generation`).

    Args:
        emb: embedding size ``e``.
        heads: number of attention heads ``h``.
        depth: number of blocks.
        seq_length: the longest sequence the model takes (learned positions know no more).
        num_tokens: vocabulary size ``v``.
        config: a :class:`~torchformer.config.TransformerConfig` instead of the numbers.
        **options: any other field of :class:`~torchformer.config.TransformerConfig` (``positions="rotary"``,
            ``tie_weights=True``, ...).

    Shapes:
        ``x`` ``(b, t)`` ids, ``mask`` ``(b, t)``, ``positions`` ``(t,)``, ``shift`` ``(b,)``, ``documents``
        ``(b, t)`` -> ``(b, t, v)`` log-probabilities of the next token (``(b, n, v)`` with ``keep_last=n``).
    """

    block_class: type[TransformerBlock] = TransformerBlock

    def __init__(self, emb: Optional[int] = None, heads: Optional[int] = None, depth: Optional[int] = None,
                 seq_length: Optional[int] = None, num_tokens: Optional[int] = None, *,
                 config: Optional[TransformerConfig] = None, **options: Any) -> None:
        given = dict(emb=emb, heads=heads, depth=depth, seq_length=seq_length, num_tokens=num_tokens)
        config = build_config("GTransformer", config, given, options)
        config.require("GTransformer", "seq_length", "num_tokens")
        # input_dim is refused: generation feeds the model's own output tokens back in, so its input is token ids.
        config.unused("GTransformer", "num_classes", "tgt_tokens", "decoder_depth", "pool", "input_dim",
                      "num_token_types", "mlm_scale", "pooler", "share_embeddings")
        super().__init__(config)
        self.embedding = TokenEmbedding.from_config(config)
        self.blocks = Encoder(config, causal=True, block_class=self.block_class)
        tie = self.embedding.tokens if config.tie_weights else None
        self.head = GeneratorHead(config.emb, config.num_tokens, tie_to=tie,  # type: ignore[arg-type]
                                  bias=config.head_bias, scale=config.head_scale, cap=config.logit_cap)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, *, caches: Optional[list[BlockCache]] = None,
                positions: Optional[Tensor] = None, shift: Optional[Tensor] = None,
                horizon: Optional[int] = None, keep_last: Optional[int] = None,
                documents: Optional[Tensor] = None) -> Tensor:
        """``(b, t) -> (b, t, v)``. ``positions`` ``(t,)`` are the absolute positions of ``x``'s tokens (default
        ``0 .. t-1``). With ``caches`` (see :meth:`new_caches`), ``x`` holds only the new tokens and ``positions``
        must say where they go, e.g. ``torch.arange(cached, cached + t)``; the earlier positions' keys and values
        come from the caches. A compiled decoding step passes the same kind of tensor, whose value changes in place.
        ``horizon`` (with caches): attention reads the caches' slots ``0 .. horizon-1`` only, which must pass the
        last position; ``None``: one past the last position when the positions are read (eager), else every slot.

        ``mask`` ``(b, t)``, True at real tokens: padding is not attended to (a cache remembers which of its slots
        are padding). With ``shift`` ``(b,)`` (see the class docstring), row ``r``'s tokens have positions
        ``positions - shift[r]`` in the position embedding; attention keeps the slots ``positions``: the schemes
        inside attention see only distances, which a shift leaves alone.

        ``keep_last=n``: the head runs over the last ``n`` positions only, ``(b, n, v)`` (a prompt's next token
        needs the last one: the vocabulary projection and softmax of the others are skipped); ``None``: all.

        ``documents`` ``(b, t)``: rows that pack several documents (:mod:`torchformer.data.packing`), the document
        of each token, non-decreasing along a row. Each token then sees only its own document, and the position
        embedding counts from 0 at each document's first token (the schemes inside attention see distances, which
        packing leaves alone): every document's output is what it gets alone. Not with ``caches``, ``positions``
        or ``shift``.
        """
        x = check_tokens(x, "x", self.config.num_tokens, values=self.check_values)  # type: ignore[arg-type]
        if mask is not None:
            check_mask(mask, "mask", tuple(x.shape), device=x.device)
        if keep_last is not None and (not is_int(keep_last) or not 1 <= keep_last <= x.size(1)):
            raise ValueError(f"keep_last must be an int in [1, {x.size(1)}] (x's positions) or None, got {keep_last!r}")
        capacity = check_caches(caches, len(self.blocks.blocks))
        if caches is not None and x.size(1) > self.config.seq_length:  # a ring would keep less than its memory
            raise ValueError(f"x has {x.size(1)} positions, but with caches a call takes at most "
                             f"seq_length={self.config.seq_length}: feed a longer input a segment at a time")
        if documents is not None:
            if caches is not None:
                raise ValueError("documents (packed rows) are for whole sequences, as in training: give no caches "
                                 "with them")
            for name, given in [("positions", positions), ("shift", shift)]:
                if given is not None:
                    raise ValueError(f"documents (packed rows) count each document's positions from 0 themselves: "
                                     f"give no {name} with them")
            within = self.packed_positions(documents, x)  # (b, t)
        positions = self.check_cache_positions(positions, x, caches, capacity, horizon)
        try:  # from here on the caches hold this call's horizon: cleared however the call ends
            embedded = positions
            if shift is not None:
                shift = check_shift(shift, x.size(0), x.device)
                embedded = (positions[None, :] - shift[:, None]).clamp(min=0)  # (b, t); a padding slot gets 0
            if documents is not None:
                embedded = within  # (b, t): from 0 at each document's first token
            h = self.embedding(x, embedded)  # (b, t) -> (b, t, e)
            h = self.blocks(h, mask, positions=positions, caches=caches, documents=documents)  # (b, t, e)
            return self.head(h if keep_last is None else h[:, -keep_last:])  # -> (b, t, v) or (b, keep_last, v)
        finally:
            clear_horizons(caches)

    def generate(self, prompt: Tensor, max_new_tokens: int, **options: Any) -> Tensor | tuple[Tensor, Tensor]:
        """Extend ``prompt`` ``(b, t)`` to ``(b, t + max_new_tokens)``: :func:`torchformer.generate` on this model.

        Args:
            prompt: the token ids to continue, ``(b, t)``.
            max_new_tokens: how many tokens to add.
            **options: :func:`~torchformer.decoding.generation.generate`'s keyword arguments (``temperature``,
                ``top_k``, ``top_p``, ``eos``, ``prompt_mask``, ...), which it checks.

        Returns:
            The token ids ``(b, t + max_new_tokens)`` (and the log-probabilities with ``return_logprobs``).
        """
        return generation.generate(self, prompt, max_new_tokens, **options)

    def beam_search(self, prompt: Tensor, max_new_tokens: int, *, beam_size: int,
                    **options: Any) -> tuple[Tensor, Tensor]:
        """The best continuation of each prompt by beam search: :func:`torchformer.beam_search` on this model.

        Args:
            prompt: the token ids to continue, ``(b, t)``.
            max_new_tokens: how many tokens to add at most.
            beam_size: the hypotheses kept per prompt.
            **options: :func:`~torchformer.decoding.generation.beam_search`'s keyword arguments
                (``length_penalty``, ``eos``, ``use_cache``).

        Returns:
            ``(tokens, scores)``: ``(b, t + max_new_tokens)`` and ``(b,)``.
        """
        return generation.beam_search(self, prompt, max_new_tokens, beam_size=beam_size, **options)

    def new_caches(self, capacity: Optional[int] = None) -> list[BlockCache]:
        """Empty KV caches for incremental decoding, one per block.

        A cache zeroes its buffers when it allocates them, so a call that decodes few positions asks for few slots
        (:func:`~torchformer.decoding.generation.generate` asks for the prompt plus the new tokens).

        Args:
            capacity: slots of each cache, the most positions decoded with them; ``None``: ``seq_length``.
                More than ``seq_length`` serves only position schemes that accept later positions (the
                relative ones); learned positions refuse them.

        Returns:
            One empty :class:`~torchformer.nn.cache.BlockCache` per block, in block order; pass them to
            :meth:`forward` as ``caches``.

        Raises:
            ValueError: ``capacity`` is not a positive int.
        """
        capacity = self.config.seq_length if capacity is None else capacity  # (0 is an error, not the default)
        return [BlockCache(capacity) for _ in self.blocks.blocks]

    def new_memory(self, memory: int) -> list[BlockCache]:
        """Transformer-XL's segment memory: caches that keep the last ``memory + seq_length`` positions of a stream.

        Feed a stream one segment at a time, ``model(x, caches=mem, positions=torch.arange(start, start + t))``
        with ``t <= seq_length`` and ``start`` the segment's place in the stream: every layer attends over the
        ``memory`` positions before the segment (their keys and values kept from the earlier calls, without
        gradients) as well as over the segment's own, so at layer ``n`` information may come from about ``n``
        segments ago (Dai et al. 2019). A new stream starts from ``[c.reset() for c in mem]``. Positions grow
        without bound along a stream, so the model must see distances (rotary, ALiBi, the relative bias, or none);
        ``docs/long-context.md`` says why at length, and what the memory computes exactly.

        Args:
            memory: the positions kept before each segment, ``>= 1``.

        Returns:
            The caches, a :class:`~torchformer.nn.cache.BlockCache` per block in block order, each with a
            :class:`~torchformer.nn.cache.RingKVCache` of ``memory + seq_length`` slots.

        Raises:
            ValueError: ``memory`` is not a positive int, or the model adds positions to its embeddings.
        """
        check_positive_int(memory, "memory")
        if self.config.positions in ("learned", "sinusoidal"):
            raise ValueError(f"segment memory needs positions that attention sees as distances (positions='rotary', "
                             f"'alibi', 'relative' or 'none'), but this model has positions={self.config.positions!r}: "
                             f"along a stream positions grow without bound, past a learned table's seq_length rows, "
                             f"and absolute embeddings would tell memory and segment apart only by where the stream "
                             f"happens to be")
        return [BlockCache(memory + self.config.seq_length, ring=True) for _ in self.blocks.blocks]

    self_attention_layers = CTransformer.self_attention_layers  # the same: each block's attention, in order

    def transformer_blocks(self) -> list[nn.Module]:
        """The model's blocks, in the order they run.

        Returns:
            The blocks, as a new list.
        """
        return list(self.blocks.blocks)


class Seq2SeqTransformer(TransformerModel):
    """Encoder-decoder transformer (Vaswani et al.), e.g. for translation or sequence transduction.

    ``tgt`` is the target shifted right, starting with a BOS token (teacher forcing); ``src_mask`` marks real source
    tokens, and the decoder's cross-attention ignores the others. ``decoder_depth`` defaults to ``depth``. The source
    vocabulary is the config's ``num_tokens``; with ``input_dim=d`` the source is feature vectors ``(b, u, d)``
    instead (speech to text, say) and ``num_tokens`` is left out. To translate, pass the model to
    ``torchformer.seq2seq_generate(model, src, max_len, bos=..., eos=...)`` (:mod:`torchformer.decoding.generation`).

    Args:
        emb: embedding size ``e``.
        heads: number of attention heads ``h``.
        depth: number of blocks.
        seq_length: the longest sequence the model takes (learned positions know no more).
        src_tokens: the source vocabulary size (the config's ``num_tokens``).
        tgt_tokens: the target vocabulary size ``v``.
        config: a :class:`~torchformer.config.TransformerConfig` instead of the numbers.
        **options: any other field of :class:`~torchformer.config.TransformerConfig` (``decoder_depth``,
            ``input_dim``, ``share_embeddings``, ...).

    With ``share_embeddings=True`` one token table reads the source and the target, and with ``tie_weights`` it is
    also the output matrix: T5's one ``shared`` matrix.

    ``forward(src, tgt, src_mask=None, *, src_documents=None, tgt_documents=None)``; the documents of packed
    source and target rows as in :meth:`decode`.

    Shapes:
        ``src`` ``(b, u)`` ids or ``(b, u, d)`` vectors, ``tgt`` ``(b, t)``, ``src_mask`` ``(b, u)`` ->
        ``(b, t, v)`` log-probabilities of the next target token.
    """

    encoder_block_class: type[TransformerBlock] = TransformerBlock
    decoder_block_class: type[DecoderBlock] = DecoderBlock

    def __init__(self, emb: Optional[int] = None, heads: Optional[int] = None, depth: Optional[int] = None,
                 seq_length: Optional[int] = None, src_tokens: Optional[int] = None, tgt_tokens: Optional[int] = None,
                 *, config: Optional[TransformerConfig] = None, **options: Any) -> None:
        given = dict(emb=emb, heads=heads, depth=depth, seq_length=seq_length, num_tokens=src_tokens,
                     tgt_tokens=tgt_tokens)
        config = build_config("Seq2SeqTransformer", config, given, options)
        config.require("Seq2SeqTransformer", "seq_length", "tgt_tokens")
        config.unused("Seq2SeqTransformer", "num_classes", "pool", "num_token_types", "mlm_scale", "pooler")
        require_input("Seq2SeqTransformer", config)
        if config.share_embeddings and (config.input_dim is not None or config.num_tokens != config.tgt_tokens):
            raise ValueError(f"share_embeddings=True reads source and target tokens through one embedding: the "
                             f"source must be token ids of the target's vocabulary, num_tokens == tgt_tokens, got "
                             f"num_tokens={config.num_tokens}, tgt_tokens={config.tgt_tokens}, "
                             f"input_dim={config.input_dim}")
        super().__init__(config)
        self.src_embedding = input_embedding(config)  # token ids, or feature vectors with input_dim
        self.tgt_embedding = TokenEmbedding.from_config(config, num_tokens=config.tgt_tokens)
        if config.share_embeddings:  # T5's `shared`: one token table for both (a position table stays each one's)
            self.tgt_embedding.tokens.weight = self.src_embedding.tokens.weight
        self.encoder = Encoder(config, block_class=self.encoder_block_class)
        self.decoder = Decoder(config, block_class=self.decoder_block_class)
        tie = self.tgt_embedding.tokens if config.tie_weights else None
        self.head = GeneratorHead(config.emb, config.tgt_tokens, tie_to=tie,  # type: ignore[arg-type]
                                  bias=config.head_bias, scale=config.head_scale, cap=config.logit_cap)

    def encode(self, src: Tensor, src_mask: Optional[Tensor] = None, *,
               src_documents: Optional[Tensor] = None) -> Tensor:
        """Run the encoder: the source -> its output ``(b, u, e)``, the context of every decoder block.

        Args:
            src: the source, ids ``(b, u)``, or vectors ``(b, u, d)`` with ``input_dim=d``.
            src_mask: ``(b, u)``, True for real source positions, False for padding; ``None``: all are real.
            src_documents: ``(b, u)``, packed source rows: each token's document, as ``documents`` in
                :meth:`GTransformer.forward` (each document encoded alone); ``None``: one per row.

        Returns:
            The encoder's output ``(b, u, e)``: the ``memory`` that :meth:`decode` takes.
        """
        src = check_input(src, "src", self.config, src_mask, "src_mask", like=self.head.toprobs.weight,
                          values=self.check_values)
        positions = check_positions(None, src.size(1), src.device, limit=self.config.position_limit)
        if src_documents is None:
            return self.encoder(self.src_embedding(src, positions), src_mask, positions=positions)
        within = self.packed_positions(src_documents, src, "src_documents", "(b, u)")  # (b, u): from 0 in each
        return self.encoder(self.src_embedding(src, within), src_mask, positions=positions, documents=src_documents)

    def decode(self, tgt: Tensor, memory: Optional[Tensor] = None, src_mask: Optional[Tensor] = None, *,
               caches: Optional[list[BlockCache]] = None, positions: Optional[Tensor] = None,
               horizon: Optional[int] = None, tgt_documents: Optional[Tensor] = None,
               src_documents: Optional[Tensor] = None) -> Tensor:
        """Target ids ``(b, t)`` and encoder output ``(b, u, e)`` -> ``(b, t, tgt_tokens)`` log-probabilities.

        ``caches`` and ``positions`` work as in :meth:`GTransformer.forward`; with caches the memory is in them.
        Packed rows: ``tgt_documents`` ``(b, t)`` and ``src_documents`` ``(b, u)`` (both or neither) number the
        documents of each target row and of its source row, the same documents in the same order (target document
        ``d`` is the target of source document ``d``, as :func:`torchformer.data.packing.pack_pairs` packs them);
        each target document then sees only itself and reads only its source. Not with ``caches`` or ``positions``.

        Args:
            tgt: the target ids ``(b, t)``, starting with the BOS token (teacher forcing: the target shifted right).
            memory: the encoder's output ``(b, u, e)`` (:meth:`encode`); ``None`` with ``caches``.
            src_mask: ``(b, u)``, True for real source positions: cross-attention ignores the others. ``None``: all
                are real (and with ``caches``, which keep the mask :meth:`fill_caches` was given).
            caches: the decoder's caches (:meth:`new_caches`), filled with the memory (:meth:`fill_caches`);
                ``tgt`` then holds only the new tokens. ``None``: no cache.
            positions: the absolute positions ``(t,)`` of ``tgt``'s tokens; ``None``: ``0 .. t-1``.
            horizon: with ``caches``, the slots self-attention reads, as in :meth:`GTransformer.forward`.
            tgt_documents: ``(b, t)``, each target token's document in packed rows; ``None``: one per row.
            src_documents: ``(b, u)``, each source token's document (with ``tgt_documents``).

        Returns:
            The log-probabilities of the next target token at every position, ``(b, t, v)`` (``v = tgt_tokens``).

        Raises:
            ValueError: ``memory`` holds no position or another batch size than ``tgt``, is missing without caches
                or given with them, the caches were never filled, or a shape or position is wrong; only one of
                ``tgt_documents`` and ``src_documents``, or documents with caches or positions.
            TypeError: documents that are not integer tensors.
        """
        tgt = check_tokens(tgt, "tgt", self.config.tgt_tokens, values=self.check_values)  # type: ignore[arg-type]
        if caches is None:
            if memory is None:
                raise ValueError("memory must be given without caches: the encoder's output (b, u, e), from "
                                 "encode(src, src_mask)")
            b = check_memory(memory, src_mask, self.config.emb, like=self.head.toprobs.weight)
            if tgt.size(0) != b:
                raise ValueError(f"tgt must have the same batch size as src ({b}), got {tgt.size(0)}")
            if memory.device != tgt.device:
                raise ValueError(f"memory must be on tgt's device, {tgt.device}, got {memory.device}")
        elif memory is not None or src_mask is not None:
            raise ValueError("memory and src_mask must be None with caches: fill_caches(caches, memory, src_mask) "
                             "computed the memory's keys and values into them once, for every step")
        packed = {}
        if tgt_documents is not None or src_documents is not None:
            if tgt_documents is None or src_documents is None:
                raise ValueError("tgt_documents and src_documents go together (packed target rows and their source "
                                 "rows): give both or neither")
            if caches is not None or positions is not None:
                raise ValueError("documents (packed rows) are for whole sequences, as in training: give no caches "
                                 "or positions with them")
            u = memory.size(1)  # type: ignore[union-attr]
            src_documents = check_documents(src_documents, tgt.size(0), u, tgt.device, "src_documents", "(b, u)")
            if self.check_values and values_checkable(src_documents):
                check_document_values(src_documents, "src_documents")
            packed = {"documents": tgt_documents, "context_documents": src_documents}
        capacity = check_caches(caches, len(self.decoder.blocks))
        positions = self.check_cache_positions(positions, tgt, caches, capacity, horizon)
        embedded = positions if tgt_documents is None else self.packed_positions(tgt_documents, tgt, "tgt_documents")
        h = self.tgt_embedding(tgt, embedded)  # (b, t, e); with documents each counts its positions from 0
        try:
            return self.head(self.decoder(h, memory, None, src_mask, positions=positions, caches=caches, **packed))
        finally:
            clear_horizons(caches)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Optional[Tensor] = None, *,
                src_documents: Optional[Tensor] = None, tgt_documents: Optional[Tensor] = None) -> Tensor:
        memory = self.encode(src, src_mask, src_documents=src_documents)
        return self.decode(tgt, memory, src_mask, tgt_documents=tgt_documents, src_documents=src_documents)

    def generate(self, src: Tensor, max_len: int, *, bos: int, eos: int, **options: Any) -> Tensor:
        """Target ids for ``src`` (greedy, sampled or beam-searched): :func:`torchformer.seq2seq_generate`.

        Args:
            src: the source token ids ``(b, u)`` (or features ``(b, u, d)`` with ``config.input_dim``).
            max_len: the most target tokens to produce.
            bos: the id the decoder starts from.
            eos: the id that ends a target.
            **options: :func:`~torchformer.decoding.generation.seq2seq_generate`'s keyword arguments
                (``src_mask``, ``beam_size``, ``temperature``, ...).

        Returns:
            Target ids ``(b, max_len)``.
        """
        return generation.seq2seq_generate(self, src, max_len, bos=bos, eos=eos, **options)

    def new_caches(self, capacity: Optional[int] = None) -> list[BlockCache]:
        """Empty caches for the decoder's blocks, one per block.

        The cross-attention parts stay empty until :meth:`fill_caches` computes a source memory's keys and values.

        Args:
            capacity: slots of each self-attention cache: the most target positions decoded with the caches.
                ``None``: ``config.seq_length``.

        Returns:
            One empty :class:`~torchformer.nn.cache.BlockCache` per decoder block, in block order; pass them
            to :meth:`decode` as ``caches``.

        Raises:
            ValueError: ``capacity`` is not a positive int.
        """
        capacity = self.config.seq_length if capacity is None else capacity  # (0 is an error, not the default)
        return [BlockCache(capacity) for _ in self.decoder.blocks]

    def fill_caches(self, caches: list[BlockCache], memory: Tensor, src_mask: Optional[Tensor] = None) -> None:
        """Compute every decoder block's cross-attention keys and values of ``memory`` once, into ``caches``.

        Call it once per source, after :meth:`encode` and before the first :meth:`decode` step with the caches::

            memory = model.encode(src, src_mask)
            caches = model.new_caches()
            model.fill_caches(caches, memory, src_mask)
            logp = model.decode(bos, caches=caches, positions=torch.tensor([0]))  # no memory: it is in the caches

        Args:
            caches: the decoder's caches (:meth:`new_caches`), their cross-attention parts empty (a fresh list, or
                one :meth:`~torchformer.nn.cache.BlockCache.reset` for a new source).
            memory: the encoder's output ``(b, u, e)`` (:meth:`encode`).
            src_mask: ``(b, u)``, True for real source positions; ``None``: all are real. The caches keep it.

        Raises:
            ValueError: ``caches`` is not one BlockCache per decoder block, one of them is already filled, or
                ``memory`` or ``src_mask`` has a wrong shape.
            TypeError: ``memory`` or ``src_mask`` is of the wrong kind or dtype.
        """
        check_caches(caches, len(self.decoder.blocks))
        check_memory(memory, src_mask, self.config.emb, like=self.head.toprobs.weight)
        self.decoder.fill_caches(caches, memory, src_mask)

    def transformer_blocks(self) -> list[nn.Module]:
        """The encoder's blocks, then the decoder's: the order they run in.

        Returns:
            The blocks, as a new list.
        """
        return [*self.encoder.blocks, *self.decoder.blocks]


# The classes a checkpoint can name (load_model rebuilds them from their config); pass others explicitly.
MODEL_CLASSES: dict[str, type[TransformerModel]] = {
    cls.__name__: cls for cls in (CTransformer, GTransformer, Seq2SeqTransformer, MLMTransformer)}
