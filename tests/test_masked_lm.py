"""Masked-language-model pretraining: the masking rule, the loss, the model, and starting a classifier from it."""

import math

import pytest
import torch
import torch.nn.functional as F

from torchformer import CTransformer, GTransformer, MaskedLMHead, MLMTransformer
from torchformer import export_model, load_model
from torchformer.train.masked_lm import IGNORE, mask_tokens, masked_lm_loss

V, MASK = 1000, 999  # a vocabulary whose last id is [MASK]


def within(observed: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    """``observed`` is a frequency of n Bernoulli(p) draws: inside ``sigmas`` standard deviations of p."""
    return abs(observed - p) <= sigmas * math.sqrt(p * (1 - p) / n)


def test_masking_statistics_follow_bert():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, MASK, (200, 500), generator=g)
    out = mask_tokens(tokens, mask_id=MASK, num_tokens=V, generator=g)
    n = tokens.numel()
    chosen = out.chosen
    k = int(chosen.sum())
    assert within(k / n, 0.15, n)
    masked = chosen & (out.inputs == MASK)
    replaced = chosen & (out.inputs != MASK) & (out.inputs != tokens)
    kept = chosen & (out.inputs == tokens)
    # A random replacement draws the original token again 1 time in 998 (the ids other than 0 and [MASK]).
    p_same = 1 / (V - 2)
    assert within(int(masked.sum()) / k, 0.8, k)
    assert within(int(replaced.sum()) / k, 0.1 * (1 - p_same), k)
    assert within(int(kept.sum()) / k, 0.1 + 0.1 * p_same, k)
    # Outside the chosen positions, the input is the original and nothing is predicted.
    assert torch.equal(out.inputs[~chosen], tokens[~chosen])
    assert (out.targets[~chosen] == IGNORE).all() and torch.equal(out.targets[chosen], tokens[chosen])


def test_padding_is_never_chosen_and_never_changed():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, MASK, (64, 100), generator=g)
    lengths = torch.randint(1, 101, (64,), generator=g)
    mask = torch.arange(100)[None, :] < lengths[:, None]
    tokens = tokens.masked_fill(~mask, 0)
    out = mask_tokens(tokens, mask, mask_id=MASK, num_tokens=V, rate=0.9, generator=g)
    assert not (out.chosen & ~mask).any()
    assert (out.inputs[~mask] == 0).all() and (out.targets[~mask] == IGNORE).all()
    assert within(int(out.chosen.sum()) / int(mask.sum()), 0.9, int(mask.sum()))  # the rate is of real tokens


def test_random_replacements_avoid_special_ids_and_mask():
    g = torch.Generator().manual_seed(2)
    tokens = torch.full((100, 100), 5)
    out = mask_tokens(tokens, mask_id=9, num_tokens=10, rate=0.99, special_ids=(0, 1), generator=g)
    replaced = out.chosen & (out.inputs != 9) & (out.inputs != 5)
    assert replaced.any()
    assert set(out.inputs[replaced].tolist()) == {2, 3, 4, 6, 7, 8}  # every allowed id, and only those


def test_masking_is_reproducible_with_a_generator():
    tokens = torch.randint(1, MASK, (4, 50))
    a = mask_tokens(tokens, mask_id=MASK, num_tokens=V, generator=torch.Generator().manual_seed(3))
    b = mask_tokens(tokens, mask_id=MASK, num_tokens=V, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_bad_masking_arguments_are_named():
    tokens = torch.randint(1, 9, (2, 5))
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(tokens, mask_id=10, num_tokens=10)
    with pytest.raises(ValueError, match="rate"):
        mask_tokens(tokens, mask_id=9, num_tokens=10, rate=1.5)
    with pytest.raises(TypeError, match="tokens"):
        mask_tokens(tokens.float(), mask_id=9, num_tokens=10)
    with pytest.raises(ValueError, match="tokens"):
        mask_tokens(tokens, mask_id=3, num_tokens=5)  # ids up to 8 in a vocabulary of 5
    with pytest.raises(ValueError, match="mask"):
        mask_tokens(tokens, torch.ones(2, 4, dtype=torch.bool), mask_id=9, num_tokens=10)
    with pytest.raises(ValueError, match="random replacements"):
        mask_tokens(tokens.clamp(max=1), mask_id=1, num_tokens=2, special_ids=(0,))


def test_the_loss_counts_only_the_chosen_positions():
    g = torch.Generator().manual_seed(4)
    log_probs = torch.randn(3, 7, 11, generator=g).log_softmax(-1).requires_grad_()
    targets = torch.full((3, 7), IGNORE)
    targets[0, 2], targets[1, 5], targets[2, 0] = 4, 10, 0
    loss = masked_lm_loss(log_probs, targets)
    expected = -(log_probs[0, 2, 4] + log_probs[1, 5, 10] + log_probs[2, 0, 0]) / 3
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    loss.backward()
    chosen = targets != IGNORE
    assert (log_probs.grad[~chosen] == 0).all() and (log_probs.grad[chosen] != 0).any()


def test_the_loss_of_no_chosen_position_is_zero_with_a_gradient():
    log_probs = torch.randn(2, 3, 5).log_softmax(-1).requires_grad_()
    loss = masked_lm_loss(log_probs, torch.full((2, 3), IGNORE))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(log_probs.grad, torch.zeros_like(log_probs))


def test_the_head_is_the_formula_and_shares_the_embedding():
    torch.manual_seed(5)
    embedding = torch.nn.Embedding(13, 8)
    head = MaskedLMHead(8, 13, tie_to=embedding)
    assert head.weight is embedding.weight
    with torch.no_grad():
        head.bias.normal_()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    head, embedding = head.double(), embedding.double()
    dense = head.transform[0]
    h = F.gelu(x @ dense.weight.T + dense.bias)
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
    logits = h @ embedding.weight.T / math.sqrt(8) + head.bias
    torch.testing.assert_close(head(x), logits.log_softmax(-1), rtol=0, atol=1e-10)


def test_the_mlm_sees_both_sides_and_ignores_padding():
    torch.manual_seed(6)
    model = MLMTransformer(16, 2, 2, 12, 30, tie_weights=True).eval()
    x = torch.randint(1, 30, (1, 10))
    later = x.clone()
    later[0, 9] = (x[0, 9] % 29) + 1
    assert not torch.allclose(model(x)[0, 0], model(later)[0, 0])  # position 0 sees position 9: not causal
    padded = torch.cat([x, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, 10:] = False
    torch.testing.assert_close(model(padded, mask)[:, :10], model(x), rtol=0, atol=1e-5)


def test_a_tiny_mlm_learns_to_fill_in_a_pattern():
    # Sequences count up by one from a random start (mod 20): a hidden token is its left neighbour plus one, so a
    # model that reads the context fills it in; one that guesses gets 1 in 20.
    torch.manual_seed(7)
    n, t, mask_id = 21, 12, 21
    model = MLMTransformer(32, 4, 2, t, n + 1, tie_weights=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(7)

    def batch(b):
        start = torch.randint(0, 20, (b, 1), generator=g)
        return (start + torch.arange(t)) % 20 + 1  # ids 1..20

    for _ in range(500):
        m = mask_tokens(batch(32), mask_id=mask_id, num_tokens=n + 1, generator=g)
        loss = masked_lm_loss(model(m.inputs), m.targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    m = mask_tokens(batch(256), mask_id=mask_id, num_tokens=n + 1, generator=g)
    with torch.no_grad():
        guess = model(m.inputs).argmax(-1)
    accuracy = (guess[m.chosen] == m.targets[m.chosen]).float().mean().item()
    assert accuracy > 0.95, accuracy


def pretrained(**options):
    torch.manual_seed(8)
    return MLMTransformer(16, 2, 2, 10, 40, tie_weights=True, **options)


def test_a_classifier_starts_from_exactly_the_pretrained_weights():
    mlm = pretrained()
    torch.manual_seed(9)
    clf = CTransformer(16, 2, 2, 10, 40, 2, dropout=0.1, pool="mean")  # head and training fields may differ
    head = {k: v.clone() for k, v in clf.head.state_dict().items()}
    clf.load_encoder(mlm)
    source = mlm.state_dict()
    for key, value in clf.state_dict().items():
        if key.startswith(("embedding.", "encoder.")):
            assert torch.equal(value, source[key]), key
    for key, value in clf.head.state_dict().items():
        assert torch.equal(value, head[key])  # the head keeps its own initialisation
    # The same encoder computes the same vectors.
    clf.eval(), mlm.eval()
    x = torch.randint(0, 40, (3, 10))
    torch.testing.assert_close(clf.encoder(clf.embedding(x)), mlm.encoder(mlm.embedding(x)), rtol=0, atol=0)
    # A copy, not a share: fine-tuning the classifier leaves the pretrained model as it was.
    assert clf.embedding.tokens.weight.data_ptr() != mlm.embedding.tokens.weight.data_ptr()


def test_a_saved_mlm_loads_and_starts_a_classifier(tmp_path):
    mlm = pretrained()
    export_model(mlm, tmp_path / "mlm")
    loaded = load_model(tmp_path / "mlm")
    assert type(loaded) is MLMTransformer and loaded.config == mlm.config
    clf = CTransformer(16, 2, 2, 10, 40, 2)
    clf.load_encoder(loaded)
    assert torch.equal(clf.embedding.tokens.weight, mlm.embedding.tokens.weight)


def test_a_mismatched_encoder_is_refused_naming_the_fields():
    mlm = pretrained()
    with pytest.raises(ValueError, match=r"depth: 2 vs 3.*heads: 2 vs 4|heads: 2 vs 4.*depth: 2 vs 3"):
        CTransformer(16, 4, 3, 10, 40, 2).load_encoder(mlm)
    with pytest.raises(ValueError, match="prenorm"):
        CTransformer(16, 2, 2, 10, 40, 2, prenorm=True).load_encoder(mlm)
    with pytest.raises(ValueError, match="layout"):  # a generator's blocks are causal, and not called encoder
        CTransformer(16, 2, 2, 10, 40, 2).load_encoder(GTransformer(16, 2, 2, 10, 40))
    with pytest.raises(TypeError, match="pretrained"):
        CTransformer(16, 2, 2, 10, 40, 2).load_encoder(mlm.state_dict())


def test_mlm_refuses_fields_it_does_not_use():
    with pytest.raises(ValueError, match="num_classes"):
        MLMTransformer(16, 2, 2, 10, 40, num_classes=2)
    with pytest.raises(ValueError, match="num_tokens"):
        MLMTransformer(16, 2, 2, 10)


def test_selecting_the_chosen_positions_gives_their_rows_and_the_same_loss():
    torch.manual_seed(10)
    model = MLMTransformer(16, 2, 2, 10, 40, tie_weights=True).eval()
    tokens = torch.randint(1, 39, (4, 10))
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[1, 6:] = False
    m = mask_tokens(tokens, mask, mask_id=39, num_tokens=40, rate=0.5, generator=torch.Generator().manual_seed(0))
    full, selected = model(m.inputs, mask), model(m.inputs, mask, select=m.chosen)
    assert selected.shape == (int(m.chosen.sum()), 40)
    torch.testing.assert_close(selected, full[m.chosen], rtol=0, atol=1e-6)
    torch.testing.assert_close(masked_lm_loss(selected, m.targets[m.chosen]), masked_lm_loss(full, m.targets),
                               rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="select"):
        model(m.inputs, mask, select=m.chosen[:, :5])
    with pytest.raises(TypeError, match=r"select must have dtype torch.bool \(True = a position to predict\)"):
        model(m.inputs, mask, select=m.chosen.long())


def test_bad_loss_and_masking_arguments_name_the_argument():
    log_probs = torch.randn(2, 5, 11).log_softmax(-1)
    targets = torch.full((2, 5), IGNORE)
    with pytest.raises(ValueError, match=r"log_probs \(2, 5, 11\) and targets \(3,\).*select=chosen"):
        masked_lm_loss(log_probs, targets[0, :3])  # full log-probs with the chosen targets only: the likely slip
    with pytest.raises(TypeError, match="targets must be an int64 tensor"):
        masked_lm_loss(log_probs, targets.float())
    with pytest.raises(TypeError, match="log_probs must be a float tensor"):
        masked_lm_loss(targets, targets)
    with pytest.raises(ValueError, match=r"log_probs must be \(b, t, v\) or \(n, v\).*got shape \(11,\)"):
        masked_lm_loss(log_probs[0, 0], targets[0, 0])
    tokens = torch.randint(1, 9, (2, 5))
    for bad in (None, 0, "a", (0, 12)):
        with pytest.raises(TypeError, match="special_ids"):
            mask_tokens(tokens, mask_id=9, num_tokens=10, special_ids=bad)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        mask_tokens(tokens, mask_id=9, num_tokens=10, generator=0)


def test_a_changed_block_class_or_position_length_is_judged_by_what_it_changes():
    from torchformer import TransformerBlock

    class Doubling(TransformerBlock):
        def forward(self, x, *args, **kwargs):
            return 2 * super().forward(x, *args, **kwargs)

    class VariantMLM(MLMTransformer):
        block_class = Doubling

    with pytest.raises(ValueError, match=r"blocks are \['Doubling', 'Doubling'\].*block_class"):
        CTransformer(16, 2, 2, 10, 40, 2).load_encoder(VariantMLM(16, 2, 2, 10, 40))
    # Rotary positions take any length: the classifier may be built for longer reviews than the pretraining.
    CTransformer(16, 2, 2, 64, 40, 2, positions="rotary").load_encoder(MLMTransformer(16, 2, 2, 10, 40,
                                                                                     positions="rotary"))
    with pytest.raises(ValueError, match="learned positions: 10 vs 64"):
        CTransformer(16, 2, 2, 64, 40, 2).load_encoder(MLMTransformer(16, 2, 2, 10, 40))
