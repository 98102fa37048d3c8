"""Tests for torchformer.train.evaluation.bits_per_byte, with small models whose exact answer is known."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchformer.train.evaluation import bits_per_byte


class Uniform(nn.Module):
    """Knows nothing: log(1/256) for every byte, so it pays exactly 8 bits per byte."""

    def __init__(self, context=None):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.context = context

    def forward(self, x):
        assert x.dtype == torch.int64 and not self.training
        if self.context is not None:
            assert x.shape[1] <= self.context
        return torch.full((*x.shape, 256), -math.log(256), dtype=torch.float64)


class Bigram(nn.Module):
    """Predicts the next byte from the last input byte only: log P[prev, next]."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.log_softmax(3 * torch.randn(256, 256, generator=g, dtype=torch.float64), -1))

    def forward(self, x):
        return self.table[x]


def bigram_by_hand(model, data):
    """Bits per byte of the bigram model, one byte at a time: every byte after the first, once."""
    table = model.table.detach().tolist()
    values = data.tolist()
    nats = sum(-table[prev][nxt] for prev, nxt in zip(values[:-1], values[1:]))
    return nats / math.log(2) / (len(values) - 1)


def random_bytes(n, seed=0):
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "n, context, stride", [(2, 8, None), (100, 8, None), (1000, 64, 64), (1001, 7, 1), (50, 64, None)]
)
def test_uniform_model_costs_eight_bits(n, context, stride):
    bpb = bits_per_byte(Uniform(context), random_bytes(n), context=context, stride=stride, batch_size=3)
    assert bpb == pytest.approx(8.0, rel=1e-12)


def sample_bigram(model, n, seed=0):
    """Text drawn from the bigram model itself, so that the model predicts it well."""
    g = torch.Generator().manual_seed(seed)
    probs = model.table.detach().exp()
    values = [0]
    for _ in range(n - 1):
        values.append(int(torch.multinomial(probs[values[-1]], 1, generator=g)))
    return torch.tensor(values, dtype=torch.uint8)


def test_bigram_matches_hand_computation():
    model = Bigram(seed=2)
    data = sample_bigram(model, 1234, seed=1)
    expected = bigram_by_hand(model, data)
    assert 1.0 < expected < 8.0  # a real, informative value: not 8 and not a total over all bytes
    assert bits_per_byte(model, data, context=50) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 300),
    context=st.integers(1, 40),
    batch_size=st.integers(1, 50),
    stride_fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_bigram_any_length_batch_size_and_stride(n, context, batch_size, stride_fraction, seed):
    stride = max(1, round(stride_fraction * context))
    data = random_bytes(n, seed)
    model = Bigram(seed)
    got = bits_per_byte(model, data, context=context, batch_size=batch_size, stride=stride)
    assert got == pytest.approx(bigram_by_hand(model, data), rel=1e-10)


def test_batch_size_does_not_matter():
    data = random_bytes(997, seed=3)  # not a multiple of the context
    model = Bigram(seed=3)
    results = [bits_per_byte(model, data, context=32, batch_size=b) for b in (1, 2, 5, 64, 1000)]
    assert max(results) - min(results) < 1e-12


class PositionOracle(nn.Module):
    """Data are positions (data[i] == i). Predicts the next byte for sure, but only with enough context.

    A prediction of byte q made after seeing k inputs costs 1 bit when k < min(q, required),
    and nothing otherwise. So the total is the number of bytes scored with too little context.
    """

    def __init__(self, vocab, required):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))
        self.vocab = vocab
        self.required = required

    def forward(self, x):
        b, t = x.shape
        q = x + 1  # the position (and value) of the byte to predict
        seen = torch.arange(1, t + 1).expand(b, t)
        short = seen < torch.clamp(q, max=self.required)
        p_right = torch.where(short, 0.5, 1.0).double()
        rest = ((1 - p_right) / (self.vocab - 1)).unsqueeze(-1).expand(b, t, self.vocab).clone()
        rest.scatter_(-1, q.clamp(max=self.vocab - 1).unsqueeze(-1), p_right.unsqueeze(-1))
        return rest.log()


@pytest.mark.parametrize("context, stride", [(16, 1), (16, 8), (16, 16), (10, 3)])
def test_every_byte_gets_the_promised_context(context, stride):
    n = 203
    data = torch.arange(n)
    promised = context - stride + 1  # see the module docstring of torchformer.train.evaluation
    bpb = bits_per_byte(PositionOracle(n + 1, promised), data, context=context, stride=stride)
    assert bpb == 0.0
    if stride > 1:
        # The same model with a full-context requirement does notice the shorter contexts, so the
        # check above can fail.
        assert bits_per_byte(PositionOracle(n + 1, context), data, context=context, stride=stride) > 0


def test_restores_training_mode():
    model = Uniform()
    model.train()
    bits_per_byte(model, random_bytes(20), context=4)
    assert model.training
    model.eval()
    bits_per_byte(model, random_bytes(20), context=4)
    assert not model.training


def test_model_without_parameters_runs_on_data_device():
    class NoParams(nn.Module):
        def forward(self, x):
            return torch.full((*x.shape, 256), -math.log(256))

    assert bits_per_byte(NoParams(), random_bytes(30), context=8) == pytest.approx(8.0, rel=1e-6)


class Logits(nn.Module):
    def __init__(self, vocab=256, shape=None):
        super().__init__()
        self.linear = nn.Embedding(300, vocab)
        self.shape = shape

    def forward(self, x):
        out = self.linear(x) * 10
        return out if self.shape is None else out.reshape(self.shape)


@pytest.mark.parametrize(
    "model, data, kwargs, error, match",
    [
        (Logits(), random_bytes(50), {}, ValueError, "log-probabilities"),
        (Logits(shape=(-1, 256)), random_bytes(50), {}, ValueError, r"shape \(b, t, vocab\)"),
        (Bigram(), torch.arange(300), {}, ValueError, "token id 299.*256 entries"),
        (Bigram(), random_bytes(1), {}, ValueError, r"at least 2 tokens.*got 1"),
        (Bigram(), random_bytes(10).reshape(2, 5), {}, ValueError, r"1-D tensor.*\(2, 5\)"),
        (Bigram(), torch.zeros(10), {}, TypeError, "integer token ids"),
        (Bigram(), random_bytes(10), {"context": 0}, ValueError, "context must be a positive int, got 0"),
        (Bigram(), random_bytes(10), {"batch_size": 0}, ValueError, "batch_size must be a positive int, got 0"),
        (Bigram(), random_bytes(10), {"stride": 0}, ValueError, r"stride must be an int in \[1, context=8\], got 0"),
        (Bigram(), random_bytes(10), {"stride": 9}, ValueError, r"stride must be an int in \[1, context=8\], got 9"),
        (lambda x: x, random_bytes(10), {}, TypeError, "torch.nn.Module"),
    ],
)
def test_bad_arguments(model, data, kwargs, error, match):
    with pytest.raises(error, match=match):
        bits_per_byte(model, data, **{"context": 8, **kwargs})


def test_context_longer_than_the_model_is_refused_by_name():
    from torchformer import GTransformer

    model = GTransformer(16, 2, 1, 32, 256)  # the model's own boundary check names the limit
    with pytest.raises(ValueError, match=r"reaches position 63.*seq_length=32"):
        bits_per_byte(model, random_bytes(200), context=64)


def test_windows_spread_over_the_data_estimate_the_whole_figure():
    # A file whose difficulty rises along it: a growing share of random bytes among text the model predicts well.
    # Its first bytes are far easier than the whole, so scoring them (what the periodic validation of the enwik8
    # example did) is badly biased; windows spread over the whole file are not.
    model = Bigram()
    n = 20_000
    noisy = torch.rand(n, generator=torch.Generator().manual_seed(3)) < torch.arange(n) / n
    data = torch.where(noisy, random_bytes(n, seed=2), sample_bigram(model, n, seed=1))
    full = bits_per_byte(model, data, context=32)
    first = bits_per_byte(model, data[:2_000], context=32)
    assert full - first > 4.0  # the file is far from uniform
    for seed in range(4):  # 125 windows of the 1,249: about 2,000 scored bytes, as many as data[:2_000]
        estimate = bits_per_byte(model, data, context=32, windows=125, seed=seed)
        assert abs(estimate - full) < 0.05 * full, (seed, estimate, full)
    assert bits_per_byte(model, data, context=32, windows=125, seed=7) == \
        bits_per_byte(model, data, context=32, windows=125, seed=7)  # the same bytes at every evaluation


def test_windows_score_the_bytes_of_the_full_plan():
    # With as many windows as the plan has (or more), the estimate is the full figure; with fewer, every scored
    # byte is one the full evaluation scores too, with the same context (checked against the bigram by hand).
    model = Bigram()
    data = sample_bigram(model, 500, seed=4)
    full = bits_per_byte(model, data, context=16)
    assert bits_per_byte(model, data, context=16, windows=10_000) == pytest.approx(full, rel=1e-12)
    # stride = context: window k scores its own 16 predictions, of data[16k + 1 : 16k + 17] (the last window is
    # moved left to end at the last byte and scores only what the one before it did not).
    per_window = [bigram_by_hand(model, data[s:s + 17]) for s in range(0, 500 - 17, 16)]
    per_window.append(bigram_by_hand(model, data[16 * len(per_window):]))
    for seed in range(5):
        one = bits_per_byte(model, data, context=16, windows=1, stride=16, seed=seed)
        assert min(abs(one - w) for w in per_window) < 1e-9


@pytest.mark.parametrize("kwargs, match", [({"windows": 0}, "windows must be a positive int"),
                                           ({"windows": 2.5}, "windows must be a positive int"),
                                           ({"seed": "1"}, "seed must be an int")])
def test_bad_window_arguments(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        bits_per_byte(Bigram(), random_bytes(100), context=8, **kwargs)


def test_nan_output_is_named_as_divergence():
    class Diverged(Bigram):
        def forward(self, x):
            return super().forward(x) * float("nan")

    with pytest.raises(ValueError, match="NaN or \\+inf.*did training diverge"):
        bits_per_byte(Diverged(), random_bytes(50), context=8)


def test_a_progress_label_shows_a_bar_and_changes_nothing(capsys):
    pytest.importorskip("tqdm")
    data = torch.randint(0, 256, (2000,))
    quiet = bits_per_byte(Bigram(), data, context=32, batch_size=8)
    assert capsys.readouterr().err == ""
    shown = bits_per_byte(Bigram(), data, context=32, batch_size=8, progress="validation")
    err = capsys.readouterr().err
    assert shown == quiet and "validation" in err and "100%" in err  # tqdm writes to stderr
    with pytest.raises(TypeError, match="progress must be a label"):
        bits_per_byte(Bigram(), data, context=32, progress=True)
