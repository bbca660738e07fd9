"""Plain DDP digits trainer with checkpoint-resume: bench/rescale.py's torchrun baseline.

Run under ``python -m torch.distributed.run ... ddp_digits.py --data D --out DIR
--ckpt PATH --tag NODE``. Same model, optimizer, loss, learning rate and global
batch as ``bench/rescale/zoo_digits.py`` under flextrain, on the same digits
training set (pre-decoded to tensors by the benchmark, ``--data``): a
64 -> 64 -> 10 MLP, SGD with momentum, global batch ``--global-batch`` split
over the ranks, gloo all-reduce through ``DistributedDataParallel``.

It is what a torchrun user writes for elasticity: on every (re)start it
resumes model, optimizer and step from the latest checkpoint (rank 0 writes one
every ``--ckpt-every`` steps, atomically) and trains until it is killed.

Probes (all wall-clock ``time.time()``):
* ``DIR/proc-<pid>.json``: written first thing (pid, parent = the agent,
  node tag, restart count, process start) and rewritten once training can
  start (after ``import torch``, ``init_process_group``, data and checkpoint
  loading, DDP construction);
* ``DIR/steps-<tag>-<pid>.txt``: ``"<time> <step>"`` after every optimizer step.
"""

import os
import time

T_START = time.time()
import argparse  # noqa: E402
import json  # noqa: E402


def write_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def parser() -> argparse.ArgumentParser:
    """The flags every baseline script of bench/rescale takes (torchft_digits.py adds its own)."""
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    return p


def digits_setup(data_path, *, lr):
    """``(x, y, model, optimizer)``: the digits tensors and the MLP + SGD every side of bench/rescale trains."""
    import torch
    from torch import nn

    data = torch.load(data_path)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return data["x"], data["y"], model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def main(argv=None):
    p = parser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--tag", default="node")
    p.add_argument("--ckpt-every", type=int, default=10)
    a = p.parse_args(argv)

    pid = os.getpid()
    info = {
        "pid": pid, "ppid": os.getppid(), "tag": a.tag,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")), "t_start": T_START,
    }
    proc_file = os.path.join(a.out, f"proc-{pid}.json")
    write_json(proc_file, info)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    info["t_imported"] = time.time()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    info["t_group"] = time.time()

    x, y, model, opt = digits_setup(a.data, lr=a.lr)
    step = 0
    if os.path.exists(a.ckpt):
        state = torch.load(a.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    info["resumed_step"] = step
    ddp = DDP(model)
    info["t_ready"] = time.time()
    write_json(proc_file, info)

    G = a.global_batch
    n = (x.shape[0] // G) * G
    per, extra = divmod(G, world)
    lo_r = rank * per + min(rank, extra)
    hi_r = lo_r + per + (1 if rank < extra else 0)
    log = open(os.path.join(a.out, f"steps-{a.tag}-{pid}.txt"), "a", buffering=1)
    while True:  # the benchmark kills the job when it has what it needs
        base = (step * G) % n
        xb, yb = x[base + lo_r: base + hi_r], y[base + lo_r: base + hi_r]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        step += 1
        log.write(f"{time.time():.6f} {step}\n")
        if rank == 0 and step % a.ckpt_every == 0:
            tmp = f"{a.ckpt}.tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, a.ckpt)


if __name__ == "__main__":
    main()
