"""--tls, real processes: a job's every channel runs over TLS with its own token. The job trains end to end
(AllReduce: scaled by `flextrain scale` through the CLI's own channel, every record applied exactly once;
ParameterServer: every record applied exactly once on every PS), while a client without the job's token —
or with another job's — is refused by the master and by a parameter server with UNAUTHENTICATED, counted
in the job's status and metrics."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest

from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.proto import ps_pb2 as ps_pb
from flextrain.proto import ps_pb2_grpc as ps_grpc
from flextrain.protocol.security import JobCredentials, make_credentials, open_channel, read_credentials
from ft_helpers import (COUNTING_MODEL, assert_exactly_once_at_latest_checkpoint, counting_data,
                        flextrain_cmd, ps_counts, read_status, run_flextrain, scrape, wait_for)

pytestmark = pytest.mark.e2e

G = 32
COUNTING_PS = f"{Path(__file__).resolve().parent / 'zoo' / 'counting_ps.py'}:Model"


def refused(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


def outsiders(job: JobCredentials):
    """Clients that must not get in: no token (but trusting the CA), another job's token, another job's CA."""
    other = make_credentials("intruder")
    return [JobCredentials(token="", ca=job.ca), JobCredentials(token=other.token, ca=job.ca), other]


def test_an_allreduce_job_over_tls_refuses_clients_without_its_token(digits_data, tmp_path):
    data = counting_data(digits_data, tmp_path / "data")
    job_dir = tmp_path / "job"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_MODEL, "--training-data", str(data), "--global-batch-size",
                      str(G), "--max-micro-batch", "16", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "1",
                      "--max-workers", "2", "--epochs", "1000", "--tls", "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "FT_COUNT_G": str(G)})
    try:
        s = wait_for(lambda: (job_dir / "status.json").exists() and (s := read_status(job_dir))["phase"] == "Running"
                     and s["step"] > 3 and s, timeout=180, what="the job training")
        creds = read_credentials(job_dir / "tls")
        assert s["tls"] is True and creds is not None and creds.tls
        assert oct((job_dir / "tls" / "tls.key").stat().st_mode & 0o777) == "0o600"
        request = pb.GetStatusRequest()
        for outsider in outsiders(creds):
            with open_channel(s["masterAddress"], outsider) as channel:
                code = refused(lambda: pb_grpc.MasterStub(channel).GetStatus(request, timeout=10))
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)  # another CA: no handshake
        with grpc.insecure_channel(s["masterAddress"]) as channel:  # plaintext: no handshake either
            assert refused(lambda: pb_grpc.MasterStub(channel).GetStatus(request, timeout=5)) == \
                grpc.StatusCode.UNAVAILABLE
        # The job's own commands get in (the CLI reads <job dir>/tls/): scale to 2, both train.
        assert run_flextrain("scale", str(job_dir), "2").returncode == 0
        s = wait_for(lambda: (s := read_status(job_dir))["workers"]["active"] == 2 and s, timeout=180,
                     what="two workers over TLS")
        assert s["unauthenticatedCalls"] == 2  # no token, a wrong token; the others never reached the server
        assert scrape(s["metricsUrl"])[("flextrain_unauthenticated_calls_total", ())] == 2
        assert "workers   2 active" in run_flextrain("status", str(job_dir)).stdout
        assert run_flextrain("stop", str(job_dir)).returncode == 0
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "resume with" in read_status(job_dir)["message"], err
    assert_exactly_once_at_latest_checkpoint(job_dir, G=G)


def test_a_parameter_server_job_over_tls_refuses_clients_without_its_token(digits_data, tmp_path):
    records = 1408
    data = counting_data(digits_data, tmp_path / "data", records=records)
    job_dir = tmp_path / "job"
    proc = subprocess.Popen(
        flextrain_cmd("train", "--model-def", COUNTING_PS,
                      "--training-data", str(data), "--distribution-strategy", "ParameterServer", "--ps", "2",
                      "--workers", "2", "--global-batch-size", str(G), "--lr", str(G), "--epochs", "2",
                      "--job-dir", str(job_dir), "--tls", "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "FT_COUNT_RECORDS": str(records), "FT_FEED_DELAY": "0.01"})
    try:
        address = wait_for(lambda: (f := job_dir / "ps" / "ps-0.addr").is_file() and f.read_text().strip(),
                           timeout=120, what="ps-0 listening")
        creds = read_credentials(job_dir / "tls")
        for outsider in outsiders(creds)[:2]:
            with open_channel(address, outsider) as channel:
                code = refused(lambda: ps_grpc.ParameterServerStub(channel).Describe(ps_pb.DescribeRequest(),
                                                                                       timeout=10))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        with open_channel(address, creds) as channel:  # the job's own token gets an answer
            assert ps_grpc.ParameterServerStub(channel).Describe(ps_pb.DescribeRequest(), timeout=10).num_ps == 2
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert read_status(job_dir)["phase"] == "Succeeded"
    dense, rows = ps_counts(job_dir, records)
    assert dense.tolist() == [2.0] * records and rows.tolist() == [2.0] * records  # exactly once, over TLS
    log = (job_dir / "logs" / "ps-0.log").read_text()
    assert log.count("refused a call to /flextrain.ps.v1.ParameterServer/Describe without the job's token") == 2
