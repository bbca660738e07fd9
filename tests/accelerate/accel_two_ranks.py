"""One rank of the 2-process accelerate tests (test_two_processes.py): each scenario's findings to JSON.

auto_accelerate initialises the gloo group itself from WORLD_SIZE/RANK (as launched by torchrun).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from accel_models import Block, BlockNet, TupleModel, loop_net, mse, regression, register_loop_pair, train
from flextrain.accelerate import Inputs, auto_accelerate, compare


def same_on_every_rank(model) -> bool:
    flat = torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1).float()
                      for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def run(strategy, *, batch=32, optim=torch.optim.SGD, lr=0.05, epochs=2, **kw):
    torch.manual_seed(0)  # the same initial model everywhere (DDP/FSDP broadcast rank 0's anyway)
    status, result, best = auto_accelerate(TupleModel(BlockNet()), optim, regression(128), mse, optim_args={"lr": lr},
                                           dataloader_args={"batch_size": batch}, load_strategy=strategy, **kw)
    assert status
    losses = train(result, epochs=epochs)
    return result, best, losses


def ddp():
    result, best, losses = run(["parallel_mode", ("amp_native", "bf16")], ignore_dryrun_on_load_strategy=False)
    return {"wrapper": type(result.model).__name__, "loader_batch": result.dataloader.batch_size,
            "sampler": type(result.dataloader.sampler).__name__, "rank_of_sampler": result.dataloader.sampler.rank,
            "parallel_mode": best.config("parallel_mode")[0][0][1], "dry_run_ok": result.args.dry_run.ok,
            "first": losses[0], "last": losses[-1], "same": same_on_every_rank(result.model)}


def zero1():
    result, best, losses = run(["zero1"], optim=torch.optim.Adam, lr=0.01)
    opt = result.optim
    local = sum(p.numel() for p in opt.optim.state)  # the parameters whose Adam state this rank holds
    total = sum(p.numel() for p in result.model.parameters())
    return {"optimizer": type(opt).__name__, "wrapper": type(result.model).__name__, "local_state_numel": local,
            "total_numel": total, "first": losses[0], "last": losses[-1], "same": same_on_every_rank(result.model)}


def sharded(name, config=None):
    result, best, losses = run([(name, config)] if config else [name], optim=torch.optim.Adam, lr=0.01)
    params = list(result.model.parameters())
    return {"dtensors": all(isinstance(p, DTensor) for p in params),
            "local_numel": sum(p.to_local().numel() for p in params), "total_numel": sum(p.numel() for p in params),
            "notes": list(result.args.notes), "first": losses[0], "last": losses[-1],
            "same": same_on_every_rank(result.model)}


def uneven():
    """G=15 over 2 processes (8 + 7): one SGD step must equal a step on the mean over all 15 samples."""
    torch.manual_seed(0)
    reference = TupleModel(BlockNet())
    torch.manual_seed(0)
    status, result, _ = auto_accelerate(TupleModel(BlockNet()), torch.optim.SGD, regression(60), mse,
                                        optim_args={"lr": 0.1}, dataloader_args={"batch_size": 15},
                                        load_strategy=["parallel_mode"])
    batch = next(iter(result.dataloader))
    data = result.prepare_input(batch, "cpu")
    result.loss_func(data, result.model(data)).backward()
    result.optim.step()
    x, y = regression(60)[0:15]
    mse((x, y), reference((x, y))).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    exact = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(reference.parameters(), result.model.module.parameters()))
    return {"local_batch": len(batch[0]), "steps": len(result.dataloader), "exact": exact,
            "notes": list(result.args.notes)}


def compared():
    torch.manual_seed(0)
    inputs = Inputs.checked(TupleModel(BlockNet()), optim_func=torch.optim.SGD, optim_args={"lr": 0.05},
                            dataset=regression(128), loss_func=mse, dataloader_args={"batch_size": 32})
    c = compare([("fsdp2", {"atorch_wrap_cls": (Block,)})], inputs)
    return {"baseline": list(c.baseline.strategy.names), "accepted": c.accepted, "reason": c.candidate.reason,
            "sps": c.candidate.samples_per_second, "peak": c.candidate.peak_bytes}


def auto():
    """The fully automatic mode: one search over both processes, the same strategy applied on each."""
    register_loop_pair()
    torch.manual_seed(0)
    status, result, best = auto_accelerate(TupleModel(loop_net()), torch.optim.SGD, regression(512), mse,
                                           optim_args={"lr": 0.05}, dataloader_args={"batch_size": 128},
                                           excluded=["native_dynamo"], time_limit=120)
    search = result.args.search
    losses = train(result, epochs=2)
    return {"status": status, "strategy": best.to_json(), "names": list(best.names),
            "wrapper": type(result.model).__name__, "loader_batch": result.dataloader.batch_size,
            "rows": [[r["label"], r["status"], r["samples_per_second"], r["runs"]] for r in search.rows()],
            "speedup": search.speedup(search.chosen), "first": sum(losses[:4]), "last": sum(losses[-4:]),
            "same": same_on_every_rank(result.model)}


if __name__ == "__main__":
    out = {"ddp": ddp(), "zero1": zero1(), "fsdp2": sharded("fsdp2", {"atorch_wrap_cls": (Block,)}),
           "zero2": sharded("zero2", {"atorch_wrap_cls": (Block,), "limit_all_gathers": True}),
           "uneven": uneven(), "compare": compared(), "auto": auto(), "rank": dist.get_rank()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done.
    os._exit(0)
