"""Training on two processes (gloo, CPU) gives what one process gives, and checkpoints move between world sizes.

One 2-process job (``torch.multiprocessing``, spawned once for the module: each process costs seconds to start on
one core) runs every multi-process scenario and writes what it found into a folder; the tests compare those files
with single-process references computed here. The job has a deadline and a short collective timeout, so a broken
rank fails the tests instead of hanging them.
"""

from __future__ import annotations

import gc
import os
import socket
import time
import weakref
from datetime import timedelta

import pytest
import torch
import torch.nn.functional as F

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this build of torch", allow_module_level=True)

from torchformer import CTransformer, GTransformer  # noqa: E402
from torchformer.train.distributed import (  # noqa: E402
    all_reduce_mean, all_reduce_sum, is_main_process, rank_and_world_size, setup_distributed, shard,
    teardown_distributed, wrap_model,
)
from torchformer.train.distributed_checkpoint import (  # noqa: E402
    load_distributed_checkpoint, save_distributed_checkpoint,
)
from torchformer.train.evaluation import bits_per_byte  # noqa: E402
from torchformer.train.optimizers import Muon, ShardedMuon, make_optimizer  # noqa: E402
from torchformer.train.metrics import evaluate_classifier  # noqa: E402

WORLD = 2
DEADLINE = 150  # seconds for the whole job; a hung rank fails the tests after this


def model(**options) -> GTransformer:
    torch.manual_seed(0)  # the same initial weights in every process
    return GTransformer(16, 2, 2, 8, 11, prenorm=True, **options)


def batch(step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: 4 sequences, inputs and next tokens; each rank takes 2 of them."""
    g = torch.Generator().manual_seed(10 + step)
    x = torch.randint(0, 11, (4, 9), generator=g)
    return x[:, :-1], x[:, 1:]


def rank_part(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = x.size(0) // world
    return x[rank * n:(rank + 1) * n]


def train_step(net, optimizer, step: int, rank: int = 0, world: int = 1) -> None:
    x, y = (rank_part(t, rank, world) for t in batch(step))
    optimizer.zero_grad()
    F.nll_loss(net(x).transpose(1, 2), y).backward()
    optimizer.step()


def full_state(net) -> dict:
    """The whole model's weights on rank 0 (gathered from the shards), {} elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


MUON_LR = 0.02
MATRIX_SHAPES = ((27, 16), (16, 27), (3, 5), (1, 4), (16, 16))
STACK_SHAPES = ((3, 6, 4), (1, 5, 3), (4, 2, 3, 5))  # stacks of experts: 2 + 1, 1 + 0 and 2 + 2 per process
SHARDED_MUON = dict(lr=0.05, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")  # decay on: its step is tested too


class Matrices(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(*shape, generator=g))
                                               for shape in MATRIX_SHAPES])


def matrix_grads(step: int, shapes: tuple = MATRIX_SHAPES) -> list:
    g = torch.Generator().manual_seed(20 + step)
    return [torch.randn(*shape, generator=g) for shape in shapes]


class Stacks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(6)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(*shape, generator=g))
                                               for shape in STACK_SHAPES])


def muon_model() -> GTransformer:
    return model(ff_hidden=27)


def eval_data() -> torch.Tensor:
    return torch.randint(0, 11, (60,), generator=torch.Generator().manual_seed(3))


def classifier() -> CTransformer:
    torch.manual_seed(0)
    return CTransformer(16, 2, 2, 8, 11, 3)


def classifier_batches() -> list:
    """5 batches of 4, 3, 5, 2 and 4 padded sequences of 3 classes: rank 0 scores 3 of them, rank 1 only 2."""
    g = torch.Generator().manual_seed(4)
    batches = []
    for b in (4, 3, 5, 2, 4):
        lengths = torch.randint(1, 9, (b,), generator=g)
        mask = torch.arange(8)[None] < lengths[:, None]  # (b, 8), True on real tokens
        ids = torch.randint(1, 11, (b, 8), generator=g) * mask
        batches.append((ids, mask, torch.randint(0, 3, (b,), generator=g)))
    return batches


def classifier_figures(result) -> dict:
    return {"loss": result.loss, "accuracy": result.accuracy, "count": result.count,
            "confusion": result.confusion.tolist(), "calibration": result.calibration.to_dict()}


# ------------------------------------------------------------------------------------------------------------
# The 2-process job


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    run = setup_distributed(device="cpu", timeout=timedelta(seconds=60))
    assert (run.rank, run.world_size, run.backend, run.is_main) == (rank, world, "gloo", rank == 0)
    assert rank_and_world_size() == (rank, world) and is_main_process() == (rank == 0)

    def save(obj, name: str) -> None:
        if run.is_main:
            torch.save(obj, os.path.join(folder, name))

    # DDP and FSDP2: one SGD step on each rank's half of the batch.
    ddp = wrap_model(model(), strategy="ddp")
    train_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.5), 0, rank, world)
    save(ddp.module.state_dict(), "ddp.pt")
    fsdp = wrap_model(model(), strategy="fsdp")
    sharded = [type(p).__name__ for p in fsdp.parameters()]
    meshes = sorted({p.device_mesh.device_type for p in fsdp.parameters()})  # the model's device, not the machine's GPU
    train_step(fsdp, torch.optim.SGD(fsdp.parameters(), lr=0.5), 0, rank, world)
    save({"state": full_state(fsdp), "parameter_types": sharded, "meshes": meshes}, "fsdp.pt")

    # FSDP2 with activation checkpointing: the blocks run again in the backward pass, and the step is the same.
    checkpointed = wrap_model(model(checkpoint_blocks=True), strategy="fsdp")
    calls = [0]
    for block in checkpointed.transformer_blocks():
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    train_step(checkpointed, torch.optim.SGD(checkpointed.parameters(), lr=0.5), 0, rank, world)
    save({"state": full_state(checkpointed), "block_calls": calls[0]}, "fsdp_checkpointed.pt")

    # Sharded classifier evaluation, uneven shares: a plain model on each process, and an FSDP2 one (whose
    # processes must run the same number of forward passes: rank 1 replays a batch).
    plain = evaluate_classifier(classifier(), classifier_batches(), distributed=True)
    sharded_classifier = wrap_model(classifier(), strategy="fsdp")
    fsdp_result = evaluate_classifier(sharded_classifier, classifier_batches(), distributed=True)
    save({"plain": classifier_figures(plain), "fsdp": classifier_figures(fsdp_result)}, "classifier.pt")

    # Sharded evaluation: 7 batches of 3 windows, so rank 1 has one batch fewer than rank 0.
    bpb = bits_per_byte(fsdp, eval_data(), context=8, stride=4, batch_size=3, distributed=True)
    save({"bpb": bpb, "sum": all_reduce_sum(torch.tensor([rank + 1.0])).item(), "mean": all_reduce_mean(rank * 2.0),
          "shard": list(shard(list(range(5))))}, "metrics.pt")

    # A checkpoint of a 2-process FSDP run after step 1, and the weights after step 2.
    net = wrap_model(model(), strategy="fsdp")
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    train_step(net, opt, 0, rank, world)
    save_distributed_checkpoint(os.path.join(folder, "two.pt"), model=net, optimizer=opt, step=1)
    train_step(net, opt, 1, rank, world)
    save(full_state(net), "two_then_step.pt")

    # The other way round: a checkpoint written by one process (the test, beforehand), one step here.
    net = wrap_model(model(), strategy="fsdp")
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    assert load_distributed_checkpoint(os.path.join(folder, "one.pt"), model=net, optimizer=opt)["world_size"] == 1
    train_step(net, opt, 1, rank, world)
    save(full_state(net), "one_then_step.pt")

    # Muon under FSDP2 (ShardedMuon): 2 steps, with a checkpoint after the first; an odd feed-forward width, so
    # that FSDP2 splits some matrices unevenly (27 rows: 14 and 13) and the owners of whole matrices alternate.
    net = wrap_model(muon_model(), strategy="fsdp")
    opt = make_optimizer(net, "muon", lr=MUON_LR)
    train_step(net, opt, 0, rank, world)
    save_distributed_checkpoint(os.path.join(folder, "muon_two.pt"), model=net, optimizer=opt, step=1)
    train_step(net, opt, 1, rank, world)
    save({"state": full_state(net), "muon": type(opt.muon).__name__}, "muon_fsdp.pt")
    # ShardedMuon alone, on gradients given whole (so every process steps the numbers one process would): 2 steps
    # of matrices split evenly, unevenly, and with fewer rows than processes (rank 1 holds none of the (1, 4)).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    matrices = fully_shard(Matrices(), mesh=init_device_mesh("cpu", (world,)))
    opt = ShardedMuon(matrices.parameters(), **SHARDED_MUON)
    for step in range(2):
        for p, grad in zip(matrices.parameters(), matrix_grads(step)):
            p.grad = distribute_tensor(grad, p.device_mesh, p.placements)
        opt.step()
    whole = [p.full_tensor() for p in matrices.parameters()]  # collective: every process gathers
    save({"weights": whole, "rows": [p.to_local().size(0) for p in matrices.parameters()]}, "sharded_muon.pt")
    # Muon on stacks that FSDP2 split along their first dim (each process holds whole matrices).
    stacks = fully_shard(Stacks(), mesh=init_device_mesh("cpu", (world,)))
    opt = Muon(stacks.parameters(), **SHARDED_MUON)
    for step in range(2):
        for p, grad in zip(stacks.parameters(), matrix_grads(step, STACK_SHAPES)):
            p.grad = distribute_tensor(grad, p.device_mesh, p.placements)
        opt.step()
    whole = [p.full_tensor() for p in stacks.parameters()]
    save({"weights": whole, "rows": [p.to_local().size(0) for p in stacks.parameters()]}, "stacked_muon.pt")

    # ... and a one-process Muon checkpoint (the test's) resumed on two.
    net = wrap_model(muon_model(), strategy="fsdp")
    opt = make_optimizer(net, "muon", lr=MUON_LR)
    load_distributed_checkpoint(os.path.join(folder, "muon_one.pt"), model=net, optimizer=opt)
    train_step(net, opt, 1, rank, world)
    save(full_state(net), "muon_one_then_step.pt")

    # Exact resume on the same world size, dropout included: each rank draws its own masks (its own seed), so
    # only restoring every rank's own generator states repeats the step exactly.
    net = wrap_model(model(dropout=0.3), strategy="ddp")
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    train_step(net, opt, 0, rank, world)
    path = os.path.join(folder, "dropout.pt")
    save_distributed_checkpoint(path, model=net, optimizer=opt, step=1)
    train_step(net, opt, 1, rank, world)
    after = {k: v.clone() for k, v in net.module.state_dict().items()}
    train_step(net, opt, 2, rank, world)  # move on, then come back
    assert load_distributed_checkpoint(path, model=net, optimizer=opt)["step"] == 1
    train_step(net, opt, 1, rank, world)
    resumed = net.module.state_dict()
    save({"same": all(torch.equal(after[k], resumed[k]) for k in after)}, "resume.pt")
    teardown_distributed()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Run the 2-process job once; the folder it wrote to."""
    folder = tmp_path_factory.mktemp("distributed")
    # The single-process checkpoint the job resumes from: one AdamW step on the whole batch.
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    train_step(net, opt, 0)
    save_distributed_checkpoint(folder / "one.pt", model=net, optimizer=opt, step=1)
    net = muon_model()
    opt = make_optimizer(net, "muon", lr=MUON_LR)
    train_step(net, opt, 0)
    save_distributed_checkpoint(folder / "muon_one.pt", model=net, optimizer=opt, step=1)

    with socket.socket() as s:  # a free port for this job's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = torch.multiprocessing.start_processes(
        _worker, args=(WORLD, port, str(folder)), nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD}-process job did not finish within {DEADLINE} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return folder


def reference(steps: int = 1, optimizer=lambda p: torch.optim.SGD(p, lr=0.5)) -> dict:
    """One process trained on the whole batches."""
    net = model()
    opt = optimizer(net.parameters())
    for step in range(steps):
        train_step(net, opt, step)
    return net.state_dict()


def assert_same_weights(state: dict, expected: dict) -> None:
    assert state.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(state[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


# ------------------------------------------------------------------------------------------------------------
# The tests


def test_ddp_step_equals_one_process_on_both_ranks_batches(job):
    state = torch.load(job / "ddp.pt")
    assert_same_weights(state, reference())
    assert not torch.equal(state["head.toprobs.weight"], model().state_dict()["head.toprobs.weight"])  # it moved


def test_fsdp_step_equals_one_process_and_its_gathered_state_equals_ddps(job):
    fsdp = torch.load(job / "fsdp.pt")
    assert set(fsdp["parameter_types"]) == {"DTensor"}  # really sharded
    assert fsdp["meshes"] == ["cpu"]  # a gloo run on a machine with a GPU too (fully_shard's default mesh is CUDA's)
    assert_same_weights(fsdp["state"], reference())
    assert_same_weights(fsdp["state"], torch.load(job / "ddp.pt"))


def test_sharded_evaluation_equals_one_process(job):
    metrics = torch.load(job / "metrics.pt")
    net = model()
    net.load_state_dict(torch.load(job / "fsdp.pt")["state"])
    assert metrics["bpb"] == bits_per_byte(net, eval_data(), context=8, stride=4, batch_size=3)
    assert (metrics["sum"], metrics["mean"], metrics["shard"]) == (3.0, 1.0, [0, 2, 4])


def test_fsdp_with_activation_checkpointing_takes_the_plain_fsdp_step(job):
    checkpointed = torch.load(job / "fsdp_checkpointed.pt")
    assert checkpointed["block_calls"] == 4  # depth 2, each block run again in the backward pass: it recomputed
    assert_same_weights(checkpointed["state"], torch.load(job / "fsdp.pt")["state"])


def test_sharded_classifier_evaluation_equals_one_process_in_every_figure(job):
    """Each process scored its share (3 and 2 batches); loss, accuracy, confusion and calibration are the single
    process's exactly (float64 sums of float32 confidences are exact, so their order does not matter)."""
    expected = classifier_figures(evaluate_classifier(classifier(), classifier_batches()))
    got = torch.load(job / "classifier.pt")
    assert got["plain"] == expected
    assert got["fsdp"] == expected
    assert expected["count"] == 18 and sum(b["count"] for b in expected["calibration"]["bins"]) == 18


def test_a_two_process_checkpoint_resumes_in_one_process(job):
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    info = load_distributed_checkpoint(job / "two.pt", model=net, optimizer=opt)
    assert (info["step"], info["world_size"]) == (1, 2)
    train_step(net, opt, 1)
    assert_same_weights(net.state_dict(), torch.load(job / "two_then_step.pt"))
    assert_same_weights(net.state_dict(), reference(2, lambda p: torch.optim.AdamW(p, lr=0.01)))


def test_a_one_process_checkpoint_resumes_on_two(job):
    expected = reference(2, lambda p: torch.optim.AdamW(p, lr=0.01))
    assert_same_weights(torch.load(job / "one_then_step.pt"), expected)


def muon_reference(steps: int = 2) -> dict:
    net = muon_model()
    opt = make_optimizer(net, "muon", lr=MUON_LR)
    for step in range(steps):
        train_step(net, opt, step)
    return net.state_dict()


def assert_muon_weights(state: dict, expected: dict) -> None:
    """Each tensor within 5 % of how far training moved it. Where the summed gradients of two processes differ
    from one process's in their last float32 digit, the Newton-Schulz iterations amplify that along the matrix's
    small singular directions (seen with the iterations in bfloat16: one matrix of 12 off by 3 % of its step, the
    others equal). A wrong step is off by far more: Muon's rescaling from a shard's
    shape instead of the matrix's by 30 %, orthogonalising each process's rows alone by about 100 %.
    (Equal gradients give equal steps: test_sharded_muon_on_equal_gradients_is_muon_on_whole_matrices.)"""
    assert state.keys() == expected.keys()
    initial = muon_model().state_dict()
    for key in expected:
        moved = (expected[key] - initial[key]).norm()
        assert (state[key] - expected[key]).norm() <= 0.05 * moved, key


def test_sharded_muon_on_equal_gradients_is_muon_on_whole_matrices(job):
    got = torch.load(job / "sharded_muon.pt")
    assert got["rows"] == [14, 8, 2, 1, 8]  # rank 0's share: FSDP2 split (27, 16) 14 + 13, (1, 4) 1 + 0
    matrices = Matrices()
    opt = Muon(matrices.parameters(), **SHARDED_MUON)
    for step in range(2):
        for p, grad in zip(matrices.parameters(), matrix_grads(step)):
            p.grad = grad
        opt.step()
    for weight, expected in zip(got["weights"], matrices.parameters()):
        torch.testing.assert_close(weight, expected.detach(), rtol=1e-6, atol=1e-7)


def test_stacked_muon_under_fsdp_steps_each_process_whole_experts_as_one_process(job):
    got = torch.load(job / "stacked_muon.pt")
    assert got["rows"] == [2, 1, 2]  # rank 0's experts: FSDP2 split (3, ...) 2 + 1, (1, ...) 1 + 0
    stacks = Stacks()
    opt = Muon(stacks.parameters(), **SHARDED_MUON)
    for step in range(2):
        for p, grad in zip(stacks.parameters(), matrix_grads(step, STACK_SHAPES)):
            p.grad = grad
        opt.step()
    for weight, expected in zip(got["weights"], stacks.parameters()):
        torch.testing.assert_close(weight, expected.detach(), rtol=1e-5, atol=1e-6)


def test_muon_under_fsdp_steps_as_one_process_muon_on_whole_matrices(job):
    got = torch.load(job / "muon_fsdp.pt")
    assert got["muon"] == "ShardedMuon"
    expected = muon_reference()
    assert_muon_weights(got["state"], expected)
    assert not torch.allclose(expected["blocks.blocks.0.ff.net.0.weight"],
                              muon_model().state_dict()["blocks.blocks.0.ff.net.0.weight"], atol=1e-3)  # it moved


def test_a_two_process_muon_checkpoint_resumes_in_one_process_and_back(job):
    net = muon_model()
    opt = make_optimizer(net, "muon", lr=MUON_LR)
    info = load_distributed_checkpoint(job / "muon_two.pt", model=net, optimizer=opt)
    assert (info["step"], info["world_size"], type(opt.muon)) == (1, 2, Muon)
    assert all(opt.muon.state[p]["momentum_buffer"].abs().sum() > 0 for p in opt.muon.param_groups[0]["params"])
    train_step(net, opt, 1)
    assert_muon_weights(net.state_dict(), torch.load(job / "muon_fsdp.pt")["state"])
    assert_muon_weights(torch.load(job / "muon_one_then_step.pt"), muon_reference())


def test_same_world_size_resumes_exactly_with_dropout(job):
    assert torch.load(job / "resume.pt")["same"]


# ------------------------------------------------------------------------------------------------------------
# A single process (no torchrun): the same calls work, and arguments are checked


def test_single_process_without_torchrun(monkeypatch, tmp_path):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    run = setup_distributed(device="cpu")
    assert (run.rank, run.world_size, run.backend, run.is_main, run.device) == (0, 1, None, True, torch.device("cpu"))
    net = model()
    assert wrap_model(net, strategy="fsdp") is net and wrap_model(net, strategy="ddp") is net
    assert list(shard([1, 2, 3])) == [1, 2, 3] and all_reduce_mean(2.5) == 2.5
    teardown_distributed()  # nothing to do


def test_teardown_frees_a_dropped_fsdp_model_while_its_process_group_is_alive(monkeypatch):
    """FSDP2's hooks keep a sharded model in a reference cycle: it outlives its last name until the garbage collector
    runs, which may be after the group is destroyed (then freeing it can abort the process). teardown_distributed
    frees it first. A 1-process gloo group here; the garbage collector is off, so only teardown can collect it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    setup_distributed(device="cpu", timeout=timedelta(seconds=30))
    freed_with_group_alive = []  # what dist.is_initialized() said when the model was freed
    collecting = gc.isenabled()
    gc.disable()
    try:
        net = wrap_model(model(), strategy="fsdp")
        weakref.finalize(net, lambda: freed_with_group_alive.append(dist.is_initialized()))
        del net
        teardown_distributed()
    finally:
        if collecting:
            gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert freed_with_group_alive == [True]


def test_a_checkpoint_of_save_checkpoint_resumes_with_its_optimizer_state(tmp_path):
    """save_checkpoint numbers the optimizer's parameters (an earlier version of a script wrote those): they are
    named by the optimizer's order when loading, and the run continues as the uninterrupted one."""
    from torchformer.train.checkpoint import save_checkpoint

    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    train_step(net, opt, 0)
    save_checkpoint(tmp_path / "plain.pt", model=net, optimizer=opt, step=1)
    resumed = model()
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=0.01)
    assert load_distributed_checkpoint(tmp_path / "plain.pt", model=resumed, optimizer=resumed_opt)["step"] == 1
    train_step(resumed, resumed_opt, 1)
    assert_same_weights(resumed.state_dict(), reference(2, lambda p: torch.optim.AdamW(p, lr=0.01)))


def test_a_scheduler_missing_at_load_and_a_bare_state_dict_are_handled(tmp_path):
    """The optimizer state of a run with a scheduler has 'initial_lr' in its groups: loading it into an optimizer
    without one was a bare KeyError from set_state_dict. A bare state_dict (no generator states) loads as weights."""
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    train_step(net, opt, 0)
    save_distributed_checkpoint(tmp_path / "c.pt", model=net, optimizer=opt, scheduler=sched, step=1)
    fresh = model()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match=r"holds optimizer settings \['initial_lr'\] that the optimizer given lacks"):
        load_distributed_checkpoint(tmp_path / "c.pt", model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in before.items())  # nothing loaded
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    torch.optim.lr_scheduler.StepLR(fresh_opt, 10)
    assert load_distributed_checkpoint(tmp_path / "c.pt", model=fresh, optimizer=fresh_opt)["step"] == 1

    torch.save(net.state_dict(), tmp_path / "bare.pt")
    assert load_distributed_checkpoint(tmp_path / "bare.pt", model=model())["step"] == 0  # was KeyError: 'rng'


def test_arguments_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="strategy must be 'ddp' or 'fsdp', got 'zero'"):
        wrap_model(model(), strategy="zero")
    with pytest.raises(TypeError, match="blocks must be given for a Linear"):
        wrap_model(torch.nn.Linear(2, 2), strategy="fsdp")
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu', got 'tpu'"):
        setup_distributed(device="tpu")
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK must be an integer >= 0, got 'one'"):
        setup_distributed(device="cpu")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK must be below WORLD_SIZE \(2\), got 2"):
        setup_distributed(device="cpu")


def test_fsdp_on_a_torch_without_fsdp2_is_a_clear_error(monkeypatch):
    """torch < 2.6 has no public fully_shard: wrap_model says so, naming the torch version, even for one process."""
    import builtins

    real_import = builtins.__import__

    def without_fsdp2(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "torch.distributed.fsdp" and "fully_shard" in (fromlist or ()):
            raise ImportError("cannot import name 'fully_shard'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", without_fsdp2)
    with pytest.raises(RuntimeError, match=r"needs FSDP2 .*torch >= 2.6.*this is torch .*strategy='ddp'"):
        wrap_model(model(), strategy="fsdp")
    assert wrap_model(model(), strategy="ddp") is not None  # DDP needs no FSDP2
