"""torchformer.train.optimizers: Muon for the blocks' matrices, Adam for the rest, as one optimizer.

The reference is torch's own ``Muon`` and ``Adam`` run side by side on the same split: the combined optimizer takes
exactly their steps, under a learning-rate schedule; its state survives a checkpoint (a resumed run takes exactly
the steps of the uninterrupted one); and the split is the documented one.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from torchformer import GTransformer
from torchformer.families import MoETransformer
from torchformer.nn.moe import MoEOptions
from torchformer.train.checkpoint import load_checkpoint, save_checkpoint
from torchformer.train.optimizers import Muon, MuonWithAdam, make_optimizer, muon_split, orthogonalise
from torchformer.train.training import warmup_cosine


def model(seed=0):
    torch.manual_seed(seed)
    return GTransformer(16, 2, 2, 8, 20, prenorm=True, qkv_bias=True)


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 20, (4, 9), generator=g)
    return x[:, :-1], x[:, 1:]


def train(net, opt, steps, start=0, sched=None, same_batch=False):
    for step in range(start, start + steps):
        x, y = batch(0 if same_batch else step)
        loss = F.nll_loss(net(x).transpose(1, 2), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return loss.item()


def test_the_split_puts_the_blocks_matrices_in_muon_and_everything_else_in_adam():
    net = model()
    matrices, rest = muon_split(net)
    names = {id(p): n for n, p in net.named_parameters()}
    assert {names[id(p)] for p in matrices} == {n for n, p in net.named_parameters()
                                               if n.startswith("blocks.blocks.") and p.dim() == 2}
    rest_names = {names[id(p)] for p in rest}
    assert {"embedding.tokens.weight", "embedding.positions.embedding.weight", "head.toprobs.weight",
            "blocks.blocks.0.attention.toqueries.bias", "blocks.blocks.0.norm1.weight"} <= rest_names
    assert len(matrices) + len(rest) == len(list(net.parameters()))


def test_it_takes_exactly_the_steps_of_torchs_muon_and_adam_side_by_side_under_a_schedule():
    ours_net, ref_net = model(), model()
    ours = make_optimizer(ours_net, "muon", lr=0.02, ns_dtype=torch.bfloat16)  # torch's dtype: torch's numbers
    matrices, rest = muon_split(ref_net)
    muon = torch.optim.Muon(matrices, lr=0.02, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    adam = torch.optim.Adam(rest, lr=0.02)
    sched = warmup_cosine(ours, warmup_steps=2, total_steps=6)
    ref_scheds = [warmup_cosine(o, warmup_steps=2, total_steps=6) for o in (muon, adam)]
    for step in range(6):
        for net, opts in ((ours_net, [ours]), (ref_net, [muon, adam])):
            x, y = batch(step)
            loss = F.nll_loss(net(x).transpose(1, 2), y)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
        sched.step()
        for s in ref_scheds:
            s.step()
    for (name, a), b in zip(ours_net.named_parameters(), ref_net.parameters()):
        assert torch.equal(a, b), name
    assert [g["lr"] for g in ours.param_groups] == [muon.param_groups[0]["lr"], adam.param_groups[0]["lr"]]


def test_a_checkpoint_resumes_exactly_and_refuses_the_other_optimizer(tmp_path):
    net = model()
    opt = make_optimizer(net, "muon", lr=0.02)
    sched = warmup_cosine(opt, warmup_steps=2, total_steps=8)
    train(net, opt, 3, sched=sched)
    path = save_checkpoint(tmp_path / "c.pt", model=net, optimizer=opt, scheduler=sched, step=3)
    train(net, opt, 3, start=3, sched=sched)
    after = copy.deepcopy(net.state_dict())

    resumed = model(seed=1)  # other weights: everything must come from the file
    opt2 = make_optimizer(resumed, "muon", lr=0.02)
    sched2 = warmup_cosine(opt2, warmup_steps=2, total_steps=8)
    assert load_checkpoint(path, model=resumed, optimizer=opt2, scheduler=sched2)["step"] == 3
    train(resumed, opt2, 3, start=3, sched=sched2)
    for k, v in after.items():
        assert torch.equal(resumed.state_dict()[k], v), k
    with pytest.raises(ValueError, match="holds the state of a MuonWithAdam optimizer, but the optimizer given is "
                                         "a Adam"):
        load_checkpoint(path, model=model(), optimizer=make_optimizer(model(), "adam", lr=0.02))


def test_muon_lowers_the_loss_and_bad_arguments_are_named():
    net = model()
    opt = make_optimizer(net, "muon", lr=0.01)
    first = train(net, opt, 1, same_batch=True)
    assert train(net, opt, 30, start=1, same_batch=True) < first / 2  # one batch, learned by heart
    assert isinstance(opt, MuonWithAdam) and type(make_optimizer(net, "adam", lr=0.01)) is torch.optim.Adam
    with pytest.raises(ValueError, match="optimizer must be one of 'adam', 'muon'; got 'sgd'"):
        make_optimizer(net, "sgd", lr=0.01)
    with pytest.raises(ValueError, match="lr must be a non-negative number, got -1"):
        make_optimizer(net, "muon", lr=-1)
    with pytest.raises(TypeError, match="blocks must be given for a Linear"):
        make_optimizer(torch.nn.Linear(2, 2), "muon", lr=0.01)
    with pytest.raises(ValueError, match=r"matrices must hold parameters of 2 or more dims only.*\(3,\)"):
        MuonWithAdam([torch.nn.Parameter(torch.zeros(3))], [], lr=0.01)


def test_step_with_a_closure_calls_it_once_with_gradients_on_and_steps_with_what_it_computed():
    """The closure contract of torch.optim.Optimizer.step (torch's optimizer tests check the same): the closure
    re-evaluates the model with autograd on, although step itself runs under no_grad; step returns its loss; and
    the step is the one taken from the gradients the closure left, as if it had been called first."""
    net, reference = model(), model()
    opt, ref_opt = make_optimizer(net, "muon", lr=0.02), make_optimizer(reference, "muon", lr=0.02)
    calls = []
    for step in range(3):
        x, y = batch(step)

        def closure():
            calls.append(torch.is_grad_enabled())
            opt.zero_grad()
            loss = F.nll_loss(net(x).transpose(1, 2), y)
            loss.backward()
            return loss

        loss = opt.step(closure)
        ref_opt.zero_grad()
        ref_loss = F.nll_loss(reference(x).transpose(1, 2), y)
        ref_loss.backward()
        assert ref_opt.step() is None
        assert torch.equal(loss, ref_loss)
    assert calls == [True] * 3
    for (name, a), b in zip(net.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), name


def moe_model(seed=0):
    torch.manual_seed(seed)
    options = (MoEOptions(experts=4, top_k=2, expert_hidden=12),)
    return MoETransformer(16, 2, 2, 8, 20, prenorm=True, activation="swiglu", options=options)


@pytest.mark.parametrize("nesterov", [True, False])
def test_a_stack_steps_each_matrix_as_torchs_muon_steps_it_alone(nesterov):
    """The reference: torch.optim.Muon over the stack's matrices as separate parameters (with weight decay, tall and
    wide matrices, a stack of two leading dims). bf16 batched products may round otherwise than single ones."""
    torch.manual_seed(0)
    stacks = [torch.randn(3, 6, 4), torch.randn(2, 2, 3, 5)]
    ours = [torch.nn.Parameter(s.clone()) for s in stacks]
    alone = [torch.nn.Parameter(m.clone()) for s in stacks for m in s.flatten(0, -3)]
    options = dict(lr=0.02, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    opt, ref = Muon(ours, ns_dtype=torch.bfloat16, **options), torch.optim.Muon(alone, **options)
    for step in range(4):
        grads = [torch.randn_like(s) for s in stacks]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        for p, g in zip(alone, [m for g in grads for m in g.flatten(0, -3)]):
            p.grad = g.clone()
        opt.step()
        ref.step()
    got = [m for p in ours for m in p.detach().flatten(0, -3)]
    start = [m for s in stacks for m in s.flatten(0, -3)]
    for m, (a, b, s) in enumerate(zip(got, alone, start)):
        moved = (b.detach() - s).abs().max()  # 4 steps moved each weight; the stack's moved it the same
        assert (a - b.detach()).abs().max() < 1e-2 * moved, m
    state = opt.state[ours[0]]["momentum_buffer"].flatten(0, -3)
    torch.testing.assert_close(state, torch.stack([ref.state[p]["momentum_buffer"] for p in alone[:3]]))


def test_muon_has_torchs_defaults_and_refuses_what_is_not_a_matrix():
    torch_defaults = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults
    assert Muon([torch.nn.Parameter(torch.zeros(2, 2, 2))]).defaults == torch_defaults
    assert Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults == torch_defaults
    with pytest.raises(ValueError, match=r"Muon needs matrices or stacks of matrices .* got shape \(2,\)"):
        Muon([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="momentum must be a non-negative number, got -1"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2, 2))], momentum=-1)
    with pytest.raises(ValueError, match="adjust_lr_fn must be one of"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2, 2))], adjust_lr_fn="rms")
    for bad in (torch.int32, "bfloat16"):
        with pytest.raises(TypeError, match="ns_dtype must be None or a floating-point torch.dtype, got"):
            Muon([torch.nn.Parameter(torch.zeros(2, 2))], ns_dtype=bad)
    with pytest.raises(ValueError, match="ns_dtype is the dtype of Muon's iterations, got torch.float32 for "
                                         "optimizer 'adam'"):
        make_optimizer(model(), "adam", lr=0.01, ns_dtype=torch.float32)


def newton_schulz_float64(matrix, steps=5, a=3.4445, b=-4.775, c=2.0315):
    """The quintic iteration written out in float64, on the wide side: X <- a X + (b A + c A^2) X, A = X X^T."""
    x = matrix.double()
    x = x.T if x.size(0) > x.size(1) else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if matrix.size(0) > matrix.size(1) else x


def test_the_iterations_run_in_float32_on_the_cpu_and_follow_the_formula():
    """On the CPU the default is float32 (bfloat16 products are emulated there, many times slower): within 1e-5 of
    the iteration in float64, where bfloat16 is off by about 1e-2; a stack is orthogonalised matrix by matrix."""
    torch.manual_seed(0)
    wide, tall, stack = torch.randn(6, 10), torch.randn(12, 5), torch.randn(3, 4, 7)
    for m in (wide, tall):
        exact = newton_schulz_float64(m)
        options = dict(coefficients=(3.4445, -4.775, 2.0315), steps=5, eps=1e-7)
        got32, got16 = orthogonalise(m, dtype=torch.float32, **options), orthogonalise(m, **options)
        assert got32.dtype == torch.float32 and got16.dtype == torch.bfloat16
        assert (got32.double() - exact).abs().max() < 1e-5
        assert (got16.double() - exact).abs().max() > 1e-3  # the dtype does change the numbers
        torch.testing.assert_close(got16.double(), exact, atol=5e-2, rtol=0)
    stacked = orthogonalise(stack, dtype=torch.float32, coefficients=(3.4445, -4.775, 2.0315), steps=5, eps=1e-7)
    for got, m in zip(stacked, stack):
        assert (got.double() - newton_schulz_float64(m)).abs().max() < 1e-5
    # The optimizer's default on the CPU is float32; bfloat16 only when asked for.
    start, grad = torch.randn(6, 10), torch.randn(6, 10)
    weights = [torch.nn.Parameter(start.clone()) for _ in range(3)]
    for w, dtype in zip(weights, (None, torch.float32, torch.bfloat16)):
        w.grad = grad.clone()
        Muon([w], lr=0.1, ns_dtype=dtype).step()
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_a_mixtures_experts_get_muon_as_stacks_and_a_checkpoint_resumes_exactly(tmp_path):
    net = moe_model()
    matrices, _ = muon_split(net)
    names = {id(p): n for n, p in net.named_parameters()}
    stacked = {names[id(p)] for p in matrices if p.dim() == 3}
    assert stacked == {f"blocks.blocks.{i}.ff.{w}" for i in range(2) for w in ("w1", "v", "w2")}
    opt = make_optimizer(net, "muon", lr=0.02)
    assert [len(g["params"]) for g in opt.param_groups][2] == 6 and type(opt.inner[2]) is Muon
    sched = warmup_cosine(opt, warmup_steps=2, total_steps=8)
    train(net, opt, 2, sched=sched)
    path = save_checkpoint(tmp_path / "c.pt", model=net, optimizer=opt, scheduler=sched, step=2)
    before = copy.deepcopy(net.state_dict())
    train(net, opt, 2, start=2, sched=sched)
    after = copy.deepcopy(net.state_dict())
    assert all(not torch.equal(before[n], after[n]) for n in stacked)  # the experts learn

    resumed = moe_model(seed=1)
    opt2 = make_optimizer(resumed, "muon", lr=0.02)
    sched2 = warmup_cosine(opt2, warmup_steps=2, total_steps=8)
    load_checkpoint(path, model=resumed, optimizer=opt2, scheduler=sched2)
    train(resumed, opt2, 2, start=2, sched=sched2)
    for k, v in after.items():
        assert torch.equal(resumed.state_dict()[k], v), k
