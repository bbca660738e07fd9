"""InstanceManager: keeps the desired number of workers running.

It launches workers through a :class:`LaunchBackend`, tells the JobMaster
who is alive, replaces a worker that died while the job runs (each worker
slot has a relaunch budget, so a worker that keeps crashing is not
relaunched for ever; one the cluster preempted or evicted costs none:
flextrain/master/k8s_priority.py), and stops surplus workers when the job is scaled down. With spare workers
(``--spare-workers``, a :class:`SparePool`) a worker to start is a parked
spare taken, when one exists, and a new spare is launched behind it; spares
are not workers here (they are not counted, judged or charged to the relaunch
budget), and a spare that dies is simply launched again. The spare behind a taken
one is launched once the taken one has trained (with ``trained``; at most
``REFILL_WAIT`` later): a spare's start-up is seconds of CPU (imports, the
model, a Keras trace) that would otherwise compete with the very join the
spare was taken to speed up, on the same node or, locally, the same cores.
Whether an exit it did not ask for is a failure worth a relaunch is the
``judge``'s decision (the JobMaster's failure tracker), not this class's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from flextrain.failures import ExitCode
from flextrain.master.launcher import InstanceSpec, LaunchBackend, Role
from flextrain.master.spares import SparePool

log = logging.getLogger(__name__)

AVOID_SECONDS = 600.0  # how long launches keep off a replaced slow worker's node
REFILL_WAIT = 10.0  # the longest a new spare waits for the taken one to train (one that never does)


class InstanceManager:
    def __init__(
        self,
        backend: LaunchBackend,
        *,
        desired: int,
        relaunch_budget: int,
        worker_args: Callable[[str], tuple[str, ...]],
        worker_env: Callable[[str], dict[str, str]],
        on_launch: Callable[[str], None],
        on_exit: Callable[[str, int], None],
        on_budget_exhausted: Callable[[str], None],
        on_retire: Callable[[str], None],
        judge: Callable[[str, int], bool] = lambda worker_id, code: code != 0,
        retire_grace: float = 30.0,
        spares: SparePool | None = None,
        on_disrupted: Callable[[str, str], None] = lambda worker_id, why: None,
        worker_memory: Callable[[], str | None] = lambda: None,
        trained: Callable[[str], bool] | None = None,
        on_desired: Callable[[int, int], None] = lambda previous, desired: None,
    ) -> None:
        """``trained(worker_id)``: whether a worker has committed a step in its round (the job's books);
        None: spares are launched behind taken ones at once. ``on_desired(previous, desired)``: the desired
        count changed (a scale, a suspend's release, a resume), told before the launches it causes."""
        self.backend = backend
        self.desired = desired
        self.relaunch_budget = relaunch_budget
        self._worker_args = worker_args
        self._worker_env = worker_env
        self._on_launch = on_launch
        self._on_exit = on_exit
        self._on_budget_exhausted = on_budget_exhausted
        self._on_retire = on_retire
        self._judge = judge  # (worker_id, exit code) of an exit we did not ask for -> relaunch?
        self._on_disrupted = on_disrupted  # (worker_id, why) of a worker the cluster took away
        self.retire_grace = retire_grace
        self.budget_exhausted = False
        self._lock = threading.Lock()
        self._next_index = 0
        self._stopping: set[str] = set()  # asked to stop by us: not a failure
        self.failures = 0
        self.preempted = 0  # workers the cluster took away (preempted, evicted): not failures
        self.last_disruption = ""  # "worker-3: PreemptionByScheduler"
        self.exits: list[tuple[str, int]] = []
        self.closed = False
        self.spares = spares
        self._worker_memory = worker_memory  # the memory a worker launched now gets (flextrain/master/oom.py)
        self.spares_lost = 0  # spares that died before they parked, in a row: a spare that cannot start
        self._avoid: dict[str, float] = {}  # node -> until when launches avoid it (replaced slow workers')
        self._trained = trained
        self._on_desired = on_desired
        self._awaited: dict[str, float] = {}  # taken spares not trained yet -> when the refill stops waiting
        backend.on_exit(self._exited)

    def _launch_one(self) -> str:
        taken = self.spares.take() if self.spares is not None else None
        if taken is not None:  # already running, its model built: it registers as soon as its Park answers
            self._on_launch(taken)
            self.backend.promote(taken)
            log.info("took spare %s", taken)
            if self._trained is not None:
                self._awaited[taken] = time.monotonic() + REFILL_WAIT
            return taken
        worker_id, index = self._next_id()
        self._on_launch(worker_id)
        self.backend.launch(
            InstanceSpec(worker_id, Role.WORKER, index, self._worker_args(worker_id),
                         self._worker_env(worker_id), avoid_nodes=self._avoided(), memory=self._worker_memory())
        )
        log.info("launched %s", worker_id)
        return worker_id

    def _avoided(self) -> tuple[str, ...]:
        now = time.monotonic()
        self._avoid = {node: until for node, until in self._avoid.items() if until > now}
        return tuple(sorted(self._avoid))

    def replace(self, worker_id: str, *, avoid_node: str = "") -> None:
        """Release a slow worker (a straggler, a failed node check) and launch a replacement, never charged
        to the relaunch budget; launches avoid ``avoid_node`` for ``AVOID_SECONDS`` (Kubernetes)."""
        with self._lock:
            if avoid_node:
                self._avoid[avoid_node] = time.monotonic() + AVOID_SECONDS
            running = worker_id in self.backend.running() and worker_id not in self._stopping
            if running:
                self._stopping.add(worker_id)
        if running:  # leaves at its next step boundary, as a scaled-away worker does
            self._on_retire(worker_id)
            timer = threading.Timer(self.retire_grace, self.backend.terminate, args=(worker_id,))
            timer.daemon = True
            timer.start()
        self.reconcile()

    def _next_id(self) -> tuple[str, int]:
        index = self._next_index
        self._next_index += 1
        return f"worker-{index}", index

    def _launch_spares(self) -> None:
        """Top the spares up to ``--spare-workers`` (called with the lock held)."""
        if self.spares is None or self.spares_lost > self.relaunch_budget:
            return
        now = time.monotonic()
        self._awaited = {w: until for w, until in self._awaited.items() if until > now}
        if self._awaited:  # top_up() launches them once the taken spares have trained
            return
        for _ in range(self.spares.missing()):
            worker_id, index = self._next_id()
            self.spares.launched(worker_id)
            self.backend.launch(InstanceSpec(worker_id, Role.WORKER, index,
                                             (*self._worker_args(worker_id), "--spare"),
                                             self._worker_env(worker_id), spare=True,
                                             avoid_nodes=self._avoided()))
            log.info("launched spare %s", worker_id)

    def top_up(self) -> None:
        """Launch the spares held back for taken ones that have trained since (the master's loop calls
        this; ``trained`` is asked without this manager's lock held)."""
        with self._lock:
            awaited = list(self._awaited)
        if not awaited:
            return
        done = [w for w in awaited if self._trained(w)]
        with self._lock:
            for w in done:
                self._awaited.pop(w, None)
            if not self.closed and not self.budget_exhausted:
                self._launch_spares()

    def reconcile(self) -> None:
        """Launch or stop workers until the running count equals ``desired``."""
        with self._lock:
            if self.closed:
                return
            # Only workers count: the same backend may run the job's parameter servers.
            spares = self.spares.ids() if self.spares is not None else set()
            running = [i for i in self.backend.running() - self._stopping - spares if i.startswith("worker-")]
            if not self.budget_exhausted:
                for _ in range(self.desired - len(running)):
                    self._launch_one()
                self._launch_spares()
            # Sorted only when some are to stop: this runs at every exit (O(n log n) each, at 1,000 workers
            # most of what a worker's exit cost the master; bench/master_scale.py).
            surplus = sorted(running, key=_index)[self.desired :] if len(running) > self.desired else []
            for worker_id in surplus[::-1]:
                # Graceful: the worker leaves at a step boundary and exits by itself;
                # it is terminated only if it has not done so after a grace period.
                self._stopping.add(worker_id)
                self._on_retire(worker_id)
                timer = threading.Timer(self.retire_grace, self.backend.terminate, args=(worker_id,))
                timer.daemon = True
                timer.start()

    def workers_running(self) -> set[str]:
        """Workers started and not seen exiting (not spares, not parameter servers)."""
        spares = self.spares.ids() if self.spares is not None else set()
        return {i for i in self.backend.running() - spares if i.startswith("worker-")}

    def release_all(self) -> int:
        """A suspend: want no worker, and take every running one's exit as asked for (the job tells them
        to stop; flextrain/master/suspension.py). Returns the count wanted before, for the resume."""
        with self._lock:
            before, self.desired = self.desired, 0
            self._stopping |= {i for i in self.backend.running() if i.startswith("worker-")}
        if before:
            self._on_desired(before, 0)
        return before

    def kill(self, worker_id: str) -> None:
        """Kill a worker that hangs; its exit counts as a failure and it is replaced."""
        self.backend.terminate(worker_id, force=True)

    def scale(self, desired: int) -> None:
        with self._lock:
            previous, self.desired = self.desired, desired
        if previous != desired:  # told first: the job's history has the scale before the launches it causes
            self._on_desired(previous, desired)
        self.reconcile()

    def exited(self, worker_id: str, code: int) -> None:
        """The backend's exit callback (public so a master can route exits of other roles elsewhere)."""
        self._exited(worker_id, code)

    def _exited(self, worker_id: str, code: int) -> None:
        was = self.spares.exited(worker_id) if self.spares is not None else None
        if was is not None:
            self._spare_exited(worker_id, code, parked=was == "parked")
            return
        with self._lock:
            expected = worker_id in self._stopping or self.closed
            self._stopping.discard(worker_id)
            if self._awaited.pop(worker_id, None) is not None and not self.closed:  # it will not train now
                self._launch_spares()
            self.exits.append((worker_id, code))
        self._on_exit(worker_id, code)
        # Preempted or evicted (priority-based elasticity): the job shrinks, the replacement waits for capacity.
        disrupted = None if expected else self.backend.disruption(worker_id)
        if disrupted:
            with self._lock:
                self.preempted += 1
                self.last_disruption = f"{worker_id}: {disrupted}"
            self._on_disrupted(worker_id, disrupted)
        if expected or not self._judge(worker_id, code):
            return
        log.info("%s exited with code %d: relaunching", worker_id, code)  # the judge told the user why
        with self._lock:
            # Neither a worker released from a dead round nor one the cluster took away did anything wrong.
            self.failures += code != ExitCode.RELEASED and not disrupted
        if self.failures > self.relaunch_budget * max(1, self.desired):
            with self._lock:
                self.budget_exhausted = True
            self._on_budget_exhausted(
                f"workers failed {self.failures} times, over the relaunch budget of "
                f"{self.relaunch_budget} per worker; not relaunching (last: {worker_id} exited with code {code})"
            )
            return
        self.reconcile()

    def _spare_exited(self, worker_id: str, code: int, *, parked: bool) -> None:
        """A spare died (not a worker: nothing to judge or charge); launch another. Spares that keep dying
        before they ever park (a module that cannot load) are given up after ``relaunch_budget`` in a row."""
        with self._lock:
            self.exits.append((worker_id, code))
        self._on_exit(worker_id, code)  # the job forgets it (e.g. an --accelerate auto searcher that was a spare)
        with self._lock:
            if self.closed:
                return
            self.spares_lost = 0 if parked else self.spares_lost + 1
            if self.spares_lost > self.relaunch_budget:
                log.error("spare %s exited with code %d before it was ready, %d spares in a row: no more spares",
                          worker_id, code, self.spares_lost)
                return
            log.info("spare %s exited with code %d: launching another", worker_id, code)
            self._launch_spares()

    def close(self, *, grace: float = 5.0) -> None:
        with self._lock:
            self.closed = True
        if self.spares is not None:
            self.spares.close()
        self.backend.close(grace=grace)


def _index(worker_id: str) -> int:
    return int(worker_id.rsplit("-", 1)[1])
