"""``--node-check``: time this worker's own training step before it joins (DLRover's node check idea).

Contract of :func:`check_node`, called by a PyTorch worker after it built its model and optimizer and
before it registers (a spare: before it parks):

* The step timed is the job's: the module's ``feed`` over the first training records
  (:func:`flextrain.worker.probing.first_records`), its model's forward, its ``loss``, backward and one
  step of its optimizer, through :func:`flextrain.elastic.probe.training_step`, which puts everything
  back as it was (checking never changes training).
* One untimed warm-up step, then ``STEPS`` timed ones of ``m`` samples, ``m`` the share of one worker in
  a full round (G / max workers, at most ``--max-micro-batch`` and the records read). The figure is the
  median step's seconds per sample; it travels with RegisterWorker and the master judges it
  (flextrain/master/stragglers.py: a worker ``--straggler-factor`` times slower than the median of the
  workers admitted so far is refused and replaced, elsewhere on Kubernetes).

Then the link: a short gloo all-reduce with the master over the job's store (``LINK_ROUNDS`` timed
rounds of ``LINK_BYTES``; flextrain/protocol/linkprobe.py), reported as seconds per MiB and judged the same
way against the workers admitted before. It measures the new node's path to the master's node, the
part of a ring all-reduce a node can make slow for everyone; once training runs, the straggler tracker's
per-sample compute figure keeps watching.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time

from flextrain.job import JobSpec
from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger("flextrain.worker")

STEPS = 3  # timed steps after the warm-up
LINK_BYTES, LINK_ROUNDS = 4 << 20, 3  # the link probe: 3 timed all-reduces of 4 MiB (after one untimed)
ENV_NODE = "FLEXTRAIN_NODE_NAME"  # flextrain.k8s.meta.ENV_NODE_NAME: the pod's spec.nodeName (downward API)


def node_name() -> str:
    """Where this worker runs: the Kubernetes node, else the host."""
    return os.environ.get(ENV_NODE) or socket.gethostname()


def share(spec: JobSpec, records: int) -> int:
    """Samples per timed step: one worker's share of a full round's global batch."""
    G = spec.training.global_batch_size
    m = max(1, G // max(1, spec.worker.effective_max_replicas))
    return max(1, min(m, spec.training.effective_max_micro_batch or m, records))


def check_node(spec: JobSpec, model_def, model, optimizer, client=None) -> pb.NodeCheck:
    """Time this worker's training step, and with ``client`` (the master's) probe its link (module docstring)."""
    from flextrain.elastic.probe import training_step  # torch: only where a check runs
    from flextrain.worker.probing import check_framework, first_records
    from flextrain.worker.pytorch import check_loss, take

    check_framework(spec, model_def)
    features, labels, n = first_records(spec, model_def, spec.training.global_batch_size)
    m = share(spec, n)

    def loss_fn(predictions, targets):
        return check_loss(model_def, model_def.loss(targets, predictions), samples=len(targets))

    model.train()
    step = training_step(model, optimizer, loss_fn, lambda k: (take(features, slice(0, k)), take(labels, slice(0, k))))
    step(m)  # warm-up: allocations, lazy initialisation
    took = []
    for _ in range(STEPS):
        began = time.perf_counter()
        step(m)
        took.append(time.perf_counter() - began)
    per_sample = statistics.median(took) / m
    link = probe_link(client) if client is not None else 0.0
    log.info("node check on %s: %.3g ms per sample (median of %d steps of %d samples); link %s", node_name(),
             per_sample * 1e3, STEPS, m, f"{link * 1e3:.3g} ms per MiB all-reduced" if link else "not probed")
    return pb.NodeCheck(seconds_per_sample=per_sample, samples=m, steps=STEPS, link_seconds_per_mib=link)


def probe_link(client) -> float:
    """A gloo all-reduce with the master over the job's store (flextrain/protocol/linkprobe.py): seconds per
    MiB; 0 when it could not run (said in the log; the compute check still decides)."""
    from flextrain.protocol.linkprobe import all_reduce_probe

    try:
        where = client.probe_link(nbytes=LINK_BYTES, rounds=LINK_ROUNDS)
        return all_reduce_probe(host=where.store_host, port=where.store_port, prefix=where.prefix, rank=1,
                                nbytes=LINK_BYTES, rounds=LINK_ROUNDS)
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run is no verdict on the node
        log.warning("node check: the link probe with the master failed (%s); judged on compute alone", exc)
        return 0.0


__all__ = ["ENV_NODE", "check_node", "node_name", "share"]
