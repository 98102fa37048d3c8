"""The position-wise feed-forward networks of a block, chosen by ``config.activation`` (``docs/modern-blocks.md``).

Shapes: b batch size, t sequence length, e embedding size, h hidden size.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import check_bool, check_choice, check_positive_int, check_probability
from torchformer.config import TransformerConfig


class ReLUSquared(nn.Module):
    """``relu(x)^2`` (So et al. 2021, "Primer").

    Shapes:
        ``forward(x)``: any shape -> the same shape, element by element.
    """

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


class GELUTanh(nn.GELU):
    """GELU's tanh approximation (GPT-2's ``gelu_new``), which GPT-2's weights need: ``nn.GELU(approximate="tanh")``.

    Shapes:
        ``forward(x)``: any shape -> the same shape, element by element.
    """

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


# Nonlinearities of the plain network, and the gates of the gated one (the activation on the W1 path).
NONLINEARITIES: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": GELUTanh, "relu2": ReLUSquared,
}
GATES: dict[str, type[nn.Module]] = {"swiglu": nn.SiLU, "geglu": nn.GELU, "geglu_tanh": GELUTanh}


def gated_hidden_size(emb: int, ff_mult: int) -> int:
    """The hidden size of a gated unit: ``2/3 * ff_mult * emb`` to the nearest multiple of 16 (at least 16).

    Args:
        emb: embedding size ``e``.
        ff_mult: the plain network's hidden size as a multiple of ``e``.

    Returns:
        The gated unit's hidden size ``h``, about a plain network's parameters (``docs/modern-blocks.md``).
    """
    return max(16, 16 * round(2 * ff_mult * emb / 48))


class FeedForward(nn.Module):
    """``W2 act(W1 x + b1) + b2`` at each position, hidden size ``h``; layers ``net.0`` (``W1``) to ``net.3`` (``W2``).

    Args:
        emb: embedding size ``e``.
        ff_mult: hidden size as a multiple of ``e``.
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` (:class:`GELUTanh`) or ``"relu2"`` (:class:`ReLUSquared`).
        dropout: dropout on the hidden activations (training only).
        hidden: the hidden size ``h`` (``config.ff_hidden``); ``None``: ``ff_mult * e``.
        bias: the biases ``b1`` and ``b2`` (``True``); ``False``: none, as T5 (``config.ff_bias``).

    Raises:
        ValueError: a gated ``activation`` (:class:`GatedFeedForward`'s), or a size or probability out of range.

    Shapes:
        ``forward(x, mask=None)``: ``(b, t, e)`` (or any ``(..., e)``) -> the same; ``mask`` ``(b, t)`` is not read.
    """

    def __init__(self, emb: int, *, ff_mult: int = 4, activation: str = "relu", dropout: float = 0.0,
                 hidden: Optional[int] = None, bias: bool = True) -> None:
        super().__init__()
        check_positive_int(emb, "emb")
        check_positive_int(ff_mult, "ff_mult")
        hidden = ff_mult * emb if hidden is None else check_positive_int(hidden, "hidden")
        if activation in GATES:
            raise ValueError(
                f"activation {activation!r} is a gated linear unit, which has three matrices: build a "
                f"GatedFeedForward (a block's feedforward_classes name it for the gated units)"
            )
        check_choice(activation, "activation", tuple(NONLINEARITIES))
        check_bool(bias, "bias")
        self.net = nn.Sequential(
            nn.Linear(emb, hidden, bias=bias),
            NONLINEARITIES[activation](),
            nn.Dropout(check_probability(dropout, "dropout")),
            nn.Linear(hidden, emb, bias=bias),
        )

    @classmethod
    def from_config(cls, config: TransformerConfig, *, layer: int = 0) -> FeedForward:
        """The network of one block of ``config``: always of the class this is called on.

        Args:
            config: the architecture; ``emb``, ``ff_mult`` (or ``ff_hidden``), ``activation``, ``dropout``, ``ff_bias``.
            layer: the block's index, from 0 at the input; unused here.

        Raises:
            ValueError: ``config.activation`` is a gated unit (``"swiglu"``, ``"geglu"``, ``"geglu_tanh"``).
        """
        network = cls(config.emb, **cls.arguments_from_config(config, layer=layer))
        if config.zero_init_residual:  # the block starts as the identity (TransformerConfig.zero_init_residual)
            for parameter in network.net[-1].parameters():
                nn.init.zeros_(parameter)
        return network

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, layer: int) -> dict[str, Any]:
        """The keyword arguments :meth:`from_config` builds ``cls(config.emb, **arguments)`` with.

        Args:
            config: the architecture.
            layer: the block's index, from 0 at the input.

        Returns:
            ``{name: value}``: ``ff_mult``, ``activation``, ``dropout``, ``hidden``, ``bias``.
        """
        return {"ff_mult": config.ff_mult, "activation": config.activation, "dropout": config.dropout,
                "hidden": config.ff_hidden, "bias": config.ff_bias}

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self.net(x)  # each position on its own: the padding mask changes nothing


class GatedFeedForward(nn.Module):
    """A gated linear unit ``W2 (act(W1 x) * (V x))`` at each position, no biases; layers ``w1``, ``v``, ``w2``.

    Args:
        emb: embedding size ``e``.
        ff_mult: the plain network's hidden size as a multiple of ``e``.
        activation: ``act``: SiLU (``"swiglu"``), GELU (``"geglu"``) or :class:`GELUTanh` (``"geglu_tanh"``).
        dropout: dropout on the product (training only).
        hidden: the hidden size ``h`` (``config.ff_hidden``); ``None``: :func:`gated_hidden_size`.

    Raises:
        ValueError: an ``activation`` that is not a gated unit, or a size or probability out of range.

    Shapes:
        As :class:`FeedForward`.
    """

    def __init__(self, emb: int, *, ff_mult: int = 4, activation: str = "swiglu", dropout: float = 0.0,
                 hidden: Optional[int] = None) -> None:
        super().__init__()
        check_positive_int(emb, "emb")
        check_positive_int(ff_mult, "ff_mult")
        check_choice(activation, "activation", tuple(GATES))
        hidden = gated_hidden_size(emb, ff_mult) if hidden is None else check_positive_int(hidden, "hidden")
        self.w1 = nn.Linear(emb, hidden, bias=False)  # the gate's input
        self.v = nn.Linear(emb, hidden, bias=False)  # the value it gates
        self.w2 = nn.Linear(hidden, emb, bias=False)
        self.act = GATES[activation]()
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig, *, layer: int = 0) -> GatedFeedForward:
        """As :meth:`FeedForward.from_config`, for the gated units; ``config.ff_bias`` is not read.

        Raises:
            ValueError: ``config.activation`` is not a gated unit.
        """
        network = cls(config.emb, **cls.arguments_from_config(config, layer=layer))
        if config.zero_init_residual:  # the block starts as the identity (TransformerConfig.zero_init_residual)
            for parameter in network.w2.parameters():
                nn.init.zeros_(parameter)
        return network

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, layer: int) -> dict[str, Any]:
        """As :meth:`FeedForward.arguments_from_config`, without ``bias``."""
        return {"ff_mult": config.ff_mult, "activation": config.activation, "dropout": config.dropout,
                "hidden": config.ff_hidden}

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self.w2(self.drop(self.act(self.w1(x)) * self.v(x)))  # (b, t, e) -> (b, t, h) -> (b, t, e)
