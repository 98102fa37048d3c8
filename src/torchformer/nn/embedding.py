"""From token ids to vectors: a lookup table, plus the position encoding, then dropout.

The embedding of token ``i`` is row ``i`` of a ``(v, e)`` matrix, which is the same as multiplying a one-hot
vector by that matrix, done without building the one-hot vector.

Shapes: b batch size, t sequence length, e embedding size, v vocabulary size.
"""

from __future__ import annotations

from torch import Tensor, nn

from torchformer._checks import check_positive_int, check_probability
from torchformer.nn.positions import make_positions


class TokenEmbedding(nn.Module):
    """Token ids ``(b, t)`` and their positions ``(t,)`` -> vectors ``(b, t, e)``.

    Args:
        num_tokens: vocabulary size ``v``.
        emb: embedding size ``e``.
        max_len: positions a learned position table holds (``seq_length``).
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        dropout: dropout on the sum of token and position vectors.
    """

    def __init__(
        self, num_tokens: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.num_tokens = check_positive_int(num_tokens, "num_tokens")
        self.tokens = nn.Embedding(num_tokens, check_positive_int(emb, "emb"))
        self.positions = make_positions(positions, emb, check_positive_int(max_len, "max_len"))
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return self.drop(self.positions(self.tokens(x), positions))  # (b, t) -> (b, t, e)
