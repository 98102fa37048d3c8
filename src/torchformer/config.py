"""The configuration of a transformer: every architectural choice, as plain data.

Every model is built from one :class:`TransformerConfig` and keeps it as ``model.config``. The config is what a
checkpoint stores next to the weights, so a model can be rebuilt from its file alone, and a checkpoint loaded into
a model of another shape fails with a message naming the fields that differ. Blocks and stacks are built from the
same object, so an option is defined once, here, instead of being passed through every layer.

The first five fields are ``former``'s positional arguments (``emb, heads, depth, seq_length, num_tokens``). The
fields a model does not use keep their defaults (a generator has no ``num_classes``).

Every field is checked when the config is made, so a wrong value fails with its name, what was expected and what
was received, before any module is built.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from torchformer._checks import (
    check_bool, check_choice, check_heads, check_int_at_least, check_positive_float, check_positive_int,
    check_probability, fields_from_dict,
)

# Absolute schemes add a vector to each token's embedding; the others act inside attention, on every layer.
ABSOLUTE_POSITIONS = ("learned", "sinusoidal", "none")
RELATIVE_POSITIONS = ("rotary", "rotary_interleaved", "alibi", "relative")
ROTARY = ("rotary", "rotary_interleaved")  # the schemes that read rotary_base and rotary_scaling
POSITIONS = ABSOLUTE_POSITIONS + RELATIVE_POSITIONS
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "relu2", "swiglu", "geglu", "geglu_tanh")
NORMS = ("layer", "rms")
POOLING = ("max", "mean", "first")
IMPLEMENTATIONS = ("sdpa", "reference", "flex")
SPARSE_PATTERNS = ("strided", "fixed")  # the sparse transformer's (torchformer.nn.masks)

# The keys of Llama-3.1's rotary frequency scaling (rotary_scaling), each a positive number.
ROTARY_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def check_rotary_scaling(scaling: object) -> Optional[dict]:
    """``rotary_scaling`` checked, as a new plain dict of floats (``None`` stays ``None``).

    Args:
        scaling: ``None``, or a mapping with exactly the keys of :data:`ROTARY_SCALING_KEYS`.

    Returns:
        ``None``, or a new dict: each value a float, ``original_max_position_embeddings`` an int.

    Raises:
        ValueError: another key set, a value that is not a positive number, or ``high_freq_factor`` not above
            ``low_freq_factor``.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping) or set(scaling) != set(ROTARY_SCALING_KEYS):
        raise ValueError(f"rotary_scaling must be None or a dict with the keys {', '.join(ROTARY_SCALING_KEYS)} "
                         f"(Llama-3.1's rope_scaling), got {scaling!r}")
    plain = {key: check_positive_float(scaling[key], f"rotary_scaling[{key!r}]") for key in ROTARY_SCALING_KEYS}
    plain["original_max_position_embeddings"] = check_positive_int(
        scaling["original_max_position_embeddings"], "rotary_scaling['original_max_position_embeddings']")
    if not plain["high_freq_factor"] > plain["low_freq_factor"]:
        raise ValueError(f"rotary_scaling's high_freq_factor must be above its low_freq_factor, got {scaling!r}")
    return plain


def check_extra(extra: object) -> dict:
    """A variant's own hyperparameters, checked, as a new plain dict.

    String keys, JSON values that read back the same (``config.json`` and checkpoints store them), so a tuple is
    refused (JSON reads it back as a list).

    Args:
        extra: the mapping given as ``TransformerConfig(extra=...)``.

    Returns:
        What JSON read back, a new ``dict`` with the same items: plain types (a NumPy float becomes a float, which a
        checkpoint can store), and nothing shared with the caller's dicts and lists.

    Raises:
        TypeError: ``extra`` is not a mapping, or a key is not a str.
        ValueError: a value is not JSON, or would not read back the same.
    """
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a dict of a variant's own hyperparameters, got {type(extra).__name__}")
    bad_keys = [key for key in extra if not isinstance(key, str)]
    if bad_keys:
        raise TypeError(f"extra's keys must be str (JSON's object keys), got {bad_keys[0]!r}")
    try:
        plain = json.loads(json.dumps(dict(extra), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra must hold JSON values (str, int, float, bool, None, lists and dicts of them): "
                         f"{e}") from e
    if plain != extra:
        raise ValueError(f"extra must read back from JSON as it is (a tuple comes back as a list: use lists), got "
                         f"{extra!r}")
    return plain


@dataclass(frozen=True)
class PartOptions:
    """The typed options of a part (a variant's, or one of the library's): kept in ``TransformerConfig.options``.

    A subclass is a frozen dataclass whose fields all have defaults and hold JSON values (``int``, ``float``,
    ``bool``, ``str``, ``None``, and tuples of them); its ``__post_init__`` checks them (calling
    ``super().__post_init__()`` first), so a wrong value fails when the config is made, naming the field. A part
    reads its options with ``config.options_of(MyOptions)`` in its ``from_config``. The config saves each as its
    class's import path and fields, and reads it back by finding the class in a module already imported (the rule
    of :func:`~torchformer.train.loading.load_model` for model classes): ``load_model`` rebuilds the variant with
    its options, and nothing a file names is imported.

    Example::

        @dataclass(frozen=True)
        class GateOptions(PartOptions):
            init: float = 0.0

            def __post_init__(self):
                super().__post_init__()
                check_real(self.init, "init")  # any check of yours

        config = TransformerConfig(64, 4, options=(GateOptions(init=1.0),))
        config.options_of(GateOptions).init   # 1.0; GateOptions() for a config without them

    Raises:
        TypeError: a field holds something other than a JSON value or a tuple of them.
    """

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):  # JSON's arrays: kept as tuples, so the options stay hashable
                object.__setattr__(self, field.name, value := _as_tuples(value))
            if not _plain(value):
                raise TypeError(f"{type(self).__name__}.{field.name} must hold a JSON value (str, int, float, bool, "
                                f"None, or a tuple of them), got {type(value).__name__} {value!r:.60}")

    @classmethod
    def import_path(cls) -> str:
        """Where the class is imported from: what a saved config records.

        Returns:
            ``"module:qualname"``.
        """
        return f"{cls.__module__}:{cls.__qualname__}"

    def to_dict(self) -> dict:
        """The options as plain data: what :meth:`TransformerConfig.to_dict` stores.

        Returns:
            ``{"class": import path, **fields}``, tuples as lists.
        """
        return {"class": self.import_path(), **json.loads(json.dumps(dataclasses.asdict(self)))}


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, bool, int, float))


def options_from_dict(data: object) -> PartOptions:
    """The options :meth:`PartOptions.to_dict` saved, their class found in a module already imported.

    Args:
        data: ``{"class": "module:qualname", **fields}``.

    Returns:
        The options, checked as new ones are.

    Raises:
        ValueError: ``data`` is not such a dict, the class's module is not imported (the message says to import
            it), or it names no :class:`PartOptions` subclass; a field is unknown or wrong.
    """
    import sys

    if not isinstance(data, Mapping) or not isinstance(data.get("class"), str) or ":" not in data["class"]:
        raise ValueError(f"a saved config's options must be {{\"class\": \"module:qualname\", ...fields}}, got "
                         f"{data!r:.80}")
    path = data["class"]
    module_name, _, qualname = path.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        raise ValueError(f"the config holds options of class {path}, whose module {module_name} is not imported: "
                         f"import it before loading (torchformer never imports a module a file names)")
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, PartOptions)):
        raise ValueError(f"the config holds options of class {path}, which names no PartOptions subclass")
    return fields_from_dict(cls, {k: v for k, v in data.items() if k != "class"})


def check_options(options: object) -> tuple:
    """``TransformerConfig.options`` checked: a tuple of :class:`PartOptions`, at most one of each class.

    Args:
        options: a tuple or list of options (or, read back from a file, of their dicts).

    Returns:
        The options as a tuple.

    Raises:
        TypeError: ``options`` is not a sequence of :class:`PartOptions`.
        ValueError: two options of one class.
    """
    if not isinstance(options, (tuple, list)):
        raise TypeError(f"options must be a tuple of PartOptions, got {type(options).__name__}")
    built = tuple(options_from_dict(o) if isinstance(o, Mapping) else o for o in options)
    for o in built:
        if not isinstance(o, PartOptions):  # an argument's type, as for a tensor: no dispatch on it
            raise TypeError(f"options must hold PartOptions (frozen dataclasses of a part's options), got "
                            f"{type(o).__name__}")
    classes = [type(o) for o in built]
    twice = sorted({cls.__name__ for cls in classes if classes.count(cls) > 1})
    if twice:
        raise ValueError(f"options must hold at most one of each class, got {', '.join(twice)} more than once")
    return built


@dataclass(frozen=True)
class TransformerConfig:
    """The architecture of a transformer (frozen: change a copy with :meth:`replace`).

    Every field from ``qkv_bias`` on was added later, and its default is what the models did before it existed.

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: transformer blocks (of the encoder, for an encoder-decoder model).
        seq_length: the longest sequence the model is built for (the learned position table has this many rows,
            and a KV cache this many slots).
        num_tokens: vocabulary size of the input (the source, for an encoder-decoder model).
        num_classes: classes of a classifier (:class:`~torchformer.models.CTransformer` only).
        tgt_tokens: target vocabulary size (:class:`~torchformer.models.Seq2SeqTransformer` only).
        decoder_depth: blocks of the decoder of an encoder-decoder model; ``None`` means ``depth``.
        wide: wide attention heads (every head sees all ``e`` dimensions) instead of narrow ones (``e // h`` each).
        positions: added to the embeddings: ``"learned"``, ``"sinusoidal"`` or ``"none"``; or acting inside
            attention: ``"rotary"`` (RoPE, pairing each half of a head with the other, as Llama and Hugging Face),
            ``"rotary_interleaved"`` (RoPE on adjacent pairs, as the paper and torchformer before 0.5), ``"alibi"``
            or ``"relative"`` (T5-style learned bias).
        dropout: dropout after the embedding, on the attention weights, inside the feed-forward network and after
            each sublayer.
        prenorm: the norm (``norm``) before each sublayer (GPT-2) instead of after the residual (Vaswani et al.,
            former).
        ff_mult: hidden size of the feed-forward network, as a multiple of ``emb``.
        activation: the feed-forward nonlinearity: ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"`` (GELU's tanh
            approximation, GPT-2's ``gelu_new``), ``"relu2"`` (ReLU squared), or a gated linear unit, ``"swiglu"``,
            ``"geglu"`` or ``"geglu_tanh"`` (its gate GELU's tanh approximation, as T5 v1.1 and flan-T5), whose
            hidden size is 2/3 of ``ff_mult * emb`` unless ``ff_hidden`` is set, so the parameter count stays about
            the same.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm) in the blocks and at the end of a pre-norm stack.
        kv_heads: heads of keys and values (grouped-query attention): ``None`` means ``heads``; 1 is multi-query
            attention. Must divide ``heads``.
        window: sliding-window (local) attention: each query sees only the last ``window`` positions (itself
            included). ``None``: no window.
        input_dim: feed dense ``(b, t, input_dim)`` vectors through a linear projection instead of token ids
            (audio frames, say); ``None``: token ids.
        kqnorm: layer-normalise keys and queries per head (bounds the attention logits).
        impl: ``"sdpa"`` (fused ``scaled_dot_product_attention``), ``"reference"`` (matmul-softmax-matmul) or
            ``"flex"`` (``flex_attention`` with a block mask, which skips what a ``sparse`` pattern rules out once
            compiled; no dropout).
        pool: how a classifier pools positions: ``"max"``, ``"mean"`` or ``"first"``.
        tie_weights: share the token embedding with the output layer (of a generator, or the masked-language head).
        checkpoint_blocks: activation checkpointing (docs/going-big.md): while training, keep only each block's
            input and recompute the rest in the backward pass: one block's activations instead of all, for about a
            third more compute, with the same results and gradients, dropout included. Not architecture: a
            checkpoint saved with it loads into a model without it. Never applies while decoding with a KV cache.
        extra: a variant's own hyperparameters, ``{name: value}`` with JSON values, untyped (``options`` is the
            typed, checked way). The built-in modules ignore it; a variant reads it in its ``from_config``, and it
            is saved with the rest of the config, so the variant comes back with it.
        qkv_bias: a bias in the query, key and value projections of every attention layer (GPT-2, BERT). The
            output projection (``unifyheads``) has a bias either way.
        head_bias: a bias in the output layer of a generator (:class:`~torchformer.models.GTransformer`,
            :class:`~torchformer.models.Seq2SeqTransformer`); ``False`` as GPT-2 (whose output layer is the tied
            embedding alone). The other heads do not read it.
        norm_eps: the ``eps`` of the blocks' norms and of a pre-norm stack's final norm (``norm``), added to the
            variance (LayerNorm) or the mean square (RMSNorm) before the square root: ``1e-5`` (the default,
            PyTorch's and Llama-3's), ``1e-6`` (Llama-2, T5), ``1e-12`` (BERT). The embedding's norm
            (``embedding_norm``) and the masked-LM head's LayerNorm use it too.
        ff_hidden: the hidden size of every feed-forward network, when it is not what ``ff_mult`` gives (Llama-2
            7B's 11008 at ``emb`` 4096); ``None``: ``ff_mult * emb``, for a gated unit 2/3 of it to the nearest
            multiple of 16 (``nn.feedforward.gated_hidden_size``).
        out_bias: a bias in the output projection of every attention layer (``unifyheads``); ``False`` as Llama,
            Mistral and Qwen2.
        rotary_base: the base of rotary positions' frequencies, ``theta_m = base^(-2m/s)``: 10000 (the default, the
            paper's); Llama-3 uses 500000. Only with ``positions="rotary"`` or ``"rotary_interleaved"``.
        rotary_scaling: Llama-3.1's rescaling of the rotary frequencies for long contexts, ``{"factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}``
            (:class:`~torchformer.nn.relative.Rotary` says what it does); ``None``: none.
        num_token_types: token-type (segment) embeddings: a learned vector for each of this many types, added to
            each token's embedding, the type given per position as the models' ``token_types`` input (BERT's
            sentence A and B: 2). ``None``: no such vectors and no such input.
        embedding_norm: normalise the embedding (token + position + token-type vectors) with ``norm`` and
            ``norm_eps`` before its dropout, as BERT does.
        mlm_scale: the masked-LM head (:class:`~torchformer.models.MLMTransformer`) multiplies its logits by
            ``e ** -0.5`` (the reason is in :class:`~torchformer.nn.heads.MaskedLMHead`); ``False``: plain dot
            products with the output matrix, as BERT. The other heads do not read it.
        pooler: a classifier (:class:`~torchformer.models.CTransformer` only) passes its pooled vector through a
            dense layer and a tanh, then dropout (``dropout``), before the linear layer that gives the class scores:
            BERT's pooler, with ``pool="first"`` on the ``[CLS]`` token (``BertForSequenceClassification``).
            ``False``: the linear layer reads the pooled vector itself.
        attention_scale: the factor each attention score ``q . k`` is multiplied by before the softmax: ``None`` is
            ``1 / sqrt(s)``; T5 uses ``1.0`` (its weights were trained with the factor folded into the query
            projection).
        head_dim: the size ``s`` of every attention head, when it is not ``emb / heads`` (t5-3b: 128 with ``emb`` 1024
            and 32 heads): the queries, keys and values then have ``heads * head_dim`` dimensions, and ``emb`` need not
            be divisible by ``heads``. ``None``: ``emb // heads`` (``emb`` with ``wide``, which refuses a ``head_dim``).
        ff_bias: biases in the two linear layers of the plain feed-forward network (``activation`` ``"relu"``,
            ``"gelu"``, ``"gelu_tanh"``, ``"relu2"``); ``False`` as T5. The gated networks have none either way.
        head_scale: a generator's output layer multiplies its input by ``e ** -0.5`` before the dot products with
            the output matrix, as T5 does with its tied output layer (``tie_weights``). ``False``: no factor, and a
            tied output matrix keeps the embedding's initialisation (the factor brings the first logits to unit
            scale instead). The other heads do not read it.
        share_embeddings: an encoder-decoder (:class:`~torchformer.models.Seq2SeqTransformer`) reads its source
            and its target through one token embedding (T5's ``shared``; Vaswani et al. with a joint
            vocabulary): ``num_tokens`` must equal ``tgt_tokens``. Learned position tables stay separate.
            ``False``: two embeddings. The other models do not use it.
        relative_buckets: the number of distance buckets of ``positions="relative"``, both directions together
            in an encoder: 32 (the default, T5's ``relative_attention_num_buckets``). At least 4.
        relative_max_distance: the distance from which on every distance shares the last bucket of
            ``positions="relative"``: 128 (the default, T5's ``relative_attention_max_distance``). Above half of
            ``relative_buckets``, where the logarithmic buckets start.
        relative_shared: one relative-position table per stack, built by the stack and shared by all of its
            self-attention layers (T5's, stored in its first block), instead of one per layer (``False``). Only
            with ``positions="relative"``.
        zero_init_residual: the output projection of every attention layer and feed-forward network starts at zero
            (weight and bias), so that each pre-norm block starts as the identity (a post-norm block still applies its
            norms; docs/training.md, "Speedrun tricks"). Only the initialisation changes; ``False``: PyTorch's.
        logit_cap: a generator's logits ``z`` become ``cap * tanh(z / cap)`` before the log-softmax (Gemma 2's
            final logit soft-capping; modded-nanogpt): no logit exceeds ``cap`` in size, which keeps a model from
            growing confident too fast. ``None`` (the default): no cap. Only the generators' heads read it.
        sparse: a sparse attention pattern in every self-attention layer (Child et al. 2019,
            :mod:`torchformer.nn.masks`): ``"strided"`` (the last ``sparse_stride`` positions and every
            ``sparse_stride``-th before them) or ``"fixed"`` (the query's own block of ``sparse_stride`` positions
            and the last ``sparse_summary`` positions of every block), besides the causal rule, ``window`` and
            padding. ``None`` (the default): dense attention.
        sparse_stride: the pattern's stride or block length ``l`` (about ``sqrt(seq_length)``); required with
            ``sparse``.
        sparse_summary: the fixed pattern's summary positions per block ``c``, in ``[1, sparse_stride]`` (default 1).
        options: the typed options of the parts that have some (:class:`PartOptions`, at most one of each
            class): a mixture of experts' ``MoEOptions``, say, or a variant's own. A part reads its own with
            :meth:`options_of`; the built-in parts ignore the others. ``()``: none.
    """

    emb: int
    heads: int
    depth: int = 1
    seq_length: Optional[int] = None
    num_tokens: Optional[int] = None
    num_classes: Optional[int] = None
    tgt_tokens: Optional[int] = None
    decoder_depth: Optional[int] = None
    wide: bool = False
    positions: str = "learned"
    dropout: float = 0.0
    prenorm: bool = False
    ff_mult: int = 4
    activation: str = "relu"
    kqnorm: bool = False
    impl: str = "sdpa"
    pool: str = "max"
    tie_weights: bool = False
    norm: str = "layer"
    kv_heads: Optional[int] = None
    window: Optional[int] = None
    input_dim: Optional[int] = None
    checkpoint_blocks: bool = False
    # Not part of the hash (a dict is unhashable); equality and the saved config include it.
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    # Added for pretrained models (GPT-2); after the others, so that no field moves.
    qkv_bias: bool = False
    head_bias: bool = True
    norm_eps: float = 1e-5
    ff_hidden: Optional[int] = None
    out_bias: bool = True
    rotary_base: float = 10000.0
    rotary_scaling: Optional[Mapping[str, Any]] = dataclasses.field(default=None, hash=False)
    # Added for BERT.
    num_token_types: Optional[int] = None
    embedding_norm: bool = False
    mlm_scale: bool = True
    pooler: bool = False
    # Added for T5.
    attention_scale: Optional[float] = None
    head_dim: Optional[int] = None
    ff_bias: bool = True
    head_scale: bool = False
    share_embeddings: bool = False
    relative_buckets: int = 32
    relative_max_distance: int = 128
    relative_shared: bool = False
    # Training tricks of the speedrun literature, off by default.
    zero_init_residual: bool = False
    logit_cap: Optional[float] = None
    # Sparse attention patterns (the sparse transformer's strided and fixed).
    sparse: Optional[str] = None
    sparse_stride: Optional[int] = None
    sparse_summary: int = 1
    # Typed options of the parts (a variant's own settings, saved with its weights).
    options: tuple = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", check_options(self.options))
        for name in ("emb", "heads", "depth", "ff_mult"):
            check_positive_int(getattr(self, name), name)
        for name in ("seq_length", "num_tokens", "num_classes", "tgt_tokens", "decoder_depth", "kv_heads", "window",
                     "input_dim", "num_token_types", "head_dim", "ff_hidden"):
            if getattr(self, name) is not None:
                check_positive_int(getattr(self, name), name)
        for name in ("wide", "prenorm", "kqnorm", "tie_weights", "qkv_bias", "head_bias", "checkpoint_blocks",
                     "embedding_norm", "mlm_scale", "pooler", "ff_bias", "head_scale", "share_embeddings",
                     "relative_shared", "zero_init_residual", "out_bias"):
            check_bool(getattr(self, name), name)
        object.__setattr__(self, "extra", check_extra(self.extra))
        # Plain floats: a NumPy float (a float subclass) would pass, and then no checkpoint could store the config.
        object.__setattr__(self, "dropout", check_probability(self.dropout, "dropout"))
        for name in ("norm_eps", "rotary_base"):
            object.__setattr__(self, name, check_positive_float(getattr(self, name), name))
        for name in ("logit_cap", "attention_scale"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_positive_float(getattr(self, name), name))
        object.__setattr__(self, "rotary_scaling", check_rotary_scaling(self.rotary_scaling))
        for name, choices in (("positions", POSITIONS), ("activation", ACTIVATIONS), ("impl", IMPLEMENTATIONS),
                              ("pool", POOLING), ("norm", NORMS)):
            check_choice(getattr(self, name), name, choices)
        if self.head_dim is not None and self.wide:
            raise ValueError(f"head_dim={self.head_dim} sets the size of narrow heads, but wide=True gives every head "
                             f"all emb={self.emb} dimensions: use one or the other")
        # A head size of its own (head_dim), like wide heads, does not cut emb into heads: no divisibility rule.
        check_heads(self.emb, self.heads, self.kv_heads, self.wide or self.head_dim is not None)
        if self.positions not in ROTARY and (self.rotary_base != 10000.0 or self.rotary_scaling is not None):
            raise ValueError(f"rotary_base and rotary_scaling apply to rotary positions only, but positions is "
                             f"{self.positions!r}: leave them out, or use positions='rotary'")
        if self.sparse is not None:
            check_choice(self.sparse, "sparse", SPARSE_PATTERNS)
            if self.sparse_stride is None:
                raise ValueError(f"sparse={self.sparse!r} needs sparse_stride, the pattern's stride (block length)")
            check_positive_int(self.sparse_stride, "sparse_stride")
        elif self.sparse_stride is not None or self.sparse_summary != 1:
            raise ValueError("sparse_stride and sparse_summary apply to a sparse pattern only: set sparse='strided' "
                             "or 'fixed', or leave them out")
        check_positive_int(self.sparse_summary, "sparse_summary")
        if self.sparse == "strided" and self.sparse_summary != 1:
            raise ValueError(f"sparse_summary applies to sparse='fixed' only, got {self.sparse_summary} with 'strided'")
        if self.sparse == "fixed" and self.sparse_summary > self.sparse_stride:  # type: ignore[operator]
            raise ValueError(f"sparse_summary must be at most sparse_stride={self.sparse_stride}, got "
                             f"{self.sparse_summary}")
        if self.impl == "flex" and self.dropout > 0:  # flex_attention has no dropout on the weights
            raise ValueError(f"impl='flex' has no dropout on the attention weights, but dropout={self.dropout}: use "
                             f"impl='sdpa' (or 'reference') for dropout")
        check_int_at_least(self.relative_buckets, "relative_buckets", 4)
        # The logarithmic buckets run from half the buckets of a side (a causal layer's side is all of them) up to
        # max_distance: it must lie beyond them, or the logarithm's range is empty.
        check_int_at_least(self.relative_max_distance, "relative_max_distance", self.relative_buckets // 2 + 1)
        if self.positions != "relative" and (self.relative_buckets != 32 or self.relative_max_distance != 128
                                             or self.relative_shared):
            raise ValueError(f"relative_buckets, relative_max_distance and relative_shared apply to "
                             f"positions='relative' only, but positions is {self.positions!r}: leave them out, or "
                             f"use positions='relative'")

    @property
    def head_size(self) -> int:
        """``s``: ``head_dim`` if given, else ``emb`` for wide heads and ``emb // heads`` for narrow ones."""
        if self.head_dim is not None:
            return self.head_dim
        return self.emb if self.wide else self.emb // self.heads

    @property
    def position_limit(self) -> Optional[int]:
        """The number of positions the model can encode: ``seq_length`` with learned positions, else no limit."""
        return self.seq_length if self.positions == "learned" else None

    def require(self, model: str, *names: str) -> None:
        """Raise a ``ValueError`` naming every field that ``model`` needs (e.g. ``num_classes``) but is ``None``.

        Args:
            model: the name of the model, for the message (``"CTransformer"``).
            *names: the fields ``model`` needs.
        """
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(f"{model} needs {', '.join(missing)} in its configuration, got None")

    def unused(self, model: str, *names: str) -> None:
        """Raise a ``ValueError`` naming each field ``model`` does not use that differs from its default, and its value.

        Such a field (``num_classes`` for a generator, say) would be silently ignored otherwise.

        Args:
            model: the name of the model, for the message (``"GTransformer"``).
            *names: the fields ``model`` does not use.
        """
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        changed = [f"{name}={getattr(self, name)!r}" for name in names if getattr(self, name) != defaults[name]]
        if changed:
            raise ValueError(f"{model} does not use {', '.join(changed)}; leave it out (it would have no effect)")

    def options_of(self, cls: type) -> Any:
        """The options of class ``cls`` (or of a subclass) in :attr:`options`, or ``cls()`` when there are none.

        A subclass of a part's options (one more field for a variant) is what the part reads, too.

        Args:
            cls: a :class:`PartOptions` subclass.

        Returns:
            An instance of ``cls``.

        Raises:
            ValueError: :attr:`options` holds several instances of ``cls`` and its subclasses.
        """
        found = [o for o in self.options if isinstance(o, cls)]
        if len(found) > 1:
            raise ValueError(f"options hold {len(found)} options of {cls.__name__} (or subclasses): "
                             f"{', '.join(type(o).__name__ for o in found)}; give one")
        return found[0] if found else cls()

    def with_options(self, *options: PartOptions) -> TransformerConfig:
        """A copy whose :attr:`options` hold ``options``, in place of any of the same classes.

        Args:
            *options: the new options.

        Returns:
            The new config.
        """
        related = lambda o: any(isinstance(o, type(n)) or isinstance(n, type(o)) for n in options)  # noqa: E731
        kept = tuple(o for o in self.options if not related(o))
        return self.replace(options=kept + tuple(options))

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed (and checked again).

        Args:
            **changes: the fields to change and their new values, ``config.replace(heads=4)``.

        Returns:
            The new config; ``self`` is unchanged (it is frozen).

        Raises:
            TypeError: a name of ``changes`` is not a field, or a flag (``wide``, ``prenorm``, ...) is not a bool.
            ValueError: another value is not valid, alone or with the other fields (``emb`` not divisible by
                ``heads`` for narrow heads, say); the message names the field.
        """
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data (str, int, float, bool, None): what checkpoints and ``config.json`` store.

        Returns:
            The fields as a new dict, ``{name: value}``, every field included but an empty ``extra`` or
            ``options`` (so that an older torchformer, which has no such field, still reads the config of a model
            without one); each of ``options`` as :meth:`PartOptions.to_dict`. :meth:`from_dict` reads it back.
        """
        data = dataclasses.asdict(self)
        if not data["extra"]:
            del data["extra"]
        data["options"] = [o.to_dict() for o in self.options]
        if not data["options"]:  # as extra: an older torchformer reads a config without them
            del data["options"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TransformerConfig:
        """The inverse of :meth:`to_dict`; unknown fields are an error naming them.

        Args:
            data: the fields, ``{name: value}``; a field left out keeps its default.

        Returns:
            The config, checked as any new one is.

        Raises:
            TypeError: ``data`` is not a mapping, a required field (``emb``, ``heads``) is missing, or a flag is
                not a bool.
            ValueError: ``data`` names an unknown field, or another value is not valid (as for :meth:`replace`).
        """
        return fields_from_dict(cls, data)

    def differences(self, other: TransformerConfig) -> list[str]:
        """``["heads: 2 vs 4", ...]``: the fields where ``self`` and ``other`` differ.

        Args:
            other: the config to compare with (a checkpoint's, say).

        Returns:
            One string per field that differs, ``"heads: 2 vs 4"`` (the reprs of ``self``'s value, then
            ``other``'s), in the order of the fields; empty when the two are equal.
        """
        return [f"{f.name}: {getattr(self, f.name)!r} vs {getattr(other, f.name)!r}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]
