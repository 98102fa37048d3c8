"""Query-key normalisation with RMSNorm, and a sigmoid gate on each head's output.

Each class overrides one step of :class:`~torchformer.nn.attention.SelfAttention` (``docs/extending.md``,
``docs/pretrained.md``). Shapes: b batch, t queries, u keys, e embedding, h heads, g key/value heads, s head size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from torchformer._checks import check_positive_float
from torchformer.config import TransformerConfig
from torchformer.nn.attention import SelfAttention
from torchformer.nn.masks import AttentionMask
from torchformer.nn.norms import RMSNorm
from torchformer.nn.relative import AttentionPositions


class HeadRMSNormAttention(SelfAttention):
    """Self-attention whose queries and keys are RMS-normalised per head: ``RMSNorm(s)`` (Qwen3, OLMo 2).

    Args:
        qk_eps: the norms' ``eps`` (``config.norm_eps`` from a config).
        **options: :class:`~torchformer.nn.attention.MultiHeadAttention`'s like ``emb``, ``heads`` (``kqnorm`` implied).

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`.
    """

    def __init__(self, emb: int, heads: int = 8, *, qk_eps: float = 1e-6, **options: Any) -> None:
        options.pop("kqnorm", None)
        super().__init__(emb, heads, **options)
        self.kqnorm = True
        self.qnorm = RMSNorm(self.head_size, eps=check_positive_float(qk_eps, "qk_eps"))
        self.knorm = RMSNorm(self.head_size, eps=qk_eps)

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """As :meth:`MultiHeadAttention.arguments_from_config`, and ``qk_eps``, the config's ``norm_eps``."""
        base = super().arguments_from_config(config, causal=causal, layer=layer, positions=positions)
        return {**base, "qk_eps": config.norm_eps}


class ProjectionRMSNormAttention(HeadRMSNormAttention):
    """Self-attention with ``RMSNorm(h s)`` on the query and ``RMSNorm(g s)`` on the key projections (OLMoE).

    Arguments: as :class:`HeadRMSNormAttention`.

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`.
    """

    def __init__(self, emb: int, heads: int = 8, *, qk_eps: float = 1e-6, **options: Any) -> None:
        super().__init__(emb, heads, qk_eps=qk_eps, **options)
        self.qnorm = RMSNorm(self.heads * self.head_size, eps=qk_eps)
        self.knorm = RMSNorm(self.kv_heads * self.head_size, eps=qk_eps)

    def project_queries(self, x: Tensor) -> Tensor:
        """As :meth:`MultiHeadAttention.project_queries`, normalised over the whole projection before the split."""
        return self.split_heads(self.qnorm(self.toqueries(x)))

    def project_keys_values(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """As :meth:`MultiHeadAttention.project_keys_values`, the keys normalised over the whole projection."""
        return self.split_heads(self.knorm(self.tokeys(y))), self.split_heads(self.tovalues(y))


class GatedHeadsAttention(SelfAttention):
    """Self-attention whose head ``n`` is multiplied by ``sigmoid(gate.weight[n] . x)`` (Qwen3-Next).

    Args:
        **options: :class:`~torchformer.nn.attention.MultiHeadAttention`'s like ``emb``, ``heads``.

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`.
    """

    def __init__(self, emb: int, heads: int = 8, **options: Any) -> None:
        super().__init__(emb, heads, **options)
        self.gate = nn.Linear(emb, heads, bias=False)

    def finish(self, out: Tensor, mask: AttentionMask, x: Tensor) -> Tensor:
        """Gate each head's output ``(b, h, t, s)`` by the input ``x``, then as :meth:`MultiHeadAttention.finish`."""
        gate = torch.sigmoid(self.gate(x)).transpose(1, 2)[..., None]  # (b, t, h) -> (b, h, t, 1)
        return super().finish(out * gate.to(out.dtype), mask, x)
