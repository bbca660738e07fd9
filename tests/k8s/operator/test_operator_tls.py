"""spec.tls on the emulator: the operator's per-job Secret, its mount into every pod, and the relay over TLS.

The operator is real (kopf against the emulator); no pod runs here (tests/k8s/e2e runs jobs with TLS on).
The master the relay dials is a recording ``Master`` service on loopback serving TLS with the material the
operator put in the job's Secret, and refusing calls without its token as the real master does.
"""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from ft_helpers import wait_for
from test_operator_create import elasticjob
from test_operator_relay import RecordingMaster, free_port

from flextrain.k8s import meta, tls_secret
from flextrain.k8s.pods import instance_pod
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.protocol.security import ENV_DIR, FILES, TokenInterceptor, add_port, open_channel


def secret_of(jobs, name: str) -> dict | None:
    return jobs.kube.get_secret(jobs.namespace, tls_secret.secret_name(name))


def assert_mounts_the_secret(pod: dict, job: str) -> None:
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[tls_secret.VOLUME]["secret"]["secretName"] == f"{job}-tls"
    (container,) = pod["spec"]["containers"]
    mounts = [m for m in container["volumeMounts"] if m["name"] == tls_secret.VOLUME]
    assert mounts == [{"name": tls_secret.VOLUME, "mountPath": tls_secret.MOUNT_PATH, "readOnly": True}]
    assert [e for e in container["env"] if e["name"] == ENV_DIR] == [{"name": ENV_DIR, "value": tls_secret.MOUNT_PATH}]


def test_the_operator_makes_one_owned_secret_per_job_and_keeps_it_across_relaunches(operator, jobs):
    job = jobs.create(elasticjob())
    pods = wait_for(lambda: jobs.master_pods("digits"), timeout=30, what="the master pod")
    secret = secret_of(jobs, "digits")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == set(FILES.values())
    assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in secret["metadata"]["ownerReferences"]] == [
        ("ElasticJob", "digits", job["metadata"]["uid"], True)]
    creds = tls_secret.credentials_of(secret)
    assert creds.tls and b"BEGIN CERTIFICATE" in creds.ca and len(creds.token) >= 32
    assert_mounts_the_secret(pods[0], "digits")
    # A relaunched master (the first one deleted) mounts the same Secret, which keeps its material.
    jobs.kube.delete_pod(jobs.namespace, "digits-master-0", grace=0)
    relaunched = wait_for(lambda: jobs.master_pods("digits").get(1), timeout=60, what="the relaunched master")
    assert_mounts_the_secret(relaunched, "digits")
    assert secret_of(jobs, "digits")["data"] == secret["data"]
    assert secret_of(jobs, "digits")["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]


def test_tls_false_makes_no_secret_and_mounts_nothing(operator, jobs):
    body = elasticjob("plain")
    body["spec"]["tls"] = False
    jobs.create(body)
    pod = wait_for(lambda: jobs.master_pods("plain").get(0), timeout=30, what="the master pod")
    assert secret_of(jobs, "plain") is None
    assert tls_secret.VOLUME not in {v["name"] for v in pod["spec"].get("volumes") or ()}
    assert ENV_DIR not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("role", ["worker", "ps"])
def test_worker_and_ps_pods_mount_the_secret_and_user_env_cannot_redirect_it(role):
    body = elasticjob("digits", env=[{"name": ENV_DIR, "value": "/elsewhere"}])
    body["metadata"].update(namespace="default", uid="u-1")
    body["spec"]["strategy"] = "ParameterServer"
    body["spec"]["replicaSpecs"]["ps"] = {"replicas": 1, "env": [{"name": ENV_DIR, "value": "/elsewhere"}]}
    body["spec"]["volumes"] = [{"name": "data", "mountPath": "/data", "emptyDir": {}}]
    pod = instance_pod(body, role=role, index=0, instance_id=f"{role}-0", args=[role], env={},
                       master_address="m:1")
    assert_mounts_the_secret(pod, "digits")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "flextrain-scratch", "flextrain-job-dir",
                                                          tls_secret.VOLUME]  # the user's kept (+ flextrain.k8s.hardening's)


def test_the_relay_dials_the_master_over_tls_with_the_jobs_token(operator, jobs):
    port = free_port()
    body = elasticjob()
    body["metadata"]["annotations"] = {meta.ANNOTATION_MASTER_PORT: str(port)}
    jobs.create(body)
    creds = tls_secret.credentials_of(wait_for(lambda: secret_of(jobs, "digits"), timeout=30, what="the Secret"))
    wait_for(lambda: "kopf.zalando.org/last-handled-configuration" in jobs.get("digits")["metadata"]["annotations"],
             timeout=30, what="the operator to finish handling the creation")
    refused: list[str] = []
    master = RecordingMaster(lo=1, hi=3)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         interceptors=[TokenInterceptor(creds.token, on_refused=refused.append)])
    pb_grpc.add_MasterServicer_to_server(master, server)
    add_port(server, f"127.0.0.1:{port}", creds)
    server.start()
    try:
        jobs.patch("digits", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
        wait_for(lambda: master.scales == [3], timeout=30, what="Scale(3) at the master over TLS")
        jobs.patch("digits", {"metadata": {"annotations": {meta.ANNOTATION_STOP: "stopped by alice"}}})
        wait_for(lambda: master.stops == ["stopped by alice"], timeout=30, what="Stop at the master over TLS")
        assert refused == []  # every relayed call carried the token
        # the same server refuses a caller with the job's CA but another token
        wrong = type(creds)(token="not-the-token", ca=creds.ca)
        with open_channel(f"127.0.0.1:{port}", wrong) as channel, pytest.raises(grpc.RpcError) as err:
            pb_grpc.MasterStub(channel).Scale(pb.ScaleRequest(workers=2), timeout=10)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED and master.scales == [3]
    finally:
        server.stop(grace=None)


@pytest.mark.parametrize("flags, written", [((), None), (("--tls",), None), (("--no-tls",), False)],
                         ids=["default", "tls", "no-tls"])
def test_train_on_kubernetes_submits_tls_unless_no_tls(flags, written):
    """On by default for Kubernetes (the CRD's default, so left out of the ElasticJob); off by default locally."""
    from test_cli_k8s import TRAIN

    from flextrain.cli import make_parser
    from flextrain.cli.kubernetes import elasticjob_from_args
    from flextrain.cli.train import tls_of
    from flextrain.k8s.resource import jobspec_from_resource

    parser = make_parser()
    body = elasticjob_from_args(parser.parse_args([*TRAIN, *flags, "--namespace", "team-a"]))
    assert body["spec"].get("tls") == written
    assert jobspec_from_resource(body).tls is (written is None) is tls_secret.enabled(body)
    local = [a for a in TRAIN if a not in ("--backend", "kubernetes", "--image", "flextrain:test")]
    assert tls_of(parser.parse_args([*local, *flags])) is (flags == ("--tls",))


def test_a_volume_in_the_secrets_place_is_refused_naming_the_field():
    from flextrain.k8s.resource import problems

    body = elasticjob()
    body["spec"]["volumes"] = [{"name": "flextrain-tls", "mountPath": "/data", "emptyDir": {}},
                               {"name": "mine", "mountPath": tls_secret.MOUNT_PATH + "/", "emptyDir": {}}]
    assert problems(body) == [
        "spec.volumes[0].name: 'flextrain-tls' is the name of the job's TLS Secret volume (spec.tls); choose another",
        f"spec.volumes[1].mountPath: {tls_secret.MOUNT_PATH} is where the job's TLS Secret is mounted (spec.tls); "
        "choose another"]
    body["spec"]["tls"] = False
    assert problems(body) == []
