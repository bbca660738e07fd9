"""Worker pods the master creates carry the role's template and the job's labels, and pass a
PodSecurity ``restricted`` namespace (the emulator admits pods through that profile here)."""

from __future__ import annotations

from kubernetes import client
from podsecurity import restricted_namespace, restricted_violations
from test_pod_backend import NS, raw_pod

from flextrain.k8s import meta
from flextrain.master.k8s_backend import KubernetesPodBackend
from flextrain.master.launcher import InstanceSpec, Role

TEMPLATE = {"metadata": {"labels": {"pool": "gpu"}},
            "spec": {"nodeSelector": {"accelerator": "h100"},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "priorityClassName": "training",
                     "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_worker_pods_carry_the_template_and_the_job_labels_and_pass_restricted(k8s_cluster, k8s_api):
    k8s_cluster.admit(restricted_namespace(NS))
    body = {"apiVersion": meta.API_VERSION, "kind": meta.KIND,
            "metadata": {"name": "gpu", "namespace": NS, "labels": {"team": "vision"}},
            "spec": {"image": "flextrain:test", "modelDef": "m.py:M", "data": {"training": "/d"},
                     "replicaSpecs": {"worker": {"replicas": 1, "template": TEMPLATE}}}}
    job = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(meta.GROUP, meta.VERSION, NS,
                                                                           meta.PLURAL, body)
    backend = KubernetesPodBackend(k8s_api, job=job, master_address="127.0.0.1:1").start()
    try:
        backend.launch(InstanceSpec("worker-0", Role.WORKER, 0, ("worker",)))
        pod = raw_pod(client.CoreV1Api(k8s_api), "gpu-worker-0")  # created: the admission let it in
    finally:
        backend.close(grace=0)
    assert pod is not None
    assert pod["spec"]["nodeSelector"] == {"accelerator": "h100"}
    assert pod["spec"]["tolerations"] == TEMPLATE["spec"]["tolerations"]
    assert pod["spec"]["priorityClassName"] == "training"
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    labels = pod["metadata"]["labels"]
    assert labels["team"] == "vision" and labels["pool"] == "gpu" and labels[meta.LABEL_ROLE] == "worker"
    assert restricted_violations(pod) == []
