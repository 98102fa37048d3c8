"""Packed rows (``documents=``) in attention: each document's output is the one it gets alone, for every position
scheme inside attention, causal or not, with windows, sparse patterns and padding; no gradient crosses documents;
the fast path equals the reference; bad ``documents`` are refused at the door."""

from __future__ import annotations

import pytest
import torch

from torchformer import TransformerConfig
from torchformer.nn.attention import SelfAttention
from torchformer.nn.masks import AttentionMask, FixedPattern, document_positions

LENGTHS = [5, 1, 7, 3]  # one packed row of four documents, then padding
T = 18


def layer(causal=True, **fields):
    torch.manual_seed(0)
    config = TransformerConfig(16, 4, **fields)
    attention = SelfAttention.from_config(config, causal=causal).double()
    with torch.no_grad():
        for p in attention.parameters():  # relative biases start at zero: make them matter
            p.add_(0.3 * torch.randn_like(p))
    return attention


def packed_row():
    documents = torch.cat([torch.full((n,), d) for d, n in enumerate(LENGTHS)])
    pad = T - documents.numel()
    documents = torch.cat([documents, torch.full((pad,), len(LENGTHS))])[None]  # (1, T): padding one past the last
    mask = torch.arange(T)[None] < sum(LENGTHS)
    x = torch.randn(1, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x, documents, mask


SCHEMES = [{"positions": "learned"}, {"positions": "rotary"}, {"positions": "rotary_interleaved"},
           {"positions": "alibi"}, {"positions": "relative"}, {"positions": "rotary", "kv_heads": 2},
           {"positions": "alibi", "window": 3}, {"positions": "rotary", "sparse": "fixed", "sparse_stride": 2}]


@pytest.mark.parametrize("fields", SCHEMES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_each_document_of_a_packed_row_gets_its_output_alone(fields, causal, impl):
    attention = layer(causal, impl=impl, **fields)
    x, documents, mask = packed_row()
    packed = attention(x, mask, documents=documents)
    start = 0
    for n in LENGTHS:
        alone = attention(x[:, start:start + n])  # the document as its own sequence: positions 0 .. n-1
        torch.testing.assert_close(packed[:, start:start + n], alone, atol=1e-10, rtol=0)
        start += n
    assert (packed[:, start:] == 0).all()  # the padding saw no real key


def test_no_gradient_crosses_documents():
    attention = layer(False, positions="rotary")
    x, documents, _ = packed_row()
    x.requires_grad_(True)
    attention(x, documents=documents)[:, 6:13].sum().backward()  # the third document's outputs
    touched = x.grad.abs().sum(-1)[0] > 0
    assert touched[6:13].all() and not touched[:6].any() and not touched[13:].any()


def test_document_positions_restart_at_each_document():
    documents = torch.tensor([[0, 0, 0, 1, 2, 2], [4, 4, 4, 4, 4, 4]])
    assert document_positions(documents).tolist() == [[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 5]]


def test_the_flex_rule_equals_the_dense_mask_with_documents():
    x, documents, mask = packed_row()
    positions = torch.arange(T)
    attention_mask = AttentionMask(positions, positions, mask, causal=True, window=4, aligned=True,
                                   pattern=FixedPattern(2), documents=documents)
    rule = attention_mask.mask_mod()
    q, k = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    zero = torch.zeros_like(q)
    assert torch.equal(rule(zero, zero, q, k), attention_mask.allowed()[0, 0])


def test_bad_documents_are_refused_at_the_door():
    attention = layer()
    x, documents, _ = packed_row()
    with pytest.raises(ValueError, match=r"documents must have shape \(b, t\) = \(1, 18\)"):
        attention(x, documents=documents[:, :5])
    with pytest.raises(TypeError, match="documents must hold integer document indices"):
        attention(x, documents=documents.float())
    with pytest.raises(TypeError, match="documents must be a torch.Tensor"):
        attention(x, documents=[0] * T)
    with pytest.raises(ValueError, match="give no cache with them"):
        from torchformer.nn.cache import KVCache
        attention(x, positions=torch.arange(T), cache=KVCache(32), documents=documents)


def test_latent_attention_keeps_documents_apart_too():
    from torchformer.nn.latent import LatentAttention, LatentOptions

    torch.manual_seed(0)
    config = TransformerConfig(16, 4, positions="rotary", out_bias=False,
                               options=(LatentOptions(kv_rank=8, rope_dim=4, nope_dim=4, value_dim=4),))
    attention = LatentAttention.from_config(config, causal=True).double()
    x, documents, mask = packed_row()
    packed = attention(x, mask, documents=documents)
    start = 0
    for n in LENGTHS:
        torch.testing.assert_close(packed[:, start:start + n], attention(x[:, start:start + n]), atol=1e-10, rtol=0)
        start += n


# ---- whole models ----------------------------------------------------------------------------------------------


MODEL_SCHEMES = [{"positions": "learned"}, {"positions": "sinusoidal"}, {"positions": "none"},
                 {"positions": "rotary", "norm": "rms", "activation": "swiglu", "kqnorm": True},
                 {"positions": "rotary_interleaved"}, {"positions": "alibi", "window": 4}, {"positions": "relative"},
                 {"positions": "rotary", "sparse": "strided", "sparse_stride": 3}]


@pytest.mark.parametrize("fields", MODEL_SCHEMES)
def test_a_generator_over_packed_rows_gives_each_document_its_output_alone(fields):
    from torchformer.models import GTransformer

    torch.manual_seed(0)
    model = GTransformer(16, 4, 2, T, 11, **fields).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _, documents, mask = packed_row()
    x = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(2))
    documents, mask = documents.expand(2, T), mask.expand(2, T)
    packed = model(x, mask, documents=documents)
    start = 0
    for n in LENGTHS:
        torch.testing.assert_close(packed[:, start:start + n], model(x[:, start:start + n]), atol=1e-10, rtol=0)
        start += n


def test_a_generator_refuses_documents_that_cannot_be_packed_rows():
    from torchformer.models import GTransformer

    model = GTransformer(16, 4, 1, T, 11, positions="rotary")
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="documents must not decrease along a row"):
        model(x, documents=torch.tensor([[0, 1, 0, 1]]))
    with pytest.raises(ValueError, match="give no positions with them"):
        model(x, positions=torch.arange(4), documents=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="give no caches with them"):
        model(x, caches=model.new_caches(), positions=torch.arange(4), documents=torch.zeros(1, 4, dtype=torch.long))


def test_a_masked_language_model_over_packed_rows_gives_each_document_its_output_alone():
    from torchformer.models import MLMTransformer

    torch.manual_seed(0)
    model = MLMTransformer(16, 4, 2, T, 11).double().eval()
    _, documents, mask = packed_row()
    x = torch.randint(0, 11, (1, T), generator=torch.Generator().manual_seed(3))
    packed = model(x, mask, documents=documents)
    start = 0
    for n in LENGTHS:
        torch.testing.assert_close(packed[:, start:start + n], model(x[:, start:start + n]), atol=1e-10, rtol=0)
        start += n


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_packed_training_step_compiles_whole_and_gives_the_eager_gradients(dynamic):
    import torch.nn.functional as F

    from torchformer.models import GTransformer

    torch.manual_seed(0)
    model = GTransformer(16, 2, 1, T, 20, prenorm=True, norm="rms", positions="rotary", activation="swiglu",
                         kv_heads=1, kqnorm=True)
    _, documents, mask = packed_row()

    def loss(x):
        return F.nll_loss(model(x, mask, documents=documents)[:, :-1].transpose(1, 2), x[:, 1:])

    x = torch.randint(0, 20, (1, T), generator=torch.Generator().manual_seed(4))
    explanation = torch._dynamo.explain(loss)(x)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    grads = []
    for step in (compiled, loss):
        model.zero_grad()
        step(x).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pool", ["max", "mean", "first"])
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_a_classifier_over_packed_rows_classifies_each_document_as_alone(pool, positions):
    from torchformer.models import CTransformer

    torch.manual_seed(0)
    model = CTransformer(16, 4, 2, T, 11, 3, pool=pool, positions=positions).double().eval()
    _, documents, mask = packed_row()
    x = torch.randint(0, 11, (1, T), generator=torch.Generator().manual_seed(5))
    packed = model(x, mask, documents=documents)  # (1, T, 3): document d at [0, d]
    assert packed.shape == (1, T, 3)
    start = 0
    for d, n in enumerate(LENGTHS):
        torch.testing.assert_close(packed[:, d], model(x[:, start:start + n]), atol=1e-10, rtol=0)
        start += n


def test_documents_out_of_range_are_refused_by_the_model():
    from torchformer.models import CTransformer

    model = CTransformer(16, 4, 1, 8, 11, 2)
    with pytest.raises(ValueError, match=r"documents must number each row's documents in \[0, t\) = \[0, 4\), got "
                                         r"values in \[0, 9\]"):
        model(torch.zeros(1, 4, dtype=torch.long), documents=torch.tensor([[0, 0, 9, 9]]))


def test_small_integer_documents_are_documents_and_a_decreasing_row_is_named():
    from torchformer.models import CTransformer

    model = CTransformer(16, 4, 1, 8, 11, 2).eval()
    x = torch.randint(0, 11, (1, 6))
    documents = torch.tensor([[0, 0, 1, 1, 1, 2]])
    torch.testing.assert_close(model(x, documents=documents.to(torch.uint8)), model(x, documents=documents))
    with pytest.raises(ValueError, match="got 1 then 0 at positions 3 and 4 of row 0"):
        model(x, documents=torch.tensor([[0, 0, 1, 1, 0, 0]]))


def test_flex_builds_a_block_mask_per_row_when_the_documents_differ_between_rows():
    # Compiled, flex attention skips the blocks the block mask calls empty and applies no rule inside the ones it
    # calls full: built from row 0 alone, row 1's documents (split inside a block) would see each other.
    t, block = 256, 128
    documents = torch.zeros(2, t, dtype=torch.long)
    documents[1, 100:] = 1  # row 1: two documents, the second starting inside the first block
    positions = torch.arange(t)
    for causal in (False, True):
        rule = AttentionMask(positions, positions, causal=causal, aligned=True, documents=documents)
        assert rule.rows == 2
        blocks = rule.block_mask(torch.device("cpu"))
        allowed = rule.allowed()[:, 0].reshape(2, t // block, block, t // block, block)  # (b, tq, bq, tk, bk)
        any_pair, every_pair = allowed.any(dim=(2, 4)), allowed.all(dim=(2, 4))  # (b, tq, tk)
        assert torch.equal(blocks.to_dense()[:, 0].bool(), any_pair)  # partial or full: the blocks computed
        full = torch.zeros_like(every_pair)
        for b in range(2):
            for q in range(t // block):
                n = int(blocks.full_kv_num_blocks[b, 0, q])
                full[b, q, blocks.full_kv_indices[b, 0, q, :n].long()] = True
        assert torch.equal(full, every_pair)  # full: computed without the rule
    assert AttentionMask(positions, positions, causal=True, aligned=True).rows is None


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flex_path_traces_as_one_graph_with_padding_and_documents():
    # The GPU's path for packed rows (impl="flex": flex attention with a block mask built in the graph). The CPU has
    # no flex backward: the forward pass, traced without a break and equal to SDPA's dense mask.
    from torchformer.models import GTransformer

    torch.manual_seed(0)
    dense = GTransformer(16, 2, 1, T, 20, prenorm=True, norm="rms", positions="rotary").eval()
    flex = GTransformer(16, 2, 1, T, 20, prenorm=True, norm="rms", positions="rotary", impl="flex").eval()
    flex.load_state_dict(dense.state_dict())
    _, documents, mask = packed_row()
    x = torch.randint(0, 20, (1, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        explanation = torch._dynamo.explain(flex)(x, mask, documents=documents)
        assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
        torch.testing.assert_close(flex(x, mask, documents=documents)[mask], dense(x, mask, documents=documents)[mask],
                                   atol=1e-5, rtol=1e-5)


PAIRS = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9, 10]), ([11, 12, 13, 14], [15]), ([3, 3], [2, 2, 2])]


def packed_pairs(row=8):
    from torchformer.data.packing import pack_pairs, packed_batch

    src_rows, tgt_rows = pack_pairs([len(s) for s, _ in PAIRS], [len(t) for _, t in PAIRS], row)
    src, src_documents, src_mask = packed_batch([s for s, _ in PAIRS], src_rows, row)
    tgt, tgt_documents, tgt_mask = packed_batch([t for _, t in PAIRS], tgt_rows, row)
    return src_rows, tgt_rows, (src, src_documents, src_mask), (tgt, tgt_documents, tgt_mask)


@pytest.mark.parametrize("fields", [{"positions": "learned"}, {"positions": "relative"},
                                    {"positions": "rotary", "prenorm": True, "norm": "rms", "kv_heads": 2}],
                         ids=["learned", "relative", "rotary"])
def test_a_seq2seq_model_on_packed_pairs_gives_each_pair_its_output_alone(fields):
    from torchformer.models import Seq2SeqTransformer

    torch.manual_seed(0)
    model = Seq2SeqTransformer(16, 4, 2, 8, 20, 20, **fields).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # relative biases start at zero: make them matter
            p.add_(0.1 * torch.randn_like(p))
    src_rows, tgt_rows, (src, src_documents, src_mask), (tgt, tgt_documents, tgt_mask) = packed_pairs()
    assert src.size(0) < len(PAIRS)  # pairs share rows
    out = model(src, tgt, src_mask, src_documents=src_documents, tgt_documents=tgt_documents)  # (b, t, v)
    for r, (src_row, tgt_row) in enumerate(zip(src_rows, tgt_rows)):
        at = 0
        for s_piece, t_piece in zip(src_row, tgt_row):
            assert s_piece.document == t_piece.document  # the same pair at the same place of both rows
            s, t = PAIRS[s_piece.document]
            alone = model(torch.tensor([s]), torch.tensor([t]))[0]
            torch.testing.assert_close(out[r, at:at + len(t)], alone, atol=1e-10, rtol=0)
            at += len(t)


def test_no_gradient_crosses_packed_pairs_and_half_a_pair_of_documents_is_refused():
    from torchformer.models import Seq2SeqTransformer

    torch.manual_seed(0)
    model = Seq2SeqTransformer(16, 4, 1, 8, 20, 20).double()
    _, _, (src, src_documents, src_mask), (tgt, tgt_documents, tgt_mask) = packed_pairs()
    memory = model.encode(src, src_mask, src_documents=src_documents).detach().requires_grad_(True)
    r = 0  # the first row: its first target document's outputs depend on its own source document only
    first = (tgt_documents[r] == 0) & tgt_mask[r]
    out = model.decode(tgt, memory, src_mask, tgt_documents=tgt_documents, src_documents=src_documents)
    out[r, first].sum().backward()
    touched = memory.grad.abs().sum(-1)  # (b, u)
    assert touched[r, src_documents[r] == 0].all() and not touched[r, src_documents[r] != 0].any()
    assert not touched[1:].any()
    with pytest.raises(ValueError, match="tgt_documents and src_documents go together"):
        model(src, tgt, src_mask, tgt_documents=tgt_documents)
    with pytest.raises(ValueError, match=r"src_documents must have shape \(b, u\) = \(2, 8\)"):
        model(src, tgt, src_mask, src_documents=src_documents[:, :5], tgt_documents=tgt_documents)
    with pytest.raises(ValueError, match="tgt_documents must not decrease along a row"):
        model(src, tgt, src_mask, src_documents=src_documents, tgt_documents=tgt_documents.flip(1))
    with pytest.raises(ValueError, match="give no caches or positions"):
        model.decode(tgt, memory, src_mask, tgt_documents=tgt_documents, src_documents=src_documents,
                     positions=torch.arange(8))


def test_cross_attention_between_packed_rows_reads_only_the_same_document():
    from torchformer import CrossAttention

    torch.manual_seed(0)
    cross = CrossAttention(16, heads=4).double()
    x, context = torch.randn(1, 6, 16, dtype=torch.float64), torch.randn(1, 5, 16, dtype=torch.float64)
    documents, context_documents = torch.tensor([[0, 0, 1, 1, 1, 2]]), torch.tensor([[0, 1, 1, 1, 2]])
    context_mask = torch.tensor([[True, True, True, True, False]])  # document 2 of the context is padding
    out, weights = cross(x, context, context_mask, documents=documents, context_documents=context_documents,
                         return_weights=True)
    allowed = (documents[0, :, None] == context_documents[0, None, :]) & context_mask[0, None, :]  # by hand
    assert torch.equal(weights[0].abs().sum(0) > 0, allowed)
    assert torch.equal(out[0, 5], torch.zeros(16, dtype=torch.float64)) or out[0, 5].abs().max() < 1e-12  # no key
    fast = cross(x, context, context_mask, documents=documents, context_documents=context_documents)
    torch.testing.assert_close(fast, out, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="documents and context_documents go together"):
        cross(x, context, documents=documents)
    with pytest.raises(ValueError, match=r"context_documents must have shape \(b, u\) = \(1, 5\)"):
        cross(x, context, documents=documents, context_documents=documents)
