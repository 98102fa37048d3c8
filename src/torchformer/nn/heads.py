"""Output heads: from the last block's vectors to log-probabilities (``log_softmax``, at least float32).

Train with :func:`torch.nn.functional.nll_loss`. See ``docs/models.md`` and ``docs/tokens.md`` (weight tying).
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
    """The output head of a classifier: pool the real positions into one vector, then class log-probabilities.

    Args:
        emb: the embedding size ``e``.
        num_classes: the number of classes ``c``.
        pool: ``"max"`` (element-wise), ``"mean"``, or ``"first"`` (position 0, which must be real: a ``[CLS]`` token).
        pooler: a dense layer ``(e, e)`` and a tanh on the pooled vector (BERT's); ``False`` (the default): none.
        dropout: the dropout probability on the pooler's output, in training; only with ``pooler=True``.

    Raises:
        ValueError: ``dropout`` above 0 without ``pooler``.

    Shapes:
        ``forward(x, mask=None, documents=None)``: ``x`` ``(b, t, e)`` -> ``(b, c)`` (:meth:`pooled`); with
        ``documents`` ``(b, t)``, each document pooled alone -> ``(b, t, c)`` (:meth:`pooled_documents`).
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
        # None without a pooler: no parameters or printout lines for an option that is off.
        self.pooler = nn.Linear(emb, emb) if pooler else None
        self.dropout = nn.Dropout(dropout) if pooler else None
        self.toprobs = nn.Linear(emb, num_classes)

    def pooled(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The pooled sequence vector, ``(b, t, e) -> (b, e)``, as ``self.pool`` says (zero without a real token).

        Args:
            x: the last block's vectors ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens (padding is left out); ``None``: every position is real.
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
        """Each document of packed rows pooled alone over its real tokens, ``(b, t, e) -> (b, t, e)``.

        Args:
            x: the last block's vectors ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens (padding is left out); ``None``: every position is real.
            documents: ``(b, t)`` integer, each token's document, in ``[0, t)`` and non-decreasing along a row.

        Returns:
            ``(b, t, e)``: row ``r``'s document ``d`` at ``[r, d]``; zero for numbers no real token has.
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
        tie_to: an :class:`~torch.nn.Embedding` ``(v, e)`` whose weight this layer shares, re-initialised with standard
            deviation ``e ** -0.5`` (unless ``scale``); ``None``: a weight of its own.
        bias: a bias per token added to the logits (the default); ``False``: none, as GPT-2 (``head_bias``).
        scale: multiply each input vector by ``e ** -0.5`` first, as T5 (``head_scale``); ``False`` (the default): not.
        cap: soft-cap the logits, ``z -> cap * tanh(z / cap)``, before the log-softmax (``logit_cap``); ``None``: none.

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

    Linear, GELU, LayerNorm, then dot products with the output matrix (times ``e ** -0.5`` with ``scale``) plus a bias.

    Args:
        emb: the embedding size ``e``.
        num_tokens: the vocabulary size ``v``.
        tie_to: the :class:`~torch.nn.Embedding` ``(v, e)`` whose weight is also the output matrix (kept as it is);
            ``None``: an output matrix of its own, initialised as an embedding (unit variance).
        eps: the transform's LayerNorm's ``eps`` (``config.norm_eps``; BERT's is ``1e-12``).
        scale: multiply the logits by ``e ** -0.5`` (the default); ``False``: the plain dot products, as BERT.

    Shapes:
        ``forward(x)``: ``x`` ``(..., e)``, typically ``(b, t, e)`` -> ``(..., v)`` log-probabilities.
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
