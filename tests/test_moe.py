"""torchformer.nn.moe: the mixture of experts against its formula, its routing and losses against theirs written out,
compute-sparse dispatch, padding left out, the balance bias, and a whole model that trains, checkpoints and loads."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torchformer import TransformerConfig
from torchformer.families import MoETransformer
from torchformer.nn.auxiliary import auxiliary_loss, auxiliary_statistics, auxiliary_terms, step_parts
from torchformer.nn.feedforward import GatedFeedForward
from torchformer.nn.moe import MoEFeedForward, MoEOptions, Router

ROUTINGS = {
    "mixtral": dict(),
    "olmoe (no renormalisation)": dict(normalize=False),
    "capacity": dict(capacity_factor=0.6),
    "deepseek-v3": dict(score="sigmoid", groups=4, top_groups=2, selection_bias=True, routed_scaling=2.5),
    "shared experts": dict(shared_hidden=16),
}


def moe(dtype=torch.float64, **options):
    torch.manual_seed(0)
    layer = MoEFeedForward(16, experts=8, top_k=2, hidden=24, **options).to(dtype)
    if layer.router.selection_bias is not None:
        layer.router.selection_bias.normal_(0, 0.1)  # a bias that changes the choice
    return layer


def padded_batch(dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 16, generator=g, dtype=dtype)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    return x, mask


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64 (loop)", "float32 (grouped)"])
def test_the_fast_path_is_the_readable_one_forwards_and_backwards(routing, dtype):
    layer = moe(dtype, **ROUTINGS[routing])
    x, mask = padded_batch(dtype)
    grad = torch.randn(3, 7, 16, dtype=dtype, generator=torch.Generator().manual_seed(2))
    results = []
    for path in (layer.forward, layer.reference):
        layer.zero_grad()
        xs = x.clone().requires_grad_()
        out = path(xs, mask)
        out.backward(grad)
        results.append([out, xs.grad] + [p.grad.clone() for p in layer.parameters()])
    tolerance = 1e-12 if dtype == torch.float64 else 2e-6
    for fast, readable in zip(*results):
        torch.testing.assert_close(fast, readable, rtol=tolerance, atol=tolerance)
        assert torch.isfinite(fast).all()


def test_under_autocast_the_experts_multiply_in_its_dtype_as_the_readable_path_does():
    """bf16 autocast on the CPU: the grouped products run in bf16 (as F.linear's would), the output is bf16 and
    equals the readable path under the same autocast within bf16 rounding; gradients reach the float32 weights."""
    layer = moe(torch.float32, shared_hidden=16)
    x, mask = padded_batch(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, readable = layer(x, mask), layer.reference(x, mask)
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), readable.float(), rtol=2e-2, atol=2e-2)
    fast.float().sum().backward()
    assert layer.w1.grad.dtype == torch.float32 and layer.w1.grad.abs().sum() > 0


def test_each_expert_computes_only_the_tokens_sent_to_it():
    layer = moe()
    x, mask = padded_batch()
    seen = []
    original = layer.experts_apply

    def recording(rows, counts, valid):
        seen.append((counts.clone(), int(valid.sum())))
        return original(rows, counts, valid)

    layer.experts_apply = recording
    routing = layer.router(x.reshape(-1, 16), mask.reshape(-1))
    layer(x, mask)
    counts, computed = seen[0]
    real = int(mask.sum())
    assert computed == int(counts.sum()) == 2 * real  # k rows per real token, none for padding, E x fewer than dense
    expected = torch.bincount(routing.experts[mask.reshape(-1)].flatten(), minlength=8)
    assert torch.equal(counts, expected)


def test_padding_is_not_routed_nor_counted_and_never_changes_a_real_output():
    layer = moe().train()
    x, mask = padded_batch()
    out = layer(x, mask)
    load = auxiliary_statistics(layer)["expert_load"][0]
    assert load.sum().item() == 2 * mask.sum().item()  # k assignments per real token only
    noisy = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
    torch.testing.assert_close(layer(noisy, mask)[mask], out[mask], rtol=0, atol=1e-12)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))  # no shared experts: padding gets nothing


def test_softmax_routing_is_mixtrals_softmax_over_the_top_k_logits():
    router = Router(6, 5, 2).double()
    x = torch.randn(9, 6, dtype=torch.float64)
    routing = router(x)
    logits = x @ router.weight.T
    top = logits.topk(2, dim=-1)
    torch.testing.assert_close(routing.experts, top.indices)
    torch.testing.assert_close(routing.weights, top.values.softmax(-1).float(), rtol=1e-6, atol=1e-7)


def test_sigmoid_routing_with_groups_and_bias_is_deepseek_v3s_rule_written_out():
    torch.manual_seed(3)
    router = Router(6, 8, 2, score="sigmoid", groups=4, top_groups=2, selection_bias=True, routed_scaling=2.5)
    router.selection_bias.normal_(0, 0.3)
    x = torch.randn(11, 6)
    routing = router(x)
    for i in range(11):  # one token at a time, with Python lists
        scores = torch.sigmoid(x[i] @ router.weight.T).tolist()
        choice = [s + b for s, b in zip(scores, router.selection_bias.tolist())]
        group_score = [sum(sorted(choice[2 * g:2 * g + 2], reverse=True)[:2]) for g in range(4)]
        best_groups = sorted(range(4), key=lambda g: -group_score[g])[:2]
        allowed = [j for j in range(8) if j // 2 in best_groups]
        picked = sorted(allowed, key=lambda j: -choice[j])[:2]
        weights = [scores[j] / sum(scores[p] for p in picked) * 2.5 for j in picked]
        assert routing.experts[i].tolist() == picked
        assert routing.weights[i].tolist() == pytest.approx(weights, rel=1e-6)


def test_the_balance_and_z_losses_are_their_formulas_over_real_tokens():
    layer = moe(torch.float32).train()
    x, mask = padded_batch(torch.float32)
    layer(x, mask)
    tokens = x.reshape(-1, 16)[mask.reshape(-1)]  # the real ones
    logits = tokens @ layer.router.weight.T
    probabilities = logits.softmax(-1)
    picked = F.one_hot(logits.topk(2, -1).indices, 8).float()  # (n, k, E), as transformers' load_balancing_loss_func
    expected = (picked.mean(0) * probabilities.mean(0)[None]).sum() * 8
    terms = auxiliary_terms(layer)
    assert terms["balance"] == pytest.approx(expected.item(), rel=1e-5)
    assert terms["router_z"] == pytest.approx(logits.logsumexp(-1).square().mean().item(), rel=1e-5)
    # Perfectly even routing gives the loss's minimum, k.
    even = Router(4, 4, 2).train()
    with torch.no_grad():
        even.weight.zero_()
    even(torch.randn(8, 4))
    assert even.losses["balance"][1].item() == pytest.approx(2.0)


def test_capacity_keeps_each_experts_earliest_tokens():
    layer = moe(capacity_factor=0.5)  # 21 real tokens * 2 / 8 experts * 0.5: at most 3 per expert
    x, mask = padded_batch()
    routing = layer.router(x.reshape(-1, 16), mask.reshape(-1))
    kept = layer.kept(routing.experts, mask.reshape(-1))
    capacity = math.ceil(0.5 * mask.sum().item() * 2 / 8)
    taken = {j: 0 for j in range(8)}
    for i in range(21):  # by hand: tokens in order, each of its experts while it has room
        for slot in range(2):
            expert = routing.experts[i, slot].item()
            room = mask.reshape(-1)[i].item() and taken[expert] < capacity
            assert kept[i, slot].item() == room, (i, slot)
            taken[expert] += room
    layer.eval()  # evaluation and decoding drop nothing: a row's output never depends on the others
    assert torch.equal(layer.kept(routing.experts, mask.reshape(-1)), mask.reshape(-1, 1).expand(-1, 2))
    with torch.no_grad():
        torch.testing.assert_close(layer(x, mask)[:1], layer(x[:1], mask[:1]), rtol=1e-12, atol=1e-12)


def test_the_selection_bias_stays_float32_in_a_bfloat16_model_and_its_steps_survive():
    net = MoETransformer(16, 2, 1, 8, 20, activation="swiglu", options=(MoEOptions(
        experts=4, score="sigmoid", selection_bias=True, bias_update_rate=0.001),)).bfloat16()
    router = net.transformer_blocks()[0].ff.router
    assert router.selection_bias.dtype == torch.float32 and router.weight.dtype == torch.bfloat16
    router.selection_bias.fill_(1.0)
    loss = net(torch.randint(0, 20, (2, 8))).float().mean() + auxiliary_loss(net)
    loss.backward()
    step_parts(net)
    assert (router.selection_bias - 1).abs().max().item() == pytest.approx(0.001, rel=1e-3)  # bf16: 1 + 0.001 == 1
    assert net.double().transformer_blocks()[0].ff.router.selection_bias.dtype == torch.float32


def test_the_parts_check_their_arguments_where_the_options_do():
    with pytest.raises(ValueError, match="score must be one of 'softmax', 'sigmoid'; got 'softmx'"):
        Router(16, 4, 2, score="softmx")
    with pytest.raises(ValueError, match="top_k must be at most experts=4, got 8"):
        Router(16, 4, 8)
    with pytest.raises(ValueError, match="groups must divide experts=6, got 4"):
        Router(16, 6, 2, groups=4, top_groups=2)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoEFeedForward(16, experts=4, top_k=2, hidden=16, capacity_factor=-1.0)
    for name in ("balance_loss", "z_loss"):
        with pytest.raises(ValueError, match=f"{name} must be a finite number >= 0, got nan"):
            MoEOptions(**{name: float("nan")})


def test_a_subclass_of_the_options_is_what_the_mixture_reads():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class JitteredMoE(MoEOptions):
        jitter: float = 0.0

    config = TransformerConfig(16, 2, 1, 8, 20, activation="swiglu", options=(JitteredMoE(experts=6, top_k=3),))
    assert MoETransformer(config=config).transformer_blocks()[0].ff.experts == 6
    replaced = config.with_options(MoEOptions(experts=4))  # in place of its subclass, not beside it
    assert replaced.options_of(MoEOptions) == MoEOptions(experts=4)
    with pytest.raises(ValueError, match="options hold 2 options of MoEOptions"):
        config.replace(options=(JitteredMoE(), MoEOptions())).options_of(MoEOptions)


def test_loss_free_balancing_raises_the_bias_of_the_starved_experts():
    router = Router(4, 4, 1, selection_bias=True, bias_update_rate=0.01).train()
    with torch.no_grad():
        router.weight.zero_()
        router.weight[0, 0] = 5.0  # expert 0 wins for tokens with x_0 > 0
    x = torch.randn(64, 4).abs()
    router(x)
    load = router.statistics["expert_load"]
    step_parts(router)
    assert load[0] == 64 and torch.allclose(router.selection_bias, torch.tensor([-0.01, 0.01, 0.01, 0.01]))
    before = router.selection_bias.clone()
    step_parts(router)  # nothing routed since: nothing moves
    assert torch.equal(router.selection_bias, before)


def test_options_are_checked_and_name_the_field():
    with pytest.raises(ValueError, match="top_k must be at most experts=4, got 5"):
        MoEOptions(experts=4, top_k=5)
    with pytest.raises(ValueError, match="score must be one of 'softmax', 'sigmoid'"):
        MoEOptions(score="relu")
    with pytest.raises(ValueError, match="bias_update_rate=0.001 moves the selection bias: set selection_bias=True"):
        MoEOptions(bias_update_rate=0.001)
    with pytest.raises(ValueError, match="groups must divide experts=8"):
        MoEOptions(groups=3)
    with pytest.raises(ValueError, match="activation must be a gated unit"):
        MoETransformer(16, 2, 1, 8, 20, options=(MoEOptions(experts=4),))  # activation "relu"


def model(**options):
    torch.manual_seed(0)
    moe_options = MoEOptions(experts=4, top_k=2, dense_layers=1, z_loss=1e-3, **options)
    return MoETransformer(16, 2, 3, 8, 20, prenorm=True, activation="swiglu", options=(moe_options,))


def train_step(net, x, *, checkpointed=False):
    net.zero_grad()
    loss = F.nll_loss(net(x).transpose(1, 2), x) + auxiliary_loss(net)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


def test_a_moe_model_has_dense_first_blocks_and_trains_every_expert_with_its_losses():
    net = model()
    assert isinstance(net.blocks.blocks[0].ff, GatedFeedForward)
    assert [type(b.ff) for b in net.blocks.blocks[1:]] == [MoEFeedForward, MoEFeedForward]
    x = torch.randint(0, 20, (4, 8), generator=torch.Generator().manual_seed(4))
    plain = F.nll_loss(net(x).transpose(1, 2), x)
    total, grads = train_step(net, x)
    terms = auxiliary_terms(net)
    assert set(terms) == {"balance", "router_z"}
    expected = plain + 0.01 * 2 * terms["balance"] + 1e-3 * 2 * terms["router_z"]  # two MoE blocks, averaged
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    named = dict(zip([n for n, _ in net.named_parameters()], grads))
    assert named["blocks.blocks.1.ff.router.weight"].abs().sum() > 0  # the balance loss reaches the router
    assert all(named[f"blocks.blocks.2.ff.{w}"].abs().sum(dim=(1, 2)).gt(0).all() for w in ("w1", "v", "w2"))


def test_activation_checkpointing_records_the_same_losses_and_takes_the_same_gradients():
    x = torch.randint(0, 20, (4, 8), generator=torch.Generator().manual_seed(4))
    plain, checkpointed = model(), model()
    checkpointed.blocks.checkpoint_blocks = True
    results = [train_step(net, x) for net in (plain, checkpointed)]
    assert results[0][0].item() == pytest.approx(results[1][0].item(), rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert auxiliary_terms(plain) == pytest.approx(auxiliary_terms(checkpointed), rel=1e-6)


def test_a_compiled_moe_model_takes_the_eager_gradients_with_its_losses():
    net = model()
    x = torch.randint(0, 20, (4, 8), generator=torch.Generator().manual_seed(4))
    eager = train_step(net, x)
    compiled = torch.compile(net, backend="eager")  # Dynamo's tracing, where the records are side effects
    fast = train_step(compiled, x)
    assert fast[0].item() == pytest.approx(eager[0].item(), rel=1e-5)
    for a, b in zip(fast[1], eager[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_options_come_back_with_the_model_from_a_checkpoint(tmp_path):
    from torchformer import load_model
    from torchformer.train.checkpoint import save_checkpoint

    net = model(selection_bias=True).eval()
    with torch.no_grad():
        net.blocks.blocks[1].ff.router.selection_bias.normal_()
    path = save_checkpoint(tmp_path / "moe.pt", model=net, step=0)
    back = load_model(path)
    assert type(back) is MoETransformer and back.config == net.config
    assert back.config.options_of(MoEOptions).selection_bias
    x = torch.randint(0, 20, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(back(x), net(x), rtol=0, atol=0)
    assert TransformerConfig.from_dict(net.config.to_dict()) == net.config
