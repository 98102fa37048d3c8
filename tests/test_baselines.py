"""LSTMClassifier: the recurrent baseline, a drop-in replacement for CTransformer."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from torchformer.baselines import LSTMClassifier, LSTMConfig
from torchformer.config import TransformerConfig
from torchformer.data import pad_batch
from torchformer.train.metrics import evaluate_classifier

V, C = 12, 3
SEQUENCES = [[3, 5, 7], [1, 2, 3, 4, 5, 6, 7], [8], [2, 4, 6, 8, 10]]  # lengths 3, 7, 1, 5: unsorted on purpose
ARCHITECTURES = [
    dict(pool=pool, bidirectional=bidirectional, layers=layers)
    for pool in ("max", "mean", "last")
    for bidirectional in (True, False)
    for layers in (1, 2)
]


def names(arch):
    return f"{arch['pool']}-{'bi' if arch['bidirectional'] else 'uni'}-{arch['layers']}"


def small_model(**options):
    torch.manual_seed(0)
    return LSTMClassifier(V, C, emb=6, hidden=5, **options).eval()


def padded_batch(extra=4, pad_id=11):
    """SEQUENCES right-padded to 4 positions beyond the longest, the padding holding a real token id."""
    ids, mask = pad_batch(SEQUENCES)
    ids = F.pad(ids, (0, extra))
    mask = F.pad(mask, (0, extra))
    return ids.masked_fill(~mask, pad_id), mask


def by_hand(model, sequence):
    """One sequence alone, unpadded, through model.lstm, pooled by the formula of each mode."""
    k = model.config.hidden
    out, _ = model.lstm(model.embedding(torch.tensor([sequence])))  # (1, L, e) -> (1, L, directions * k)
    out = out[0]  # (L, directions * k): the last layer's outputs, forward features first
    if model.config.pool == "max":
        pooled = out.max(dim=0).values
    elif model.config.pool == "mean":
        pooled = out.sum(dim=0) / len(sequence)
    else:  # the forward direction ends at the last token, the backward one at the first
        pooled = out[-1, :k] if not model.config.bidirectional else torch.cat([out[-1, :k], out[0, k:]])
    return F.log_softmax(model.toprobs(pooled), dim=-1)


# ------------------------------------------------------------------ padding and the reference


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=names)
def test_padding_never_changes_the_output(arch):
    model = small_model(**arch)
    ids, mask = padded_batch()
    with torch.no_grad():
        batched = model(ids, mask)
        for i, sequence in enumerate(SEQUENCES):
            alone = model(torch.tensor([sequence]))  # no padding, no mask
            assert torch.allclose(batched[i], alone[0], atol=1e-6), (i, batched[i], alone[0])
        # More padding, and other ids in it, change nothing either.
        more_ids, more_mask = padded_batch(extra=9, pad_id=1)
        assert torch.allclose(model(more_ids, more_mask), batched, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=names)
def test_equals_each_sequence_alone_through_the_lstm_pooled_by_hand(arch):
    model = small_model(**arch)
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = torch.stack([by_hand(model, sequence) for sequence in SEQUENCES])
        assert torch.allclose(model(ids, mask), expected, atol=1e-6)


def test_no_mask_means_every_position_is_real():
    model = small_model()
    ids = torch.randint(1, V, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids), model(ids, torch.ones(3, 6, dtype=torch.bool)))


def test_output_is_log_probabilities_of_the_inputs_dtype():
    model = small_model().double()
    ids, mask = padded_batch()
    with torch.no_grad():
        out = model(ids, mask)
    assert out.shape == (len(SEQUENCES), C) and out.dtype == torch.float64
    assert torch.allclose(out.exp().sum(-1), torch.ones(len(SEQUENCES), dtype=torch.float64))


# ------------------------------------------------------------------ training


@pytest.mark.parametrize("pool", ["max", "mean", "last"])
def test_gradients_reach_every_parameter_and_never_the_padding(pool):
    torch.manual_seed(0)
    model = LSTMClassifier(V, C, emb=6, hidden=5, layers=2, pool=pool)
    ids, mask = padded_batch(pad_id=11)  # id 11 occurs only in the padding
    F.nll_loss(model(ids, mask), torch.tensor([0, 1, 2, 1])).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    grad = model.embedding.weight.grad
    assert grad[11].abs().sum() == 0  # padding is never read...
    assert grad[0].abs().sum() == 0  # ...and the padding id's embedding is never trained
    assert grad[[3, 5, 8]].abs().sum(1).gt(0).all()


def test_learns_whether_token_3_occurs():
    # A task an LSTM must carry over many steps: the class is whether id 3 occurs anywhere in the sequence.
    g = torch.Generator().manual_seed(0)

    def batch(n):
        lengths = torch.randint(1, 13, (n,), generator=g)
        sequences, labels = [], torch.randint(0, 2, (n,), generator=g)
        for length, label in zip(lengths.tolist(), labels.tolist()):
            sequence = torch.tensor([1, 2, 4, 5, 6, 7, 8, 9])[torch.randint(0, 8, (length,), generator=g)]
            if label:
                sequence[torch.randint(0, length, (1,), generator=g)] = 3
            sequences.append(sequence)
        return (*pad_batch(sequences), labels)

    torch.manual_seed(0)
    model = LSTMClassifier(10, 2, emb=16, hidden=16, pool="max")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        ids, mask, labels = batch(64)
        loss = F.nll_loss(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = evaluate_classifier(model, [batch(500)], num_classes=2)  # CTransformer's evaluation, unchanged
    assert result.accuracy > 0.97, result


def test_evaluate_classifier_takes_it_as_it_takes_a_transformer():
    model = small_model()
    ids, mask = padded_batch()
    labels = torch.tensor([0, 1, 2, 1])
    result = evaluate_classifier(model, [(ids, mask, labels), (ids[:2], None, labels[:2])], num_classes=C)
    with torch.no_grad():
        first, second = model(ids, mask), model(ids[:2])
    right = (first.argmax(-1) == labels).sum() + (second.argmax(-1) == labels[:2]).sum()
    assert result.count == 6 and result.accuracy == pytest.approx(right.item() / 6)


def test_dropout_acts_in_training_only():
    torch.manual_seed(0)
    model = LSTMClassifier(V, C, emb=6, hidden=5, layers=2, dropout=0.5)
    ids, mask = padded_batch()
    assert not torch.equal(model(ids, mask), model(ids, mask))
    model.eval()
    assert torch.equal(model(ids, mask), model(ids, mask))


# ------------------------------------------------------------------ configuration


def test_config_round_trips_and_rebuilds_the_model(tmp_path):
    model = small_model(pool="last", layers=2, bidirectional=False, dropout=0.1)
    config = model.config
    assert config == LSTMConfig(V, C, emb=6, hidden=5, layers=2, bidirectional=False, dropout=0.1, pool="last")
    assert config.features == 5 and LSTMConfig(V, C, hidden=7).features == 14
    data = json.loads(json.dumps(config.to_dict()))
    assert LSTMConfig.from_dict(data) == config
    # What a checkpoint holds: the config as plain data, the weights; both load with weights_only=True.
    torch.save({"config": config.to_dict(), "model": model.state_dict()}, tmp_path / "lstm.pt")
    saved = torch.load(tmp_path / "lstm.pt", weights_only=True)
    again = LSTMClassifier.from_config(LSTMConfig.from_dict(saved["config"]))
    again.load_state_dict(saved["model"])
    again.eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        assert torch.equal(again(ids, mask), model(ids, mask))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden = 9


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(pool="first"), ValueError, "pool must be one of 'max', 'mean', 'last'; got 'first'"),
        (dict(hidden=0), ValueError, "hidden must be a positive int, got 0"),
        (dict(layers=1.0), ValueError, "layers must be a positive int, got 1.0"),
        (dict(bidirectional="yes"), TypeError, "bidirectional must be a bool, got 'yes'"),
        (dict(dropout=1.0), ValueError, r"dropout must be a float in \[0, 1\), got 1.0"),
    ],
)
def test_bad_options_are_named(options, error, match):
    with pytest.raises(error, match=match):
        LSTMClassifier(V, C, **options)


def test_bad_configs_are_named():
    with pytest.raises(ValueError, match="num_tokens must be a positive int, got 0"):
        LSTMClassifier(0, C)
    with pytest.raises(TypeError):  # keyword-only beyond the first two
        LSTMClassifier(V, C, 16)
    with pytest.raises(ValueError, match="unknown config field.s. heads; known fields are"):
        LSTMConfig.from_dict({"num_tokens": V, "num_classes": C, "heads": 4})
    with pytest.raises(TypeError, match="config must be a dict of fields, got list"):
        LSTMConfig.from_dict([V, C])
    with pytest.raises(TypeError, match="config must be an LSTMConfig, got TransformerConfig"):
        LSTMClassifier.from_config(TransformerConfig(emb=8, heads=2))


@pytest.mark.parametrize(
    "x, mask, error, match",
    [
        (torch.ones(2, 3), None, TypeError, "x must hold integer token ids"),
        (torch.ones(3, dtype=torch.long), None, ValueError, r"x must have shape \(b, t\)"),
        (torch.full((2, 3), V), None, ValueError, rf"x must hold token ids in \[0, {V}\), got values in \[{V}, {V}\]"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), TypeError, "mask must have dtype torch.bool"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), ValueError,
         r"mask must have shape \(b, t\) = \(2, 3\), got \(2, 4\)"),
        (torch.ones(2, 3, dtype=torch.long), torch.tensor([[True, True, True], [False, True, True]]), ValueError,
         r"mask must mark the real tokens first .* rows \[1\] have padding before a real token"),
        (torch.ones(2, 3, dtype=torch.long), torch.tensor([[True, False, True], [True, True, True]]), ValueError,
         r"right padding.*rows \[0\]"),
        (torch.ones(2, 3, dtype=torch.long), torch.tensor([[True, True, False], [False, False, False]]), ValueError,
         r"mask marks every position of rows \[1\] as padding"),
    ],
    ids=["float-ids", "1-d", "id-out-of-range", "float-mask", "mask-shape", "left-padding", "gap", "all-padding"],
)
def test_bad_inputs_are_named(x, mask, error, match):
    with pytest.raises(error, match=match):
        small_model()(x, mask)
