"""A sparse mixture of experts: a feed-forward network of ``E`` experts, each token sent to ``k`` of them.

See ``docs/experts-and-latents.md``. Shapes: b batch, t sequence length, e embedding, n = b t tokens, E experts, k
experts per token, h an expert's hidden size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import (
    autocast_dtype, check_bool, check_choice, check_embeddings, check_int_at_least, check_mask, check_positive_float,
    check_positive_int, check_probability, is_number,
)
from torchformer.config import PartOptions, TransformerConfig
from torchformer.nn.auxiliary import AuxiliaryLosses
from torchformer.nn.blocks import TransformerBlock
from torchformer.nn.feedforward import GATES, GatedFeedForward, gated_hidden_size

SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEOptions(PartOptions):
    """The options of a mixture of experts (:class:`MoEFeedForward`), in ``TransformerConfig.options``.

    Args:
        experts: ``E``, the routed experts.
        top_k: ``k``, the experts each token goes to, at most ``experts``.
        expert_hidden: each expert's hidden size ``h``; ``None``: the dense network's (``ff_hidden``, or the gated
            size of ``ff_mult``).
        shared_experts: experts every token goes to, one gated network of ``shared_experts * h`` units; 0: none.
        score: ``"softmax"`` or ``"sigmoid"`` of the router's logits.
        normalize: renormalise the ``k`` weights of a token to sum to 1.
        routed_scaling: the factor the routed experts' weights are multiplied by (DeepSeek-V3: 2.5).
        groups: the experts fall into this many groups (dividing ``E``), for group-limited routing (DeepSeek-V3).
        top_groups: how many of the best groups a token's experts come from, each scored by its two best experts.
        dense_layers: the first blocks keep a dense feed-forward network (DeepSeek's ``first_k_dense_replace``).
        capacity_factor: ``None`` drops no token; a number ``f`` lets each expert take at most ``ceil(f * n * k / E)``
            of a training batch's ``n k`` assignments, earliest tokens first (evaluation drops none).
        balance_loss: the weight of the balance loss in the training loss (0 records it for the log only).
        z_loss: the weight of the router z-loss.
        selection_bias: a per-expert bias added to the scores to choose the experts, not to weigh them (DeepSeek-V3's
            ``e_score_correction_bias``), a buffer saved with the weights.
        bias_update_rate: how far :meth:`Router.after_step` moves the selection bias per step (DeepSeek-V3: 0.001);
            0: it stays as loaded. Needs ``selection_bias``.

    Raises:
        ValueError: a value out of range, or options that contradict each other (``top_k`` above ``experts``,
            groups that do not divide the experts).
        TypeError: ``normalize`` or ``selection_bias`` is not a bool.
    """

    experts: int = 8
    top_k: int = 2
    expert_hidden: Optional[int] = None
    shared_experts: int = 0
    score: str = "softmax"
    normalize: bool = True
    routed_scaling: float = 1.0
    groups: int = 1
    top_groups: int = 1
    dense_layers: int = 0
    capacity_factor: Optional[float] = None
    balance_loss: float = 0.01
    z_loss: float = 0.0
    selection_bias: bool = False
    bias_update_rate: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.experts, "experts")
        check_positive_int(self.top_k, "top_k")
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be at most experts={self.experts}, got {self.top_k}")
        if self.expert_hidden is not None:
            check_positive_int(self.expert_hidden, "expert_hidden")
        check_int_at_least(self.shared_experts, "shared_experts", 0)
        check_choice(self.score, "score", SCORES)
        check_bool(self.normalize, "normalize")
        check_positive_float(self.routed_scaling, "routed_scaling")
        check_positive_int(self.groups, "groups")
        check_positive_int(self.top_groups, "top_groups")
        if self.experts % self.groups:
            raise ValueError(f"groups must divide experts={self.experts}, got {self.groups}")
        if self.top_groups > self.groups:
            raise ValueError(f"top_groups must be at most groups={self.groups}, got {self.top_groups}")
        if self.groups > 1 and self.top_groups * (self.experts // self.groups) < self.top_k:
            raise ValueError(f"top_groups={self.top_groups} groups of {self.experts // self.groups} experts hold "
                             f"fewer than top_k={self.top_k} experts")
        check_int_at_least(self.dense_layers, "dense_layers", 0)
        if self.capacity_factor is not None:
            check_positive_float(self.capacity_factor, "capacity_factor")
        for name in ("balance_loss", "z_loss", "bias_update_rate"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        check_bool(self.selection_bias, "selection_bias")
        if self.bias_update_rate > 0 and not self.selection_bias:
            raise ValueError(f"bias_update_rate={self.bias_update_rate} moves the selection bias: set "
                             f"selection_bias=True")


class Routing(NamedTuple):
    """What the router decided for ``n`` tokens."""

    experts: Tensor  # (n, k) long: each token's experts
    weights: Tensor  # (n, k): their weights, in the scores' dtype (float32)
    logits: Tensor  # (n, E) float32: the router's logits


class Router(AuxiliaryLosses):
    """Scores the experts for each token and picks ``k``: ``(n, e) -> Routing``; records the balance losses.

    Args:
        emb: the embedding size ``e``.
        experts: ``E``.
        top_k: ``k``.
        score: ``"softmax"`` or ``"sigmoid"``.
        normalize: renormalise each token's ``k`` weights to sum to 1.
        routed_scaling: the weights' factor.
        groups: expert groups, for group-limited routing.
        top_groups: the groups a token's experts may come from.
        balance_loss: the balance loss's weight.
        z_loss: the z-loss's weight.
        selection_bias: a per-expert bias for the choice (the buffer ``selection_bias``, zeros at first).
        bias_update_rate: the loss-free balancing step of :meth:`after_step`.

    Raises:
        ValueError, TypeError: as :class:`MoEOptions` for the same values.

    Shapes:
        ``forward(x, real=None)``: ``x`` ``(n, e)``, ``real`` ``(n,)`` bool (True at real tokens) -> a
        :class:`Routing`: ``experts`` ``(n, k)``, ``weights`` ``(n, k)``, ``logits`` ``(n, E)``.
    """

    def __init__(self, emb: int, experts: int, top_k: int, *, score: str = "softmax", normalize: bool = True,
                 routed_scaling: float = 1.0, groups: int = 1, top_groups: int = 1, balance_loss: float = 0.0,
                 z_loss: float = 0.0, selection_bias: bool = False, bias_update_rate: float = 0.0) -> None:
        super().__init__()
        MoEOptions(experts=experts, top_k=top_k, score=score, normalize=normalize, routed_scaling=routed_scaling,
                   groups=groups, top_groups=top_groups, balance_loss=balance_loss, z_loss=z_loss,
                   selection_bias=selection_bias, bias_update_rate=bias_update_rate)  # the checks' one home
        self.experts, self.top_k, self.score = experts, top_k, score
        self.normalize, self.routed_scaling = normalize, routed_scaling
        self.groups, self.top_groups = groups, top_groups
        self.balance_loss, self.z_loss, self.bias_update_rate = balance_loss, z_loss, bias_update_rate
        self.weight = nn.Parameter(torch.empty(experts, emb))  # (E, e): the router's logits W_r x
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's initialisation
        # Added in float32 (a step of 0.001 vanishes in bf16 next to a bias of 1): the buffer stays float32.
        self.register_buffer("selection_bias", torch.zeros(experts) if selection_bias else None)
        self.pending_load: Optional[Tensor] = None  # (E,) the assignments since the last after_step (training)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Router:
        """``to()``, ``cuda()``, ``bfloat16()``, ...: the selection bias moves with the module but stays float32."""
        bias = self.selection_bias
        super()._apply(fn, recurse)
        if bias is not None and self.selection_bias.dtype != torch.float32:  # cast: take the float32 numbers over
            self.selection_bias = bias.to(self.selection_bias.device, torch.float32)
        return self

    def forward(self, x: Tensor, real: Optional[Tensor] = None) -> Routing:
        logits = F.linear(x.float(), self.weight.float())  # (n, E): in float32, as the references route
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()  # (n, E)
        choice = scores if self.selection_bias is None else scores + self.selection_bias.float()  # (n, E)
        if self.top_groups < self.groups:  # only experts of each token's best groups
            grouped = choice.view(choice.size(0), self.groups, -1)  # (n, G, E/G)
            best = grouped.topk(min(2, grouped.size(-1)), dim=-1).values.sum(-1)  # (n, G): a group's two best
            keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(self.top_groups, -1).indices, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(1)  # (n, E)
        experts = choice.topk(self.top_k, dim=-1).indices  # (n, k)
        weights = scores.gather(1, experts)  # (n, k)
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        if self.training:
            self.record_balance(logits, scores, experts, real)
        return Routing(experts, weights * self.routed_scaling, logits)

    def record_balance(self, logits: Tensor, scores: Tensor, experts: Tensor, real: Optional[Tensor]) -> None:
        """Record the balance loss and the z-loss of these tokens (padding left out), and note each expert's load.

        Args:
            logits: ``(n, E)`` float32.
            scores: ``(n, E)``.
            experts: ``(n, k)``, the chosen experts.
            real: ``(n,)`` bool, or ``None``: every token is real.
        """
        counted = torch.ones(logits.size(0), device=logits.device) if real is None else real.float()  # (n,)
        tokens = counted.sum().clamp(min=1)
        load = torch.zeros(self.experts, device=logits.device).index_add_(
            0, experts.flatten(), counted.repeat_interleave(self.top_k))  # (E,): assignments per expert
        probabilities = scores if self.score == "softmax" else scores / scores.sum(-1, keepdim=True)  # (n, E)
        mean_probability = (probabilities * counted[:, None]).sum(0) / tokens  # (E,)
        self.record("balance", self.experts * (load / tokens * mean_probability).sum(), weight=self.balance_loss)
        self.record("router_z", (logits.logsumexp(-1).square() * counted).sum() / tokens, weight=self.z_loss)
        self.note("expert_load", load)
        if self.selection_bias is not None and self.bias_update_rate > 0:
            pending = load.detach() if self.pending_load is None else self.pending_load + load.detach()
            self.pending_load = pending

    def after_step(self, reduce: Callable[[Tensor], Tensor]) -> None:
        """Loss-free balancing: move the selection bias by ``bias_update_rate`` towards the starved experts.

        As :meth:`AuxiliaryLosses.after_step`: the experts with fewer assignments than the mean since the last step
        (summed over the processes by ``reduce``) go up by the rate, the others down.
        """
        if self.pending_load is None or self.selection_bias is None:
            return
        load = reduce(self.pending_load)  # (E,)
        with torch.no_grad():
            self.selection_bias.add_(self.bias_update_rate * torch.sign(load.mean() - load))
        self.pending_load = None

    def extra_repr(self) -> str:
        return (f"experts={self.experts}, top_k={self.top_k}, score={self.score!r}, normalize={self.normalize}"
                + (f", routed_scaling={self.routed_scaling}" if self.routed_scaling != 1 else "")
                + (f", groups={self.groups}, top_groups={self.top_groups}" if self.groups > 1 else ""))


class MoEFeedForward(nn.Module):
    """A mixture of ``E`` gated experts, ``k`` per token, and optional shared experts.

    Args:
        emb: the embedding size ``e``.
        experts: ``E``.
        top_k: ``k``.
        hidden: ``h``.
        activation: the gate, ``"swiglu"``, ``"geglu"`` or ``"geglu_tanh"``.
        shared_hidden: the hidden size of the shared experts' gated network; 0: none.
        dropout: dropout on each expert's hidden layer.
        capacity_factor: ``None``: no token dropped; else each expert's capacity, as :class:`MoEOptions` says.
        **routing: the :class:`Router`'s keyword arguments (``score``, ``normalize``, ``groups``, ...).

    Raises:
        ValueError, TypeError: a non-gated ``activation``, or a value :class:`MoEOptions` refuses.

    Shapes:
        ``forward(x, mask=None)``: ``x`` ``(b, t, e)``, ``mask`` ``(b, t)`` (True at real tokens) -> ``(b, t, e)``;
        padding gets the shared experts' output only (zero without them).
    """

    def __init__(self, emb: int, *, experts: int = 8, top_k: int = 2, hidden: int, activation: str = "swiglu",
                 shared_hidden: int = 0, dropout: float = 0.0, capacity_factor: Optional[float] = None,
                 **routing: Any) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.hidden = check_positive_int(hidden, "hidden")
        if activation not in GATES:
            raise ValueError(f"activation must be a gated unit for the experts, one of {', '.join(map(repr, GATES))};"
                             f" got {activation!r}")
        self.capacity_factor = MoEOptions(capacity_factor=capacity_factor).capacity_factor  # checked there
        self.router = Router(emb, experts, top_k, **routing)
        self.w1 = nn.Parameter(torch.empty(experts, emb, hidden))  # (E, e, h): the gates' input
        self.v = nn.Parameter(torch.empty(experts, emb, hidden))  # (E, e, h): the values they gate
        self.w2 = nn.Parameter(torch.empty(experts, hidden, emb))  # (E, h, e)
        for weight, fan_in in ((self.w1, emb), (self.v, emb), (self.w2, hidden)):  # nn.Linear's range
            nn.init.uniform_(weight, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
        self.act = GATES[activation]()
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))
        self.shared = (GatedFeedForward(emb, hidden=shared_hidden, activation=activation, dropout=dropout)
                       if shared_hidden else None)

    @classmethod
    def from_config(cls, config: TransformerConfig, *, layer: int = 0) -> MoEFeedForward:
        """As :meth:`FeedForward.from_config`: the mixture of one block of ``config``, with its :class:`MoEOptions`.

        Raises:
            ValueError: ``config.activation`` is not a gated unit.
        """
        network = cls(config.emb, **cls.arguments_from_config(config, layer=layer))
        if config.zero_init_residual:  # the block starts as the identity
            nn.init.zeros_(network.w2)
            if network.shared is not None:
                nn.init.zeros_(network.shared.w2.weight)
        return network

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, layer: int) -> dict[str, Any]:
        """As :meth:`FeedForward.arguments_from_config`, for this class: from ``config`` and its :class:`MoEOptions`."""
        o = config.options_of(MoEOptions)
        hidden = o.expert_hidden or config.ff_hidden or gated_hidden_size(config.emb, config.ff_mult)
        return {"experts": o.experts, "top_k": o.top_k, "hidden": hidden, "activation": config.activation,
                "shared_hidden": o.shared_experts * hidden, "dropout": config.dropout,
                "capacity_factor": o.capacity_factor, "score": o.score, "normalize": o.normalize,
                "routed_scaling": o.routed_scaling, "groups": o.groups, "top_groups": o.top_groups,
                "balance_loss": o.balance_loss, "z_loss": o.z_loss, "selection_bias": o.selection_bias,
                "bias_update_rate": o.bias_update_rate}

    @property
    def experts(self) -> int:
        """``E``, the routed experts."""
        return self.router.experts

    def idle_parameters(self) -> int:
        """The weights a token does not use, ``(E - k) * 3 e h``: those of the routed experts it is not sent to."""
        return (self.experts - self.router.top_k) * 3 * self.emb * self.hidden

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        tokens, real = self._tokens(x, mask)  # (n, e), (n,) or None
        routing = self.router(tokens, real)
        kept = self.kept(routing.experts, real)  # (n, k)
        routed = self.dispatch(tokens, routing.experts, routing.weights, kept)  # (n, e)
        return self._finish(routed, tokens, x.shape)

    def reference(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """The readable path, equal to :meth:`forward` at ``E / k`` times the cost: every expert on every token.

        Args:
            x: ``(b, t, e)``.
            mask: ``(b, t)``, True at real tokens; ``None``: all real.
        """
        tokens, real = self._tokens(x, mask)
        routing = self.router(tokens, real)
        kept = self.kept(routing.experts, real)
        # (n, E): token i's weight for expert j, 0 where j was not picked (or the assignment was dropped)
        mixing = torch.zeros(tokens.size(0), self.experts, dtype=routing.weights.dtype, device=tokens.device)
        mixing = mixing.scatter_add(1, routing.experts, routing.weights * kept)
        routed = tokens.new_zeros(tokens.shape)
        for j in range(self.experts):
            out = self.drop(self.act(tokens @ self.w1[j]) * (tokens @ self.v[j])) @ self.w2[j]  # (n, e)
            routed = routed + mixing[:, j, None].to(out.dtype) * out
        return self._finish(routed, tokens, x.shape)

    def _tokens(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
        b, t, e = check_embeddings(x, "x", self.emb)
        if mask is not None:
            check_mask(mask, "mask", (b, t), device=x.device)
        return x.reshape(b * t, e), None if mask is None else mask.reshape(b * t)  # (n, e), (n,)

    def _finish(self, routed: Tensor, tokens: Tensor, shape: torch.Size) -> Tensor:
        if self.shared is not None:
            routed = routed + self.shared(tokens)
        return routed.view(shape)  # (n, e) -> (b, t, e)

    def kept(self, experts: Tensor, real: Optional[Tensor]) -> Tensor:
        """Which of the ``n k`` assignments are computed: those of real tokens, within the experts' capacity.

        Args:
            experts: ``(n, k)``, each token's experts.
            real: ``(n,)`` bool, or ``None``.

        Returns:
            ``(n, k)`` bool.
        """
        n, k = experts.shape
        kept = torch.ones_like(experts, dtype=torch.bool) if real is None else real[:, None].expand(n, k)
        if self.capacity_factor is None or not self.training:  # evaluation: a row never depends on the others
            return kept
        tokens = kept[:, 0].sum()  # real tokens (a tensor: no wait for the device)
        capacity = torch.ceil(self.capacity_factor * tokens * k / self.experts)
        flat = torch.where(kept.reshape(-1), experts.reshape(-1), self.experts)  # (n k,) dropped ones last
        order = flat.argsort(stable=True)  # token order within each expert: the earliest first
        counts = torch.bincount(flat, minlength=self.experts + 1)  # (E + 1,)
        start = counts.cumsum(0) - counts  # (E + 1,): where each expert's assignments begin in `order`
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        position = rank - start[flat]  # (n k,): the assignment's place in its expert's queue
        return kept & (position < capacity).view(n, k)

    def dispatch(self, tokens: Tensor, experts: Tensor, weights: Tensor, kept: Tensor) -> Tensor:
        """Each kept assignment's expert applied to its token, weighted, and summed per token: the fast path.

        Args:
            tokens: ``(n, e)``.
            experts: ``(n, k)``.
            weights: ``(n, k)``.
            kept: ``(n, k)`` bool.

        Returns:
            ``(n, e)``.
        """
        n, k = experts.shape
        flat = torch.where(kept.reshape(-1), experts.reshape(-1), self.experts)  # (n k,): dropped ones last
        order = flat.argsort(stable=True)  # the assignments grouped by expert
        token = order // k  # (n k,): the token of each sorted assignment
        valid = (flat[order] < self.experts)[:, None]  # (n k, 1): kept; the others sit at the end
        rows = tokens[token]  # (n k, e): each expert's tokens side by side
        counts = torch.bincount(flat, minlength=self.experts + 1)[:self.experts]  # (E,)
        out = self.experts_apply(rows, counts, valid)  # (n k, e)
        out = out * weights.reshape(-1)[order, None].to(out.dtype)
        return out.new_zeros(n, tokens.size(1)).index_add_(0, token, out)  # (n, e), in the products' dtype

    def experts_apply(self, rows: Tensor, counts: Tensor, valid: Tensor) -> Tensor:
        """The experts on their rows ``(m, e)``, sorted by expert with ``counts`` ``(E,)`` of each; 0 for the rest.

        Args:
            rows: ``(m, e)``.
            counts: ``(E,)`` long, summing to at most ``m``.
            valid: ``(m, 1)`` bool, True for the first ``counts.sum()`` rows.
        """
        cast = autocast_dtype(rows.device.type)  # autocast runs matrix products in its dtype; _grouped_mm too
        rows = rows if cast is None else rows.to(cast)
        if self._grouped(rows):
            offsets = counts.cumsum(0).to(torch.int32)  # (E,): where each expert's rows end
            rows = torch.where(valid, rows, 0.0)  # the backward pass reads no unwritten gradient either
            gate = torch.where(valid, torch._grouped_mm(rows, self.w1.to(rows.dtype), offs=offsets), 0.0)  # (m, h)
            value = torch.where(valid, torch._grouped_mm(rows, self.v.to(rows.dtype), offs=offsets), 0.0)
            out = torch._grouped_mm(self.drop(self.act(gate) * value), self.w2.to(rows.dtype), offs=offsets)
            return torch.where(valid, out, 0.0)  # (m, e)
        out = torch.zeros_like(rows)
        start = 0
        for j, count in enumerate(counts.tolist()):
            part = rows[start:start + count]  # (count, e)
            out[start:start + count] = self.drop(self.act(part @ self.w1[j]) * (part @ self.v[j])) @ self.w2[j]
            start += count
        return out

    def _grouped(self, rows: Tensor) -> bool:
        compiling = torch.compiler.is_compiling()
        dtypes = (torch.bfloat16,) if compiling else (torch.float32, torch.bfloat16, torch.float16)
        aligned = all(size * rows.element_size() % 16 == 0 for size in (self.emb, self.hidden))
        return hasattr(torch, "_grouped_mm") and rows.dtype in dtypes and aligned and rows.device.type != "meta"

    def extra_repr(self) -> str:
        return (f"emb={self.emb}, experts={self.experts}, top_k={self.router.top_k}, hidden={self.hidden}"
                + (f", shared_hidden={self.shared.w1.out_features}" if self.shared is not None else "")
                + (f", capacity_factor={self.capacity_factor}" if self.capacity_factor is not None else ""))


class MoEBlock(TransformerBlock):
    """A transformer block whose feed-forward network is a :class:`MoEFeedForward`, after ``dense_layers`` dense ones.

    Arguments: as :class:`TransformerBlock`, ``config`` with its :class:`MoEOptions`.

    Shapes:
        As :class:`TransformerBlock`.
    """

    def feedforward_for(self, config: TransformerConfig) -> type[nn.Module]:
        """As :meth:`TransformerBlock.feedforward_for`: :class:`MoEFeedForward`, dense in the first ``dense_layers``."""
        if self.layer < config.options_of(MoEOptions).dense_layers:
            return super().feedforward_for(config)
        return MoEFeedForward
