"""``checkpoint_blocks=True`` (activation checkpointing) changes memory, never results.

The checkpointed model must give the plain model's outputs and gradients exactly, with dropout too (non-reentrant
checkpointing replays the RNG, so the recomputed forward pass draws the same masks), under bf16 autocast and
torch.compile; it must really recompute (the blocks run twice per training step) and must stay out of evaluation
and cached decoding.
"""

from __future__ import annotations

import pytest
import torch

from torchformer import CTransformer, GTransformer, Seq2SeqTransformer, generate
from torchformer.train.checkpoint import load_checkpoint, save_checkpoint

BUILDERS = {
    "CTransformer": lambda **o: CTransformer(16, 2, 2, 8, 11, 3, **o),
    "GTransformer": lambda **o: GTransformer(16, 2, 2, 8, 11, **o),
    "Seq2SeqTransformer": lambda **o: Seq2SeqTransformer(16, 2, 2, 8, 11, 13, **o),
}


def pair(kind: str, **options):
    """The same weights twice: without and with activation checkpointing."""
    torch.manual_seed(0)
    plain = BUILDERS[kind](**options)
    checkpointed = BUILDERS[kind](checkpoint_blocks=True, **options)
    checkpointed.load_state_dict(plain.state_dict())
    return plain, checkpointed


def loss(model, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 11, (3, 8), generator=g)
    if kind == "Seq2SeqTransformer":
        return model(x, torch.randint(0, 13, (3, 6), generator=g)).sum()
    return model(x).sum()


def gradients(model, kind: str, *, seed: int = 5) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)  # the dropout masks
    value = loss(model, kind)
    value.backward()
    return value.detach(), [p.grad.clone() for p in model.parameters()]


def count_block_calls(model) -> list[int]:
    calls = [0]
    for block in model.transformer_blocks():
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_gradients_equal_the_plain_models(kind, dropout):
    plain, checkpointed = pair(kind, dropout=dropout, prenorm=True)
    value, grads = gradients(plain, kind)
    value_c, grads_c = gradients(checkpointed, kind)
    assert torch.equal(value, value_c)
    for g, g_c in zip(grads, grads_c):
        assert torch.equal(g, g_c)
    if dropout:  # the masks matter: another seed gives another result, so the equality above is not vacuous
        assert not torch.equal(gradients(plain, kind, seed=6)[0], value)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_the_blocks_run_again_in_the_backward_pass(kind):
    # Every block of every stack, the encoder-decoder's decoder too: twice as many calls when recomputing.
    plain, checkpointed = pair(kind)
    blocks = len(plain.transformer_blocks())
    for model, expected in ((plain, blocks), (checkpointed, 2 * blocks)):
        calls = count_block_calls(model)
        gradients(model, kind)
        assert calls[0] == expected


def test_not_applied_in_evaluation_or_decoding():
    _, model = pair("GTransformer")
    calls = count_block_calls(model)
    model.train()
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long))
    model.eval()
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()  # eval mode: no recomputation either
    assert calls[0] == 4
    model.train()  # in training mode, the KV caches still keep the blocks out of checkpointing
    plain, _ = pair("GTransformer")
    torch.manual_seed(0)
    assert torch.equal(generate(model, torch.zeros(1, 2, dtype=torch.long), 4, temperature=0.0),
                       generate(plain.train(), torch.zeros(1, 2, dtype=torch.long), 4, temperature=0.0))


def test_bf16_autocast_gives_the_plain_models_gradients():
    plain, checkpointed = pair("GTransformer", dropout=0.2)
    results = []
    for model in (plain, checkpointed):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(gradients(model, "GTransformer"))
    assert torch.equal(results[0][0], results[1][0])
    for g, g_c in zip(results[0][1], results[1][1]):
        assert torch.equal(g, g_c)


def test_compiled_model_gives_the_plain_models_gradients():
    plain, checkpointed = pair("GTransformer")
    value, grads = gradients(plain, "GTransformer")
    value_c, grads_c = gradients(torch.compile(checkpointed, backend="aot_eager"), "GTransformer")
    torch.testing.assert_close(value_c, value)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g)


def test_a_checkpoint_loads_with_or_without_it(tmp_path):
    plain, checkpointed = pair("GTransformer")
    save_checkpoint(tmp_path / "a.pt", model=checkpointed, step=1)
    load_checkpoint(tmp_path / "a.pt", model=plain)  # no "architecture differs" error
    with pytest.raises(TypeError, match="checkpoint_blocks must be a bool, got 1"):
        GTransformer(16, 2, 2, 8, 11, checkpoint_blocks=1)
