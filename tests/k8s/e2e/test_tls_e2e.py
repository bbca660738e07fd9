"""spec.tls on the emulator, end to end: a ParameterServer ElasticJob with TLS on (the default) trains to
Succeeded, every record applied exactly once, every pod of it (master, worker, PS) mounting the job's
Secret; clients without the job's token, or with another, are refused UNAUTHENTICATED by its master and
its parameter server, and the master counts them in the ElasticJob's status.

Everything is real: the operator (kopf), the master pod launching worker and PS pods through the API, the
node agent running them as local processes with the Secret's keys as files (tests/k8s/nodeagent.py).
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from ft_helpers import counting_data, ps_counts, wait_for
from test_elasticjob_e2e import free_port, pods_of, wait_phase

from flextrain.k8s import meta, tls_secret
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.proto import ps_pb2 as ps_pb
from flextrain.proto import ps_pb2_grpc as ps_grpc
from flextrain.protocol.security import ENV_DIR, JobCredentials, make_credentials, open_channel

pytestmark = pytest.mark.e2e

G, RECORDS = 32, 1408
COUNTING_PS = f"{Path(__file__).resolve().parents[2] / 'e2e' / 'zoo' / 'counting_ps.py'}:Model"


def ps_job(name: str, data: Path, job_dir: Path) -> dict:
    env = [{"name": "FT_COUNT_RECORDS", "value": str(RECORDS)}, {"name": "FT_FEED_DELAY", "value": "0.05"}]
    with socket.socket() as s:  # one PS: its port is free (every "pod" shares this host)
        s.bind(("127.0.0.1", 0))
        ps_port = s.getsockname()[1]
    return {
        "apiVersion": meta.API_VERSION, "kind": meta.KIND,
        "metadata": {"name": name, "annotations": {meta.ANNOTATION_MASTER_PORT: str(free_port()),
                                                   meta.ANNOTATION_PS_PORT_BASE: str(ps_port)}},
        "spec": {  # no spec.tls: on by default
            "image": "flextrain:test", "modelDef": COUNTING_PS, "jobDir": str(job_dir),
            "strategy": "ParameterServer", "data": {"training": str(data)},
            "training": {"epochs": 2, "globalBatchSize": G, "learningRate": float(G)},
            "replicaSpecs": {"master": {"env": env}, "worker": {"replicas": 1, "env": env},
                             "ps": {"replicas": 1, "env": env}},
        },
    }


def refused(address: str, creds: JobCredentials, call) -> grpc.StatusCode:
    with open_channel(address, creds) as channel, pytest.raises(grpc.RpcError) as err:
        call(channel)
    return err.value.code()


def test_a_ps_elasticjob_over_tls_refuses_clients_without_its_token(operator, node_agent, jobs, digits_data,
                                                                    tmp_path):
    data = counting_data(digits_data, tmp_path / "data", records=RECORDS)
    body = ps_job("tls", data, tmp_path / "job")
    job = jobs.create(body)
    secret = wait_for(lambda: jobs.kube.get_secret(jobs.namespace, "tls-tls"), timeout=30, what="the job's Secret")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    creds = tls_secret.credentials_of(secret)
    master = f"127.0.0.1:{body['metadata']['annotations'][meta.ANNOTATION_MASTER_PORT]}"
    ps = f"127.0.0.1:{body['metadata']['annotations'][meta.ANNOTATION_PS_PORT_BASE]}"
    describe = lambda channel: ps_grpc.ParameterServerStub(channel).Describe(ps_pb.DescribeRequest(), timeout=10)  # noqa: E731
    status = lambda channel: pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)  # noqa: E731

    def answers(address: str, call) -> bool:
        try:
            with open_channel(address, creds) as channel:
                call(channel)
            return True
        except grpc.RpcError:
            return False

    # The job's own material gets answers from both servers (once they listen) ...
    wait_for(lambda: answers(ps, describe) and answers(master, status), timeout=180, what="master and PS over TLS")
    # ... a client without the token, or with another job's, gets UNAUTHENTICATED from both.
    for outsider in (JobCredentials(token="", ca=creds.ca), JobCredentials(token=make_credentials("x").token,
                                                                             ca=creds.ca)):
        assert refused(master, outsider, status) is grpc.StatusCode.UNAUTHENTICATED
        assert refused(ps, outsider, describe) is grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(master) as channel, pytest.raises(grpc.RpcError) as err:  # plaintext: no handshake
        status(channel)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    wait_for(lambda: pods_of(jobs, "tls", "worker"), timeout=120, what="the worker pod")  # after the PS
    for pod in pods_of(jobs, "tls"):  # master, worker and PS: the Secret, read-only, and where it is
        (container,) = pod["spec"]["containers"]
        assert {"name": tls_secret.VOLUME, "mountPath": tls_secret.MOUNT_PATH, "readOnly": True} in \
            container["volumeMounts"], pod["metadata"]["name"]
        assert {"name": ENV_DIR, "value": tls_secret.MOUNT_PATH} in container["env"], pod["metadata"]["name"]
    assert {p["metadata"]["labels"][meta.LABEL_ROLE] for p in pods_of(jobs, "tls")} == {"master", "worker", "ps"}

    final = wait_phase(jobs, node_agent, "tls", "Succeeded", timeout=300)
    assert final["unauthenticatedCalls"] == 2  # the master's two refusals, counted in the ElasticJob's status
    assert final["progress"]["recordsDone"] == 2 * RECORDS
    assert node_agent.log("tls-ps-0").count("without the job's token") == 2
    dense, rows = ps_counts(tmp_path / "job", RECORDS, num_ps=1)
    assert dense.tolist() == [2.0] * RECORDS and rows.tolist() == [2.0] * RECORDS  # exactly once, over TLS
