"""PSTrainer against real in-process parameter servers and a fake master."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from flextrain.data.ctr import CTR_FIELDS, write_ctr
from flextrain.job import JobSpec, Strategy
from flextrain.proto import flextrain_pb2 as pb
from flextrain.worker.module import load_model_def
from flextrain.worker.ps_trainer import PSEmbedding, PSTrainer, replace_embeddings
from flextrain.worker.trainer import WorkerState
from ft_helpers import MODEL_ZOO, FakeMaster

DEEPFM = f"{MODEL_ZOO / 'deepfm_torch.py'}:Model"


@pytest.fixture
def start_cluster():
    """``start_cluster(num_ps) -> (handles, None)``: in-process PS on loopback, stopped afterwards."""
    from flextrain.ps.main import start_ps

    handles = []

    def start(num_ps: int):
        hs = [start_ps(shard_index=i, num_ps=num_ps, host="127.0.0.1") for i in range(num_ps)]
        handles.extend(hs)
        return hs, None

    yield start
    for h in handles:
        h.stop(grace=0.2, checkpoint=False)


def test_embeddings_are_replaced_and_tables_match_their_dims():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    nn.init.zeros_(model[0].weight)
    tables = replace_embeddings(model, client=None, tape=[])
    assert isinstance(model[0], PSEmbedding)
    assert tables == {"0": (4, "zeros", {}, "float32")}  # the table keeps the embedding's dtype
    assert [n for n, _ in model.named_parameters()] == ["1.weight", "1.bias"]


def test_ps_trainer_trains_on_two_ps_and_reports_after_pushes(start_cluster, tmp_path):
    write_ctr(tmp_path / "data", rows=1200, seed=3)
    source = str(tmp_path / "data" / "train" / "ctr-00000.rio")
    spec = JobSpec.of(name="j", model_def=DEEPFM, training_data=str(tmp_path / "data" / "train"), job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=2, global_batch_size=100, max_micro_batch=40,
                   learning_rate=0.05).validate()
    handles, _ = start_cluster(2)
    model_def = load_model_def(DEEPFM)
    torch.manual_seed(0)
    model = model_def.build_model()
    tasks = [pb.Task(task_id=i, kind=pb.Task.TRAINING, source=source, start=i * 480, end=(i + 1) * 480,
                     global_batch_size=100) for i in range(2)]
    master = FakeMaster(tasks)
    state = WorkerState()
    trainer = PSTrainer(spec=spec, model_def=model_def, model=model,
                        optimizer=model_def.build_optimizer(model, spec.training.learning_rate), client=master,
                        state=state, ps_addresses=[h.address for h in handles])
    try:
        assert trainer.train() is True
        assert [r[0] for r in master.reports] == [0, 1] and all(r[1]["ok"] for r in master.reports)
        assert state.version >= 5  # 5 minibatches per task, one PS update each
        tables = {t.name: t.dim for t in trainer.ps.describe()[0].tables}
        assert tables == {**{f"embeddings.{f}": 8 for f in range(CTR_FIELDS)},
                          **{f"linear.{f}": 1 for f in range(CTR_FIELDS)}}
        # the model's dense parameters are the PS's after the final pull
        _, fresh = trainer.ps.pull_dense(None)
        for name, p in trainer.dense.items():
            assert torch.equal(p.detach(), fresh[name]), name
    finally:
        trainer.close()


def test_bad_records_report_the_pushed_minibatches(start_cluster, tmp_path):
    write_ctr(tmp_path / "data", rows=300, seed=3)
    source = str(tmp_path / "data" / "train" / "ctr-00000.rio")
    spec = JobSpec.of(name="j", model_def=DEEPFM, training_data=source, job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=1, global_batch_size=100).validate()
    handles, _ = start_cluster(1)
    model_def = load_model_def(DEEPFM)
    model = model_def.build_model()
    # records past the end of the file: the second minibatch cannot be read
    master = FakeMaster([pb.Task(task_id=7, source=source, start=140, end=400, global_batch_size=100)])
    trainer = PSTrainer(spec=spec, model_def=model_def, model=model,
                        optimizer=model_def.build_optimizer(model, None), client=master,
                        state=WorkerState(), ps_addresses=[h.address for h in handles])
    try:
        trainer.train()
    finally:
        trainer.close()
    (task_id, kw), = master.reports
    assert task_id == 7 and kw["ok"] is False and kw["steps_done"] == 1


@pytest.mark.parametrize("policy", ["fail", "skip-step"])
def test_a_non_finite_minibatch_is_never_pushed(start_cluster, tmp_path, policy):
    """--nan-policy with parameter servers: a NaN loss stops the worker (fail) or drops that minibatch
    (skip-step); either way nothing of it reaches the PS, whose version counts only what was pushed."""
    from flextrain.worker.failure import NonFiniteError

    write_ctr(tmp_path / "data", rows=1200, seed=3)
    source = str(tmp_path / "data" / "train" / "ctr-00000.rio")
    spec = JobSpec.of(name="j", model_def=DEEPFM, training_data=str(tmp_path / "data" / "train"), job_dir=str(tmp_path),
                   strategy=Strategy.PARAMETER_SERVER, ps=1, global_batch_size=100, learning_rate=0.05,
                   nan_policy=policy).validate()
    handles, _ = start_cluster(1)
    model_def = load_model_def(DEEPFM)
    torch.manual_seed(0)
    model = model_def.build_model()
    feed = model_def.feed

    def poisoned(records, mode, metadata):  # the minibatch of records [200, 300) reaches the model as NaN
        features, labels = feed(records, mode, metadata)
        if metadata.start == 200:
            features = {k: v.float() * float("nan") if v.is_floating_point() else v for k, v in features.items()}
        return features, labels

    model_def = dataclasses.replace(model_def, feed=poisoned)
    master = FakeMaster([pb.Task(task_id=0, kind=pb.Task.TRAINING, source=source, start=0, end=500,
                                 global_batch_size=100)])
    state = WorkerState()
    trainer = PSTrainer(spec=spec, model_def=model_def, model=model,
                        optimizer=model_def.build_optimizer(model, spec.training.learning_rate), client=master,
                        state=state, ps_addresses=[h.address for h in handles])
    try:
        if policy == "fail":
            with pytest.raises(NonFiniteError, match=r"records \[200, 300\)"):
                trainer.train()
            assert trainer.ps.describe()[0].version == 2  # the two minibatches before it
        else:
            assert trainer.train() is True
            assert state.skipped_steps == 1 and trainer.ps.describe()[0].version == 4
            assert all(torch.isfinite(p).all() for p in model.parameters())
    finally:
        trainer.close()
