"""JobSpec: the one typed description of a job.

It is built from ``flextrain train`` flags or (on Kubernetes) from an
ElasticJob spec, travels to workers as JSON over gRPC, and is what the master,
the workers and the status file agree on. Its sections mirror the ElasticJob:
``spec.data`` is :class:`DataSpec`, ``spec.training`` :class:`TrainingSpec`,
``spec.replicaSpecs.worker`` :class:`WorkerSpec` and ``spec.replicaSpecs.ps``
:class:`PSSpec`; a leaf's name is the CRD field's in snake_case
(``training.globalBatchSize`` -> ``spec.training.global_batch_size``).

:data:`SETTINGS` is the one table of every setting: its key (the ``flextrain
train`` option's dest and the keyword of :meth:`JobSpec.of` and
:meth:`JobSpec.replace`), its JobSpec path, its flag and its ElasticJob path.
CLI, operator, resume and tests read it instead of keeping their own lists.
"""

from flextrain.job.settings import (
    AUTO,
    KUBERNETES_DEFAULTS,
    NAN_POLICIES,
    SETTING,
    SETTINGS,
    VALUE_RULES,
    Backend,
    JobSpecError,
    IntOrStr,
    JobType,
    Setting,
    Strategy,
    check_count,
    check_job_name,
    check_non_negative,
    check_port,
    check_positive_finite,
    flag_of,
)
from flextrain.job.spec import SECTIONS, DataSpec, JobSpec, PSSpec, SchedulingSpec, TrainingSpec, WorkerSpec

__all__ = ["AUTO", "IntOrStr", "KUBERNETES_DEFAULTS", "NAN_POLICIES", "SECTIONS", "SETTING", "SETTINGS", "VALUE_RULES", "Backend", "DataSpec", "JobSpec", "SchedulingSpec",
           "JobSpecError", "JobType", "PSSpec", "Setting", "Strategy", "TrainingSpec", "WorkerSpec", "check_count",
           "check_job_name", "check_non_negative", "check_port", "check_positive_finite", "flag_of"]
