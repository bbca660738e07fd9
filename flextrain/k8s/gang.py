"""Gang admission of an ElasticJob (``spec.scheduling``): what flextrain creates for Volcano and Kueue.

A job's minimum set is its master, its parameter servers and ``minReplicas``
workers: fewer cannot train. A batch scheduler admits that set together or
not at all, so a job never holds half its pods while waiting for the rest.

* ``gang: volcano``: a ``PodGroup`` (``scheduling.volcano.sh/v1beta1``) named
  after the job, owned by it, with the job's ``queue``. As Volcano's own job
  controller does, the operator creates the master only once the PodGroup is
  ``Inqueue`` (or later), so the job stays ``Pending`` with the PodGroup's
  phase as the reason until Volcano admits it. The pods the master then
  creates (parameter servers, workers) name the group (annotation
  ``scheduling.k8s.io/group-name``, ``schedulerName: volcano``) and
  ``minMember`` is their minimum, parameter servers + ``minReplicas``:
  Volcano binds none of them before it can bind that many. The master pod
  itself is not a member: it is created alone, before the others exist, and
  Volcano's gang check (members that exist >= ``minMember``) would hold it,
  and with it the whole job, for ever.
* ``gang: kueue``: the ElasticJob carries the label
  ``kueue.x-k8s.io/queue-name: QUEUE`` and is created with ``spec.suspend:
  true``; Kueue admits it by setting ``suspend`` to false, and only then does
  the operator create the master (:mod:`flextrain.operator.admission`). The
  pods carry no queue label: Kueue admits the job, not each pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flextrain.k8s import meta

VOLCANO, KUEUE = "volcano", "kueue"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"
# PodGroup phases in which Volcano has admitted the gang (its job controller creates pods from Inqueue on).
ADMITTED_PHASES = ("Inqueue", "Running")


def scheduling(job: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(gang, queue)`` of an ElasticJob (``(None, None)`` without ``spec.scheduling``)."""
    section = (job.get("spec") or {}).get("scheduling") or {}
    return section.get("gang"), section.get("queue")


def min_member(job: Mapping[str, Any]) -> int:
    """The PodGroup's ``minMember``: every parameter server and ``minReplicas`` (else ``replicas``) workers
    (the master is admitted with the group, not scheduled in it: see the module docstring)."""
    replicas = (job.get("spec") or {}).get("replicaSpecs") or {}
    worker = replicas.get("worker") or {}
    ps = int((replicas.get("ps") or {}).get("replicas") or 0)
    return ps + int(worker.get("minReplicas") or worker.get("replicas") or 1)


def pod_group_name(job_name: str) -> str:
    return job_name


def pod_group(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Volcano PodGroup of ``job`` (an ElasticJob dict with ``metadata.uid``)."""
    md = job["metadata"]
    _, queue = scheduling(job)
    spec: dict[str, Any] = {"minMember": min_member(job)}
    if queue:
        spec["queue"] = queue
    return {
        "apiVersion": f"{PODGROUP_GROUP}/{PODGROUP_VERSION}", "kind": "PodGroup",
        "metadata": {"name": pod_group_name(md["name"]), "namespace": md["namespace"],
                     "labels": {meta.LABEL_JOB: md["name"], meta.LABEL_MANAGED_BY: "flextrain"},
                     "ownerReferences": [meta.owner_reference(job)]},
        "spec": spec,
    }


def apply_to_pod(job: Mapping[str, Any], pod: dict[str, Any], *, role: str) -> dict[str, Any]:
    """Put ``job``'s gang on one of its pods (Volcano: scheduler and group for worker and PS pods; Kueue:
    nothing, the job as a whole is admitted)."""
    gang, _ = scheduling(job)
    if gang == VOLCANO and role != "master":
        pod["spec"]["schedulerName"] = VOLCANO_SCHEDULER
        pod["metadata"].setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = pod_group_name(
            job["metadata"]["name"])
    return pod


def job_labels(gang: str | None, queue: str | None) -> dict[str, str]:
    """Labels of the ElasticJob itself: Kueue finds the jobs of a LocalQueue by this one."""
    return {KUEUE_QUEUE_LABEL: queue} if gang == KUEUE and queue else {}


__all__ = ["ADMITTED_PHASES", "KUEUE", "KUEUE_QUEUE_LABEL", "VOLCANO", "VOLCANO_GROUP_ANNOTATION",
           "apply_to_pod", "job_labels", "min_member", "pod_group", "pod_group_name", "scheduling"]
