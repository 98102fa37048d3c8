"""BERT in the Hugging Face layout, and torchformer's MLMTransformer (masked-LM) and CTransformer (classifier).

BERT (Devlin et al. 2019) is an ``MLMTransformer`` with these choices away from torchformer's defaults, each a
config field: the embedding sums a token-type (segment) vector too (``num_token_types``, ``type_vocab_size`` in
``config.json``, 2) and is layer-normalised before its dropout (``embedding_norm=True``); biases in the query, key
and value projections (``qkv_bias=True``); the exact GELU (``activation="gelu"``); every LayerNorm's eps ``1e-12``
(``norm_eps``, which the embedding's and the masked-LM head's LayerNorms follow too); and a masked-LM head whose
logits are the plain dot products with the (tied) token embedding, plus a bias (``mlm_scale=False``).
Everything else is torchformer's default already: learned absolute positions, post-norm blocks (``prenorm=False``:
``x = LayerNorm(x + sublayer(x))``), narrow heads of ``e / h``, a feed-forward network with biases, and the
masked-LM head's transform (dense, GELU, LayerNorm) of :class:`~torchformer.nn.heads.MaskedLMHead`.

**The classifier.** A folder whose ``config.json`` names ``"architectures": ["BertForSequenceClassification"]``
is the same encoder with another head: the *pooler* (a dense layer and a tanh on the ``[CLS]`` vector, then
dropout) and a linear layer to the ``num_labels`` classes. It loads into a :class:`~torchformer.models.CTransformer`
with ``pool="first"`` and ``pooler=True`` (:class:`~torchformer.nn.heads.ClassifierHead`), whose
log-probabilities are the ``log_softmax`` of BERT's logits; every other BERT folder loads into an
``MLMTransformer``. Only single-label classification is what a ``CTransformer`` computes (:func:`classifier_fields`).

**The config.** :func:`config_from_huggingface` reads ``config.json``'s fields (:data:`DEFAULTS` fills a field left
out, as ``BertConfig`` does) and refuses, naming the field and its value, any the library cannot express (the list:
``docs/pretrained.md``, "What is refused for BERT"). :func:`config_to_huggingface` is the way back.

**The weights.** :data:`EMBEDDINGS`, :data:`BLOCK` and :data:`MLM_HEAD` (:data:`POOLER` and :data:`CLASSIFIER` for
the classifier) are the name map, read in both directions.
BERT stores every layer as PyTorch does (``nn.Linear``'s weight ``(out, in)``, separate query, key and value
layers), so each of its tensors is one torchformer tensor, renamed: no transposes, no cuts (GPT-2's
:mod:`~torchformer.pretrained.gpt2` needs both). ``BertForMaskedLM`` prefixes the encoder's names with ``bert.``
(the head's start with ``cls.``); a file that ``BertModel`` wrote has no prefix, and no head to load.
``BertForSequenceClassification`` prefixes the encoder and the pooler with ``bert.``; its linear layer is
``classifier``. What a released checkpoint holds besides (``bert-base-uncased``, saved as ``BertForPreTraining``,
holds all of it) is read or skipped as the constants below say: old LayerNorm names (:data:`OLD_NAMES`), the
pretraining pooler and next-sentence head and the position ids (:data:`UNUSED`, :data:`NEXT_SENTENCE_HEAD`), the
decoder's copies of tied tensors (:data:`OUTPUT`). Any other tensor left over, missing, or of another shape than
the config gives is an error naming it.

Shapes: e embedding size (``hidden_size``), v vocabulary size (``vocab_size``), p positions
(``max_position_embeddings``), k token types (``type_vocab_size``), f the feed-forward hidden size
(``intermediate_size``).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Union

import torch
from torch import Tensor

from torchformer._checks import is_int
from torchformer.config import TransformerConfig
from torchformer.models import CTransformer, MLMTransformer
import torchformer.pretrained.building as building
from torchformer.pretrained.folders import WeightReader, copy_tensor

# The torchformer models this family writes (to_huggingface picks the family by the model's class): the masked-LM
# as BertForMaskedLM, the classifier as BertForSequenceClassification.
MODELS = (MLMTransformer, CTransformer)
Model = Union[MLMTransformer, CTransformer]
# The architecture (config.json's "architectures") that loads as a CTransformer; any other BERT as an MLMTransformer.
CLASSIFIER_ARCHITECTURE = "BertForSequenceClassification"


def describes(model: Model) -> bool:
    """Whether ``model`` is written as BERT: every MLMTransformer and CTransformer is (the one family with these heads).

    Args:
        model: the model to write.

    Returns:
        True; :func:`config_to_huggingface` names each field that does not map.
    """
    return True


# The name map: BERT's name -> torchformer's, each tensor as it is (shape in the comment). The encoder's names
# follow PREFIX, a block's "encoder.layer.{i}." and "encoder.blocks.{i}.".
EMBEDDINGS = (
    ("embeddings.word_embeddings.weight", "embedding.tokens.weight"),  # (v, e); also the output matrix, tied
    ("embeddings.position_embeddings.weight", "embedding.positions.embedding.weight"),  # (p, e): learned positions
    ("embeddings.token_type_embeddings.weight", "embedding.types.weight"),  # (k, e): one vector per segment
    ("embeddings.LayerNorm.weight", "embedding.norm.weight"),  # (e,): the LayerNorm of the summed embedding
    ("embeddings.LayerNorm.bias", "embedding.norm.bias"),  # (e,)
)
BLOCK = (
    ("attention.self.query.weight", "attention.toqueries.weight"),  # (e, e)
    ("attention.self.query.bias", "attention.toqueries.bias"),  # (e,): qkv_bias
    ("attention.self.key.weight", "attention.tokeys.weight"),  # (e, e)
    ("attention.self.key.bias", "attention.tokeys.bias"),  # (e,)
    ("attention.self.value.weight", "attention.tovalues.weight"),  # (e, e)
    ("attention.self.value.bias", "attention.tovalues.bias"),  # (e,)
    ("attention.output.dense.weight", "attention.unifyheads.weight"),  # (e, e): mixes the heads
    ("attention.output.dense.bias", "attention.unifyheads.bias"),  # (e,)
    ("attention.output.LayerNorm.weight", "norm1.weight"),  # (e,): post-norm, after the attention's residual
    ("attention.output.LayerNorm.bias", "norm1.bias"),  # (e,)
    ("intermediate.dense.weight", "ff.net.0.weight"),  # (f, e): W1
    ("intermediate.dense.bias", "ff.net.0.bias"),  # (f,)
    ("output.dense.weight", "ff.net.3.weight"),  # (e, f): W2
    ("output.dense.bias", "ff.net.3.bias"),  # (e,)
    ("output.LayerNorm.weight", "norm2.weight"),  # (e,): after the feed-forward network's residual
    ("output.LayerNorm.bias", "norm2.bias"),  # (e,)
)
MLM_HEAD = (  # no prefix: BertForMaskedLM's head is "cls."
    ("cls.predictions.transform.dense.weight", "head.transform.0.weight"),  # (e, e)
    ("cls.predictions.transform.dense.bias", "head.transform.0.bias"),  # (e,); then GELU
    ("cls.predictions.transform.LayerNorm.weight", "head.transform.2.weight"),  # (e,)
    ("cls.predictions.transform.LayerNorm.bias", "head.transform.2.bias"),  # (e,)
)
# BertForSequenceClassification's head: the pooler on the [CLS] vector (after PREFIX, a part of BertModel), then,
# after dropout, the linear layer to the classes (no prefix).
POOLER = (
    ("pooler.dense.weight", "head.pooler.weight"),  # (e, e); then tanh
    ("pooler.dense.bias", "head.pooler.bias"),  # (e,)
)
CLASSIFIER = (
    ("classifier.weight", "head.toprobs.weight"),  # (c, e)
    ("classifier.bias", "head.toprobs.bias"),  # (c,)
)
BIAS = ("cls.predictions.bias", "head.bias")  # (v,): the output bias of each token, with the tied output matrix
# An untied output layer (tie_word_embeddings false) is the decoder's own weight and bias: transformers 5 computes
# with decoder.bias and leaves cls.predictions.bias unused (older versions made them one tensor).
OUTPUT = (
    ("cls.predictions.decoder.weight", "head.weight"),  # (v, e)
    ("cls.predictions.decoder.bias", "head.bias"),  # (v,)
)
PREFIX = "bert."
# Stored, and no part of a masked-LM: the position ids (a constant buffer) and the pooler, after PREFIX, and the
# next-sentence head; the pooler and that head are BertForPreTraining's.
UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
NEXT_SENTENCE_HEAD = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")
# The names of a LayerNorm's gain and bias in checkpoints converted from TensorFlow (bert-base-uncased's).
OLD_NAMES = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
# An untied file that stores only the one output bias: read it as the decoder's.
OTHER_NAMES = {OUTPUT[1][0]: BIAS[0]}

# BertConfig's defaults: what a config.json that leaves a field out means.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def encoder_names(depth: int, prefix: str) -> Iterator[tuple[str, str]]:
    """Every tensor of the embedding and an encoder of ``depth`` blocks: (BERT's name as stored, torchformer's name).

    Args:
        depth: the number of blocks (``num_hidden_layers``).
        prefix: the encoder's prefix in the files, ``"bert."`` or ``""``.

    Yields:
        The pairs, in the order of the model: the embedding, then each block.
    """
    for bert, ours in EMBEDDINGS:
        yield prefix + bert, ours
    for i in range(depth):
        for bert, ours in BLOCK:
            yield f"{prefix}encoder.layer.{i}.{bert}", f"encoder.blocks.{i}.{ours}"


def names(depth: int, tied: bool, prefix: str) -> Iterator[tuple[str, str]]:
    """Every tensor of a masked-LM with ``depth`` blocks: (BERT's name as stored, torchformer's name).

    Args:
        depth: the number of blocks (``num_hidden_layers``).
        tied: whether the output matrix is the word embedding (then the output bias is ``cls.predictions.bias``;
            untied, the decoder's weight and bias).
        prefix: the encoder's prefix in the files, ``"bert."`` or ``""``.

    Yields:
        The pairs, in the order of the model: the embedding, each block, the head.
    """
    yield from encoder_names(depth, prefix)
    yield from MLM_HEAD
    yield from (BIAS,) if tied else OUTPUT


def classifier_names(depth: int) -> Iterator[tuple[str, str]]:
    """Every tensor of ``BertForSequenceClassification`` with ``depth`` blocks: (BERT's name, torchformer's name).

    Args:
        depth: the number of blocks (``num_hidden_layers``).

    Yields:
        The pairs, in the order of the model: the embedding, each block, the pooler, the linear layer.
    """
    yield from encoder_names(depth, PREFIX)
    yield from ((PREFIX + bert, ours) for bert, ours in POOLER)
    yield from CLASSIFIER


def num_labels(hf: dict[str, Any]) -> Any:
    """The classifier's number of classes, as ``PretrainedConfig`` reads it.

    ``id2label``'s length, else ``num_labels``, else 2 (transformers' default).

    Args:
        hf: the JSON object of ``config.json``.

    Returns:
        The number (checked by the caller), or the values of the two fields that disagree, for the message.

    Raises:
        ValueError: ``id2label`` is not an object, or ``num_labels`` and ``id2label`` disagree.
    """
    id2label, given = hf.get("id2label"), hf.get("num_labels")
    if id2label is None:
        return 2 if given is None else given
    if not isinstance(id2label, dict):
        raise ValueError(f"config.json: id2label={id2label!r} is not supported: expected an object of class names")
    if given is not None and given != len(id2label):
        raise ValueError(f"config.json: num_labels={given!r} is not supported: id2label names {len(id2label)} "
                         f"classes")
    return len(id2label)


def config_from_huggingface(hf: dict[str, Any]) -> TransformerConfig:
    """The :class:`~torchformer.config.TransformerConfig` of a BERT ``config.json``.

    Args:
        hf: the JSON object of ``config.json`` (``model_type`` ``"bert"``); fields left out mean :data:`DEFAULTS`.

    Returns:
        The config of the equal :class:`~torchformer.models.MLMTransformer`, or for ``BertForSequenceClassification``
        (``architectures`` names it) :class:`~torchformer.models.CTransformer` (their fields: the module's docstring).
        ``dropout`` is the two dropouts' common value (they act in training only; torchformer also drops inside the
        feed-forward network, where BERT does not).

    Raises:
        ValueError: a field holds a value torchformer cannot express; the message names the field and the value.
    """
    get = {**DEFAULTS, **hf}.get

    def refuse(field: str, why: str) -> ValueError:
        return ValueError(f"config.json: {field}={get(field)!r} is not supported: {why}")

    if get("hidden_act") != "gelu":  # the masked-LM head's transform uses it too, and MaskedLMHead's is the GELU
        raise refuse("hidden_act", "torchformer's BERT has the exact GELU, 'gelu', in its blocks and its head")
    if get("position_embedding_type") != "absolute":
        raise refuse("position_embedding_type", "torchformer's BERT adds learned absolute positions, 'absolute'")
    for field in ("is_decoder", "add_cross_attention"):
        if get(field) is not False:
            raise refuse(field, "torchformer's BERT is an encoder (bidirectional, no cross-attention): false")
    if get("hidden_dropout_prob") != get("attention_probs_dropout_prob"):
        raise refuse("attention_probs_dropout_prob", f"torchformer has one dropout, and "
                                                     f"hidden_dropout_prob={get('hidden_dropout_prob')!r} differs")
    tied = get("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise refuse("tie_word_embeddings", "expected true or false")
    emb, inner = get("hidden_size"), get("intermediate_size")
    # intermediate_size as ff_mult where it is a multiple of hidden_size (BERT's own 4 e), else as the size itself
    ff = dict(ff_mult=inner // emb) if is_int(inner) and is_int(emb) and emb > 0 and inner > 0 and inner % emb == 0 \
        else dict(ff_hidden=inner)
    architectures = hf.get("architectures")  # a classifier's names it; a masked-LM's, BertForPreTraining's or none
    classifier = isinstance(architectures, list) and CLASSIFIER_ARCHITECTURE in architectures
    head = classifier_fields(hf, get) if classifier else dict(tie_weights=tied, mlm_scale=False)
    try:
        return TransformerConfig(
            emb=emb, heads=get("num_attention_heads"), depth=get("num_hidden_layers"),
            seq_length=get("max_position_embeddings"), num_tokens=get("vocab_size"), **ff,
            activation="gelu", dropout=get("hidden_dropout_prob"), qkv_bias=True, norm_eps=get("layer_norm_eps"),
            num_token_types=get("type_vocab_size"), embedding_norm=True, **head,
        )
    except (TypeError, ValueError) as e:  # hidden_size not divisible by the heads, a size that is not an int, ...
        raise ValueError(f"config.json: its values (hidden_size, num_attention_heads, num_hidden_layers, "
                         f"max_position_embeddings, vocab_size, type_vocab_size, intermediate_size, layer_norm_eps, "
                         f"hidden_dropout_prob, num_labels) do not make a model: {e}") from e


def classifier_fields(hf: dict[str, Any], get: Any) -> dict[str, Any]:
    """The head's config fields of ``BertForSequenceClassification``, or an error naming what does not map.

    Args:
        hf: the JSON object of ``config.json``.
        get: its fields, BERT's defaults filling those left out.

    Returns:
        ``num_classes``, ``pool="first"`` (the ``[CLS]`` token) and ``pooler=True``.

    Raises:
        ValueError: ``problem_type`` is not single-label classification (a CTransformer's log-probabilities are a
            softmax over the classes), one label (a regression to transformers), or a ``classifier_dropout`` other
            than the one dropout.
    """
    classes = num_labels(hf)
    problem = hf.get("problem_type")
    if problem not in (None, "single_label_classification"):
        raise ValueError(f"config.json: problem_type={problem!r} is not supported: a CTransformer gives a softmax over "
                         f"the classes, 'single_label_classification' (or null with 2 or more labels)")
    if classes == 1:  # transformers 5 refuses single-label classification with one label
        raise ValueError("config.json: num_labels=1 is not supported: transformers reads one label as a regression "
                         "of one number, and a CTransformer classifies into 2 or more classes")
    dropout = hf.get("classifier_dropout")
    if dropout is not None and dropout != get("hidden_dropout_prob"):
        raise ValueError(f"config.json: classifier_dropout={dropout!r} is not supported: torchformer has one dropout, "
                         f"and hidden_dropout_prob={get('hidden_dropout_prob')!r} differs")
    return dict(num_classes=classes, pool="first", pooler=True)


def config_to_huggingface(model: Model) -> dict[str, Any]:
    """BERT's ``config.json`` for ``model``, or an error naming every field that BERT cannot express.

    Args:
        model: an :class:`~torchformer.models.MLMTransformer` or a :class:`~torchformer.models.CTransformer` (not a
            subclass: a variant computes something else).

    Returns:
        The JSON object of ``config.json``: for ``BertForMaskedLM``, or for ``BertForSequenceClassification`` (a
        classifier: ``id2label`` names its classes ``LABEL_0``, ...; ``problem_type`` is single-label
        classification). A model without token types (``num_token_types=None``) is written with ``type_vocab_size``
        1, whose one vector is zero: the same function.

    Raises:
        ValueError: the model is a subclass, or its config has fields that do not map; the message names each, with
            its value.
    """
    config = model.config
    classifier = isinstance(model, CTransformer)
    base = CTransformer if classifier else MLMTransformer
    if type(model) is not base:
        raise ValueError(f"to_huggingface: a {type(model).__name__} is a variant of {base.__name__}, which BERT "
                         f"cannot express; only an {base.__name__} itself maps onto BERT")
    checks = [
        ("positions", config.positions == "learned", 'BERT adds learned positions: "learned"'),
        ("prenorm", not config.prenorm, "BERT's blocks are post-norm: False"),
        ("norm", config.norm == "layer", 'BERT has LayerNorm: "layer"'),
        ("activation", config.activation == "gelu", 'BERT has the exact GELU: "gelu"'),
        ("embedding_norm", config.embedding_norm, "BERT normalises its embedding: True"),
        ("wide", not config.wide, "BERT's heads are narrow: False"),
        ("kv_heads", config.kv_heads in (None, config.heads), "BERT gives every head its keys and values: None"),
        ("window", config.window is None, "BERT attends to the whole sequence: None"),
        ("kqnorm", not config.kqnorm, "BERT does not normalise queries and keys: False"),
        ("extra", not config.extra, "BERT knows no variant's hyperparameters: {}"),
    ]
    if classifier:
        checks += [
            ("input_dim", config.input_dim is None, "BERT reads token ids: None"),
            ("pool", config.pool == "first", 'BERT classifies from the [CLS] token, position 0: "first"'),
            ("pooler", config.pooler, "BERT's classifier reads the pooler's output: True"),
            ("num_classes", config.num_classes != 1, "transformers reads one label as a regression: 2 or more"),
        ]
    else:
        checks.append(("mlm_scale", not config.mlm_scale, "BERT's logits are plain dot products: False"))
    wrong = [f"{field}={getattr(config, field)!r} ({why})" for field, ok, why in checks if not ok]
    if wrong and classifier:  # the one family with a classifier: say so, as for a model of a class none writes
        raise ValueError(f"to_huggingface: a CTransformer does not map onto a Hugging Face family unless BERT's "
                         f"classifier (BertForSequenceClassification) expresses it, and this one has: "
                         f"{'; '.join(wrong)}")
    if wrong:
        raise ValueError(f"to_huggingface: this MLMTransformer does not map onto BERT: {'; '.join(wrong)}")
    written = {
        "model_type": "bert",
        "architectures": [CLASSIFIER_ARCHITECTURE if classifier else "BertForMaskedLM"],
        "vocab_size": config.num_tokens,
        "hidden_size": config.emb,
        "num_hidden_layers": config.depth,
        "num_attention_heads": config.heads,
        "intermediate_size": model.encoder.blocks[0].ff.net[0].out_features,  # ff_mult * emb, or ff_hidden
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.seq_length,
        "type_vocab_size": config.num_token_types or 1,
        "layer_norm_eps": config.norm_eps,
        "position_embedding_type": "absolute",
        "is_decoder": False,
        "add_cross_attention": False,
        # A classifier has no output matrix to tie; transformers' default (true) would tie nothing either.
        "tie_word_embeddings": config.tie_weights,
        # BertConfig's default is bert-base's [PAD] id 0, which another vocabulary need not have.
        "pad_token_id": None,
        "dtype": str(model.embedding.tokens.weight.dtype).removeprefix("torch."),
    }
    if classifier:  # torchformer's classes have no names: transformers' own default names, and the softmax's loss
        written.update({
            "id2label": {str(i): f"LABEL_{i}" for i in range(config.num_classes)},  # type: ignore[arg-type]
            "label2id": {f"LABEL_{i}": i for i in range(config.num_classes)},  # type: ignore[arg-type]
            "problem_type": "single_label_classification",
            "classifier_dropout": None,  # hidden_dropout_prob, the one dropout
        })
    return written


def stored_prefix(reader: WeightReader) -> str:
    """``"bert."`` if the files prefix the encoder's names with it (``BertForMaskedLM``), else ``""`` (``BertModel``).

    Args:
        reader: the folder's tensors.

    Returns:
        The prefix.
    """
    return PREFIX if any(name.startswith(PREFIX) for name in reader.names()) else ""


def empty_model(config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                device: torch.device) -> Model:
    """The model of ``config`` with memory but no values yet (:mod:`~torchformer.pretrained.building`).

    An MLMTransformer, or a CTransformer for a config with ``num_classes`` (BERT's classifier).

    Args:
        config: what :func:`config_from_huggingface` made.
        reader: the folder's tensors (for the stored dtype).
        dtype: the parameters' floating dtype, or ``None``: the stored word embedding's.
        device: where the parameters go.

    Returns:
        The model, its parameters' values unset (the output matrix tied to the embedding again, if tied).
    """
    embedding = stored_prefix(reader) + EMBEDDINGS[0][0]  # embeddings.word_embeddings.weight
    stored = reader.dtype(stored_name(reader, embedding))
    model_class = MLMTransformer if config.num_classes is None else CTransformer  # BertForSequenceClassification
    return building.empty_model(model_class, config, dtype=dtype or stored, device=device)


def stored_name(reader: WeightReader, name: str) -> str:
    """The name ``name`` is stored under: itself, or its older name (a LayerNorm's ``gamma``, ``beta``) if only that is.

    Args:
        reader: the folder's tensors.
        name: BERT's current name (``bert.embeddings.LayerNorm.weight``).

    Returns:
        The name in the files (``bert.embeddings.LayerNorm.gamma`` in ``bert-base-uncased``), or ``name`` itself
        when neither is there (the caller names the missing tensor).
    """
    stored = set(reader.names())
    if name in stored:
        return name
    for new, old in OLD_NAMES.items():
        if name.endswith(new) and name.removesuffix(new) + old in stored:
            return name.removesuffix(new) + old
    return OTHER_NAMES[name] if OTHER_NAMES.get(name) in stored else name


def load_weights(model: Model, reader: WeightReader) -> None:
    """Copy BERT's tensors into ``model``'s parameters, one tensor at a time, every name and shape checked.

    Args:
        model: the MLMTransformer or CTransformer :func:`config_from_huggingface`'s config built (its parameters'
            values unset).
        reader: the folder's tensors (:class:`~torchformer.pretrained.folders.WeightReader`).

    Raises:
        ValueError: a tensor is missing, left over, or of another shape than the config says; a stored copy of a
            tied tensor (``cls.predictions.decoder.weight`` or ``.bias``) differs from the tensor it is tied to.
    """
    if isinstance(model, CTransformer):
        return _load_classifier_weights(model, reader)
    prefix, depth, tied = stored_prefix(reader), model.config.depth, model.config.tie_weights
    left = set(reader.names()) - {prefix + name for name in UNUSED} - set(NEXT_SENTENCE_HEAD)
    _copy_tensors(model, reader, names(depth, tied, prefix), left, f"BERT's masked-LM with num_hidden_layers={depth}")
    if tied:  # second copies of tied tensors, which some files store: each must be the tensor it is tied to
        for (copy, ours), original in zip(OUTPUT, (prefix + EMBEDDINGS[0][0], BIAS[0])):
            if copy in left:
                tied_to = model.get_parameter(ours)  # head.weight is embedding.tokens.weight
                if not torch.equal(reader.tensor(copy).to(tied_to), tied_to.detach()):
                    raise ValueError(f"{reader.where}: {copy} differs from {original}, but config.json ties them "
                                     f"(tie_word_embeddings=true)")
                left.discard(copy)
    else:  # transformers 5 computes an untied output with the decoder's bias; cls.predictions.bias is unused then
        left.discard(BIAS[0])
    _refuse_left_over(reader, left, "BERT's masked-LM")


def _load_classifier_weights(model: CTransformer, reader: WeightReader) -> None:
    """:func:`load_weights` for ``BertForSequenceClassification``: the encoder, the pooler and the classifier."""
    depth = model.config.depth
    left = set(reader.names()) - {PREFIX + UNUSED[0]}  # only the position ids, a constant buffer, are skipped
    _copy_tensors(model, reader, classifier_names(depth), left,
                  f"BERT's classifier (BertForSequenceClassification) with num_hidden_layers={depth}")
    _refuse_left_over(reader, left, "BertForSequenceClassification")


def _copy_tensors(model: Model, reader: WeightReader, pairs: Iterator[tuple[str, str]], left: set[str],
                  model_name: str) -> None:
    """Copy each ``(BERT name, our name)`` pair, refusing a missing tensor; removes what it copied from ``left``."""
    params = dict(model.named_parameters())  # a tied weight once, under the embedding's name
    for name, ours in pairs:
        stored = stored_name(reader, name)
        if stored not in left:
            untied = " and tie_word_embeddings=false" if (name, ours) in OUTPUT else ""
            no_head = (" (a BertModel file has no masked-LM head; a BertForSequenceClassification file loads as a "
                       "CTransformer when its config.json's architectures say so)") if name.startswith("cls.") else ""
            raise ValueError(f"{reader.where} holds no {name}, which {model_name}{untied} has{no_head}")
        copy_tensor(reader, stored, params[ours])
        left.discard(stored)


def _refuse_left_over(reader: WeightReader, left: set[str], model_name: str) -> None:
    """Refuse the stored tensors nothing read: another architecture's."""
    if left:
        raise ValueError(f"{reader.where} holds tensors {model_name} does not have (another architecture?): "
                         f"{', '.join(sorted(left)[:8])}{' ...' if len(left) > 8 else ''}")


def export_weights(model: Model) -> dict[str, Tensor]:
    """``model``'s parameters under BERT's names, as BERT stores them.

    ``BertForMaskedLM``'s names for an MLMTransformer, ``BertForSequenceClassification``'s for a CTransformer.

    A model without ``qkv_bias`` (or ``out_bias``) gets zero biases there, one without token types a single zero
    token-type vector: the same function.

    Args:
        model: an MLMTransformer or CTransformer that :func:`config_to_huggingface` accepts.

    Returns:
        ``{name: tensor}``, contiguous CPU tensors; for a masked-LM, the decoder's weight and bias only when the
        output matrix is not tied (and then ``cls.predictions.bias`` too, the same bias, which older versions of
        transformers read).
    """
    params = dict(model.named_parameters())
    weight = model.embedding.tokens.weight
    classifier = isinstance(model, CTransformer)
    tensors = {}
    pairs = classifier_names(model.config.depth) if classifier else names(model.config.depth,
                                                                         model.config.tie_weights, PREFIX)
    for name, ours in pairs:
        if ours in params:
            tensor = params[ours].detach()
        elif ours == "embedding.types.weight":  # no token types: one type, whose vector adds nothing
            tensor = torch.zeros(1, model.config.emb, dtype=weight.dtype, device=weight.device)
        else:  # a query, key, value or output bias of a model without qkv_bias (out_bias)
            out = params[ours.removesuffix(".bias") + ".weight"].shape[0]
            tensor = torch.zeros(out, dtype=weight.dtype, device=weight.device)
        tensors[name] = tensor.contiguous().cpu()
    if not classifier and not model.config.tie_weights:
        tensors[BIAS[0]] = tensors[OUTPUT[1][0]].clone()  # its own memory: safetensors stores no shared tensors
    return tensors
