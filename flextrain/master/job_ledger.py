"""The task ledger of a job as its JobSpec describes it: which data, cut how (``flextrain.master.ledger``)."""

from __future__ import annotations

from flextrain.data import DataOptions, plan_shards
from flextrain.job import JobSpec, JobType, Strategy
from flextrain.job.usermodule import module_attribute
from flextrain.master.batches import job_schedule
from flextrain.master.ledger import TaskLedger


def build_ledger(spec: JobSpec, skipped: list[str] | None = None) -> TaskLedger:
    """The job's tasks: training epochs, evaluations of the validation data, or prediction tasks.

    Warnings about data files skipped under --skip-unknown-files go to ``skipped`` (else the log).
    A module that defines ``custom_data_reader`` plans its own shards (flextrain.data.custom): the master
    imports it for that name only."""
    if spec.is_script:  # a script reads its own data: no tasks
        return TaskLedger(shards=[], epochs=0, global_batch_size=spec.training.global_batch_size,
                          steps_per_task=spec.training.steps_per_task)
    opts = {"options": DataOptions.of(spec.data), "skipped": skipped, "reader": custom_reader_of(spec),
            "records_per_task": spec.training.global_batch_size * spec.training.steps_per_task}
    training = spec.job_type is JobType.TRAINING
    shards = plan_shards(spec.data.training, what="training data", **opts) if training else []
    evaluate = spec.data.validation and spec.job_type is not JobType.PREDICTION
    eval_shards = plan_shards(spec.data.validation, what="validation data", **opts) if evaluate else []
    predict = spec.job_type is JobType.PREDICTION
    pred_shards = plan_shards(spec.data.prediction, what="prediction data", **opts) if predict else []
    return TaskLedger(
        shards=shards, epochs=spec.training.epochs if training else 0, global_batch_size=spec.training.global_batch_size,
        steps_per_task=spec.training.steps_per_task, shuffle=spec.training.shuffle, seed=spec.training.seed,
        max_retries=spec.training.max_task_retries, evaluation_shards=eval_shards, prediction_shards=pred_shards,
        renew_ids=spec.strategy is not Strategy.PARAMETER_SERVER,
        # The trace read (and checked, naming its line) here too: in a pod, the operator could not read a path.
        schedule=job_schedule(spec) if training else None,
    )


def custom_reader_of(spec: JobSpec):
    """The module's ``custom_data_reader`` (None if it defines none, or the job runs a script)."""
    return None if spec.is_script else module_attribute(spec.model_def, "custom_data_reader")

