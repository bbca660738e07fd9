"""The master's own API identity: a ServiceAccount, Role and RoleBinding per ElasticJob.

The operator creates the three (all named ``<job>-master``, owned by the
ElasticJob, so the garbage collector removes them with it) before the job's
first master pod, and again before each relaunch (creation by name: a second
create is "already exists", nothing more). The master pod runs as that
ServiceAccount unless the master's template names another
(``spec.replicaSpecs.master.template.spec.serviceAccountName``, which must then
hold these rights itself). Workers and parameter servers mount no token at all
(:mod:`flextrain.k8s.hardening`).

The Role grants what the master calls (flextrain/master/k8s_*.py) and nothing else:

==========================================  ==================================  ===============================
resource                                    verbs                               why
==========================================  ==================================  ===============================
pods                                        create, delete, list, patch, watch  its workers' and PS pods: launched,
                                                                                watched, relabelled (a spare taken),
                                                                                deleted on scale-down
services                                    create, get                         the PS Services; its own Service's
                                                                                address
events                                      create                              Events on its job
elasticjobs (its own: resourceNames)        get                                 its job's spec
elasticjobs/status (its own: resourceNames) patch                               its job's status
elasticjobs/finalizers (its own)            update                              its pods and Services are owned
                                                                                by the job with
                                                                                blockOwnerDeletion, which the
                                                                                OwnerReferencesPermission-
                                                                                Enforcement admission plugin
                                                                                (OpenShift) allows only with it
==========================================  ==================================  ===============================

Pods and Services cannot be limited by name (a create has no name to check
until it is made, and a job's pod names are not known in advance), so those
rules cover the namespace: keep jobs that must not touch each other's pods in
different namespaces. The operator itself holds every one of these rights, which
is what RBAC requires of whoever creates a Role and binds it (no ``escalate``
or ``bind``; docs/security.md).

The ServiceAccount copies the ``imagePullSecrets`` of the namespace's
``flextrain-job`` ServiceAccount (the chart's), so the master pulls the image
as every other pod of the job does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flextrain.k8s import meta

RBAC = "rbac.authorization.k8s.io"


def master_account_name(job_name: str) -> str:
    """``<job>-master``: the name of the job's ServiceAccount, Role and RoleBinding."""
    return f"{job_name}-master"


def master_rules(job_name: str) -> list[dict[str, Any]]:
    """The rules of the master's Role (the table in the module docstring)."""
    own = [job_name]
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "list", "patch", "watch"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [meta.GROUP], "resources": [meta.PLURAL], "resourceNames": own, "verbs": ["get"]},
        {"apiGroups": [meta.GROUP], "resources": [f"{meta.PLURAL}/status"], "resourceNames": own, "verbs": ["patch"]},
        # blockOwnerDeletion on the pods and Services it creates (meta.owner_reference): no finalizer is written
        {"apiGroups": [meta.GROUP], "resources": [f"{meta.PLURAL}/finalizers"], "resourceNames": own,
         "verbs": ["update"]},
    ]


def _metadata(job: Mapping[str, Any]) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {"name": master_account_name(name), "namespace": job["metadata"]["namespace"],
            "labels": meta.labels(name, "master"), "ownerReferences": [meta.owner_reference(job)]}


def master_service_account(job: Mapping[str, Any], *, image_pull_secrets: Sequence[Mapping[str, Any]] = ()
                           ) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(job)}
    if image_pull_secrets:
        body["imagePullSecrets"] = [dict(s) for s in image_pull_secrets]
    return body


def master_role(job: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": _metadata(job),
            "rules": master_rules(job["metadata"]["name"])}


def master_role_binding(job: Mapping[str, Any]) -> dict[str, Any]:
    md = _metadata(job)
    return {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": md,
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": md["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": md["name"], "namespace": md["namespace"]}]}


def master_access(job: Mapping[str, Any], *, image_pull_secrets: Sequence[Mapping[str, Any]] = ()
                  ) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding: in the order they are created."""
    return [master_service_account(job, image_pull_secrets=image_pull_secrets), master_role(job),
            master_role_binding(job)]


__all__ = ["master_access", "master_account_name", "master_role", "master_role_binding", "master_rules",
           "master_service_account"]
