"""torchft digits replica: bench/rescale.py's torchft baseline (one replica group of one process).

Run as ``python torchft_digits.py --data D --out DIR --replica R --lighthouse http://127.0.0.1:PORT``.
The same model, optimizer, loss and learning rate as ``zoo_digits.py`` under flextrain; torchft's
``Manager`` (quorum through the Lighthouse every step, asynchronous), its ``ProcessGroupGloo``
(reconfigured at each new quorum), ``Manager.allreduce`` of the flattened gradients after backward
(one collective per step, averaged over the quorum's participants) and its ``OptimizerWrapper``
(the inner optimizer steps only when ``should_commit`` agrees). torchft 0.2.0's
``DistributedDataParallel`` is not used: under torch 2.13 its comm hook fails an assertion
(``assert fut._fut`` in ``torchft/ddp.py``) when a peer dies, which kills the survivors too. A replica takes ``--global-batch
/ --replicas`` samples per step (torchft keeps the per-replica batch; it does not re-split a
global batch when replicas come and go), and a recovering replica fetches the model and
optimizer state from a healthy one (torchft's HTTP checkpoint transport).

Probes (wall-clock ``time.time()``): ``DIR/proc-<pid>.json`` (as ``ddp_digits.py``: the process
start, ``t_ready`` once the Manager is built) and ``DIR/steps-<replica>-<pid>.txt``:
``"<time> <n> <participants>"`` after every committed step (the inner optimizer's ``step``;
``participants``: the replicas of the quorum that committed it).
"""

import os
import sys
import time

T_START = time.time()
from datetime import timedelta  # noqa: E402

from ddp_digits import digits_setup, parser, write_json  # noqa: E402  (beside this script: sys.path[0])


def main(argv=None):
    p = parser()
    p.add_argument("--replica", required=True)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--replicas", type=int, default=3, help="the global batch is split by this many")
    p.add_argument("--timeout", type=float, default=10.0, help="torchft Manager/collective timeout, seconds")
    a = p.parse_args(argv)

    pid = os.getpid()
    info = {"pid": pid, "tag": a.replica, "t_start": T_START, "restart": 0, "local_rank": 0}
    proc_file = os.path.join(a.out, f"proc-{pid}.json")
    write_json(proc_file, info)

    import torch
    from torch import nn
    from torch.distributed import TCPStore
    from torchft import Manager, Optimizer, ProcessGroupGloo

    torch.set_num_threads(1)
    info["t_imported"] = time.time()
    x, y, model, inner = digits_setup(a.data, lr=a.lr)
    log = open(os.path.join(a.out, f"steps-{a.replica}-{pid}.txt"), "a", buffering=1)
    committed = [0]
    plain_step = inner.step

    def stamped_step(*args, **kwargs):  # called by torchft only for a committed step
        out = plain_step(*args, **kwargs)
        committed[0] += 1
        log.write(f"{time.time():.6f} {committed[0]} {manager.num_participants()}\n")
        return out

    inner.step = stamped_step

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=a.timeout)
    # torchrun would host the replica group's store; a group of one hosts its own (port 0: any free one)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(store_addr="127.0.0.1", store_port=store.port, pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"digits_{a.replica}", lighthouse_addr=a.lighthouse,
                      timeout=timeout, quorum_timeout=timedelta(seconds=60), connect_timeout=timeout,
                      rank=0, world_size=1)
    params = list(model.parameters())
    opt = Optimizer(manager, inner)
    info["t_ready"] = time.time()
    write_json(proc_file, info)

    per = a.global_batch // a.replicas
    n = (x.shape[0] // per) * per
    index = abs(hash(a.replica)) % max(1, n // per)
    while True:  # the benchmark kills it when it has what it needs
        base = (index * per) % n
        xb, yb = x[base: base + per], y[base: base + per]
        opt.zero_grad(set_to_none=True)  # starts the (asynchronous) quorum
        nn.functional.cross_entropy(model(xb), yb).backward()
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        manager.allreduce(flat).wait()  # an error is recorded by the manager: should_commit says no
        offset = 0
        for q in params:
            q.grad.copy_(flat[offset: offset + q.numel()].view_as(q.grad))
            offset += q.numel()
        opt.step()  # should_commit, then the inner step if every replica agreed
        index += 1


if __name__ == "__main__":
    sys.exit(main())
