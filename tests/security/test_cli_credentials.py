"""`flextrain scale/stop/suspend JOBDIR` against a --tls job whose tls/ directory is broken or belongs to
another job: each is one `flextrain: error: ...` line naming the file or the problem (exit code 2), never a
traceback, and never a fallback to plaintext with the token.

The master is a stand-in that answers the three calls, on a real gRPC server on loopback: over TLS with the
job's token check as a --tls master serves, or in plaintext recording every authorization header it
receives (to catch a client that sends the token in the clear)."""

from __future__ import annotations

import json
import os
from concurrent import futures

import grpc
import pytest

from flextrain.cli import main as cli_main
from flextrain.proto import flextrain_pb2 as pb
from flextrain.proto import flextrain_pb2_grpc as pb_grpc
from flextrain.protocol.security import JobCredentials, TokenInterceptor, add_port, make_credentials, write_credentials


class Master(pb_grpc.MasterServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def Scale(self, request, context):
        self.calls.append(f"Scale {request.workers}")
        return pb.ScaleResponse(accepted=True, message=f"scaling to {request.workers}")

    def Stop(self, request, context):
        self.calls.append("Stop")
        return pb.StopResponse(accepted=True, message="stopping")

    def Suspend(self, request, context):
        self.calls.append("Suspend")
        return pb.SuspendResponse(accepted=True, message="suspending")


class Headers(grpc.ServerInterceptor):
    """Records the authorization header of every call that reaches the server."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def intercept_service(self, continuation, details):
        self.seen += [value for key, value in details.invocation_metadata or () if key == "authorization"]
        return continuation(details)


def serve(creds: JobCredentials | None):
    headers, master = Headers(), Master()
    checks = [headers] + ([TokenInterceptor(creds.token)] if creds else [])
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=checks)
    pb_grpc.add_MasterServicer_to_server(master, server)
    port = add_port(server, "127.0.0.1:0", creds)
    server.start()
    return server, f"127.0.0.1:{port}", master, headers


@pytest.fixture(scope="module")
def job():
    return make_credentials("tlsjob")


@pytest.fixture
def tls_master(job):
    server, address, master, headers = serve(job)
    yield address, master, headers
    server.stop(0)


@pytest.fixture
def plain_master():
    server, address, master, headers = serve(None)
    yield address, master, headers
    server.stop(0)


def job_dir(tmp_path, address: str, job: JobCredentials | None):
    """A running job's directory as its master leaves it (this process stands in for the master's pid)."""
    status = {"name": "tlsjob", "phase": "Running", "pid": os.getpid(), "masterAddress": address,
              "jobDir": str(tmp_path), "tls": job is not None}
    (tmp_path / "status.json").write_text(json.dumps(status))
    if job is not None:
        write_credentials(tmp_path / "tls", job)
    return tmp_path


def flextrain(capsys, *argv: str) -> tuple[int, str]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().err


def test_a_tls_job_is_scaled_stopped_and_suspended_with_its_ca_and_token_alone(job, tls_master, tmp_path, capsys):
    address, master, _ = tls_master
    d = job_dir(tmp_path, address, job)
    (d / "tls" / "tls.key").unlink()  # the server's: a client never needs it
    (d / "tls" / "tls.crt").unlink()
    for argv in (("scale", str(d), "2"), ("suspend", str(d)), ("stop", str(d))):
        assert flextrain(capsys, *argv) == (0, "")
    assert master.calls == ["Scale 2", "Suspend", "Stop"]


@pytest.mark.parametrize("command", [("scale", "2"), ("stop",), ("suspend",)])
def test_a_missing_ca_is_named_and_the_token_never_goes_out_in_plaintext(job, plain_master, tmp_path, capsys,
                                                                           command):
    # The address answers plaintext: a client that fell back to it would hand it the token.
    address, master, headers = plain_master
    d = job_dir(tmp_path, address, job)
    (d / "tls" / "ca.crt").unlink()
    code, err = flextrain(capsys, command[0], str(d), *command[1:])
    assert code == 2 and err == (f"flextrain: error: job tlsjob runs with --tls: {d / 'tls' / 'ca.crt'} is missing: "
                                 f"a job with TLS on needs its certificate\n")
    assert master.calls == [] and headers.seen == []


@pytest.mark.parametrize("broken, expected", [
    ("ca.crt", "ca.crt is not a PEM certificate"),
    ("token", "token is missing: a job with TLS on needs its token"),
])
def test_a_garbage_ca_or_a_missing_token_is_one_line_naming_the_file(job, tls_master, tmp_path, capsys, broken,
                                                                       expected):
    address, master, headers = tls_master
    d = job_dir(tmp_path, address, job)
    if broken == "token":
        (d / "tls" / "token").unlink()
    else:
        (d / "tls" / broken).write_text("not a certificate\n")
    code, err = flextrain(capsys, "scale", str(d), "2")
    assert code == 2 and err.startswith(f"flextrain: error: job tlsjob runs with --tls: {d / 'tls'}/")
    assert expected in err and err.count("\n") == 1
    assert master.calls == [] and headers.seen == []


def test_a_token_the_job_refuses_is_named(job, tls_master, tmp_path, capsys):
    address, master, _ = tls_master
    d = job_dir(tmp_path, address, job)
    (d / "tls" / "token").write_text("someone-elses-token\n")
    code, err = flextrain(capsys, "scale", str(d), "2")
    assert (code, err) == (2, f"flextrain: error: job tlsjob's master refused the token in {d / 'tls' / 'token'}: "
                              f"the credentials in {d / 'tls'} don't match this job's\n")
    assert master.calls == []


def test_another_jobs_ca_is_a_failed_handshake_naming_the_ca(job, tls_master, tmp_path, capsys):
    address, master, _ = tls_master
    d = job_dir(tmp_path, address, job)
    (d / "tls" / "ca.crt").write_bytes(make_credentials("other").ca)
    code, err = flextrain(capsys, "stop", str(d))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"flextrain: error: no TLS connection to job tlsjob's master at {address}: the handshake "
                          f"failed; is {d / 'tls' / 'ca.crt'} this job's CA?")
    assert master.calls == []


def test_a_job_without_tls_is_dialled_in_plaintext_without_a_token(plain_master, tmp_path, capsys):
    address, master, headers = plain_master
    d = job_dir(tmp_path, address, None)
    assert flextrain(capsys, "scale", str(d), "3") == (0, "")
    assert master.calls == ["Scale 3"] and headers.seen == []


def test_a_master_that_does_not_answer_is_one_line(tmp_path, capsys):
    d = job_dir(tmp_path, "127.0.0.1:1", None)  # nothing listens on port 1
    code, err = flextrain(capsys, "scale", str(d), "2")
    assert code == 2 and err.startswith("flextrain: error: job tlsjob's master at 127.0.0.1:1 did not answer Scale: "
                                        "UNAVAILABLE: ") and err.count("\n") == 1
