"""Suspending a running job and resuming it: ``flextrain suspend/resume JOB``, an ElasticJob's ``spec.suspend``.

The master stays up, holding the job's ledger and checkpoints; what a suspend releases is every
worker process or pod (the point, on a shared cluster: their CPUs, GPUs and memory). Contract:

* ``suspend``: the workers are told to stop exactly as for ``flextrain stop`` (rank 0 writes a checkpoint
  at the next step boundary) and the instance manager wants no worker, so none is relaunched. Once no
  worker runs, the phase is ``Suspended``; a worker still running ``grace`` seconds after the request is
  killed (the job then continues from its latest checkpoint instead, which is just as exact).
* ``resume``: the phase goes back to ``Pending`` and the workers wanted before are launched again. Their
  first round finds no survivor of the last one and rolls model and ledger back to the latest checkpoint
  (:meth:`~flextrain.master.rounds.RoundKeeping._rollback`, the path of a job that lost every worker),
  which is the suspend's own when rank 0 wrote one: every record is still applied exactly once.
* A resume asked while the suspend is under way is kept and done once the job is Suspended (Kueue and
  the operator may flip ``spec.suspend`` back at any time).
* Refused, with the reason: a job that is over, already suspended (suspend) or not suspended (resume);
  a job whose training finished (its last evaluation runs to the end); ParameterServer, script and
  ``--spare-workers`` jobs (their state lives beyond rank 0's checkpoint: not supported yet).

Both calls come from the gRPC thread pool; :meth:`Suspension.tick` from the master's main loop.
"""

from __future__ import annotations

import time
from typing import Callable

from flextrain.job import Strategy
from flextrain.master.phase import Phase

SUSPEND_GRACE = 30.0  # seconds the workers get to write the suspend checkpoint and exit


class Suspension:
    def __init__(self, job, *, manager: Callable[[], object], grace: float = SUSPEND_GRACE,
                 clock=time.monotonic) -> None:
        self.job = job
        self._manager = manager  # the InstanceManager (built after the servicer that calls us)
        self.grace = grace
        self.clock = clock
        self.since: float | None = None  # when the running suspend was asked
        self.desired = 0  # the workers wanted before the suspend: what a resume launches
        self.resume_after: str | None = None  # a resume's reason, asked while the suspend was under way

    def request(self, suspend: bool, reason: str) -> tuple[bool, str]:
        """Suspend (``suspend``) or resume the job; ``(accepted, message)``."""
        return self._suspend(reason) if suspend else self._resume(reason)

    def _suspend(self, reason: str) -> tuple[bool, str]:
        job, spec = self.job, self.job.spec
        with job.cond:
            refused = (f"job already {job.phase.value}" if job.over or job.phase is Phase.SUSPENDED
                       else "a suspend is already under way" if job.suspension
                       else "stopping" if job.stopping
                       else "training has finished; the final evaluation runs to its end" if job.training_finished()
                       else "suspend is not supported yet for ParameterServer jobs"
                       if spec.strategy is Strategy.PARAMETER_SERVER
                       else "suspend is not supported yet for script jobs" if spec.is_script
                       else job.words("suspend is not supported yet for jobs with --spare-workers")
                       if spec.worker.spares else "")
            if refused:
                return False, f"cannot suspend: {refused}"
            job.suspension = reason
            job.stopping = f"suspending: {reason}"  # the workers' stop: a checkpoint at the next step boundary
            job.message = job.stopping
            job.events.append(job.message)
            self.since = self.clock()
            job.cond.notify_all()
        manager = self._manager()
        self.desired = manager.release_all()
        self.tick()  # no worker running (none started yet): suspended at once
        return True, "suspending: the workers stop at the next step boundary after a checkpoint"

    def _resume(self, reason: str) -> tuple[bool, str]:
        job = self.job
        with job.cond:
            if job.suspension is not None and not job.over:
                self.resume_after = reason
                return True, "resuming once the suspend under way completes"
            if job.phase is not Phase.SUSPENDED:
                return False, f"cannot resume: the job is {job.phase.value}, not Suspended"
            job.phase, job.stopping, job.short_since = Phase.PENDING, None, None
            job.note(f"resumed ({reason}): launching {self.desired} worker(s); training continues from the "
                     "latest checkpoint")
            job.cond.notify_all()
        self._manager().scale(self.desired)
        return True, f"resuming with {self.desired} worker(s)"

    def tick(self) -> None:
        """Suspending: Suspended once no worker runs; past ``grace``, kill the workers still running."""
        job = self.job
        with job.cond:
            if job.suspension is None or job.over:
                return
        manager = self._manager()
        left = manager.workers_running()
        if left and self.clock() - self.since > self.grace:
            for worker_id in sorted(left):
                manager.kill(worker_id)
            return
        if left:
            return
        with job.cond:
            if job.suspension is None or job.over:
                return
            latest = job.checkpoints.latest() if job.checkpoints else None
            where = (f"checkpoint {latest['checkpoint']} (step {latest['version']})" if latest
                     else "the start (no checkpoint yet)")
            job.phase, job.suspension = Phase.SUSPENDED, None
            job.note(f"suspended: every worker released; a resume continues from {where}")
            job.cond.notify_all()
        if self.resume_after is not None:
            reason, self.resume_after = self.resume_after, None
            self._resume(reason)


__all__ = ["SUSPEND_GRACE", "Suspension"]
