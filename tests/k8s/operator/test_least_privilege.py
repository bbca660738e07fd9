"""Least privilege of what the operator makes for a job, read back from the emulator.

The master pod runs as its job's own ServiceAccount, bound to a Role with exactly the rights the
master uses (its own ElasticJob by name, no wildcard); every object is owned by the job; the
NetworkPolicies (``--network-policies``) admit only the job's pods and the operator to the master and
PS ports; a refused Role fails the job naming it. (Workers' and PS pods: tests/k8s/backend/test_ps_pods.py.)
"""

from __future__ import annotations

import json

import pytest
from ft_helpers import wait_for
from kubernetes import client
from least_privilege_checks import assert_pod_least_privileged
from test_operator_create import elasticjob

from flextrain.k8s import meta

OPERATOR_NAMESPACE = "flextrain-system"
JOB_LABELS = {meta.LABEL_JOB: "ctr"}


@pytest.fixture
def policing_operator(k8s_cluster, k8s_api):
    """The real operator with ``--network-policies``, its pod in OPERATOR_NAMESPACE."""
    from operator_support import Operator

    op = Operator(k8s_api, k8s_cluster.namespace, sweep_interval=1.0, network_policies_from=OPERATOR_NAMESPACE)
    yield op.start()
    op.close()


def raw(reply) -> dict:
    try:
        return json.loads(reply.data)
    finally:
        reply.release_conn()


def ps_job() -> dict:
    job = elasticjob("ctr")
    job["metadata"]["annotations"] = {meta.ANNOTATION_PS_PORT_BASE: "7000"}
    job["spec"]["strategy"] = "ParameterServer"
    job["spec"]["replicaSpecs"]["ps"] = {"replicas": 2}
    return job


def test_the_master_runs_as_its_jobs_own_account_behind_the_jobs_network_policies(k8s_api, policing_operator, jobs):
    core, rbac, net = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api), client.NetworkingV1Api(k8s_api)
    ns = jobs.namespace
    core.create_namespaced_service_account(ns, {"metadata": {"name": meta.JOB_SERVICE_ACCOUNT},
                                                "imagePullSecrets": [{"name": "regcred"}]})
    uid = jobs.create(ps_job())["metadata"]["uid"]
    (pod,) = wait_for(lambda: jobs.master_pods("ctr"), timeout=30, what="the master pod").values()
    assert pod["spec"]["serviceAccountName"] == "ctr-master"
    assert_pod_least_privileged(pod, token=True, job_dir="/flextrain-jobs/ctr")

    account = raw(core.read_namespaced_service_account("ctr-master", ns, _preload_content=False))
    role = raw(rbac.read_namespaced_role("ctr-master", ns, _preload_content=False))
    binding = raw(rbac.read_namespaced_role_binding("ctr-master", ns, _preload_content=False))
    assert account["imagePullSecrets"] == [{"name": "regcred"}]  # pulls the image as the job's other pods do
    # Exactly what flextrain/master/k8s_*.py call, its own ElasticJob by name; nothing else, no wildcard.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "list", "patch", "watch"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": ["flextrain.dev"], "resources": ["elasticjobs"], "resourceNames": ["ctr"], "verbs": ["get"]},
        {"apiGroups": ["flextrain.dev"], "resources": ["elasticjobs/status"], "resourceNames": ["ctr"],
         "verbs": ["patch"]},
        # blockOwnerDeletion on the pods and Services it owns to the job (OwnerReferencesPermissionEnforcement)
        {"apiGroups": ["flextrain.dev"], "resources": ["elasticjobs/finalizers"], "resourceNames": ["ctr"],
         "verbs": ["update"]},
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ctr-master"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ctr-master", "namespace": ns}]

    policies = {p["metadata"]["name"]: p for p in
                raw(net.list_namespaced_network_policy(ns, _preload_content=False))["items"]}
    assert sorted(policies) == ["ctr-master", "ctr-ps"]
    own_pods = {"podSelector": {"matchLabels": JOB_LABELS}}
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flextrain",
                                                "app.kubernetes.io/component": "operator"}}}
    master, ps = policies["ctr-master"]["spec"], policies["ctr-ps"]["spec"]
    assert master["podSelector"] == {"matchLabels": {**JOB_LABELS, meta.LABEL_ROLE: "master"}}
    assert master["policyTypes"] == ["Ingress"]
    assert master["ingress"] == [
        {"from": [own_pods]},  # every port: gRPC and the rendezvous stores, on ports picked as they start
        {"from": [operator], "ports": [{"protocol": "TCP", "port": 50051}]},
        {"ports": [{"protocol": "TCP", "port": 9464}]},  # metrics: Prometheus, wherever it runs
    ]
    assert ps["podSelector"] == {"matchLabels": {**JOB_LABELS, meta.LABEL_ROLE: "ps"}}
    assert ps["ingress"] == [{"from": [own_pods], "ports": [{"protocol": "TCP", "port": 7000},
                                                              {"protocol": "TCP", "port": 7001}]}]
    for made in (account, role, binding, *policies.values()):  # collected with the job
        (ref,) = made["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("ElasticJob", "ctr", uid)


def test_a_refused_role_fails_the_job_naming_it(k8s_cluster, operator, jobs):
    k8s_cluster.admit(lambda res, ns, body: (403, "Forbidden", 'roles.rbac.authorization.k8s.io "x-master" is '
                                             'forbidden: user cannot create roles') if res == "rbac.authorization.k8s.io/v1/roles" else None)
    jobs.create(elasticjob("x"))
    status = wait_for(lambda: jobs.status("x").get("phase") == "Failed" and jobs.status("x"),
                      timeout=30, what="the job to fail")
    assert status["message"] == ('cannot create Role "x-master": the API server refused it (403 Forbidden): '
                                 'roles.rbac.authorization.k8s.io "x-master" is forbidden: user cannot create roles')
    assert jobs.master_pods("x") == {}  # no master without its rights
