"""Bucketed gradient reduction overlapped with backward (flextrain/worker/buckets.py), with real
processes: two ranks, gloo on loopback, AllReduceTrainer.run_task as a job's worker runs it.

Timeouts here are safety nets only (a hang fails the test instead of blocking the suite): every
test asserts that things ended well before them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from flextrain.data.digits import write_digits
from flextrain.worker.buckets import plan_buckets
from flextrain.worker.pytorch import TorchBackend
from ft_helpers import MODEL_ZOO

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"
CHECKPOINTED = f"{Path(__file__).parents[1] / 'e2e' / 'zoo' / 'checkpointed_digits.py'}:Model"
SAFETY = 120  # seconds: only a hang ever reaches it

# (global batch, max micro-batch, records): one micro-step each; uneven (G=50 over 2 ranks of
# micro-batches of 6 and 7); accumulation (M=4 < 16 per rank) with an uneven short last step
CASES = [(32, 16, 96), (50, 8, 150), (32, 4, 88)]
REDO_CASES = CASES[1:]  # the uneven split and accumulation (hooks armed for the last micro-step only)


def _trainer(tmp: Path, source: str, *, bucket_mb: float, G: int, M: int, timeout: float = 30.0,
             model: str = DIGITS):
    from flextrain.job import JobSpec
    from flextrain.worker.collective import Collective
    from flextrain.worker.module import load_model_def
    from flextrain.worker.state import WorkerState
    from flextrain.worker.trainer import AllReduceTrainer
    from ft_helpers import FakeMaster

    spec = JobSpec.of(name="j", model_def=model, training_data=source, job_dir=str(tmp / "job"),
                      global_batch_size=G, bucket_mb=bucket_mb).validate()
    model_def = load_model_def(model)
    torch.manual_seed(0)  # the same initial model on every rank and in every mode
    model = model_def.build_model()
    trainer = AllReduceTrainer(spec=spec, model_def=model_def, model=model,
                               optimizer=model_def.build_optimizer(model, 0.1), client=FakeMaster([]),
                               collective=Collective(timeout=timeout), state=WorkerState())
    trainer.max_micro_batch = M
    return trainer


def _task(source: str, G: int, records: int, task_id: int = 0):
    from flextrain.proto import flextrain_pb2 as pb

    return pb.Task(task_id=task_id, source=source, start=0, end=records, global_batch_size=G)


def _params(trainer) -> list:
    """The parameters as numpy arrays (a torch tensor would cross the queue as a shared-memory
    handle that dies with the process)."""
    return [p.detach().clone().numpy() for p in trainer.model.parameters()]


_HELD: list = []  # what a scenario keeps alive after its result is out, until the test releases it


def _rank_main(rank: int, port: int, tmp: str, source: str, scenario: str, out: mp.Queue, release) -> None:
    """One rank of ``scenario``; puts ``(rank, result)`` on ``out``, then keeps what the scenario
    put in ``_HELD`` until ``release`` is set."""
    try:
        torch.set_num_threads(1)
        out.put((rank, SCENARIOS[scenario](rank, port, Path(tmp), source)))
    except BaseException:
        out.put((rank, {"error": traceback.format_exc()}))
    if _HELD:
        release.wait(SAFETY)


def _one_round(trainer, *, port: int, round_id: int, rank: int, task) -> None:
    """``task`` in a round of two of its own; the whole task is trained (no END_ROUND, no failure)."""
    trainer.collective.join_round(host="127.0.0.1", port=port, round_id=round_id, rank=rank, world_size=2)
    try:
        assert trainer.run_task(task) is None
    finally:
        trainer.collective.leave()


def _equivalence(rank, port, tmp, source):
    """Every case, flat (--bucket-mb 0) then bucketed (tiny buckets: one per parameter,
    several of them launched from hooks), each in a round of its own."""
    result = {}
    round_id = 0
    for G, M, records in CASES:
        for mode, mb in (("flat", 0), ("bucketed", 0.001)):
            trainer = _trainer(tmp, source, bucket_mb=mb, G=G, M=M)
            assert trainer.overlap == (mode == "bucketed")
            if mode == "bucketed":
                assert len(trainer.backend.reducer.buckets) == 4  # b2, W2, b1, W1 (the tail)
            round_id += 1
            _one_round(trainer, port=port, round_id=round_id, rank=rank, task=_task(source, G, records))
            result[(G, M, mode)] = (_params(trainer), trainer.state.version)
    return result


def _redo(rank, port, tmp, source):
    """A layer used inside and outside re-entrant checkpointing: its second gradient comes after its
    bucket left. Flat, then bucketed (one bucket a parameter), each case in a round of its own; the
    bucketed trainer records each step's spoiled flag as backward leaves it."""
    result = {}
    round_id = 40
    for G, M, records in REDO_CASES:
        for mode, mb in (("flat", 0), ("bucketed", 0.001)):
            trainer = _trainer(tmp, source, bucket_mb=mb, G=G, M=M, model=CHECKPOINTED)
            spoiled = []
            if mode == "bucketed":
                launch = trainer.backend.launch_buckets

                def launch_buckets(start, launch=launch, backend=trainer.backend):
                    launch(start)
                    spoiled.append(backend.spoiled)
                trainer.backend.launch_buckets = launch_buckets
            round_id += 1
            _one_round(trainer, port=port, round_id=round_id, rank=rank, task=_task(source, G, records))
            result[(G, M, mode)] = (_params(trainer), trainer.state.version, trainer.overlap, spoiled)
    return result


def _raise_in_backward(trainer, *, at_call: int, action):
    """``action()`` from a hook on the first parameter (the last gradient backward produces:
    the buckets of later parameters have left by then) in backward number ``at_call``."""
    calls = [0]
    first = next(trainer.model.parameters())

    def hook(p):
        calls[0] += 1
        if calls[0] == at_call:
            action()

    first.register_post_accumulate_grad_hook(hook)  # after the reducer's own (registered when built)


def _failing_compute(rank, port, tmp, source):
    """Rank 1's compute fails in the middle of step 3's backward, its buckets partly launched:
    both ranks skip that step and the rest of the task, nothing hangs, both end alike."""
    result = {}
    for round_id, (mode, mb) in enumerate((("flat", 0), ("bucketed", 0.001)), start=10):
        trainer = _trainer(tmp, source, bucket_mb=mb, G=32, M=16)
        if rank == 1:
            def fail():
                raise ValueError("bad record")
            _raise_in_backward(trainer, at_call=3, action=fail)
        trainer.collective.join_round(host="127.0.0.1", port=port, round_id=round_id, rank=rank, world_size=2)
        started = time.monotonic()
        try:
            assert trainer.run_task(_task(source, 32, 160)) is None
        finally:
            trainer.collective.leave()
        result[mode] = (_params(trainer), trainer.state.version, trainer.client.reports,
                        time.monotonic() - started)
    return result


def _killed_peer(rank, port, tmp, source):
    """Rank 1 dies (os._exit) in step 2's backward after some buckets left: rank 0 gets a
    CollectiveError, not a hang, and nothing of step 2 is applied."""
    from flextrain.worker.collective import CollectiveError

    trainer = _trainer(tmp, source, bucket_mb=0.001, G=32, M=16)
    if rank == 1:
        _raise_in_backward(trainer, at_call=2, action=lambda: os._exit(17))
    trainer.collective.join_round(host="127.0.0.1", port=port, round_id=20, rank=rank, world_size=2)
    started = time.monotonic()
    try:
        trainer.run_task(_task(source, 32, 160))
    except CollectiveError as exc:
        return {"error_type": "CollectiveError", "message": str(exc), "seconds": time.monotonic() - started,
                "version": trainer.state.version, "initialized": dist.is_initialized()}
    return {"error_type": None, "version": trainer.state.version}


def _killed_peer_of_three(rank, port, tmp, source):
    """Rank 2 dies in step 2's backward with buckets in flight. Each survivor, after its
    CollectiveError, keeps its trainer (and whatever it holds) alive and does nothing more, as a
    survivor waiting for the next round does: the other survivor must still fail because the peer
    died, not wait out the collective timeout on our open connections."""
    from flextrain.worker.collective import CollectiveError

    trainer = _trainer(tmp, source, bucket_mb=0.001, G=32, M=16, timeout=3600)
    if rank == 2:
        _raise_in_backward(trainer, at_call=2, action=lambda: os._exit(17))
    trainer.collective.join_round(host="127.0.0.1", port=port, round_id=30, rank=rank, world_size=3)
    try:
        trainer.run_task(_task(source, 32, 160))
    except CollectiveError as exc:
        _HELD.append(trainer)
        return {"error_type": "CollectiveError", "message": str(exc), "version": trainer.state.version}
    return {"error_type": None, "version": trainer.state.version}


SCENARIOS = {"equivalence": _equivalence, "redo": _redo, "failing_compute": _failing_compute, "killed_peer": _killed_peer,
             "killed_peer_of_three": _killed_peer_of_three}


def _run(tmp_path: Path, scenario: str, *, world: int = 2, killed: int | None = None) -> dict[int, object]:
    """Run ``scenario`` on ``world`` ranks; ``killed``: the rank that dies (exit code 17)."""
    write_digits(tmp_path / "digits")
    source = str(sorted((tmp_path / "digits" / "train").iterdir())[0])
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_rank_main, args=(r, store.port, str(tmp_path), source, scenario, out, release))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + SAFETY
    try:
        while len(results) < world - (killed is not None):
            rank, value = out.get(timeout=max(1.0, deadline - time.monotonic()))
            assert "error" not in value if isinstance(value, dict) else True, value.get("error")
            results[rank] = value
    finally:
        release.set()
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
    if killed is not None:
        assert procs[killed].exitcode == 17
    return results


def test_bucketed_reduction_trains_exactly_as_the_flat_one(tmp_path):
    """Even split, uneven split, accumulation: the same parameters, bit for bit, on both ranks
    and in both modes (a sum of two floats does not depend on how the buffer is cut)."""
    results = _run(tmp_path, "equivalence")
    for G, M, records in CASES:
        steps = -(-records // G)
        flat, flat_version = results[0][(G, M, "flat")]
        for rank in (0, 1):
            for mode in ("flat", "bucketed"):
                params, version = results[rank][(G, M, mode)]
                assert version == steps
                for a, b in zip(params, flat):
                    assert np.array_equal(a, b), (G, M, rank, mode)
        assert flat_version == steps


def test_a_bucket_spoiled_by_reentrant_checkpointing_is_reduced_again_flat_on_every_rank(tmp_path):
    """The first step's bucket of the twice-used layer leaves before its second gradient: every rank
    sums the step again in one piece and goes on flat; the parameters equal the flat run's, on
    both ranks, split unevenly and with accumulation."""
    results = _run(tmp_path, "redo")
    for G, M, records in REDO_CASES:
        steps = -(-records // G)
        flat = results[0][(G, M, "flat")][0]
        for rank in (0, 1):
            params, version, overlap, spoiled = results[rank][(G, M, "bucketed")]
            assert version == steps
            assert spoiled[0] is True and overlap is False  # step 1 redone, the rest flat
            assert len(spoiled) == 1, spoiled  # no bucket launched after the switch
            for a, b in zip(params, flat):
                torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=0, atol=0)
            assert results[rank][(G, M, "flat")][1:] == (steps, False, [])


def test_a_failing_compute_with_buckets_in_flight_skips_the_step_on_every_rank(tmp_path):
    results = _run(tmp_path, "failing_compute")
    for mode in ("flat", "bucketed"):
        p0, v0, reports0, s0 = results[0][mode]
        p1, v1, reports1, s1 = results[1][mode]
        assert v0 == v1 == 2  # steps 1 and 2 applied, step 3 failed: the task's rest skipped
        assert reports0 == [] and [(t, kw["ok"], kw["steps_done"]) for t, kw in reports1] == [(0, False, 2)]
        for a, b, c in zip(p0, p1, results[0]["flat"][0]):
            assert np.array_equal(a, b) and np.array_equal(a, c)
        assert max(s0, s1) < 20  # far from the 30 s collective timeout: nobody waited on a mismatch


def test_a_peer_killed_with_buckets_in_flight_is_a_collective_error(tmp_path):
    result = _run(tmp_path, "killed_peer", killed=1)[0]
    assert result["error_type"] == "CollectiveError", result
    assert result["version"] == 1  # step 1 applied; step 2 not
    assert not result["initialized"]  # the group is torn down: the round re-forms
    assert result["seconds"] < 20  # the peer's death broke the collectives, not the 30 s timeout


def test_survivors_of_a_peer_killed_with_buckets_in_flight_both_fail_without_waiting_on_each_other(tmp_path):
    """The collective timeout is an hour and each survivor keeps its trainer after its error: both
    errors come from the dead peer's broken connections (the test's safety net is 120 s)."""
    results = _run(tmp_path, "killed_peer_of_three", world=3, killed=2)
    for rank in (0, 1):
        assert results[rank]["error_type"] == "CollectiveError", results[rank]
        assert results[rank]["version"] == 1  # step 1 applied; step 2 not
        assert "timed out" not in results[rank]["message"].lower(), results[rank]


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4).double()
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 2).double()

    def forward(self, x):
        return self.c(self.b(self.a(x.double()).float()).double())


def test_buckets_are_slices_in_reverse_order_and_the_slots_ride_with_the_tail():
    model = Mixed()
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(lambda y, p: nn.functional.mse_loss(p, y))})()
    backend = TorchBackend(model_def=model_def, model=model, extra=3,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert backend.overlap(cap=1)  # one parameter a bucket
    buckets, tail = backend.reducer.buckets, backend.reducer.tail
    params = backend.params
    assert [b.params for b in buckets] == [[5], [4], [3], [2], [1], [0]]  # reverse order: c, b, a
    assert tail == 3  # b.weight: the first float32 parameter, whose slice ends where the slots begin
    assert buckets[tail].tensor.numel() == params[2].numel() + 3
    assert buckets[tail].tensor.data_ptr() + buckets[tail].tensor.numel() * 4 == \
        backend.slots.data_ptr() + 3 * 4
    for b in buckets:
        assert b.tensor.dtype == params[b.params[0]].dtype and b.tensor.is_contiguous()
    # the default: one bucket per dtype here, the float32 one the tail
    big, tail = plan_buckets(params, backend.reducer.views, backend.buffers, 3, cap=25 << 20)
    assert [b.params for b in big] == [[5, 4], [3, 2], [1, 0]] and tail == 1


def test_hooks_launch_buckets_in_order_during_the_last_backward_only():
    """In process, with a recording launcher: earlier micro-steps launch nothing; the last one
    launches every bucket but the tail during backward, in bucket order; the rest after it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(lambda y, p: nn.functional.mse_loss(p, y))})()
    backend = TorchBackend(model_def=model_def, model=model, extra=3,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    backend.overlap(cap=1)
    launched = []
    x, y = torch.randn(8, 8), torch.randn(8, 2)
    backend.zero()
    backend.accumulate(x, y, slice(0, 4), scale=0.5)
    assert launched == []
    backend.arm(launched.append)
    backend.accumulate(x, y, slice(4, 8), scale=0.5)
    tail = backend.reducer.tail
    assert tail == len(backend.reducer.buckets) - 1
    assert [id(t) for t in launched] == [id(b.tensor) for b in backend.reducer.buckets[:tail]]
    backend.launch_buckets(launched.append)
    backend.launch_tail(launched.append)
    assert [id(t) for t in launched] == [id(b.tensor) for b in backend.reducer.buckets]
    expected = torch.autograd.grad(nn.functional.mse_loss(model(x), y), list(model.parameters()))
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want)  # the buffers hold the step's whole gradient


def test_a_model_of_one_bucket_is_reduced_flat_without_hooks():
    """Nothing of a one-bucket model could leave before backward ends (the tail waits for the
    flags): the backend declines to overlap and puts no hook on its parameters; a smaller cap
    that makes two buckets overlaps."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    model_def = type("Def", (), {"path": "test", "loss": staticmethod(lambda y, p: nn.functional.mse_loss(p, y))})()
    backend = TorchBackend(model_def=model_def, model=model, extra=3,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert backend.overlap(cap=25 << 20) is False and backend.reducer is None
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    assert backend.overlap(cap=1) and len(backend.reducer.buckets) == 4
    assert all(len(p._post_accumulate_grad_hooks) == 1 for p in model.parameters())
