"""The operator's side of a job's TLS (spec.tls; docs/security.md, "Kubernetes").

* :func:`ensure_secret`: before a job's master pod is created (and again before a relaunch), the Secret
  ``<job>-tls`` (flextrain/k8s/tls_secret.py) exists: made once with fresh material, owned by the job, so
  it goes with it. One that exists is kept as it is: the pods running already hold its token, and a
  relaunched master must speak to them with it. Its contents are never logged.
* :func:`master_credentials`: what the operator's own channel to the master (flextrain/operator/relay.py)
  dials with, read from that Secret through the API.
* :func:`delete_secret`: a finished job's Secret, deleted with its pods (ttlSecondsAfterFinished).
"""

from __future__ import annotations

import logging

from flextrain.k8s import tls_secret
from flextrain.operator.jobview import ident
from flextrain.operator.kube import Kube
from flextrain.protocol.security import JobCredentials, make_credentials

log = logging.getLogger(__name__)


def ensure_secret(kube: Kube, job: dict) -> bool:
    """Create ``job``'s TLS Secret unless it exists or TLS is off; True if this call created it.
    The API server's refusal propagates (the reconciler reports it as it does a refused pod)."""
    if not tls_secret.enabled(job):
        return False
    namespace, name = ident(job)
    if kube.get_secret(namespace, tls_secret.secret_name(name)) is not None:
        return False
    created = kube.create_secret(tls_secret.secret(job, make_credentials(name)))  # False: a racing handler won
    if created:
        log.info("%s/%s: created Secret %s (the job's CA, certificate and token)", namespace, name,
                 tls_secret.secret_name(name))
    return created


def master_credentials(kube: Kube, job: dict) -> JobCredentials | None:
    """The material to dial ``job``'s master with: None when TLS is off. A job with TLS on whose Secret is
    missing (its master started before the operator made Secrets) is dialled in plaintext, with a warning."""
    if not tls_secret.enabled(job):
        return None
    namespace, name = ident(job)
    found = kube.get_secret(namespace, tls_secret.secret_name(name))
    if found is None:
        log.warning("%s/%s: Secret %s is missing: dialling the master without TLS", namespace, name,
                    tls_secret.secret_name(name))
        return None
    return tls_secret.credentials_of(found)


def delete_secret(kube: Kube, job: dict) -> str | None:
    """Delete ``job``'s TLS Secret; ``secret/NAME`` if there was one to delete."""
    namespace, name = ident(job)
    secret = tls_secret.secret_name(name)
    if kube.get_secret(namespace, secret) is None:  # TLS off, or deleted already
        return None
    kube.delete_secret(namespace, secret)
    return f"secret/{secret}"


__all__ = ["delete_secret", "ensure_secret", "master_credentials"]
