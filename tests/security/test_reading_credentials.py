"""A job's material as its processes read it (flextrain/protocol/security.py): a client (a worker, the CLI)
reads only the CA and the token, a server its certificate and key too; a missing or broken file is named,
and a worker given a FLEXTRAIN_TLS_DIR without the job's material exits with that one line."""

from __future__ import annotations

import pytest

from flextrain.failures import ExitCode
from flextrain.protocol.security import (CredentialsError, JobCredentials, from_environment, make_credentials,
                                         read_credentials, write_credentials)


@pytest.fixture(scope="module")
def job():
    return make_credentials("tlsjob")


def test_servers_read_their_key_and_clients_do_not(job, tmp_path, monkeypatch):
    d = tmp_path / "tls"
    write_credentials(d, job)
    (d / "tls.key").write_text("garbage")
    assert read_credentials(d) == JobCredentials(token=job.token, ca=job.ca)  # a worker, the CLI
    with pytest.raises(CredentialsError, match=r"tls.key is not a PEM private key"):
        read_credentials(d, server=True)  # a parameter server, a Kubernetes master
    monkeypatch.setenv("FLEXTRAIN_TLS_DIR", str(d))
    with pytest.raises(CredentialsError, match=rf"^FLEXTRAIN_TLS_DIR={d}: {d / 'tls.key'} is not a PEM private key"):
        from_environment(server=True)
    (d / "ca.crt").unlink()
    with pytest.raises(CredentialsError, match=rf"^FLEXTRAIN_TLS_DIR={d}: {d / 'ca.crt'} is missing"):
        from_environment(server=False)  # no CA: an error, not plaintext with the token


def test_a_worker_without_the_jobs_material_exits_with_one_line(monkeypatch, capsys):
    from flextrain.worker.main import run_worker

    monkeypatch.setenv("FLEXTRAIN_TLS_DIR", "/nonexistent")
    assert run_worker("127.0.0.1:1", "worker-0") == ExitCode.USAGE  # never dials: nothing to report to
    assert capsys.readouterr().err == ("flextrain: error: FLEXTRAIN_TLS_DIR=/nonexistent holds no token "
                                       "(/nonexistent/token)\n")
