"""Checkpoints as the workers report them (periodic, final, stop, persisted in-memory snapshots), and
the in-memory snapshots' ledgers, resolved by the master on its own.

Rank 0 puts a snapshot into shared memory under a name carrying its exact position and sends no mark
(worker/flash.py). The master resolves every snapshot there that has no ledger yet
(:meth:`CheckpointReports.resolve_snapshots`) *before its ledger records any outcome*
(``TaskLedger.before_outcome``: a task leaving DOING, whatever the cause), before it records a
persisted snapshot and before it flushes one: at such a moment the ledger holds no outcome after the
last one, so the answer is what a mark arriving just then would have been given
(``accounting.snapshot_ledger``: exact unless ``moved_past``). A snapshot whose state reached shared
memory only after an outcome it lacks is refused (its state removed), as a late mark was. The newest
resolved snapshot gets its ledger file (older ones go); its ledger is also kept in memory for the
report of its persisted copy.

A mixin of :class:`flextrain.master.coordinator.JobMaster` (as
:class:`flextrain.master.rounds.RoundKeeping` is): these methods use its lock,
phase, ledger, rendezvous and checkpoint store (``checkpoints``, ``flash``,
``recorded_version``), and its ``finish``/``note``/``check_outcome``.
"""

from __future__ import annotations

from flextrain.elastic.flash import stem
from flextrain.master.accounting import ledger_at, snapshot_ledger
from flextrain.master.checkpoints import StateWriteError
from flextrain.master.phase import Phase
from flextrain.proto import flextrain_pb2 as pb


class CheckpointReports:
    def kept_checkpoint(self) -> str:
        """``"; the last good checkpoint is kept: PATH (step N)"``, or "" without one: how a message
        about a failed write says what a resume continues from."""
        latest = self.checkpoints.latest() if self.checkpoints else None
        return f"; the last good checkpoint is kept: {latest['checkpoint']} (step {latest['version']})" if latest else ""

    def flush_flash(self, *, why: str = "every worker of the last round was lost") -> int | None:
        """Persist the newest in-memory snapshot when it is newer than the newest checkpoint (``why``:
        every worker lost, a resume, the job's end); the snapshots are cleared after, as the model goes
        back to that checkpoint. Returns the version persisted, or None."""
        if self.flash is None:
            return None
        self.resolve_snapshots()  # one its ledger has not moved past: the newest in the round that died
        try:
            version = self.checkpoints.adopt_flash(self.flash, note=self.note)
        except OSError as exc:  # StateWriteError (a full disk) names the file; the older checkpoint stays
            self.note(f"the newest in-memory checkpoint could not be persisted: {exc}")
            version = None
        if version is not None:
            self.recorded_version = max(self.recorded_version, version)
            self.note(f"in-memory checkpoint of step {version} persisted ({why})")
        self.flash.clear()
        self.snapshot_rounds.clear()  # the model goes back: a late snapshot of those rounds is not theirs
        return version

    def resolve_snapshots(self) -> None:
        """Give the newest in-memory snapshot in shared memory without a ledger its ledger (the ledger
        file beside it, older snapshots pruned), or remove it when the ledger has moved past it; the
        same for the next older one until one is kept. The caller holds the lock (see the module
        docstring for when it is called). One ``listdir`` when nothing is pending."""
        current = self.rendezvous.current
        if current is not None and self.snapshot_rounds.get(current.round_id) is not current:
            self.snapshot_rounds[current.round_id] = current
            for old in sorted(self.snapshot_rounds)[:-3]:  # a snapshot is at most a round or two behind
                del self.snapshot_rounds[old]
        if self.flash is None:
            return
        for pending in self.flash.pending():  # newest first
            pos = pb.Position(**pending.position)
            self.snapshots_seen[stem(pos)] = None
            ledger = self._snapshot_ledger(pos, current)
            if ledger is None:
                self.flash.discard(pending)
                self.snapshots_refused += 1
                continue
            self.flash.put_ledger(pending, ledger)
            self.snapshot_ledgers[stem(pos)] = ledger
            for old in list(self.snapshot_ledgers)[:-4]:  # the newest few: their persisted copies' reports
                del self.snapshot_ledgers[old]
            for old in list(self.snapshots_seen)[:-16]:
                del self.snapshots_seen[old]
            return

    def _snapshot_ledger(self, pos: pb.Position, current) -> dict | None:
        """``accounting.snapshot_ledger`` for a snapshot at ``pos`` now (None: refused)."""
        if self.over:
            return None
        return snapshot_ledger(self.ledger, self.snapshot_rounds.get(pos.round_id), current, pos,
                               beyond=current is not None and any(w.position.round_id == current.round_id
                                                                  and w.position.version > pos.version
                                                                  for w in self.workers.values()))

    def report_checkpoint(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        if req.memory:
            return self._record_snapshot(req)
        if not (req.final or req.stop):
            return self._record_periodic(req)
        with self.cond:
            self._touch(req.worker_id, req.position)
            if self.checkpoints is not None:
                try:
                    ledger = ledger_at(self.ledger, self.rendezvous.current, req.position)
                    self.checkpoints.record(checkpoint=req.path, version=req.position.version,
                                            ledger=ledger, final=req.final)
                    self._recorded(req.position.version, ledger)
                except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
                    self._checkpoint_not_recorded(req, exc)
                    return pb.ReportCheckpointResponse()
            if req.final:
                self.final_checkpoint = req.path
            if req.stop and self.suspension is not None:
                self.note(f"suspend checkpoint at step {req.position.version}: {req.path}")
            elif req.stop and self.stopping:
                self.finish(Phase.FAILED, f"stopped: {self.stopping}; checkpoint at step "
                            f"{req.position.version}: resume with `flextrain train --resume {self.spec.job_dir}`")
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _record_periodic(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        """A periodic checkpoint (``--checkpoint-steps``). Its ledger is taken under the job's lock, at the
        reported position; its two fsync'd files are written outside it (:meth:`_record_unlocked`)."""
        with self.cond:
            self._touch(req.worker_id, req.position)
            if self.checkpoints is None:
                return pb.ReportCheckpointResponse()
            ledger = ledger_at(self.ledger, self.rendezvous.current, req.position)
        return self._record_unlocked(req, ledger, newer_only=False)

    def _record_snapshot(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        """A persisted in-memory snapshot: recorded with the ledger resolved for its position (resolved
        now if it was still pending), unless it was refused or a newer checkpoint is recorded."""
        with self.cond:
            pos = req.position
            info = self.workers.get(req.worker_id)
            if info is not None and (info.position.round_id, info.position.version) > (pos.round_id, pos.version):
                info.last_seen = self.clock()  # a snapshot's position is behind: the worker's newer one stays
            else:
                self._touch(req.worker_id, pos)
            self.resolve_snapshots()
            ledger = self.snapshot_ledgers.get(stem(pos))
            if ledger is None and stem(pos) not in self.snapshots_seen:
                # never in this master's shared memory (Kubernetes: the master's pod has its own):
                # resolved now, as a mark arriving now would have been
                ledger = self._snapshot_ledger(pos, self.rendezvous.current)
            if ledger is None or self.checkpoints is None or self.over or pos.version <= self.recorded_version:
                return pb.ReportCheckpointResponse()
        return self._record_unlocked(req, ledger, newer_only=True)

    def _record_unlocked(self, req: pb.ReportCheckpointRequest, ledger: dict, *,
                         newer_only: bool) -> pb.ReportCheckpointResponse:
        """Write a checkpoint's two fsync'd files outside the job's lock: every worker's heartbeats and
        task calls would otherwise wait on the disk (the asyncio server serves them inline). The store
        keeps writers in order; ``newer_only`` (a persisted snapshot): not recorded when older than a
        recorded checkpoint."""
        try:
            recorded = self.checkpoints.record(checkpoint=req.path, version=req.position.version, ledger=ledger,
                                               final=False, newer_only=newer_only)
        except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
            with self.cond:
                self._checkpoint_not_recorded(req, exc)
            return pb.ReportCheckpointResponse()
        with self.cond:
            if recorded:
                self._recorded(req.position.version, ledger)
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _recorded(self, version: int, ledger: dict) -> None:
        """A checkpoint is recorded: what it keeps is the least a status may show as done (a round
        that ended, e.g. by the job's failure, no longer adds its progress to the ledger's)."""
        self.recorded_version = max(self.recorded_version, version)
        self.recorded_records = max(self.recorded_records, int(ledger.get("records_done", 0)))

    def _checkpoint_not_recorded(self, req: pb.ReportCheckpointRequest, exc: StateWriteError) -> None:
        """A checkpoint's files could not be written: the job fails naming the file and the reason, and
        the last good checkpoint (caller holds the lock)."""
        self.finish(Phase.FAILED, f"cannot record the checkpoint of step {req.position.version}: "
                    f"{exc}{self.kept_checkpoint()}")
        self.cond.notify_all()
