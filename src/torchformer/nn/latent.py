"""Multi-head latent attention (DeepSeek-V2, DeepSeek-V3): a KV cache of one small latent per position.

The formulas, the parameters and the absorbed decoding path: ``docs/experts-and-latents.md``, "Latent attention".
Shapes: b batch, t queries, u keys, e embedding, h heads, n and r the non-rotary and rotary query/key size of a
head, v its value size, R the latent size, Q the query latent size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from torchformer._checks import check_bool, check_positive_int
from torchformer.config import PartOptions, TransformerConfig
from torchformer.nn.attention import SelfAttention
from torchformer.nn.masks import AttentionMask
from torchformer.nn.norms import RMSNorm
from torchformer.nn.relative import AttentionPositions


@dataclass(frozen=True)
class LatentOptions(PartOptions):
    """The sizes of latent attention (:class:`LatentAttention`), in ``TransformerConfig.options``.

    Args:
        kv_rank: ``R``, the latent's size (DeepSeek-V3's ``kv_lora_rank``, 512).
        rope_dim: ``r``, the rotary part of each query and key (``qk_rope_head_dim``, 64); even.
        q_rank: ``Q``, the queries' latent size (``q_lora_rank``, 1536); ``None``: queries projected directly.
        nope_dim: ``n``, the non-rotary part of each query and key (``qk_nope_head_dim``); ``None``: the head size.
        value_dim: ``v``, each head's value size (``v_head_dim``); ``None``: the config's head size.

    Raises:
        ValueError: a size that is not a positive int, or an odd ``rope_dim``.
    """

    kv_rank: int = 512
    rope_dim: int = 64
    q_rank: Optional[int] = None
    nope_dim: Optional[int] = None
    value_dim: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.kv_rank, "kv_rank")
        if check_positive_int(self.rope_dim, "rope_dim") % 2:
            raise ValueError(f"rope_dim must be even (rotary positions rotate pairs), got {self.rope_dim}")
        for name in ("q_rank", "nope_dim", "value_dim"):
            if getattr(self, name) is not None:
                check_positive_int(getattr(self, name), name)


class LatentAttention(SelfAttention):
    """Multi-head latent attention: keys and values projected up from a cached latent, scale ``1 / sqrt(n + r)``.

    Args:
        kv_rank: ``R``.
        rope_dim: ``r``.
        nope_dim: ``n``.
        value_dim: ``v``.
        q_rank: ``Q``; ``None``: queries projected directly.
        norm_eps: the ``eps`` of the latents' RMSNorms.
        absorb: attention on the latents (the decoding path, same result; settable); ``False``: per-head keys, values.
        **options: :class:`~torchformer.nn.attention.MultiHeadAttention`'s ``causal``, ``dropout``, ``impl``,
            ``positions`` (a scheme, or its name, for the rotary coordinates), ``window``, ``pattern``, ``out_bias``;
            ``emb`` and ``heads`` are its too.

    Raises:
        ValueError: ``kv_heads``, ``wide``, ``kqnorm``, ``qkv_bias``, ``head_size`` or ``scale`` given, or a size
            that is not a positive int (and as :class:`~torchformer.nn.attention.MultiHeadAttention`).

    Shapes:
        As :class:`~torchformer.nn.attention.SelfAttention`: ``x`` ``(b, t, e)`` -> ``(b, t, e)``; a KV cache holds
        ``(b, 1, c, R)`` latents and ``(b, 1, c, r)`` rotary keys.
    """

    def __init__(self, emb: int, heads: int = 8, *, kv_rank: int, rope_dim: int, nope_dim: int, value_dim: int,
                 q_rank: Optional[int] = None, norm_eps: float = 1e-6, absorb: bool = False, **options: Any) -> None:
        for name, field in (("kv_heads", "kv_heads"), ("wide", "wide"), ("kqnorm", "kqnorm"), ("qkv_bias", "qkv_bias"),
                            ("head_size", "head_dim"), ("scale", "attention_scale")):
            if options.get(name) not in (None, False):
                raise ValueError(f"{name}={options[name]!r} (a config's {field}) does not apply to latent attention: "
                                 f"its keys and values come from one latent, its heads' sizes are nope_dim, rope_dim "
                                 f"and value_dim, its scale 1/sqrt(nope_dim + rope_dim)")
            options.pop(name, None)
        n, r, v = (check_positive_int(d, name) for d, name in ((nope_dim, "nope_dim"), (rope_dim, "rope_dim"),
                                                             (value_dim, "value_dim")))
        name = options.get("positions")
        if isinstance(name, str) and name in self.position_classes:  # its scheme for the r rotary coordinates
            scheme = self.position_classes[name]
            options["positions"] = scheme.from_sizes(heads=heads, head_size=r, causal=options.get("causal", False))
        super().__init__(emb, heads, head_size=n + r, scale=1 / math.sqrt(n + r), **options)
        self.kv_rank, self.rope_dim, self.nope_dim, self.value_dim = check_positive_int(kv_rank, "kv_rank"), r, n, v
        self.q_rank = None if q_rank is None else check_positive_int(q_rank, "q_rank")
        del self.tokeys, self.tovalues  # keys and values come from the latent
        if self.q_rank is not None:
            del self.toqueries
            self.q_down = nn.Linear(emb, self.q_rank, bias=False)
            self.q_norm = RMSNorm(self.q_rank, eps=norm_eps)
            self.q_up = nn.Linear(self.q_rank, heads * (n + r), bias=False)
        self.kv_down = nn.Linear(emb, kv_rank + r, bias=False)  # the latent and the rotary key, side by side
        self.kv_norm = RMSNorm(kv_rank, eps=norm_eps)
        self.kv_up = nn.Linear(kv_rank, heads * (n + v), bias=False)
        self.unifyheads = nn.Linear(heads * v, emb, bias=self.unifyheads.bias is not None)
        self.absorb = check_bool(absorb, "absorb")

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """As :meth:`MultiHeadAttention.arguments_from_config`, with the :class:`LatentOptions` and ``norm_eps``."""
        o = config.options_of(LatentOptions)
        base = super().arguments_from_config(config, causal=causal, layer=layer, positions=positions)
        base.pop("head_size")  # the config's head size is the default of nope_dim and value_dim, not a head size here
        return {**base, "kv_rank": o.kv_rank, "rope_dim": o.rope_dim, "q_rank": o.q_rank,
                "nope_dim": o.nope_dim or config.head_size, "value_dim": o.value_dim or config.head_size,
                "norm_eps": config.norm_eps}

    @classmethod
    def positions_from_config(cls, config: TransformerConfig, *, causal: bool) -> AttentionPositions:
        """As :meth:`MultiHeadAttention.positions_from_config`, for the ``rope_dim`` rotary coordinates of a head."""
        rope = config.options_of(LatentOptions).rope_dim
        return super().positions_from_config(config.replace(head_dim=rope), causal=causal)

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """The queries, their rotary part rotated: ``(b, h, t, n + r)``; ``(b, h, t, R + r)`` absorbed.

        As :meth:`SelfAttention.queries`.
        """
        q = self.q_up(self.q_norm(self.q_down(x))) if self.q_rank is not None else self.toqueries(x)
        q_nope, q_rope = self.split_heads(q).split([self.nope_dim, self.rope_dim], dim=-1)  # (b, h, t, n), (.., r)
        q_rope = self.relative.rotate(q_rope, positions)
        if self.absorb:
            w_uk, _ = self._up_weights()  # (h, n, R)
            q_nope = q_nope @ w_uk.to(q_nope.dtype)  # (b, h, t, n) @ (h, n, R) -> (b, h, t, R)
        return torch.cat([q_nope, q_rope], dim=-1)

    def entries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, ...]:
        """As :meth:`SelfAttention.entries`: the normalised latent ``(b, 1, t, R)``, the rotary key ``(b, 1, t, r)``."""
        latent, k_rope = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)  # (b, t, R), (b, t, r)
        k_rope = self.relative.rotate(k_rope[:, None], positions)  # (b, 1, t, r): one rotary key for all heads
        return self.kv_norm(latent)[:, None], k_rope

    def keys_values(self, entries: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """Keys and values, per head; with ``absorb`` the latents themselves, one head.

        As :meth:`SelfAttention.keys_values`: ``(b, h, u, n + r)`` and ``(b, h, u, v)``; absorbed ``(b, 1, u, R + r)``
        and ``(b, 1, u, R)``.
        """
        latent, k_rope = entries
        if self.absorb:
            return torch.cat([latent, k_rope], dim=-1), latent
        b, _, u, _ = latent.shape
        kv = self.kv_up(latent[:, 0]).view(b, u, self.heads, self.nope_dim + self.value_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.value_dim], dim=-1)  # (b, h, u, n), (b, h, u, v)
        return torch.cat([k_nope, k_rope.expand(b, self.heads, u, self.rope_dim)], dim=-1), v

    def share_kv_heads(self, x: Tensor) -> Tensor:
        """As :meth:`MultiHeadAttention.share_kv_heads`, but never a copy (absorbed: a view of the one latent head)."""
        return x.expand(x.size(0), self.heads, *x.shape[2:]) if x.size(1) == 1 and self.heads > 1 else x

    def finish(self, out: Tensor, mask: AttentionMask, x: Tensor) -> Tensor:
        """As :meth:`MultiHeadAttention.finish`; absorbed, the latents ``(b, h, t, R)`` are projected up first."""
        if self.absorb:
            _, w_uv = self._up_weights()  # (h, v, R)
            out = out @ w_uv.transpose(1, 2).to(out.dtype)  # (b, h, t, R) @ (h, R, v) -> (b, h, t, v)
        return super().finish(out, mask, x)

    def _up_weights(self) -> tuple[Tensor, Tensor]:
        """``kv_up``'s weight as each head's key part ``(h, n, R)`` and value part ``(h, v, R)``."""
        w = self.kv_up.weight.view(self.heads, self.nope_dim + self.value_dim, self.kv_rank)
        return w[:, :self.nope_dim], w[:, self.nope_dim:]

    def score_value_widths(self) -> tuple[int, int]:
        """As :meth:`MultiHeadAttention.score_value_widths`: ``(h (n + r), h v)``, the plain path's."""
        return self.heads * (self.nope_dim + self.rope_dim), self.heads * self.value_dim

    def extra_repr(self) -> str:
        return (f"emb={self.emb}, heads={self.heads}, kv_rank={self.kv_rank}, rope_dim={self.rope_dim}, "
                f"nope_dim={self.nope_dim}, value_dim={self.value_dim}, q_rank={self.q_rank}, causal={self.causal}, "
                f"absorb={self.absorb}")
