"""The master's rendezvous stores (torch's TCPStore, unauthenticated: docs/security.md "Not covered") listen
on the master's own host: loopback for a local job, not every interface as torch binds them by itself; a
wildcard host (the master in a pod) keeps every interface. Checked on the kernel's table of listening
sockets, and by a client that uses the store."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist

from flextrain.master.stores import open_store
from flextrain.master.rendezvous import Round
from flextrain.master.script_strategy import ScriptStrategy

TIMEOUT = timedelta(seconds=10)


def listening(port: int) -> set[str]:
    """The local addresses sockets listen on at ``port`` (/proc/net/tcp and tcp6; state 0A is LISTEN)."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        for line in path.read_text().splitlines()[1:] if path.exists() else ():
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)  # the kernel's words, each in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, raw))
    return found


def test_a_local_jobs_store_listens_on_loopback_only_and_serves_its_clients():
    store = open_store("127.0.0.1", TIMEOUT)
    assert listening(store.port) == {"127.0.0.1"}  # torch alone: {"::"}, every interface
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=TIMEOUT)
    client.set("round/1", "ready")
    assert store.get("round/1") == b"ready"


def test_a_wildcard_host_keeps_every_interface():
    store = open_store("0.0.0.0", TIMEOUT)
    assert listening(store.port) & {"0.0.0.0", "::"}


def test_a_script_rounds_own_store_listens_where_the_jobs_does():
    job = SimpleNamespace(store_bind="127.0.0.1", note=lambda message: None)
    strategy = ScriptStrategy()
    rnd = Round(round_id=1, members=["worker-0"], version=0)
    strategy.round_formed(job, rnd, None, [])
    assert rnd.store_port and listening(rnd.store_port) == {"127.0.0.1"}


def test_a_kubernetes_jobs_pods_reach_its_masters_stores_and_no_one_else_does():
    """On Kubernetes the store listens on every interface of the master's pod, on a port picked as it starts:
    the master's NetworkPolicy admits the job's own pods on every port (else their rendezvous would be
    dropped), the operator on the gRPC port only, and nobody else but on the metrics port."""
    from flextrain.k8s.netpol import job_policies

    job = {"apiVersion": "flextrain.dev/v1", "kind": "ElasticJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": {"strategy": "AllReduce"}}
    (master,) = job_policies(job, operator_namespace="flextrain-system")
    rules = master["spec"]["ingress"]
    own_pods = {"podSelector": {"matchLabels": {"flextrain.dev/job": "j"}}}
    assert [rule for rule in rules if "ports" not in rule] == [{"from": [own_pods]}]  # every port: the job's only
    assert all("ports" in rule for rule in rules if rule.get("from") != [own_pods])
