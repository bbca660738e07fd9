"""A worker refuses a round that starts "in sync" when it is not: training on would leave the
members with different models (the skip itself, across real processes: tests/e2e/test_recovery_sync.py)."""

from __future__ import annotations

import pytest

from flextrain.job import JobSpec
from flextrain.worker.collective import Collective, CollectiveError
from flextrain.worker.module import load_model_def
from flextrain.worker.trainer import AllReduceTrainer, WorkerState
from ft_helpers import MODEL_ZOO

DIGITS = f"{MODEL_ZOO / 'digits_torch.py'}:Model"


def trainer_at(version: int) -> AllReduceTrainer:
    spec = JobSpec.of(name="j", model_def=DIGITS, training_data="d", job_dir="/tmp/unused", global_batch_size=8,
                      workers=2).validate()
    model_def = load_model_def(DIGITS)
    model = model_def.build_model()
    trainer = AllReduceTrainer(spec=spec, model_def=model_def, model=model, client=None, collective=Collective(),
                               optimizer=model_def.build_optimizer(model, 0.1), state=WorkerState(round_id=3))
    trainer.state.version = version
    return trainer


def test_in_sync_at_this_workers_version_skips_the_broadcast():
    trainer = trainer_at(5)
    trainer.collective.world_size = 2  # a round of two whose group was never formed: a broadcast fails
    before = trainer.state_blob()
    trainer.sync_state(in_sync_at=5, synced=True)
    assert trainer.state_blob() == before and trainer.state.version == 5
    with pytest.raises(CollectiveError):  # not in sync: it does broadcast
        trainer.sync_state()


@pytest.mark.parametrize("version, synced, named", [(4, True, "at version 4"), (5, False, "not synced")])
def test_a_round_in_sync_that_this_worker_is_not_in_is_refused(version, synced, named):
    with pytest.raises(RuntimeError, match=f"round 3 starts in sync at version 5, but this worker is .*{named}"):
        trainer_at(version).sync_state(in_sync_at=5, synced=synced)
