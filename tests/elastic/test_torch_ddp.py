"""The GA wrapper under DDP in 2 real processes (gloo on 127.0.0.1): equal to full-batch training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ft_helpers import run_two_ranks
from ga_model import full_batch_reference



def run_ddp_ranks(tmp_path: Path, G: int, M: int, real_steps: int, weigh: str = "grads") -> list[dict]:
    return run_two_ranks(tmp_path, "elastic/ddp_ga_worker.py", str(G), str(M), str(real_steps), weigh)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def assert_matches(ranks: list[dict], reference: list[torch.Tensor]) -> None:
    for result in ranks:
        for p, r in zip(result["params"], reference, strict=True):
            torch.testing.assert_close(torch.tensor(p, dtype=torch.float64), r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("G, batch_sizes, weigh", [(256, [[64, 64], [64, 64]], "grads"),
                                                    (250, [[63, 63], [62, 62]], "grads"),
                                                    (250, [[63, 63], [62, 62]], "loss")])
def test_two_ddp_processes_equal_full_batch_sgd(tmp_path, G, batch_sizes, weigh):
    """Even (256 = 2 x 2 x 64) and uneven (250: rank 0 gets 63+63, rank 1 62+62, so the ranks'
    weights differ and the last micro-step is weighted before DDP's all-reduce); and uneven with
    the losses weighted by ``optimizer.scale`` instead (the hooks then leave the gradients alone)."""
    ranks = run_ddp_ranks(tmp_path, G, 64, real_steps=2, weigh=weigh)
    assert [r["batch_sizes"] for r in ranks] == batch_sizes
    for r, result in enumerate(ranks):
        # init read the process group (the launcher's variables were gone by then).
        assert (result["source"], result["rank"], result["world_size"], result["steps"]) == ("process-group", r, 2, 2)
        assert result["real_steps"] == 2
        # no_sync: no all-reduce on the first micro-step of a step, at least one on the last.
        assert [boundary for boundary, _ in result["reduces"]] == [False, True, False, True]
        assert [n for boundary, n in result["reduces"] if not boundary] == [0, 0]
        assert all(n > 0 for boundary, n in result["reduces"] if boundary)
    assert_matches(ranks, full_batch_reference(G, 2, sgd))
