"""A job's lifetime, with Kubernetes' Job names and meanings: ``activeDeadlineSeconds`` and
``ttlSecondsAfterFinished`` (``backoffLimit`` bounds master relaunches in the reconciler).

Both are level-triggered: the operator's sweep calls them for every job, so
they act within one sweep interval of the moment and again after an operator
restart, and doing one twice changes nothing.

* ``spec.activeDeadlineSeconds``: a job that has not finished this long after
  its ``status.startTime`` (when its first master pod was created; a job
  waiting for admission has none, so waiting does not count) is failed with
  reason ``DeadlineExceeded`` (its ``Failed`` condition's reason, a Warning
  Event, the message) and all its pods are deleted, the master first and at
  once, so it cannot write a phase of its own after the operator's.
* ``spec.ttlSecondsAfterFinished``: this long after ``status.completionTime``
  of a Succeeded or Failed job, its pods, Services, TLS Secret and PodGroup are deleted;
  the ElasticJob and its status stay (``kubectl get ej`` still shows how it
  ended). Unlike a Kubernetes Job, the ElasticJob itself is not deleted.
"""

from __future__ import annotations

import datetime
import logging

from flextrain.k8s import gang, meta
from flextrain.k8s.job_status import ended_status
from flextrain.operator.credentials import delete_secret
from flextrain.operator.jobview import TERMINAL, ident, phase_of
from flextrain.operator.kube import Kube

log = logging.getLogger(__name__)

DEADLINE_EXCEEDED = "DeadlineExceeded"


def _since(stamp: str | None) -> float | None:
    """Seconds since an RFC 3339 time of the status (None when there is none)."""
    if not stamp:
        return None
    then = datetime.datetime.fromisoformat(stamp)
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def past_deadline(job: dict) -> int | None:
    """``spec.activeDeadlineSeconds`` when a live job has run past it, else None."""
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if deadline is None or phase_of(job) in TERMINAL:
        return None
    ran = _since((job.get("status") or {}).get("startTime"))
    return int(deadline) if ran is not None and ran >= deadline else None


def enforce_deadline(kube: Kube, job: dict) -> bool:
    """Fail a job past its ``activeDeadlineSeconds`` and delete its pods; True if it was."""
    deadline = past_deadline(job)
    if deadline is None:
        return False
    message = (f"{DEADLINE_EXCEEDED}: the job was still running {deadline}s after it started "
               f"({job['status']['startTime']}; spec.activeDeadlineSeconds); its pods were deleted")
    fail_job(kube, job, reason=DEADLINE_EXCEEDED, message=message, masters=True,
             failure={"kind": DEADLINE_EXCEEDED, "message": message})
    kube.event(job, reason=DEADLINE_EXCEEDED, message=message, warning=True, key="deadline")
    return True


def fail_job(kube: Kube, job: dict, *, reason: str, message: str, failure: dict | None = None,
             masters: bool = False) -> None:
    """End ``job`` Failed as every failure does (:func:`~flextrain.k8s.job_status.ended_status`: the
    ``Failed`` condition with ``reason``, ``Running`` False, no active workers) and delete its worker and
    PS pods: with the master gone nobody would, and they would train on (or wait for a master that
    never answers) until they gave up. With ``masters`` a live master is deleted too, first and at
    once; otherwise the master pods, dead or never made, stay for ``kubectl logs``."""
    namespace, name = ident(job)
    failed = ended_status(job, phase="Failed", message=message, reason=reason, failure=failure)
    kube.patch_status(job, failed)  # first: the operator must not relaunch a master deleted next
    pods, _ = kube.job_objects(namespace, name)
    doomed = [p for p in pods if masters or p["metadata"].get("labels", {}).get(meta.LABEL_ROLE) != "master"]
    for pod in sorted(doomed, key=lambda p: p["metadata"]["labels"].get(meta.LABEL_ROLE) != "master"):
        kube.delete_pod(namespace, pod["metadata"]["name"], grace=0 if masters else None)
    if masters:
        kube.patch_status(job, failed)  # again: a status the master wrote before it was killed loses


def collect_finished(kube: Kube, job: dict) -> list[str]:
    """Delete a finished job's pods, Services, TLS Secret and PodGroup once ``ttlSecondsAfterFinished`` has
    passed; what was deleted (``pod/NAME``, ``service/NAME``, ``secret/NAME``)."""
    ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
    if ttl is None or phase_of(job) not in TERMINAL:
        return []
    done = _since((job.get("status") or {}).get("completionTime"))
    if done is None or done < ttl:
        return []
    namespace, name = ident(job)
    pods, services = kube.job_objects(namespace, name)
    for pod in pods:
        kube.delete_pod(namespace, pod["metadata"]["name"])
    for service in services:
        kube.delete_service(namespace, service["metadata"]["name"])
    deleted = [f"pod/{p['metadata']['name']}" for p in pods] + [f"service/{s['metadata']['name']}" for s in services]
    if secret := delete_secret(kube, job):  # the job's token outlives none of its pods
        deleted.append(secret)
    if gang.scheduling(job)[0] == gang.VOLCANO:
        kube.delete_pod_group(namespace, gang.pod_group_name(name))
    if deleted:
        kube.event(job, reason="Cleaned", key="ttl",
                   message=f"ttlSecondsAfterFinished ({ttl}s) passed: deleted {', '.join(deleted)}; "
                           "the ElasticJob and its status are kept")
    return deleted


__all__ = ["DEADLINE_EXCEEDED", "collect_finished", "enforce_deadline", "fail_job", "past_deadline"]
