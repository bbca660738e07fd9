"""Where the master's servers listen, and the address workers dial for them.

The job's rendezvous store and each script round's store are torch TCPStores;
a local job's listen on loopback, as its gRPC server does (docs/security.md).
"""

from __future__ import annotations

import os
from datetime import timedelta

WILDCARDS = ("0.0.0.0", "::", "")


def reachable_host(host: str) -> str:
    """The address workers dial for a server bound to ``host`` (a wildcard means this pod's IP)."""
    if host not in WILDCARDS:
        return host
    import socket

    from flextrain.k8s.meta import ENV_POD_IP

    return os.environ.get(ENV_POD_IP) or socket.gethostbyname(socket.gethostname())


def open_store(host: str, timeout: timedelta):
    """A TCPStore server (the job's rendezvous store, a script round's own) that listens on ``host`` only,
    unless ``host`` is a wildcard.

    torch's TCPStore listens on every interface whatever host it is given, and authenticates no one
    (docs/security.md, "Not covered"); a local job's master serves gRPC on loopback, so its store listens
    there too, on a socket bound here and handed to torch (``master_listen_fd``; torch closes it). Workers
    dial :func:`reachable_host`, which is ``host`` itself when it is not a wildcard; with a wildcard (the
    master in a pod, which pods reach at its IP) the store listens on every interface, as torch binds it."""
    import socket

    import torch.distributed as dist

    if host in WILDCARDS:
        return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout,
                         master_listen_fd=sock.detach())


__all__ = ["WILDCARDS", "open_store", "reachable_host"]
