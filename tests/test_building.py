"""torchformer.pretrained.building: a model built with memory but no values is, once its state is loaded, the model
the ordinary constructor builds, for every position scheme (ALiBi's slopes and the rotary angles are computed, not
kept in buffers that no file fills)."""

from __future__ import annotations

import pytest
import torch

from torchformer import CTransformer, GTransformer, MLMTransformer, Seq2SeqTransformer
from torchformer.config import POSITIONS
from torchformer.pretrained.building import empty_model

MODELS = {
    GTransformer: dict(num_tokens=20),
    MLMTransformer: dict(num_tokens=20),
    CTransformer: dict(num_tokens=20, num_classes=3),
    Seq2SeqTransformer: dict(num_tokens=20, tgt_tokens=20),
}


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("model_class", list(MODELS), ids=lambda c: c.__name__)
def test_an_empty_model_given_the_state_of_a_built_one_is_that_model(model_class, positions):
    torch.manual_seed(0)
    built = model_class(16, 4, 2, 8, positions=positions, tie_weights=model_class is GTransformer,
                        **MODELS[model_class]).eval()
    with torch.no_grad():
        for p in built.parameters():
            p.add_(0.1 * torch.randn_like(p))  # no parameter at a constructor's value (a zero bias, a unit gain)
    empty = empty_model(model_class, built.config, dtype=torch.float32, device=torch.device("cpu"))
    empty.load_state_dict(built.state_dict())
    empty.eval()
    x = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if model_class is Seq2SeqTransformer:
            torch.testing.assert_close(empty(x, x), built(x, x), atol=0, rtol=0)
        else:
            torch.testing.assert_close(empty(x), built(x), atol=0, rtol=0)


def test_a_model_with_a_buffer_no_file_would_fill_is_refused_by_name():
    class Unsaved(GTransformer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    config = GTransformer(16, 2, 1, 8, 20).config
    with pytest.raises(ValueError, match=r"Unsaved keeps buffers outside its state_dict \(table\)"):
        empty_model(Unsaved, config, dtype=torch.float32, device=torch.device("cpu"))
