"""Query-key normalisation with RMSNorm, as the 2025 families do it, and a sigmoid gate on each head's output.

``kqnorm=True`` normalises each head's query and key with a LayerNorm before rotary positions (the base
:class:`~torchformer.nn.attention.SelfAttention`): the attention logits then stay bounded however large the
projections grow. Two small variants of it, and one of the output step:

* :class:`HeadRMSNormAttention`: an RMSNorm (gain, no bias) over each head's ``s`` numbers, one gain of ``s`` shared
  by the heads: Qwen3's and OLMo 2's ``q_norm`` and ``k_norm``.
* :class:`ProjectionRMSNormAttention`: an RMSNorm over the whole query projection (``h s`` numbers) and the whole
  key projection (``g s``), before they are cut into heads: OLMoE's.
* :class:`GatedHeadsAttention`: each head's output times ``sigmoid(w_n . x)``, a gate computed from the layer's input
  (Qiu et al. 2025, Qwen3-Next): a head can switch itself off where it has nothing to add.

Each overrides one step of attention's pipeline, so caches, masks and compiled decoding work unchanged.

Shapes: b batch size, t sequence length, e embedding size, h heads, g key/value heads, s head size.
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
    """Self-attention whose queries and keys are RMS-normalised per head (``qnorm``, ``knorm``: ``RMSNorm(s)``).

    Args:
        emb: embedding size ``e``.
        heads: heads ``h``.
        qk_eps: the norms' ``eps`` (``config.norm_eps`` when built from a config).
        **options: :class:`~torchformer.nn.attention.SelfAttention`'s (``kqnorm`` is implied).

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
        """The parent's arguments and ``qk_eps``, the config's ``norm_eps``.

        Args:
            config: the architecture.
            causal: whether the layer is causal.
            layer: the block's index.
            positions: a shared scheme, or ``None``.

        Returns:
            ``{name: value}``.
        """
        base = super().arguments_from_config(config, causal=causal, layer=layer, positions=positions)
        return {**base, "qk_eps": config.norm_eps}


class ProjectionRMSNormAttention(HeadRMSNormAttention):
    """Self-attention whose whole query and key projections are RMS-normalised before they are cut into heads.

    ``qnorm`` is ``RMSNorm(h s)``, ``knorm`` ``RMSNorm(g s)`` (OLMoE's ``q_norm``, ``k_norm``).

    Args:
        emb: embedding size ``e``.
        heads: heads ``h``.
        qk_eps: the norms' ``eps``.
        **options: :class:`~torchformer.nn.attention.SelfAttention`'s.

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`.
    """

    def __init__(self, emb: int, heads: int = 8, *, qk_eps: float = 1e-6, **options: Any) -> None:
        super().__init__(emb, heads, qk_eps=qk_eps, **options)
        self.qnorm = RMSNorm(self.heads * self.head_size, eps=qk_eps)
        self.knorm = RMSNorm(self.kv_heads * self.head_size, eps=qk_eps)

    def project_queries(self, x: Tensor) -> Tensor:
        """The queries, normalised over the whole projection, then split: ``(b, t, e) -> (b, h, t, s)``.

        Args:
            x: ``(b, t, e)``.

        Returns:
            ``(b, h, t, s)``.
        """
        return self.split_heads(self.qnorm(self.toqueries(x)))

    def project_keys_values(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """The keys, normalised over the whole projection, and the values, split: ``(b, u, e) -> (b, g, u, s)``.

        Args:
            y: ``(b, u, e)``.

        Returns:
            ``(keys, values)``, each ``(b, g, u, s)``.
        """
        return self.split_heads(self.knorm(self.tokeys(y))), self.split_heads(self.tovalues(y))


class GatedHeadsAttention(SelfAttention):
    """Self-attention whose heads' outputs are each multiplied by a sigmoid gate of the layer's input.

    ``gate`` ``(h, e)``, no bias: head ``n``'s output at a position is multiplied by ``sigmoid(gate.weight[n] . x)``
    before the heads are mixed (``unifyheads``).

    Args:
        emb: embedding size ``e``.
        heads: heads ``h``.
        **options: :class:`~torchformer.nn.attention.SelfAttention`'s.

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`.
    """

    def __init__(self, emb: int, heads: int = 8, **options: Any) -> None:
        super().__init__(emb, heads, **options)
        self.gate = nn.Linear(emb, heads, bias=False)

    def finish(self, out: Tensor, mask: AttentionMask, x: Tensor) -> Tensor:
        """Gate each head's output by the input, then the parent's merge and mix.

        Args:
            out: ``(b, h, t, s)``.
            mask: the mask attention used.
            x: the layer's input ``(b, t, e)``.

        Returns:
            ``(b, t, e)``.
        """
        gate = torch.sigmoid(self.gate(x)).transpose(1, 2)[..., None]  # (b, t, h) -> (b, h, t, 1)
        return super().finish(out * gate.to(out.dtype), mask, x)
