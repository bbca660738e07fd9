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

A compute check, not a network one: a slow link between two nodes slows every member of a round alike,
so it names no node; the straggler tracker's per-sample compute figure keeps watching after the start.
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
ENV_NODE = "FLEXTRAIN_NODE_NAME"  # flextrain.k8s.meta.ENV_NODE_NAME: the pod's spec.nodeName (downward API)


def node_name() -> str:
    """Where this worker runs: the Kubernetes node, else the host."""
    return os.environ.get(ENV_NODE) or socket.gethostname()


def share(spec: JobSpec, records: int) -> int:
    """Samples per timed step: one worker's share of a full round's global batch."""
    G = spec.training.global_batch_size
    m = max(1, G // max(1, spec.worker.effective_max_replicas))
    return max(1, min(m, spec.training.effective_max_micro_batch or m, records))


def check_node(spec: JobSpec, model_def, model, optimizer) -> pb.NodeCheck:
    """Time this worker's training step (module docstring)."""
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
    log.info("node check on %s: %.3g ms per sample (median of %d steps of %d samples)", node_name(),
             per_sample * 1e3, STEPS, m)
    return pb.NodeCheck(seconds_per_sample=per_sample, samples=m, steps=STEPS)


__all__ = ["ENV_NODE", "check_node", "node_name", "share"]
