"""The parked phase of a spare worker (``--spare-workers``; the master's side is flextrain/master/spares.py).

A spare has done everything a worker does before it registers — imported
torch and the user's module, built the model and optimizer (and probed or
chosen its strategy where the job asks) — and then waits here, in the master's
``Park`` long poll, instead of registering: it is not a member, is in no
rendezvous and reads no task. :func:`park` returns once the master took it
(a scale-up or a replacement): the worker then registers and joins the next
round as any newcomer does, taking the round's state from rank 0.
"""

from __future__ import annotations

import logging
import os
import time

from flextrain.proto import flextrain_pb2 as pb

log = logging.getLogger("flextrain.worker")


def park(client, *, pid: int | None = None) -> bool:
    """Wait parked until the master takes this spare: True (go on and register), or False when the
    master answers STOP (the job is over, or no spare is wanted any more: exit 0).

    ``client`` is the worker's MasterClient; each poll blocks on the master for up to its long-poll
    time, so a parked spare costs one RPC every few seconds and no CPU in between.
    """
    pid = os.getpid() if pid is None else pid
    since = time.monotonic()
    log.info("%s parked as a spare (pid %d)", client.worker_id, pid)
    while True:
        action = client.park(pid=pid).action
        if action == pb.ParkResponse.TAKEN:
            log.info("%s taken after %.1fs parked", client.worker_id, time.monotonic() - since)
            return True
        if action == pb.ParkResponse.STOP:
            log.info("%s: the master needs no spare any more; exiting", client.worker_id)
            return False
