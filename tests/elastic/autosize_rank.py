"""One rank of test_autosize's two-rank case: rank r probes under limit argv[2+r]; both report M."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import flextrain.elastic.torch as elastic
from flextrain.elastic.autosize import probe_for_init
from test_autosize import model, sample


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    limit = int(sys.argv[2 + rank])
    net = model()
    opt = torch.optim.Adam(net.parameters())
    kw = dict(model=net, loss_fn=torch.nn.functional.cross_entropy, sample=sample(), optimizer=opt, memory_limit=limit)
    s = elastic.init(1024, "auto", **kw)
    dist.barrier()
    dist.destroy_process_group()
    alone = probe_for_init(1024, **kw)  # without a process group: this rank's own answer
    with open(sys.argv[1], "w") as f:
        json.dump({"rank": rank, "max_micro_batch": s.max_micro_batch, "probed_alone": alone}, f)


if __name__ == "__main__":
    main()
    os._exit(0)  # no interpreter teardown: gloo's threads sometimes abort it ('terminate called ...')
