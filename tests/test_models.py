"""Properties of torchformer.models: causality, padding invariance, gradients, learning, errors."""

import pytest
import torch
import torch.nn.functional as F

from torchformer import CTransformer, GTransformer, MLMTransformer, Seq2SeqTransformer, TransformerConfig
from torchformer.nn.cache import BlockCache


def seeded(cls, *args, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
@pytest.mark.parametrize("prenorm", [False, True])
def test_generator_is_causal(positions, prenorm):
    model = seeded(GTransformer, 32, 4, 2, 12, 20, positions=positions, prenorm=prenorm).double()
    x = torch.randint(0, 20, (2, 12))
    out = model(x)
    assert out.shape == (2, 12, 20)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 12).double())
    for j in range(1, 12):
        changed = x.clone()
        changed[:, j:] = (changed[:, j:] + 1) % 20
        torch.testing.assert_close(model(changed)[:, :j], out[:, :j])


def test_classifier_ignores_padding_when_masked():
    model = seeded(CTransformer, 32, 4, 2, 16, 30, 3).double()
    x = torch.randint(1, 30, (2, 6))
    padded = torch.cat([x, torch.randint(0, 30, (2, 10))], dim=1)  # random tokens in the padding
    mask = torch.tensor([[True] * 6 + [False] * 10] * 2)
    for pool in ["max", "mean"]:
        model.head.pool = pool
        torch.testing.assert_close(model(padded, mask), model(x))
    assert model(x).shape == (2, 3)


def test_classifier_is_order_sensitive_with_positions_and_invariant_without():
    x = torch.randint(0, 30, (2, 8))
    perm = torch.randperm(8)
    bag = seeded(CTransformer, 32, 4, 2, 8, 30, 2, positions="none").double()
    torch.testing.assert_close(bag(x[:, perm]), bag(x))  # attention + max pooling is a set function
    ordered = seeded(CTransformer, 32, 4, 2, 8, 30, 2).double()
    assert not torch.allclose(ordered(x[:, perm]), ordered(x))


def test_seq2seq_ignores_source_padding_and_is_causal_in_target():
    model = seeded(Seq2SeqTransformer, 32, 4, 2, 16, 25, 15).double()
    src, tgt = torch.randint(0, 25, (2, 5)), torch.randint(0, 15, (2, 7))
    out = model(src, tgt)
    assert out.shape == (2, 7, 15)
    padded = torch.cat([src, torch.randint(0, 25, (2, 4))], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 4] * 2)
    torch.testing.assert_close(model(padded, tgt, mask), out)
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 15
    torch.testing.assert_close(model(src, changed)[:, :4], out[:, :4])
    assert not torch.allclose(model((src + 1) % 25, tgt), out)  # the decoder really reads the source


@pytest.mark.parametrize(
    "build",
    [
        lambda: CTransformer(16, 2, 2, 8, 10, 2, wide=True),
        lambda: CTransformer(16, 2, 2, 8, 10, 2, pool="mean", prenorm=True, kqnorm=True),
        lambda: CTransformer(16, 2, 2, 8, 10, 2, pool="first", pooler=True),
        lambda: GTransformer(16, 2, 2, 8, 10, tie_weights=True),
        lambda: GTransformer(16, 2, 2, 8, 10, positions="sinusoidal", activation="gelu"),
        lambda: Seq2SeqTransformer(16, 2, 2, 8, 10, 12, decoder_depth=1),
    ],
)
def test_every_parameter_gets_a_gradient(build):
    torch.manual_seed(0)
    model = build()
    x = torch.randint(0, 10, (3, 8))
    out = model(x, x[:, :5]) if isinstance(model, Seq2SeqTransformer) else model(x)
    out.exp().pow(2).sum().backward()  # a loss that depends on every output
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_reference_impl_gives_the_same_model_output():
    fast = seeded(GTransformer, 32, 4, 2, 12, 20, wide=True).double()
    ref = seeded(GTransformer, 32, 4, 2, 12, 20, wide=True, impl="reference").double()
    x = torch.randint(0, 20, (2, 12))
    torch.testing.assert_close(fast(x), ref(x))


def test_cached_forward_equals_full_forward():
    model = seeded(GTransformer, 32, 4, 2, 12, 20).double().eval()
    x = torch.randint(0, 20, (2, 9))
    caches = model.new_caches()
    steps = [model(x[:, :4], caches=caches, positions=torch.arange(4))]
    steps += [model(x[:, i : i + 1], caches=caches, positions=torch.tensor([i])) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(x))


V, N = 10, 6


def test_tiny_generator_learns_to_copy():
    """a1..a6 SEP a1..a6: the second half is only predictable by attending back to the first."""
    model = seeded(GTransformer, 64, 4, 2, 2 * N + 1, V + 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        a = torch.randint(0, V, (32, N), generator=g)
        seq = torch.cat([a, torch.full((32, 1), V), a], dim=1)
        logp = model(seq[:, :-1])[:, N:]  # predictions of the copied half
        loss = F.nll_loss(logp.reshape(-1, V + 1), seq[:, N + 1 :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05  # chance level is ln(10) = 2.3


def test_tiny_seq2seq_learns_to_reverse():
    model = seeded(Seq2SeqTransformer, 64, 4, 2, N, V, V + 1)  # target vocabulary: digits + BOS
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        src = torch.randint(0, V, (32, N), generator=g)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((32, 1), V), tgt[:, :-1]], dim=1)  # teacher forcing: BOS + shifted target
        loss = F.nll_loss(model(src, tgt_in).reshape(-1, V + 1), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_former_positional_arguments():
    c = CTransformer(32, 4, 2, 16, 100, 2)  # emb, heads, depth, seq_length, num_tokens, num_classes
    assert c.embedding.tokens.num_embeddings == 100 and c.head.toprobs.out_features == 2
    g = GTransformer(32, 4, 2, 16, 100)  # emb, heads, depth, seq_length, num_tokens
    assert g.embedding.positions.max_len == 16 and len(g.blocks.blocks) == 2


def test_bad_inputs_raise_clear_errors():
    model = seeded(CTransformer, 16, 2, 1, 8, 10, 2)
    with pytest.raises(TypeError, match="integer token ids.*torch.float32"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"token ids in \[0, 10\), got values in \[0, 12\]"):
        model(torch.tensor([[0, 12]]))
    with pytest.raises(ValueError, match=r"token ids in \[0, 10\), got values in \[-1, 3\]"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"x must have shape \(b, t\).*got shape \(4,\)"):
        model(torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match=r"mask must have shape \(b, t\) = \(1, 4\), got \(1, 3\)"):
        model(torch.tensor([[1, 2, 3, 4]]), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"reaches position 8.*seq_length=8.*crop"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="CTransformer got unexpected keyword argument.*attention_type.*emb, heads"):
        CTransformer(16, 2, 1, 8, 10, 2, attention_type="default")
    with pytest.raises(ValueError, match="GTransformer does not use num_classes=3"):  # it would be ignored
        GTransformer(16, 2, 1, 8, 10, num_classes=3)
    with pytest.raises(ValueError, match="CTransformer does not use tie_weights=True"):
        CTransformer(16, 2, 1, 8, 10, 2, tie_weights=True)
    gen = seeded(GTransformer, 16, 2, 1, 8, 10)
    with pytest.raises(TypeError, match="causal"):  # a generator is causal by construction: not an option
        GTransformer(16, 2, 1, 8, 10, causal=False)
    with pytest.raises(ValueError, match="GTransformer needs num_tokens"):
        GTransformer(16, 2, 1, 8)
    with pytest.raises(ValueError, match="positions must be one of"):
        GTransformer(16, 2, 1, 8, 10, positions="xpos")
    s2s = seeded(Seq2SeqTransformer, 16, 2, 1, 8, 10, 12)
    with pytest.raises(ValueError, match=r"tgt must hold token ids in \[0, 12\)"):
        s2s(torch.zeros(1, 3, dtype=torch.long), torch.full((1, 3), 12))
    with pytest.raises(ValueError, match=r"src_mask must have shape"):
        s2s(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 2).bool())
    with pytest.raises(ValueError, match="same batch size"):
        s2s(torch.zeros(1, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"memory must have embedding size 16"):
        s2s.decode(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, 8))
    with pytest.raises(TypeError, match="memory must be a torch.Tensor"):
        s2s.decode(torch.zeros(1, 3, dtype=torch.long), [[0.0] * 16])
    assert gen(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 10)


@pytest.mark.parametrize("tie_weights", [False, True])
def test_initial_loss_is_close_to_uniform_guessing(tie_weights):
    """An untrained generator should be about as unsure as a uniform guess (ln 256 = 5.55 nats), tied or not."""
    model = seeded(GTransformer, 64, 4, 2, 32, 256, tie_weights=tie_weights)
    x = torch.randint(0, 256, (8, 33))
    loss = F.nll_loss(model(x[:, :-1]).transpose(1, 2), x[:, 1:]).item()
    assert 5.0 < loss < 7.0


def test_positions_with_caches_are_required_and_checked():
    model = seeded(GTransformer, 32, 4, 2, 12, 20).double().eval()
    x = torch.randint(0, 20, (1, 6))
    caches = model.new_caches()
    model(x[:, :5], caches=caches, positions=torch.arange(5))
    torch.testing.assert_close(model(x[:, 5:], caches=caches, positions=torch.tensor([5]))[:, -1], model(x)[:, -1])
    with pytest.raises(ValueError, match=r"positions must be given with caches.*torch.arange"):
        model(x[:, :1], caches=caches)
    with pytest.raises(ValueError, match=r"caches must be a list of one BlockCache per block \(2\), got 1"):
        model(x, caches=caches[:1], positions=torch.arange(6))
    with pytest.raises(ValueError, match=r"positions must have shape \(t,\) = \(1,\).*got \(2,\)"):
        model(x[:, :1], caches=caches, positions=torch.tensor([5, 6]))
    with pytest.raises(TypeError, match="positions must hold integer positions.*float32"):
        model(x[:, :1], caches=caches, positions=torch.tensor([5.0]))
    with pytest.raises(ValueError, match=r"positions must be >= 0, got values in \[-1, -1\]"):
        model(x[:, :1], positions=torch.tensor([-1]))
    with pytest.raises(TypeError, match="positions must be a torch.Tensor"):
        model(x[:, :1], positions=5)
    with pytest.raises(ValueError, match=r"reaches position 12.*seq_length=12"):
        model(x[:, :1], caches=caches, positions=torch.tensor([12]))
    with pytest.raises(ValueError, match=r"positions must be consecutive.*\[6, 6\]"):
        model(x[:, :2], caches=caches, positions=torch.tensor([6, 6]))
    with pytest.raises(ValueError, match="positions must be consecutive"):
        model(x[:, :3], positions=torch.tensor([2, 1, 0]))
    with pytest.raises(ValueError, match=r"caches\[0\] must be a BlockCache with a capacity.*got object"):
        model(x[:, :1], caches=[object(), object()], positions=torch.tensor([0]))
    # Every entry is checked, not only the first (a str second entry failed inside a block, AttributeError).
    with pytest.raises(ValueError, match=r"caches\[1\] must be a BlockCache with a capacity.*got str"):
        model(x[:, :1], caches=[model.new_caches()[0], "x"], positions=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"caches must all have one capacity.*caches\[1\] 20"):
        model(x[:, :1], caches=[model.new_caches()[0], BlockCache(20)], positions=torch.tensor([0]))
    sinusoidal = seeded(GTransformer, 32, 4, 2, 12, 20, positions="sinusoidal").eval()
    with pytest.raises(ValueError, match=r"caches hold 12 positions"):  # no position limit, but the caches have one
        sinusoidal(x[:, :1], caches=sinusoidal.new_caches(), positions=torch.tensor([12]))


def test_token_ids_of_any_integer_dtype_work():
    model = seeded(GTransformer, 16, 2, 1, 8, 256).eval()
    ids = torch.randint(0, 256, (2, 8))
    expected = model(ids)
    for dtype in (torch.uint8, torch.int16, torch.int32, torch.uint16, torch.uint32):
        torch.testing.assert_close(model(ids.to(dtype)), expected, atol=0, rtol=0)


def test_config_is_the_model_s_architecture():
    torch.manual_seed(0)
    positional = GTransformer(32, 4, 2, 12, 20, prenorm=True, tie_weights=True)
    config = positional.config
    assert config == TransformerConfig(32, 4, 2, 12, 20, prenorm=True, tie_weights=True)
    torch.manual_seed(0)
    rebuilt = GTransformer.from_config(TransformerConfig.from_dict(config.to_dict()))
    x = torch.randint(0, 20, (2, 12))
    torch.testing.assert_close(rebuilt(x), positional(x), atol=0, rtol=0)
    assert config.differences(config.replace(heads=2)) == ["heads: 4 vs 2"]
    with pytest.raises(TypeError, match="either config= or the model's arguments"):
        GTransformer(32, config=config)
    with pytest.raises(TypeError, match=r"num_tokens twice.*src_tokens is the config's num_tokens"):
        Seq2SeqTransformer(32, 4, 2, 16, 50, 40, num_tokens=50)
    with pytest.raises(ValueError, match="unknown config field.*colour"):
        TransformerConfig.from_dict({**config.to_dict(), "colour": "red"})
    with pytest.raises(ValueError, match=r"emb \(30\) must be divisible by heads \(4\)"):
        config.replace(emb=30)



def test_from_encoder_builds_a_classifier_on_a_pretrained_encoder():
    """from_encoder: the pretrained model's config with the head's fields changed, its encoder copied (the same
    encoder output), the other heads' fields back at their defaults, on the pretrained model's dtype."""
    mlm = seeded(MLMTransformer, 16, 4, 2, 8, 11, tie_weights=True, mlm_scale=False, num_token_types=2,
                 embedding_norm=True).double().eval()
    classifier = CTransformer.from_encoder(mlm, 3, pool="first", pooler=True)
    assert classifier.config == mlm.config.replace(tie_weights=False, mlm_scale=True, num_classes=3, pool="first",
                                                   pooler=True)
    assert classifier.training and {p.dtype for p in classifier.parameters()} == {torch.float64}
    x, types = torch.randint(0, 11, (2, 8)), torch.randint(0, 2, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(classifier.eval().encoder(classifier.embedding(x, token_types=types)),
                                   mlm.encoder(mlm.embedding(x, token_types=types)), atol=0, rtol=0)
    assert classifier(x, token_types=types).shape == (2, 3)
    with pytest.raises(ValueError, match="encoder differs from this classifier's .*heads: 4 vs 2"):
        CTransformer.from_encoder(mlm, 3, heads=2)
    with pytest.raises(TypeError, match="pretrained must be a torchformer model"):
        CTransformer.from_encoder(torch.nn.Linear(2, 2), 3)

def test_zero_decoder_depth_is_refused():
    with pytest.raises(ValueError, match="depth must be a positive int, got 0"):
        Seq2SeqTransformer(16, 2, 2, 8, 10, 12, decoder_depth=0)


def check_compiled_matches_eager_and_is_causal(device: str) -> None:
    torch.manual_seed(0)
    model = GTransformer(64, 4, 2, 32, 50, prenorm=True).to(device).eval()
    compiled = torch.compile(model)
    x = torch.randint(0, 50, (4, 32), device=device)
    later = x.clone()
    later[:, 16:] = torch.randint(0, 50, (4, 16), device=device)  # change every token from position 16 on
    with torch.no_grad():
        eager, fast, fast_later = model(x), compiled(x), compiled(later)
        # float32: the same function computed by other kernels agrees to rounding.
        torch.testing.assert_close(fast, eager, atol=1e-4, rtol=1e-4)
        # Outputs before position 16 must not move at all. Without the causal mask they move by about 1e-3 here.
        torch.testing.assert_close(fast_later[:, :16], fast[:, :16], atol=1e-5, rtol=0)
        with torch.autocast(device, dtype=torch.bfloat16):
            eager_bf16, fast_bf16 = model(x).float(), compiled(x).float()
    # bf16 rounds differently in the two; compare probabilities (bf16 vs float32 alone moves them by about 1e-3).
    torch.testing.assert_close(fast_bf16.exp(), eager_bf16.exp(), atol=2e-2, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_generator_matches_eager_and_stays_causal_on_cuda():
    check_compiled_matches_eager_and_is_causal("cuda")


# The modern blocks (RMSNorm, rotary positions, SwiGLU, grouped-query attention, QK-norm): their eager fast paths
# are custom autograd Functions, which torch.compile cannot trace; under compilation the formulas run instead.
MODERN = dict(prenorm=True, norm="rms", positions="rotary", activation="swiglu", kv_heads=1, kqnorm=True)


def modern_loss(model, x):
    return F.nll_loss(model(x)[:, :-1].transpose(1, 2), x[:, 1:])


def test_the_modern_model_compiles_into_one_graph_without_a_break():
    model = seeded(GTransformer, 16, 2, 2, 8, 20, **MODERN)
    explanation = torch._dynamo.explain(lambda x: modern_loss(model, x))(torch.randint(0, 20, (2, 8)))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_modern_training_step_compiles_with_fullgraph_and_gives_the_eager_gradients(dynamic):
    # aot_eager traces the backward pass too (what inductor compiles), without a C++ compiler; dynamic shapes on
    # Dynamo alone (the SymBool of is_causal was the one obstacle there), which is faster.
    model = seeded(GTransformer, 16, 2, 1, 8, 20, **MODERN)
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend="eager" if dynamic else "aot_eager")
    for t in (8, 6) if dynamic else (8,):
        x = torch.randint(0, 20, (2, t), generator=torch.Generator().manual_seed(t))
        grads = []
        for net in (compiled, model):
            model.zero_grad()
            modern_loss(net, x).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for fast, eager in zip(*grads):
            torch.testing.assert_close(fast, eager, rtol=1e-5, atol=1e-6)
