"""Output heads: from the last block's vectors to predictions.

* :class:`ClassifierHead` pools the sequence into one vector (max, mean, or the first token), then maps it to
  class log-probabilities, optionally through BERT's pooler (a dense layer and a tanh) first. With a padding mask it
  pools over real tokens only, so padding cannot change the result.
* :class:`GeneratorHead` maps every position to log-probabilities over the vocabulary (the next token). Its weight
  matrix can be *tied* to the token embedding (Press & Wolf 2017): the same vectors read tokens in and write them out.
* :class:`MaskedLMHead` predicts the hidden token at every position of a masked-language model (BERT): a small
  transform, then a generator head tied to the embedding.

Both return log-probabilities (``log_softmax``), as ``former`` does; train with :func:`torch.nn.functional.nll_loss`.
The log-probabilities are at least float32, also for a half-precision model or under autocast on any device: in
bfloat16 (8 bits of mantissa) a log-probability near -10 is off by up to 0.03, which a loss or a bits-per-byte figure
adds up over every token.

Shapes: b batch size, t sequence length, e embedding size, c number of classes, v vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import (check_bool, check_choice, check_positive_float, check_positive_int,
                                 check_probability)
from torchformer.config import POOLING
from torchformer.nn.masks import document_positions


class ClassifierHead(nn.Module):
    """The output head of a classifier: pool the positions, then class log-probabilities.

    ``forward(x, mask=None)`` pools the vectors of the real positions (``mask``: True for real tokens) into one and
    maps it to ``c`` log-probabilities. With ``"max"`` or ``"mean"``, a sequence with no real token at all pools to
    the zero vector.

    With ``pooler=True`` the pooled vector ``p`` first goes through BERT's *pooler*, ``tanh(W p + b)``, and dropout:
    ``log_softmax(W_c dropout(tanh(W p + b)) + b_c)``. BERT's pretraining trained the pooler on the ``[CLS]`` token
    (``pool="first"``) for next-sentence prediction, and ``BertForSequenceClassification`` keeps it between the
    encoder and its linear layer; the tanh bounds every entry of the vector the classifier reads to (-1, 1).

    Args:
        emb: the embedding size ``e``.
        num_classes: the number of classes ``c``.
        pool: ``"max"`` takes the element-wise maximum over positions, ``"mean"`` the average, ``"first"`` the
            vector at position 0 (a ``[CLS]``-style token; position 0 must then be a real token).
        pooler: a dense layer ``(e, e)`` and a tanh on the pooled vector (BERT's); ``False`` (the default): the
            linear layer reads the pooled vector itself.
        dropout: the dropout probability on the pooler's output, in training (BERT's classifier drops the pooled
            vector before its linear layer); only with ``pooler=True``, whose output it drops.

    ``forward(x, mask=None, documents=None)``: with ``documents`` ``(b, t)`` (packed rows, each token's document in
    ``[0, t)``), each document is pooled alone: the output ``(b, t, c)`` holds row ``r``'s document ``d`` at
    ``[r, d]`` (entries of numbers no document has are meaningless; "first" pools each document's first token).

    Shapes:
        ``x`` ``(b, t, e)``, ``mask`` ``(b, t)`` -> ``(b, c)`` log-probabilities; with ``documents``, ``(b, t, c)``.
    """

    def __init__(self, emb: int, num_classes: int, pool: str = "max", *, pooler: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        check_positive_int(num_classes, "num_classes")
        self.pool = check_choice(pool, "pool", POOLING)
        pooler, dropout = check_bool(pooler, "pooler"), check_probability(dropout, "dropout")
        if dropout > 0 and not pooler:
            raise ValueError(f"dropout={dropout!r} drops the pooler's output, but pooler is False: leave dropout out, "
                             f"or set pooler=True")
        # None without a pooler: the head, its parameters and its printout stay as they were before the option.
        self.pooler = nn.Linear(emb, emb) if pooler else None
        self.dropout = nn.Dropout(dropout) if pooler else None
        self.toprobs = nn.Linear(emb, num_classes)

    def pooled(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The pooled sequence vector, ``(b, t, e) -> (b, e)``.

        Args:
            x: the last block's vectors ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens, False for padding (left out of the pool). ``None``: every
                position is real.

        Returns:
            One vector per sequence ``(b, e)``, pooled as ``self.pool`` says; the zero vector for a sequence with no
            real token (``"max"`` and ``"mean"``).
        """
        if self.pool == "first":
            return x[:, 0]
        if mask is None:
            return x.max(dim=1).values if self.pool == "max" else x.mean(dim=1)
        real = mask[:, :, None]  # (b, t, 1)
        if self.pool == "max":
            pooled = x.masked_fill(~real, torch.finfo(x.dtype).min).max(dim=1).values  # (b, e)
            return pooled.masked_fill(~real.any(dim=1), 0.0)
        count = real.sum(dim=1).clamp(min=1)  # (b, 1); an all-padding row divides 0 by 1
        return x.masked_fill(~real, 0.0).sum(dim=1) / count  # masked_fill, not x * real: padding may hold NaN

    def pooled_documents(self, x: Tensor, mask: Tensor | None, documents: Tensor) -> Tensor:
        """Each document of packed rows pooled alone, ``(b, t, e) -> (b, t, e)``.

        Row ``r``'s document ``d`` goes to ``[r, d]``, pooled as ``self.pool`` says over its real tokens.

        Args:
            x: the last block's vectors ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens (padding is left out); ``None``: every position is real.
            documents: ``(b, t)`` integer, each token's document, in ``[0, t)`` and non-decreasing along a row.

        Returns:
            ``(b, t, e)``: the pooled vector of each document number, zero for numbers no real token has.
        """
        b, t, e = x.shape
        documents = documents.long()  # scatter's indices (a no-op for long)
        real = torch.ones(b, t, dtype=torch.bool, device=x.device) if mask is None else mask
        index = documents[..., None].expand(b, t, e)  # (b, t, e): where each token's vector goes
        if self.pool == "first":  # each document's first token, at position 0 within it
            kept = x.masked_fill(~((document_positions(documents) == 0) & real)[..., None], 0.0)
            return torch.zeros_like(x).scatter_add(1, index, kept)  # one first token per document: a copy
        count = torch.zeros(b, t, dtype=x.dtype, device=x.device).scatter_add(1, documents, real.to(x.dtype))
        if self.pool == "max":
            present = (count > 0)[..., None]  # (b, t, 1): document numbers that have real tokens
            low = torch.finfo(x.dtype).min
            pooled = torch.full_like(x, low).scatter_reduce(1, index, x.masked_fill(~real[..., None], low), "amax")
            return pooled.masked_fill(~present, 0.0)
        sums = torch.zeros_like(x).scatter_add(1, index, x.masked_fill(~real[..., None], 0.0))  # (b, t, e)
        return sums / count.clamp(min=1)[..., None]

    def forward(self, x: Tensor, mask: Tensor | None = None, documents: Tensor | None = None) -> Tensor:
        # (b, t, e) -> (b, e), or each document's: (b, t, e)
        pooled = self.pooled(x, mask) if documents is None else self.pooled_documents(x, mask, documents)
        if self.pooler is not None:  # BERT's: dense, tanh, then dropout
            pooled = self.dropout(torch.tanh(self.pooler(pooled)))  # (b, e) -> (b, e)
        return log_probabilities(self.toprobs(pooled))  # (b, e) -> (b, c), or (b, t, e) -> (b, t, c)


def log_probabilities(logits: Tensor) -> Tensor:
    """``log_softmax`` over the last dimension, computed and returned in at least float32 (float64 stays).

    Args:
        logits: unnormalised scores, ``(..., c)`` or ``(..., v)``, of any floating dtype.

    Returns:
        The log-probabilities, the same shape, float32 (float64 for float64 logits).
    """
    return F.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))


def check_tie_to(tie_to: nn.Embedding | None, num_tokens: int, emb: int) -> None:
    """Refuse an embedding to tie an output layer to unless it has ``v`` rows of size ``e``.

    Args:
        tie_to: the embedding, or ``None`` (nothing to check).
        num_tokens: the vocabulary size ``v``.
        emb: the embedding size ``e``.

    Raises:
        TypeError: ``tie_to`` is not an :class:`~torch.nn.Embedding`.
        ValueError: its weight is not ``(v, e)``.
    """
    if tie_to is None:
        return
    if not isinstance(tie_to, nn.Embedding):
        raise TypeError(f"tie_to must be an nn.Embedding (the token embedding), got {type(tie_to).__name__}")
    if tuple(tie_to.weight.shape) != (num_tokens, emb):
        raise ValueError(f"tie_to must be an embedding of shape (num_tokens, emb) = ({num_tokens}, {emb}), "
                         f"got {tuple(tie_to.weight.shape)}")


class GeneratorHead(nn.Module):
    """The output head of a generator: log-probabilities of the next token at every position.

    Args:
        emb: the embedding size ``e``.
        num_tokens: the vocabulary size ``v``.
        tie_to: an :class:`~torch.nn.Embedding` with ``v`` rows of size ``e`` whose weight this layer shares (weight
            tying); the shared matrix is then re-initialised with standard deviation ``e ** -0.5`` so the first
            logits have unit scale (unless ``scale``, which does that instead). ``None``: a weight of its own.
        bias: a bias per token added to the logits (the default); ``False``: none, as GPT-2's output layer, which is
            the tied embedding alone (config field ``head_bias``).
        scale: multiply each input vector by ``e ** -0.5`` before the output layer, as T5 does before its tied
            output layer (config field ``head_scale``); ``False`` (the default): no factor.
        cap: soft-cap the logits, ``z -> cap * tanh(z / cap)``, before the log-softmax (config field
            ``logit_cap``): each stays below ``cap`` in size, and near zero it is unchanged. ``None``: no cap.

    Shapes:
        ``forward(x)``: ``x`` ``(b, t, e)`` -> ``(b, t, v)`` log-probabilities.
    """

    def __init__(self, emb: int, num_tokens: int, *, tie_to: nn.Embedding | None = None, bias: bool = True,
                 scale: bool = False, cap: float | None = None) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        check_positive_int(num_tokens, "num_tokens")
        self.cap = None if cap is None else check_positive_float(cap, "cap")
        self.toprobs = nn.Linear(emb, num_tokens, bias=check_bool(bias, "bias"))
        self.scale = emb**-0.5 if check_bool(scale, "scale") else None
        check_tie_to(tie_to, num_tokens, emb)
        if tie_to is not None:
            # nn.Embedding starts with unit-variance entries; as output weights they would give logits of standard
            # deviation sqrt(e) (a starting loss far above uniform guessing). Rescale to std e^-1/2: unit-variance
            # logits. With the scale, the factor e^-1/2 does that, and the embedding keeps its unit-variance entries
            # (T5's choice: its input vectors are then on the scale of the blocks' activations).
            if self.scale is None:
                with torch.no_grad():
                    tie_to.weight.normal_(0.0, emb**-0.5)
            self.toprobs.weight = tie_to.weight

    def forward(self, x: Tensor) -> Tensor:
        if self.scale is not None:  # T5's: the vectors scaled before the dot products (a bias stays as it is)
            x = x * self.scale
        logits = self.toprobs(x)  # (b, t, e) -> (b, t, v)
        if self.cap is not None:
            logits = self.cap * torch.tanh(logits / self.cap)
        return log_probabilities(logits)


class MaskedLMHead(nn.Module):
    """The output head of a masked-language model (BERT): at every position, log-probabilities of the original token.

    A linear layer, GELU and LayerNorm transform each vector first; then the logits are its dot products with the
    rows of the token embedding (when tied), scaled by ``e ** -0.5``, plus a bias per token. The transform gives the
    prediction room of its own: the encoder's last vectors are what a classifier fine-tuned later reads, and need
    not lie in the embedding's space; it is discarded with the head when the encoder is fine-tuned. Tying means that
    every masked prediction trains the embedding rows of the whole vocabulary, not only of the tokens in the batch.

    Why the scale, when :class:`GeneratorHead` instead re-initialises a tied embedding with small entries: the
    LayerNorm's output and the embedding rows both have unit-variance entries, so their dot product has variance
    ``e``, and ``e ** -0.5`` brings the first logits to unit scale. Shrinking the embedding would do the same for the
    logits, but the input would then be a small token vector next to unit-variance learned position vectors: the
    tiny model of ``tests/test_masked_lm.py``'s learning test, given a tied embedding shrunk to ``e ** -0.5``
    instead, stayed at the loss of uniform guessing (``log 20``) for 300 steps (measured once, 2026-11-24), where
    with the scale it learns the task. BERT has no scale (``scale=False``, the config's ``mlm_scale``): its embedding
    starts with entries of standard deviation 0.02, and its logits are the plain dot products, plus the bias.

    Args:
        emb: the embedding size ``e``.
        num_tokens: the vocabulary size ``v``.
        tie_to: the :class:`~torch.nn.Embedding` (``v`` rows of size ``e``) whose weight is also the output matrix
            (kept as it is). ``None``: an output matrix of its own, initialised as an embedding (unit variance).
        eps: the transform's LayerNorm's ``eps`` (``config.norm_eps``; BERT's is ``1e-12``).
        scale: multiply the logits by ``e ** -0.5`` (the default); ``False``: the plain dot products, as BERT.

    Shapes:
        ``forward(x)``: ``x`` ``(b, t, e)`` -> ``(b, t, v)`` log-probabilities (or ``(n, e) -> (n, v)``: any
        leading dimensions).
    """

    def __init__(self, emb: int, num_tokens: int, *, tie_to: nn.Embedding | None = None, eps: float = 1e-5,
                 scale: bool = True) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        check_positive_int(num_tokens, "num_tokens")
        check_tie_to(tie_to, num_tokens, emb)
        eps = check_positive_float(eps, "eps")
        self.transform = nn.Sequential(nn.Linear(emb, emb), nn.GELU(), nn.LayerNorm(emb, eps=eps))
        self.weight = tie_to.weight if tie_to is not None else nn.Parameter(torch.randn(num_tokens, emb))  # (v, e)
        self.bias = nn.Parameter(torch.zeros(num_tokens))
        self.scale = emb**-0.5 if check_bool(scale, "scale") else 1.0

    def forward(self, x: Tensor) -> Tensor:
        logits = F.linear(self.transform(x), self.weight)  # (b, t, e) -> (b, t, v)
        if self.scale != 1.0:  # BERT's: the dot products as they are (no multiplication by 1, either)
            logits = logits * self.scale
        return log_probabilities(logits + self.bias)
