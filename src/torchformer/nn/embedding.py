"""From the input to vectors: the embedding, then the position encoding, then dropout.

Token ids go through a lookup table, feature vectors through a linear projection.

* :class:`TokenEmbedding`: the embedding of token ``i`` is row ``i`` of a ``(v, e)`` matrix, which is the same as
  multiplying a one-hot vector by that matrix, done without building the one-hot vector.
* :class:`VectorEmbedding`: inputs that already are vectors (audio frames, sensor readings, image patches) of
  ``d`` features each. A linear layer ``W x + b`` maps each to ``e`` dimensions: the dense counterpart of the
  lookup, which multiplies by a one-hot vector. Chosen by ``config.input_dim = d``.

Both take the absolute positions of their inputs ``(t,)`` and add the same position encoding.

Shapes: b batch size, t sequence length, d input features, e embedding size, v vocabulary size.
"""

from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from torchformer._checks import check_choice, check_positive_int, check_probability
from torchformer.config import TransformerConfig
from torchformer.nn.positions import LearnedPositions, NoPositions, SinusoidalPositions


class EmbeddingPositions:
    """What an embedding adds for each value of the config's ``positions``.

    The class attribute ``position_classes`` names the scheme's class; a variant replaces it to try another scheme
    (its classes build themselves with ``from_sizes(emb, max_len)``). The schemes that act inside attention
    (``"rotary"``, ``"alibi"``, ``"relative"``) and ``"none"`` add nothing here:
    :class:`~torchformer.nn.positions.NoPositions`.
    """

    position_classes: dict[str, type[nn.Module]] = {
        "learned": LearnedPositions, "sinusoidal": SinusoidalPositions, "none": NoPositions,
        "rotary": NoPositions, "rotary_interleaved": NoPositions, "alibi": NoPositions, "relative": NoPositions,
    }

    def position_class(self, positions: str) -> type[nn.Module]:
        """The class of the scheme ``positions`` names.

        Args:
            positions: the config's ``positions``, a key of ``position_classes``.

        Returns:
            The class, which builds itself with ``from_sizes(emb, max_len)``.

        Raises:
            ValueError: ``positions`` is not a key of ``position_classes`` (the message lists them).
        """
        check_choice(positions, "positions", tuple(self.position_classes))
        return self.position_classes[positions]


class TokenEmbedding(EmbeddingPositions, nn.Module):
    """Token ids ``(b, t)`` and their positions ``(t,)`` -> vectors ``(b, t, e)``.

    Args:
        num_tokens: vocabulary size ``v``.
        emb: embedding size ``e``.
        max_len: positions a learned position table holds (``seq_length``).
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        dropout: dropout on the sum of token and position vectors.

    Shapes:
        ``forward(x, positions=None)``: ids ``x`` ``(b, t)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) ->
        ``(b, t, e)``.
    """

    def __init__(
        self, num_tokens: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.num_tokens = check_positive_int(num_tokens, "num_tokens")
        self.tokens = nn.Embedding(num_tokens, check_positive_int(emb, "emb"))
        self.positions = self.position_class(positions).from_sizes(emb, check_positive_int(max_len, "max_len"))
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig, *, num_tokens: Optional[int] = None) -> TokenEmbedding:
        """An embedding of ``num_tokens`` tokens (default ``config.num_tokens``; a decoder's is ``tgt_tokens``).

        Args:
            config: gives ``emb``, ``seq_length`` (the size of a learned position table), ``positions`` and
                ``dropout``, and the vocabulary size unless ``num_tokens`` does.
            num_tokens: the vocabulary size ``v``; ``None``: ``config.num_tokens``.

        Returns:
            The embedding, ``(b, t) -> (b, t, e)``.

        Raises:
            ValueError: the vocabulary size or ``config.seq_length`` is ``None``.
        """
        return cls(config.num_tokens if num_tokens is None else num_tokens, config.emb,  # type: ignore[arg-type]
                   config.seq_length, positions=config.positions, dropout=config.dropout)  # type: ignore[arg-type]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.drop(self.positions(self.tokens(x), positions))  # (b, t) -> (b, t, e)


class VectorEmbedding(EmbeddingPositions, nn.Module):
    """Feature vectors ``(b, t, d)`` and their positions ``(t,)`` -> vectors ``(b, t, e)``.

    ``W x + b``, plus the position encoding, then dropout.

    Args:
        input_dim: features per input vector ``d``.
        emb: embedding size ``e``.
        max_len: positions a learned position table holds (``seq_length``).
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``, as for :class:`TokenEmbedding`.
        dropout: dropout on the sum of projected and position vectors.

    The features are used as they come: normalise them beforehand (per feature, over the training set) as for
    any linear model, or the largest feature dominates the first steps of training.

    Shapes:
        ``forward(x, positions=None)``: ``x`` ``(b, t, d)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) ->
        ``(b, t, e)``.
    """

    def __init__(
        self, input_dim: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.input_dim = check_positive_int(input_dim, "input_dim")
        self.project = nn.Linear(input_dim, check_positive_int(emb, "emb"))
        self.positions = self.position_class(positions).from_sizes(emb, check_positive_int(max_len, "max_len"))
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig) -> VectorEmbedding:
        """An embedding of ``config.input_dim``-dimensional feature vectors, with ``config``'s positions and dropout.

        Args:
            config: gives ``input_dim`` (``d``), ``emb``, ``seq_length`` (the size of a learned position table),
                ``positions`` and ``dropout``.

        Returns:
            The embedding, ``(b, t, d) -> (b, t, e)``.

        Raises:
            ValueError: ``config.input_dim`` or ``config.seq_length`` is ``None``.
        """
        return cls(config.input_dim, config.emb, config.seq_length,  # type: ignore[arg-type]
                   positions=config.positions, dropout=config.dropout)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.drop(self.positions(self.project(x), positions))  # (b, t, d) -> (b, t, e)


def input_embedding(config: TransformerConfig) -> Union[TokenEmbedding, VectorEmbedding]:
    """The embedding of a model's input: token ids or feature vectors, as ``config`` says.

    :class:`VectorEmbedding` when ``config.input_dim`` is set, else :class:`TokenEmbedding` of ``config.num_tokens``
    tokens.

    Args:
        config: the model's configuration.

    Returns:
        The embedding, ``(b, t, d) -> (b, t, e)`` for vectors, ``(b, t) -> (b, t, e)`` for token ids.

    Raises:
        ValueError: a field the embedding needs (``num_tokens`` or ``input_dim``, ``seq_length``) is ``None``.
    """
    if config.input_dim is not None:
        return VectorEmbedding.from_config(config)
    return TokenEmbedding.from_config(config)
