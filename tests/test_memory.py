"""Transformer-XL's segment memory (``GTransformer.new_memory``, ``RingKVCache``): against a full forward with the
segment-window rule written out, gradients, padding, resets and the errors."""

import pytest
import torch

from torchformer import GTransformer, TransformerBlock
from torchformer.nn.attention import SelfAttention, attention_reference
from torchformer.nn.cache import BlockCache, KVCache, RingKVCache, check_caches

SCHEMES = ["rotary", "rotary_interleaved", "alibi", "relative", "none"]


class SegmentWindowAttention(SelfAttention):
    """The reference: a whole-sequence attention in which query ``i`` sees key ``j`` only if ``j`` is among the last
    ``m + t`` positions up to the end of ``i``'s segment (segments of ``t``, the last one possibly shorter, of a
    stream of ``n``), on the matmul-softmax path: its segment and the ``m`` positions before it, more before a
    short segment (what a ring of ``m + t`` slots still holds).

    That rule at every layer is what segment-by-segment processing with the memory computes: a state at position
    ``j`` of layer ``l`` was computed when ``j``'s segment was the current one, seeing the same keys."""

    segment = memory = length = 0

    def attend(self, q, k, v, mask, *, return_weights=False):
        i, j = mask.query_positions[:, None], mask.key_positions[None, :]
        end = ((i // self.segment + 1) * self.segment).clamp(max=self.length)  # where i's segment ends
        rule = j >= end - (self.memory + self.segment)  # (t, u)
        allowed = mask.allowed()
        allowed = rule if allowed is None else allowed & rule
        out, _ = attention_reference(q, k, v, allowed, dropout=0.0, bias=self.relative.bias(mask), scale=self.scale)
        return out, None


class SegmentWindowBlock(TransformerBlock):
    attention_class = SegmentWindowAttention


class SegmentWindowModel(GTransformer):
    block_class = SegmentWindowBlock


def stream_logits(model, x, t, memory, mask=None):
    """Feed ``x`` ``(b, n)`` segment by segment (``t`` tokens each) through fresh memory; the logits, joined."""
    caches = model.new_memory(memory)
    outs = []
    for start in range(0, x.size(1), t):
        segment_mask = None if mask is None else mask[:, start:start + t]
        positions = torch.arange(start, min(start + t, x.size(1)))
        outs.append(model(x[:, start:start + t], segment_mask, caches=caches, positions=positions))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("positions", SCHEMES)
@pytest.mark.parametrize("memory", [6, 4, 10])
def test_segment_memory_equals_a_full_forward_with_the_segment_window_rule(positions, memory):
    torch.manual_seed(0)
    t, n = 6, 27  # four whole segments and a short last one
    model = GTransformer(16, 4, 3, t, 20, positions=positions, prenorm=True).double().eval()
    SegmentWindowAttention.segment, SegmentWindowAttention.memory, SegmentWindowAttention.length = t, memory, n
    reference = SegmentWindowModel(16, 4, 3, n, 20, positions=positions, prenorm=True).double().eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randint(0, 20, (2, n))
    torch.testing.assert_close(stream_logits(model, x, t, memory), reference(x), atol=1e-10, rtol=0)
    if memory >= t:  # the first two segments, the second remembering all of the first: the plain model over both
        whole = GTransformer(16, 4, 3, 2 * t, 20, positions=positions, prenorm=True).double().eval()
        whole.load_state_dict(model.state_dict())
        torch.testing.assert_close(stream_logits(model, x[:, :2 * t], t, memory), whole(x[:, :2 * t]), atol=1e-10,
                                   rtol=0)


def test_the_memory_carries_no_gradient_and_the_segment_its_own():
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 8, 20, positions="rotary", prenorm=True)
    x = torch.cat([torch.randperm(8), 10 + torch.randperm(8)]).repeat(2, 1)  # ids 0-7, then 10-17
    caches = model.new_memory(8)
    model(x[:, :8], caches=caches, positions=torch.arange(8)).sum().backward()  # the first segment's step
    model.zero_grad()
    second = model(x[:, 8:], caches=caches, positions=torch.arange(8, 16))
    second.sum().backward()  # no "backward through the graph a second time": the memory was cut from it
    grad = model.embedding.tokens.weight.grad
    assert not grad[:10].any()  # the first segment's tokens: read through the memory, but no gradient
    assert grad[10:18].abs().sum(-1).gt(0).all()  # the second segment's own
    assert model.blocks.blocks[0].attention.tokeys.weight.grad.abs().sum() > 0
    # In one forward over both segments the same outputs reach the first segment's tokens: the test can fail.
    whole = GTransformer(16, 2, 2, 16, 20, positions="rotary", prenorm=True)
    whole.load_state_dict(model.state_dict())
    whole(x)[:, 8:].sum().backward()
    assert whole.embedding.tokens.weight.grad[:8].abs().sum(-1).gt(0).all()


def test_padding_in_the_memory_is_never_attended_and_a_reset_starts_the_stream_again():
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 5, 20, positions="alibi", prenorm=True).double().eval()
    x = torch.randint(0, 20, (2, 15))
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[0, 3:7] = False  # padding in row 0: in the first segment's memory and the second segment
    other = x.clone()
    other[0, 3:7] = (x[0, 3:7] + 1) % 20  # other tokens at the padded places
    a, b = stream_logits(model, x, 5, 5, mask), stream_logits(model, other, 5, 5, mask)
    torch.testing.assert_close(a[mask], b[mask], atol=1e-12, rtol=0)  # real positions never read padding
    # A reset forgets the stream: the next segment is computed as at the start of one (distances only, so the
    # absolute positions do not matter).
    caches = model.new_memory(5)
    model(x[:, :5], caches=caches, positions=torch.arange(5))
    [cache.reset() for cache in caches]
    again = model(x[:, 5:10], caches=caches, positions=torch.arange(5, 10))
    torch.testing.assert_close(again, model(x[:, 5:10]), atol=1e-12, rtol=0)


def test_a_ring_keeps_the_last_positions_of_an_endless_stream():
    ring = RingKVCache(4)
    keys = torch.arange(10.0).view(1, 1, 10, 1)  # key p holds the number p
    for start in range(0, 10, 3):  # writes of 3, 3, 3 and 1 positions
        positions = torch.arange(start, min(start + 3, 10))
        k, _, usable = ring.update(keys[:, :, positions], keys[:, :, positions], positions)
    assert sorted(ring.slots.tolist()) == [6, 7, 8, 9] and usable.all()  # the last four, slot p mod 4
    assert [k[0, 0, slot, 0].item() for slot in range(4)] == [p for p in (8, 9, 6, 7)]
    with pytest.raises(ValueError, match="the ring cache has 4 slots .* but 5 positions were written at once"):
        ring.update(torch.zeros(1, 1, 5, 1), torch.zeros(1, 1, 5, 1), torch.arange(10, 15))
    model = GTransformer(8, 2, 1, 4, 11, positions="rotary")
    caches = model.new_memory(4)
    assert all(c.capacity == 8 and c.position_limit is None for c in caches)
    far = 10**7  # positions far beyond seq_length and the capacity are a ring's everyday work
    assert model(torch.zeros(1, 3, dtype=torch.long), caches=caches, positions=torch.arange(far, far + 3)).shape \
        == (1, 3, 11)


def test_the_errors_name_what_is_wrong():
    for positions in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match=f"segment memory needs .* positions={positions!r}"):
            GTransformer(8, 2, 1, 4, 11, positions=positions).new_memory(4)
    model = GTransformer(8, 2, 2, 4, 11, positions="rotary")
    with pytest.raises(ValueError, match="memory must be a positive int"):
        model.new_memory(0)
    with pytest.raises(ValueError, match="positions must be given with caches"):
        model(torch.zeros(1, 3, dtype=torch.long), caches=model.new_memory(4))
    mixed = [BlockCache(8), BlockCache(8, ring=True)]
    with pytest.raises(ValueError, match="one capacity and kind"):
        check_caches(mixed, 2)
    assert isinstance(model.new_caches()[0].self_attention, KVCache)


def test_generation_with_memory_sees_the_whole_context_while_it_fits_and_goes_on_past_it():
    from torchformer import generate
    from torchformer.decoding.generation import MemoryStep

    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 6, 11, positions="rotary").double().eval()
    whole = GTransformer(16, 2, 2, 20, 11, positions="rotary").double().eval()  # a context of all 20 positions
    whole.load_state_dict(model.state_dict())
    prompt = torch.randint(0, 11, (2, 9))  # longer than seq_length: fed in segments of 6
    with_memory, logp = generate(model, prompt, 11, temperature=0, step=MemoryStep(model, 14), return_logprobs=True)
    plain, plain_logp = generate(whole, prompt, 11, temperature=0, return_logprobs=True)  # 9 + 11 = 14 + 6 positions
    assert torch.equal(with_memory, plain)
    torch.testing.assert_close(logp, plain_logp, atol=1e-10, rtol=0)
    far = generate(model, prompt, 40, temperature=0, step=MemoryStep(model, 4))  # far past memory + seq_length
    assert far.shape == (2, 49) and torch.equal(far[:, :9], prompt)
    with pytest.raises(ValueError, match="segment memory needs"):
        MemoryStep(GTransformer(16, 2, 1, 6, 11), 4)


def test_bits_per_byte_with_memory_scores_each_stream_as_the_segment_window_rule_says():
    import math

    from torchformer.train.evaluation import bits_per_byte

    torch.manual_seed(0)
    t, m = 5, 3
    model = GTransformer(16, 2, 2, t, 20, positions="alibi", prenorm=True).double().eval()
    data = torch.randint(0, 20, (47,))  # 46 predictions: 3 streams of 16, 16 and 14
    got = bits_per_byte(model, data, context=t, memory=m, batch_size=3)
    nats = 0.0
    # Each stream alone, one pass with the rule written out; the short last stream is padded at its end to 16 (its
    # segments are the others': 5, 5, 5 and 1 positions), which its real positions, before the padding, never see.
    SegmentWindowAttention.segment, SegmentWindowAttention.memory, SegmentWindowAttention.length = t, m, 16
    for start, end in ((0, 16), (16, 32), (32, 46)):
        inputs, targets = data[start:end], data[start + 1:end + 1]
        reference = SegmentWindowModel(16, 2, 2, end - start, 20, positions="alibi", prenorm=True).double().eval()
        reference.load_state_dict(model.state_dict())
        with torch.no_grad():
            nats -= reference(inputs[None])[0].gather(-1, targets[:, None]).sum().item()
    assert got == pytest.approx(nats / math.log(2) / 46, abs=1e-9)
    assert model.training is False and bits_per_byte(model, data, context=t, memory=m, batch_size=1) < 8
    with pytest.raises(ValueError, match="memory=3 scores every byte once as streams: leave out windows"):
        bits_per_byte(model, data, context=t, memory=m, windows=2)


def test_a_model_without_segment_memory_is_named_by_both_doors():
    from torchformer import CTransformer
    from torchformer.decoding.generation import MemoryStep
    from torchformer.train.evaluation import bits_per_byte

    classifier = CTransformer(16, 2, 1, 6, 11, 2, positions="rotary")
    with pytest.raises(TypeError, match=r"bits_per_byte\(memory=3\) .* needs a model with new_memory\(\), and a "
                                        r"CTransformer has none"):
        bits_per_byte(classifier, torch.arange(20) % 11, context=6, memory=3)
    with pytest.raises(TypeError, match=r"MemoryStep .*memory=3.* needs a model with new_memory\(\), and a "
                                        r"CTransformer has none"):
        MemoryStep(classifier, 3)


def test_summed_segment_losses_backpropagate_at_once_and_long_calls_are_refused():
    from torchformer import generate
    from torchformer.decoding.generation import MemoryStep

    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 4, 11, positions="rotary")
    x = torch.randint(0, 11, (2, 12))
    caches = model.new_memory(4)
    loss = sum(model(x[:, s:s + 4], caches=caches, positions=torch.arange(s, s + 4)).mean() for s in (0, 4, 8))
    loss.backward()  # each segment's graph kept the buffers it read: no in-place error
    per_segment = GTransformer(16, 2, 2, 4, 11, positions="rotary")
    per_segment.load_state_dict(model.state_dict())
    caches = per_segment.new_memory(4)
    for s in (0, 4, 8):  # the same, one backward per segment: gradients add up to the same
        per_segment(x[:, s:s + 4], caches=caches, positions=torch.arange(s, s + 4)).mean().backward()
    for (name, p), q in zip(model.named_parameters(), per_segment.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    with pytest.raises(ValueError, match="x has 6 positions, but with caches a call takes at most seq_length=4"):
        model(x[:, :6], caches=model.new_memory(4), positions=torch.arange(6))
    with pytest.raises(ValueError, match="step=MemoryStep runs cached steps, but use_cache is False"):
        generate(model, x[:, :3], 2, step=MemoryStep(model, 4), use_cache=False)
