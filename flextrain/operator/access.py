"""The operator's side of a job's least privilege: its master's ServiceAccount, Role and RoleBinding
(:mod:`flextrain.k8s.access`) and, when enabled, its NetworkPolicies (:mod:`flextrain.k8s.netpol`).

:class:`JobAccess` creates them before a master pod is created (the first and every relaunched one),
by name, so running again is harmless (409: there already). Each object is created through the
caller's ``create_object(what, create)``, so a refusal (say the operator's own Role lacks
``roles`` create) is reported like a refused master pod: the job fails naming the object and the
API server's words, or waits for a retryable one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flextrain.k8s import meta
from flextrain.k8s.access import master_access
from flextrain.k8s.netpol import job_policies
from flextrain.k8s.refusals import Refused, refusal_of
from flextrain.operator.kube import Kube

CreateObject = Callable[[str, Callable[[], bool]], bool]


class JobAccess:
    """Creates a job's access objects through ``kube``; NetworkPolicies when ``operator_namespace`` (where
    the operator's pod runs, admitted to the master's port) is given."""

    def __init__(self, kube: Kube, *, operator_namespace: str | None = None) -> None:
        from kubernetes import client

        self.kube = kube
        self.operator_namespace = operator_namespace
        self.rbac = client.RbacAuthorizationV1Api(kube.api_client)
        self.networking = client.NetworkingV1Api(kube.api_client)

    def ensure(self, job: dict, create_object: CreateObject) -> None:
        namespace = job["metadata"]["namespace"]
        creators: dict[str, Callable[[dict], Any]] = {
            "ServiceAccount": lambda b: self.kube.core.create_namespaced_service_account(namespace, b),
            "Role": lambda b: self.rbac.create_namespaced_role(namespace, b),
            "RoleBinding": lambda b: self.rbac.create_namespaced_role_binding(namespace, b),
            "NetworkPolicy": lambda b: self.networking.create_namespaced_network_policy(namespace, b),
        }
        objects = master_access(job, image_pull_secrets=self._pull_secrets(namespace))
        if self.operator_namespace is not None:
            objects += job_policies(job, operator_namespace=self.operator_namespace)
        for body in objects:
            create = creators[body["kind"]]
            create_object(f'{body["kind"]} "{body["metadata"]["name"]}"',
                          lambda body=body, create=create: self.kube._create(lambda: create(body)))

    def _pull_secrets(self, namespace: str) -> list[dict]:
        """The ``imagePullSecrets`` of the namespace's ``flextrain-job`` ServiceAccount (none without it)."""
        from kubernetes.client.exceptions import ApiException

        try:
            account = self.kube.core.read_namespaced_service_account(meta.JOB_SERVICE_ACCOUNT, namespace,
                                                                     _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise Refused(refusal_of(exc, what=f'ServiceAccount "{meta.JOB_SERVICE_ACCOUNT}"', action="read")) from exc
        try:
            return list(json.loads(account.data).get("imagePullSecrets") or ())
        finally:
            account.release_conn()


__all__ = ["JobAccess"]
