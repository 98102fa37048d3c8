"""torchformer.scripts.launch: how a global batch is shared out, and what one process sees (no process group)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchformer.scripts import launch
from torchformer.train.distributed import DistributedRun


@pytest.mark.parametrize("batch_size", [1, 4, 5])
def test_the_shares_of_a_batch_are_disjoint_and_together_the_batch(monkeypatch, batch_size):
    world = 2
    shares = []
    for rank in range(world):
        monkeypatch.setattr(launch, "rank_and_world_size", lambda rank=rank: (rank, world))
        shares.append(launch.share_batch(batch_size))
    assert len({len(s.rows) for s in shares}) == 1  # every process computes as many rows
    real = [int(row) for s in shares for row, counts in zip(s.rows, s.real) if counts]
    assert sorted(real) == list(range(batch_size))  # each row of the batch exactly once
    assert {s.divisor for s in shares} == {batch_size / world}
    assert not any(s.whole for s in shares)  # a part of the batch: gathered

    # Summed over the real rows and divided by the divisor, the processes' losses average to the batch's mean.
    logp = torch.randn(batch_size, 3).log_softmax(-1)
    targets = torch.randint(0, 3, (batch_size,))
    parts = [F.nll_loss(s.take(logp), s.targets(targets), reduction="sum") / s.divisor for s in shares]
    torch.testing.assert_close(sum(parts) / world, F.nll_loss(logp, targets))


def test_one_process_takes_the_whole_batch_in_order():
    share = launch.share_batch(6)
    x = torch.arange(12).view(6, 2)
    assert torch.equal(share.take(x), x) and torch.equal(share.targets(x), x) and share.divisor == 6
    assert share.whole and share.take(x) is x and share.targets(x) is x  # no copy on every step
    logp, y = torch.randn(6, 4).log_softmax(-1), torch.randint(0, 4, (6,))
    assert torch.equal(F.nll_loss(logp, y, reduction="sum") / share.divisor, F.nll_loss(logp, y))  # bit for bit
    assert torch.equal(launch.average_over_processes(torch.tensor([1.5, 2.0])), torch.tensor([1.5, 2.0]))
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        launch.share_batch(0)


def test_one_process_keeps_its_random_stream_and_the_start_up_line_says_what_b_means():
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    launch.seed_each_process(3)  # rank 0: nothing changes
    assert torch.equal(torch.rand(2), expected)
    one = DistributedRun(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    two = DistributedRun(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    assert "-b 32 sequences per step in all (32 per process)" in launch.describe_run(
        one, strategy="ddp", batch_size=32, unit="sequences", learn_rate=1e-3)
    line = launch.describe_run(two, strategy="fsdp", batch_size=5, unit="reviews", learn_rate=1e-3)
    assert "2 processes (FSDP over gloo); -b 5 reviews per step in all (2 or 3 per process)" in line
    assert "not scaled" in line
    with pytest.raises(ValueError, match="strategy must be one of ddp, fsdp, got 'zero'"):
        launch.start_run(torch.device("cpu"), strategy="zero", seed=1)
