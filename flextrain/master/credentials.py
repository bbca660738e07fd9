"""The TLS material and token of the job a master runs (--tls, spec.tls; docs/security.md)."""

from __future__ import annotations

from pathlib import Path

from flextrain.job import JobSpec
from flextrain.protocol.security import ENV_DIR, JobCredentials, from_environment, make_credentials, write_credentials

TLS_DIR = "tls"  # --tls: a local job's CA, certificate and token, under the job directory


def job_credentials(spec: JobSpec, job_dir: Path, *, kubernetes: bool) -> tuple[JobCredentials | None, dict]:
    """The job's material (None: TLS off) and the environment that tells the processes the master starts where
    it is.

    Locally: a CA, certificate and token of this run's own, made in ``<job dir>/tls/`` (every run anew).
    On Kubernetes: the job's Secret, which the operator made once and mounted into this pod and every pod
    of the job (flextrain/k8s/tls_secret.py), so a relaunched master keeps the job's token and the pods need
    nothing from here.
    """
    if not spec.tls:
        return None, {}
    if kubernetes:
        creds = from_environment(server=True)
        if creds is None:
            raise ValueError(f"spec.tls is on but {ENV_DIR} is not set: the operator mounts the job's Secret "
                             f"{spec.name}-tls into its pods; run a Kubernetes job's master through an ElasticJob")
        return creds, {}
    creds = make_credentials(spec.name)
    write_credentials(job_dir / TLS_DIR, creds)
    return creds, {ENV_DIR: str(job_dir / TLS_DIR)}


__all__ = ["TLS_DIR", "job_credentials"]
