"""What a variant can change without copying library code: every part learns its block's index, position schemes
are classes named by class attributes, ``from_config`` builds the class it is called on, and a block wired another
way (a parallel block) overrides only ``forward`` and tells the stack whether it needs a final norm."""

import pytest
import torch
from torch import nn

from torchformer import (
    CrossAttention, Decoder, DecoderBlock, Encoder, FeedForward, GTransformer, SelfAttention, TransformerBlock,
    TransformerConfig, generate,
)
from torchformer.nn.embedding import TokenEmbedding
from torchformer.nn.positions import SinusoidalPositions
from torchformer.nn.relative import Rotary

CONFIG = TransformerConfig(16, 4, 3, 12, 20)


def recording(base):
    """A subclass of ``base`` whose ``from_config`` records the ``layer`` it was given."""

    class Recording(base):
        @classmethod
        def from_config(cls, config, *, layer=0, **options):
            part = super().from_config(config, layer=layer, **options)
            part.built_for = layer
            return part

    return Recording


def test_every_block_and_part_learns_its_layer():
    class Block(TransformerBlock):
        attention_class = recording(SelfAttention)
        feedforward_classes = dict.fromkeys(TransformerBlock.feedforward_classes, recording(FeedForward))

    class Cross(DecoderBlock):
        attention_class = recording(SelfAttention)
        cross_attention_class = recording(CrossAttention)

    encoder, decoder = Encoder(CONFIG, block_class=Block), Decoder(CONFIG.replace(decoder_depth=2), block_class=Cross)
    assert [b.layer for b in encoder.blocks] == [0, 1, 2]
    assert [(b.attention.built_for, b.ff.built_for) for b in encoder.blocks] == [(0, 0), (1, 1), (2, 2)]
    assert [(b.layer, b.attention.built_for, b.cross_attention.built_for) for b in decoder.blocks] == [(0, 0, 0),
                                                                                                     (1, 1, 1)]


def test_a_depth_dependent_variant_needs_no_patching_after_construction():
    """Depth-scaled initialisation (as GPT-2 scales its residual projections), decided in from_config."""

    class Scaled(SelfAttention):
        @classmethod
        def from_config(cls, config, *, causal=False, layer=0):
            attention = super().from_config(config, causal=causal, layer=layer)
            with torch.no_grad():
                attention.unifyheads.weight.mul_(1 / (layer + 1))
            return attention

    class Block(TransformerBlock):
        attention_class = Scaled

    class Model(GTransformer):
        block_class = Block

    torch.manual_seed(0)
    model = Model(config=CONFIG)
    torch.manual_seed(0)
    plain = GTransformer(config=CONFIG)
    for i, (ours, theirs) in enumerate(zip(model.blocks.blocks, plain.blocks.blocks)):
        torch.testing.assert_close(ours.attention.unifyheads.weight, theirs.attention.unifyheads.weight / (i + 1))


def test_a_position_scheme_is_replaced_by_naming_a_subclass():
    class HalfRotary(Rotary):
        """Rotates the first half of each head only (a variant's own scheme)."""

        def rotate(self, x, positions):
            s = x.size(-1) // 2
            return torch.cat([super(HalfRotary, self).rotate(x[..., :s], positions), x[..., s:]], dim=-1)

        @classmethod
        def from_sizes(cls, *, heads, head_size, causal):
            return cls(head_size // 2)

    class Attention(SelfAttention):
        position_classes = {**SelfAttention.position_classes, "rotary": HalfRotary}

    attention = Attention.from_config(CONFIG.replace(positions="rotary"), causal=True)
    assert type(attention.relative) is HalfRotary and attention.relative.head_size == 2
    x = torch.randn(2, 5, 16)
    assert attention(x).shape == (2, 5, 16)
    assert type(SelfAttention.from_config(CONFIG.replace(positions="rotary")).relative) is Rotary  # untouched

    class Embedding(TokenEmbedding):
        position_classes = {**TokenEmbedding.position_classes, "learned": SinusoidalPositions}

    assert type(Embedding.from_config(CONFIG).positions) is SinusoidalPositions
    with pytest.raises(ValueError, match="positions must be one of"):
        TokenEmbedding(20, 16, 12, positions="learnd")


class ParallelBlock(TransformerBlock):
    """GPT-J and PaLM: attention and feed-forward read the same normalised input, side by side."""

    def __init__(self, config, *, causal=False, layer=0):
        super().__init__(config, causal=causal, layer=layer)
        del self.norm2  # one norm feeds both sublayers

    @classmethod
    def needs_final_norm(cls, config):
        return True  # the residual stream is never normalised inside the block

    def forward(self, x, mask=None, *, positions=None, cache=None):
        x = self.zero_padding(x, mask)
        h = self.norm1(x)
        return x + self.drop(self.self_attend(h, mask, positions, cache)) + self.drop(self.ff(h))


def test_a_parallel_block_is_its_formula_and_gets_a_final_norm():
    torch.manual_seed(0)
    config = CONFIG.replace(depth=1)
    stack = Encoder(config, causal=True, block_class=ParallelBlock)
    assert not isinstance(stack.norm, nn.Identity)  # asked of the block, though config.prenorm is False
    assert isinstance(Encoder(config).norm, nn.Identity)
    block = stack.blocks[0]
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    stack.double()
    h = block.norm1(x)
    expected = stack.norm(x + block.attention(h) + block.ff(h))
    torch.testing.assert_close(stack(x), expected)


def test_a_model_of_parallel_blocks_decodes_with_the_cache_as_without():
    class ParallelGPT(GTransformer):
        block_class = ParallelBlock

    torch.manual_seed(0)
    model = ParallelGPT(config=CONFIG).eval()
    prompt = torch.randint(0, 20, (2, 4))
    cached = generate(model, prompt, 6, temperature=0)
    recomputed = generate(model, prompt, 6, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed)


class ScaledGPT(GTransformer):
    """A variant with a hyperparameter of its own, in the config's ``extra``: its output is multiplied by it."""

    def forward(self, x, **options):
        return super().forward(x, **options) * self.config.extra["scale"]


def test_a_variant_and_its_own_hyperparameters_come_back_from_a_file_without_naming_its_class(tmp_path):
    pytest.importorskip("safetensors")
    from torchformer import export_model, load_model
    from torchformer.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = ScaledGPT(config=CONFIG.replace(extra={"scale": 0.5})).eval()
    x = torch.randint(0, 20, (2, 6))
    for path in (export_model(model, tmp_path / "folder"), save_checkpoint(tmp_path / "c.pt", model=model, step=1)):
        loaded = load_model(path)  # the class is imported from where the file says it lives
        assert type(loaded) is ScaledGPT and loaded.config.extra == {"scale": 0.5}
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


@pytest.mark.parametrize(("extra", "error", "message"), [
    ({"a": (1, 2)}, ValueError, "a tuple comes back as a list"),
    ({1: 2}, TypeError, "extra's keys must be str"),
    ([1], TypeError, "extra must be a dict"),
    ({"x": float("nan")}, ValueError, "extra must hold JSON values"),
    ({"x": object()}, ValueError, "extra must hold JSON values"),
])
def test_extra_holds_json_only(extra, error, message):
    with pytest.raises(error, match=message):
        TransformerConfig(16, 2, extra=extra)


def test_extra_is_part_of_the_config_but_not_of_its_hash():
    a, b = TransformerConfig(16, 2, extra={"k": [1, 2]}), TransformerConfig(16, 2)
    assert a != b and a.differences(b) == ["extra: {'k': [1, 2]} vs {}"]
    assert TransformerConfig.from_dict(a.to_dict()) == a and hash(a) == hash(b)


def test_the_old_feedforward_class_attribute_is_refused_not_ignored():
    with pytest.raises(TypeError, match="feedforward_class is no longer read.*feedforward_classes"):
        class Old(TransformerBlock):  # noqa: F841 - the class statement itself raises
            feedforward_class = FeedForward

    class Partial(TransformerBlock):
        feedforward_classes = {"relu": FeedForward}

    with pytest.raises(ValueError, match="Partial.feedforward_classes has no network for activation 'gelu'"):
        Partial(CONFIG.replace(activation="gelu"))


def test_extra_is_stored_as_plain_json_and_left_out_of_to_dict_when_empty():
    import numpy as np

    inner = {"k": [1, 2]}
    config = TransformerConfig(16, 2, extra={"v": np.float64(0.5), "inner": inner})
    inner["k"].append(3)  # the caller's list is not the config's
    assert config.extra == {"v": 0.5, "inner": {"k": [1, 2]}} and type(config.extra["v"]) is float
    assert "extra" not in TransformerConfig(16, 2).to_dict()  # an older torchformer can read it
    assert TransformerConfig.from_dict(TransformerConfig(16, 2).to_dict()) == TransformerConfig(16, 2)
